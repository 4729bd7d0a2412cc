"""The fused accelerator kernels of the SO(2) path: the same four ops as :mod:`accrot.ops.cpu_kernels`, compiled.

On the CPU one compiled C++ pass replaces the four to six eager ops of a rotation (and of the angle accumulation);
on CUDA the same fusion comes from ``torch.compile`` (Inductor writes one Triton kernel per op), so the learned-
increment path — rotate q, k (v, out), accumulate the angles, and their backward — is fused on both. :func:`ops`
returns an object with ``rotate``, ``rotate_backward``, ``accumulate_wrap`` and ``suffix_sum`` (the signatures of
``torch.ops.accrot_cpu``), or None, in which case :mod:`accrot.ops.rotary` runs its eager formulas.
``ACCROT_GPU_KERNELS`` chooses:

* ``auto`` (default): compile on first use where Triton is installed; if compiling fails, warn once (a
  ``RuntimeWarning`` naming the error, kept in :func:`failure`; :func:`describe` then says ``eager``) and run the
  same formulas eagerly (:data:`EAGER`) for the rest of the process;
* ``off``: always eager (to compare: ``make gpu-check`` times both and reports which is faster);
* ``on``: compile or raise, whatever failed earlier in the process.

Each op is compiled once per Python-level variant (sign of the rotation, which outputs are wanted, an offset or
none) with dynamic shapes, so new lengths never recompile. What does make dynamo compile another graph is each
distinct value of what it specialises on: a size-1 dimension (cos/sin shared over the batch and heads, or not;
batch 1 at evaluation), the dtype (float64 in tests), autocast on or off, inference mode. A run meets a handful of
these, more than dynamo's default limit of 8 graphs per function, which with ``fullgraph=True`` raises; so each
variant gets its own limit, :data:`RECOMPILE_LIMIT`, above every combination of them (2⁵ = 32).
``tests/ops/test_gpu_kernels.py`` counts the graphs on Inductor's CPU backend. The formulas here are also the
eager fallback, and ``tests/ops/test_rotary.py`` checks both against the twins.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import threading
import warnings
from collections.abc import Callable

import torch

TWO_PI = 2.0 * math.pi
_lock = threading.Lock()
_state: dict[str, object] = {"failed": None}
_compiled: dict[tuple, Callable] = {}
RECOMPILE_LIMIT = 64  # graphs per variant: above the 32 combinations of what dynamo specialises on (docstring)


def mode() -> str:
    value = os.environ.get("ACCROT_GPU_KERNELS", "auto").strip().lower() or "auto"
    if value not in ("auto", "on", "off"):
        raise ValueError(f"ACCROT_GPU_KERNELS={value!r} is not valid; choose one of auto, on, off")
    return value


# -- the formulas (eager, and what torch.compile fuses) -----------------------------------------------------
def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
    """y = R(sθ) x per pair: (a, b) → (a cos − s b sin, s a sin + b cos); x ``[B, H, T, D]``, cos/sin
    ``[B|1, H|1, T, D/2]`` in x's dtype."""
    a, b = x.chunk(2, dim=-1)  # [B, H, T, D/2] each
    if sign > 0:
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)  # [B, H, T, D]
    return torch.cat((a * cos + b * sin, b * cos - a * sin), dim=-1)


def _dtheta(grad: torch.Tensor, y: torch.Tensor, sign: float) -> torch.Tensor:
    """dθ = s (y_a g_b − y_b g_a), ``[B, H, T, D/2]`` (the caller sums broadcast dimensions)."""
    ga, gb = grad.chunk(2, dim=-1)
    ya, yb = y.chunk(2, dim=-1)
    d = ya * gb - yb * ga
    return d if sign > 0 else -d


def _rotate_backward_dx(grad, cos, sin, sign):
    return _rotate(grad, cos, sin, -sign)  # dx = R(−sθ) g


def _rotate_backward_both(grad, y, cos, sin, sign):
    return _rotate(grad, cos, sin, -sign), _dtheta(grad, y, sign)


def _accumulate(delta: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    """θ = wrap(offset + cumsum δ) along T, summed in float64, wrapped to [−π, π), float32 ``[B, H, T, P]``."""
    theta = delta.to(torch.float64).cumsum(dim=-2)
    if offset is not None:
        theta = theta + offset.to(torch.float64)
    return (torch.remainder(theta + math.pi, TWO_PI) - math.pi).to(torch.float32)


def _suffix(grad: torch.Tensor) -> torch.Tensor:
    """d δ_j = Σ_{t≥j} g_t along T, accumulated in float64 (as the CPU kernel), in grad's dtype."""
    return grad.to(torch.float64).flip(-2).cumsum(-2).flip(-2).to(grad.dtype)


VARIANTS: dict[str, Callable] = {
    "rotate+": lambda x, c, s: _rotate(x, c, s, 1.0),
    "rotate-": lambda x, c, s: _rotate(x, c, s, -1.0),
    "dx+": lambda g, c, s: _rotate_backward_dx(g, c, s, 1.0),
    "dx-": lambda g, c, s: _rotate_backward_dx(g, c, s, -1.0),
    "dtheta+": lambda g, y: _dtheta(g, y, 1.0),
    "dtheta-": lambda g, y: _dtheta(g, y, -1.0),
    "both+": lambda g, y, c, s: _rotate_backward_both(g, y, c, s, 1.0),
    "both-": lambda g, y, c, s: _rotate_backward_both(g, y, c, s, -1.0),
    "accumulate": lambda d: _accumulate(d, None),
    "accumulate+offset": _accumulate,
    "suffix": _suffix,
}
EAGER = VARIANTS  # the same callables, uncompiled


def _compile(fn: Callable) -> Callable:
    """``torch.compile`` of one variant with its own :data:`RECOMPILE_LIMIT` (torch's ``recompile_limit``
    argument; a torch without it runs each call under the same limit set on dynamo's config)."""
    if "recompile_limit" in inspect.signature(torch.compile).parameters:
        return torch.compile(fn, dynamic=True, fullgraph=True, recompile_limit=RECOMPILE_LIMIT)
    compiled = torch.compile(fn, dynamic=True, fullgraph=True)

    def limited(*args):
        with torch._dynamo.config.patch(recompile_limit=max(RECOMPILE_LIMIT, torch._dynamo.config.recompile_limit)):
            return compiled(*args)

    return limited


def _compiled_variant(name: str) -> Callable:
    fn = _compiled.get(name)
    if fn is None:
        with _lock:
            fn = _compiled.get(name)
            if fn is None:
                fn = _compile(VARIANTS[name])
                _compiled[name] = fn
    return fn


def _call(name: str, *args):
    """Run variant ``name`` compiled; on a compile failure under ``auto``, warn once, record it and run it (and
    every later call) eagerly; under ``on`` always compiled, a failure raised.

    The autograd nodes call these inside their forward and backward, where gradients are their own business:
    the inputs go in detached (saved outputs are non-leaf tensors that require grad, which dynamo would inspect)."""
    args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    strict = mode() == "on"
    if strict or _state["failed"] is None:
        try:
            return _compiled_variant(name)(*args)
        except torch.OutOfMemoryError:
            raise  # the data's size, not the compiler: eager would not fit either
        except Exception as exc:  # noqa: BLE001 - a missing or broken compiler must not stop training
            if strict:
                raise
            _fall_back(name, exc)
    return EAGER[name](*args)


def _fall_back(name: str, exc: Exception) -> None:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
    _state["failed"] = f"{name}: {type(exc).__name__}: {text}"
    warnings.warn(f"accrot: torch.compile of the rotation kernels failed ({_state['failed']}); the rest of this "
                  "process runs the eager rotation path (same math, more kernel launches); "
                  "ACCROT_GPU_KERNELS=on raises the error instead", RuntimeWarning, stacklevel=3)


def failure() -> str | None:
    """The compile failure that sent this process to the eager rotation path (``auto``), as one line; else None."""
    return _state["failed"]  # type: ignore[return-value]


class CompiledOps:
    """``torch.ops.accrot_cpu``'s four ops for accelerator tensors, each a compiled fusion of its formula."""

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
        return _call("rotate+" if sign > 0 else "rotate-", x, cos, sin)

    @staticmethod
    def rotate_backward(grad: torch.Tensor, y: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                        sign: float, want_dx: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        s = "+" if sign > 0 else "-"
        if y is None:
            return (_call("dx" + s, grad, cos, sin) if want_dx else None), None
        if not want_dx:
            return None, _call("dtheta" + s, grad, y)
        return _call("both" + s, grad, y, cos, sin)

    @staticmethod
    def accumulate_wrap(delta: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        if offset is None:
            return _call("accumulate", delta)
        return _call("accumulate+offset", delta, offset)

    @staticmethod
    def suffix_sum(grad: torch.Tensor, strides=None) -> torch.Tensor:
        return _call("suffix", grad)  # contiguous whatever ``strides`` asks (only the CPU kernel honours it)


def _have_triton() -> bool:
    """Triton is importable (Inductor's GPU backend); looked up once per process (ops() runs per rotation)."""
    if "triton" not in _state:
        _state["triton"] = importlib.util.find_spec("triton") is not None
    return bool(_state["triton"])


def available() -> bool:
    """True when this mode and install compile: not ``off``, and Triton importable."""
    return mode() != "off" and _have_triton()


def ops() -> CompiledOps | None:
    """The compiled ops, or None (``ACCROT_GPU_KERNELS=off``, no Triton under ``auto``, or under ``auto`` a compile
    that failed earlier in this process). With ``on`` and no Triton, raises RuntimeError."""
    chosen = mode()
    if chosen == "off" or (chosen == "auto" and _state["failed"] is not None):
        return None
    if not _have_triton():
        if chosen == "on":
            raise RuntimeError("ACCROT_GPU_KERNELS=on but Triton is not installed (torch.compile's GPU backend)")
        return None
    return CompiledOps()


def describe(device: torch.device | str) -> str:
    """Which SO(2) rotation path runs on the accelerator ``device``: ``compiled`` or ``eager``."""
    if torch.device(device).type == "cpu":
        raise ValueError("gpu_kernels.describe is for accelerators; the CPU's is cpu_kernels.describe")
    return "compiled" if available() and (mode() == "on" or _state["failed"] is None) else "eager"

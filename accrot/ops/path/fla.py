"""The bridge to fla's Triton PaTH kernel (``kernel="fla"``, CUDA only): whether it can run, as one line
(:func:`fla_problem`), the import of fla (:func:`import_fla_path`), and the call in fla's layout and dtypes.

fla 0.6.0's ``parallel_path_attn`` takes ``[B, T, H, D]`` tensors, asserts that w, β and the gate are float32
(it rounds w to float16 itself for its transports) and supports head dims 16, 32, 64 and 128. Its gate enters
the logit before the softmax scale, ``(qᵀk + g_t − g_s) · scale``; accrot's is added after, so the bridge passes
``log_decay / scale``.
"""

from __future__ import annotations

import warnings

import torch

from accrot.errors import ConfigError

FLA_HEAD_DIMS = (16, 32, 64, 128)  # what fla 0.6.0's PaTH kernel asserts it supports (q, k and v alike)
FLA_PACKAGE = "fla-core"  # the ops alone (the flash-linear-attention package adds its models and transformers)
FLA_INSTALL = "pip install -e '.[gpu]'"
# Notices fla prints while it imports, about parts of it accrot never calls: its NSA kernels without the
# flash-attn package, its CPU fallback on a machine without a GPU, and torch's notice about the TorchScript
# decorators fla uses. Under warnings-as-errors (the test suite's setting) each would stop the import and make a
# working fla look broken, so the import ignores these three, and only these.
FLA_IMPORT_NOTICES = (
    (ImportWarning, "Flash Attention is not installed"),
    (UserWarning, "Triton is not supported on current platform"),
    (DeprecationWarning, ".*torch.jit.script_method"),
)


def import_fla_path():
    """fla's ``fla.ops.path_attn.parallel`` module, imported with :data:`FLA_IMPORT_NOTICES` ignored (any other
    warning or error propagates)."""
    with warnings.catch_warnings():
        for category, message in FLA_IMPORT_NOTICES:
            warnings.filterwarnings("ignore", message=message, category=category)
        from fla.ops.path_attn import parallel
    return parallel


def fla_problem(device: torch.device | str | None = None) -> str | None:
    """Why ``kernel='fla'`` cannot run (on ``device``, when given), as one line; None when it can.

    Checked in order: a CUDA device, Triton, then fla's PaTH kernel itself (``find_spec`` first, so a missing
    package never costs an import; an installed fla that does not import is named with its error)."""
    import importlib.util

    if device is not None and torch.device(device).type != "cuda":
        return (f"kernel='fla' needs CUDA tensors (got device {torch.device(device).type!r}); use "
                "kernel='chunked' on the CPU")
    if importlib.util.find_spec("triton") is None:
        return (f"kernel='fla' needs Triton, which is not installed (it comes with torch's CUDA wheels and with "
                f"{FLA_INSTALL}); use kernel='chunked'")
    if importlib.util.find_spec("fla") is None:
        return (f"kernel='fla' needs fla's ops ({FLA_PACKAGE}, of flash-linear-attention), which are not "
                f"installed ({FLA_INSTALL}); use kernel='chunked'")
    try:
        import_fla_path().parallel_path_attention  # noqa: B018 - the name the bridge calls
    except Exception as err:  # noqa: BLE001 - an fla that does not import (Triton too old or too new) is the reason
        text = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        return (f"kernel='fla' could not import fla's PaTH kernel ({type(err).__name__}: {text}); install the "
                f"pinned version ({FLA_INSTALL}) or use kernel='chunked'")
    return None


def _path_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    log_decay: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """fla's Triton PaTH (``parallel_path_attention``, ``[B, T, H, D]`` layout): q, k and v in q's dtype (its
    matmuls want one dtype); w, β and the gate in float32, as fla asserts (β near 0 and near 2 must not round: H_j
    is a reflection at exactly 2; fla makes its own float16 copy of w where it wants one)."""
    problem = fla_problem(q.device)
    if problem is not None:
        raise ConfigError(problem)
    D, Dv = q.shape[-1], v.shape[-1]
    if D not in FLA_HEAD_DIMS or Dv not in FLA_HEAD_DIMS:
        got = f"{D}" if D == Dv else f"{D} for q, k and {Dv} for v"
        raise ConfigError(f"kernel='fla' supports head dims {', '.join(map(str, FLA_HEAD_DIMS))} (got {got}); change "
                          "d_model / n_heads or use kernel='chunked'")
    parallel_path_attention = import_fla_path().parallel_path_attention

    B = q.shape[0]
    g = None
    if log_decay is not None:
        # fla adds its gate before multiplying by the softmax scale; ours is added after, so pre-divide.
        g = (log_decay.float().expand(B, -1, -1) / scale).transpose(1, 2).contiguous()  # [B, T, H] float32
    o, _ = parallel_path_attention(
        q=q.transpose(1, 2),  # fla is [B, T, H, D]
        k=k.to(q.dtype).transpose(1, 2),
        v=v.to(q.dtype).transpose(1, 2),
        w=w.float().transpose(1, 2),  # [B, T, H, D] float32
        beta=beta.float().transpose(1, 2),  # [B, T, H] float32
        g=g,
        scale=scale,
    )
    return o.transpose(1, 2).to(q.dtype)  # [B, H, T, Dv]

"""The suite's one comparison of a fast result against its reference: ``‖ref − fast‖ ≤ rtol·‖ref‖ + atol``.

A plain relative error ‖ref − fast‖ / ‖ref‖ is ill-posed where the reference is exactly zero (the gradient of q
with a single token is 0: the naive twin returns zeros, a fused kernel rounding noise of 1e-17, and the ratio is
astronomically large or exactly 0 depending on the CPU). So every twin comparison also allows an absolute term at
the rounding level of the compared dtype: ``atol = ulps · eps(dtype) · √numel · scale`` — the norm of a vector
of ``numel`` errors of ``ulps`` units in the last place of a value of size ``scale``. For a non-zero reference it
is orders below ``rtol·‖ref‖`` (a tolerance never gets looser in any way that matters), for a zero reference it
admits rounding noise, and a real error on a zero reference (far above eps) still fails.
"""

from __future__ import annotations

import math

import torch

ULPS = 4  # units in the last place per element that rounding may contribute


def _eps(*tensors: torch.Tensor) -> float:
    """Machine epsilon of the least precise floating dtype among ``tensors`` (float64 for integer tensors)."""
    dtypes = [t.dtype for t in tensors if t.is_floating_point()] or [torch.float64]
    return max(torch.finfo(d).eps for d in dtypes)


def noise_floor(ref: torch.Tensor, fast: torch.Tensor, scale: float = 1.0, ulps: float = ULPS) -> float:
    """The absolute tolerance the comparison allows: ``ulps · eps · √numel · scale``."""
    return ulps * _eps(ref, fast) * math.sqrt(max(ref.numel(), 1)) * scale


def norms(ref: torch.Tensor, fast: torch.Tensor) -> tuple[float, float]:
    """``(‖ref − fast‖, ‖ref‖)`` computed in float64."""
    if ref.shape != fast.shape:
        raise AssertionError(f"shapes differ: ref {tuple(ref.shape)} vs fast {tuple(fast.shape)}")
    r, f = ref.detach().double().cpu(), fast.detach().double().cpu()
    return float((r - f).norm()), float(r.norm())


def within(ref: torch.Tensor, fast: torch.Tensor, rtol: float, atol: float | None = None,
           scale: float = 1.0) -> bool:
    """True when ``‖ref − fast‖ ≤ rtol·‖ref‖ + atol`` (``atol`` defaults to :func:`noise_floor`)."""
    diff, size = norms(ref, fast)
    atol = noise_floor(ref, fast, scale) if atol is None else atol
    return math.isfinite(diff) and diff <= rtol * size + atol


def assert_close(ref: torch.Tensor, fast: torch.Tensor, rtol: float, name: str = "tensor",
                 atol: float | None = None, scale: float = 1.0) -> None:
    """Assert :func:`within`; the message names the tensor, the two norms and the tolerance."""
    diff, size = norms(ref, fast)
    atol = noise_floor(ref, fast, scale) if atol is None else atol
    bound = rtol * size + atol
    if not (math.isfinite(diff) and diff <= bound):
        raise AssertionError(
            f"{name}: ‖ref − fast‖ = {diff:.3e} > rtol·‖ref‖ + atol = {rtol:g}·{size:.3e} + {atol:.3e} = {bound:.3e}"
        )


# fla's Triton PaTH against the chunked kernel (CUDA), per tensor, as ‖ref − fla‖ / ‖ref‖: fla runs its Householder
# transports on float16 copies of w and of its own transform of w (unit roundoff 2^−11 per element, compounded over
# every 64-token block a query crosses), its float32 dot products in TF32 on Ampere and later (the same 10-bit
# mantissa), and returns the output and gradients in the inputs' dtype. Its own tests of this kernel allow these
# bounds against its float32 reference (fla 0.6.0, bf16 inputs); the comparison feeds both kernels the same values
# (bf16 inputs upcast for the chunked one), so the inputs' rounding is not counted against fla.
FLA_RTOL = {"out": 5e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dw": 1.5e-2, "dbeta": 2e-2, "dlog_decay": 2e-2}
# accrot's own float32 bar before these bounds (bf16: 2e-2), one rtol on every tensor: below what fla's arithmetic
# allows in its gate's gradient (tests/ops/test_path_fla.py shows it with that arithmetic simulated on the CPU)
FLOAT32_RTOL_BEFORE_FLA = 2e-3


def fla_mismatches(ref, fast, rtol: dict[str, float] | None = None) -> list[str]:
    """Every tensor of fla's ``(out, {name: grad})`` outside its :data:`FLA_RTOL` bound against the chunked
    kernel's, one message each (empty: a match). ``rtol`` replaces the bounds (the test of the bounds themselves)."""
    (out_ref, grads_ref), (out_fast, grads_fast) = ref, fast
    pairs = {"out": (out_ref, out_fast), **{f"d{name}": (grads_ref[name], grads_fast[name]) for name in grads_ref}}
    bad = []
    for name, (a, b) in pairs.items():
        try:
            assert_close(a, b, (rtol or FLA_RTOL)[name], name)
        except AssertionError as exc:
            bad.append(str(exc))
    return bad

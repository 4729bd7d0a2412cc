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

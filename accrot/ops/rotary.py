"""SO(2) rotations in the half-split layout: coordinate i pairs with i + D/2 (DESIGN §2)."""

from __future__ import annotations

import torch


def rotate_pairs(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_i, x_{i+D/2}) by θ_i: (a, b) → (a cos θ − b sin θ, a sin θ + b cos θ).

    Args:
        x: ``[B, H, T, D]`` any float dtype.
        theta: ``[B|1, H|1, T, D/2]`` angles (float32 or wider; broadcast over batch / heads).
    Returns:
        ``[B, H, T, D]`` in x's dtype; the rotation itself runs in float32 or wider.
    """
    dtype = x.dtype
    work = torch.promote_types(theta.dtype, torch.float32)
    a, b = x.to(work).chunk(2, dim=-1)  # [B, H, T, D/2] each
    cos, sin = theta.to(work).cos(), theta.to(work).sin()
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1).to(dtype)

"""Scalable softmax (Nakanishi, 2025, *Scalable-Softmax Is Superior for Attention*, arXiv:2501.19399).

Softmax over n keys flattens as n grows: with every other logit fixed, the largest weight falls like 1/n. SSMax
replaces softmax(z) by n^{s·z_i} / Σ_j n^{s·z_j} = softmax(s·log n · z), so a logit margin that wins at one length
keeps winning at any length. Under the causal mask query t sees n = t + 1 keys, so every logit of row t is
multiplied by s_h·log(t + 1), with one learned s per head (and per layer: each layer is its own module):

    ℓ_ts = s_h·log(t + 1) · D^−1/2 q_tᵀ M_{t,s} k_s           (no additive bias: ``log_decay`` is 0)

It is applied in training and evaluation alike. The factor depends on the row only, so it is folded into the query
(q_t ← s_h·log(t + 1)·q_t) before the fused attention call: the kernel stays the plain fused one, O(T·D) extra.
At t = 0 the factor is 0 and the one visible key takes all the weight, as it would anyway.

``cfg.ssmax_init`` sets the initial s of every head (0.43 by default, the s of the paper's first figure; training
then learns it); the factor is computed in float32 or wider (log(t + 1) in float64) whatever the autocast or
parameter dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from accrot.position.base import FarMassPart
from accrot.position.config import SchemeConfig
from accrot.position.scheme import register_far_mass


@register_far_mass("ssmax")
class ScalableSoftmax(FarMassPart):
    """``logit_scale(x, tokens) -> [1, H, T]`` float32 (float64 for float64 x), s_h·log(t + 1); ``log_decay`` is 0
    (no bias)."""

    additive = False
    controls_far_mass = False  # no term growing with distance: a row's factor grows with its number of keys
    scales_logits = True
    reads = ("ssmax_init", "block_size")

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int) -> None:
        super().__init__(cfg, d_model, n_heads)
        self.s = nn.Parameter(torch.full((n_heads,), float(cfg.ssmax_init)))  # [H]
        self._log_n: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}  # log(t + 1), grown on demand

    def log_n(self, T: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """log(t + 1) for t = 0..T−1, ``[T]`` (computed in float64; a prefix of a longer table is exact)."""
        table = self._log_n.get((device, dtype))
        if table is None or table.shape[0] < T:
            table = torch.arange(1, T + 1, dtype=torch.float64, device=device).log().to(dtype)  # [T]
            self._log_n[(device, dtype)] = table
        return table[:T]

    def logit_scale(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        dt = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for a float64 model
        with torch.autocast(device_type=x.device.type, enabled=False):
            return self.s.to(dt)[None, :, None] * self.log_n(T, x.device, dt)[None, None, :]  # [1, H, T]

    def log_decay(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(1, self.n_heads, tokens.shape[1], dtype=torch.float32)  # [1, H, T]

    def describe(self) -> dict:
        return {"ssmax_s": self.s.detach().float().tolist()}

    def decode_logit_scale(self, x: torch.Tensor, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """s_h·log(t + 1) of positions t = ``start..start+n−1`` alone, ``[1, H, n]`` (the table's entries there)."""
        n = tokens.shape[1]
        dt = torch.promote_types(x.dtype, torch.float32)
        log_n = torch.arange(start + 1, start + n + 1, dtype=torch.float64, device=x.device).log().to(dt)  # [n]
        with torch.autocast(device_type=x.device.type, enabled=False):
            return self.s.to(dt)[None, :, None] * log_n[None, None, :]  # [1, H, n]

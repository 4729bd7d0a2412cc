"""PaTH: data-dependent Householder-like transforms accumulated along the path s → t.

    H_j = I − β_j w_j w_jᵀ,  ℓ_ts = D^−1/2 q_tᵀ H_t H_{t−1} ⋯ H_{s+1} k_s   (+ b_ts with far_mass, PaTH-FoX)

By default the layer is fla's ``PaTHAttention``: w_j comes from a rank-32 projection of the layer input
(d_model → 32 → H·D, no bias; ``path_rank``), a short causal depthwise convolution of width 3 over time with SiLU
and no bias (``conv_size``; fla's ShortConvolution), then per-head L2 normalisation; β_j = beta_max ·
sigmoid(linear(x_j)) ∈ (0, beta_max], beta_max = 2; every weight starts N(0, 0.02) and the β bias at 0 (fla's
``_init_weights``; ``learned_init_std``), so β ≈ 1 at init. ``path_rank=0, conv_size=0, learned_init_std=null``
is accrot's earlier, plain form: one full-rank projection of x_j alone (w_j is then a function of one token)
with PyTorch's default init. With β ∈ (0, 2) H_j contracts along w_j; at β = 2 it is a reflection (orthogonal,
H² = I).

w and β are computed in float32 (or wider, for a float64 model) with autocast disabled, whatever the autocast
dtype. The attention itself is :func:`accrot.ops.path.path_attention` (chunked UT/WY algorithm, ``PATH.md``).

Reference: Yang et al., "PaTH Attention: Position Encoding via Accumulating Householder Transformations" (2025,
arXiv:2505.16381); the layer parameterisation follows fla-org/flash-linear-attention ``fla/layers/path_attn.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from accrot.position.base import RotationPart, init_weights
from accrot.position.config import SchemeConfig
from accrot.position.scheme import register_rotation


@register_rotation("path")
class PathRotation(RotationPart):
    """PaTH's rotation part: ``householder(x, tokens) -> (w [B, H, T, D] unit rows, beta [B, H, T])``."""

    kind = "path"

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int) -> None:
        super().__init__(cfg, d_model, n_heads)
        HD = n_heads * self.head_dim
        if not cfg.path_rank:
            self.w_proj = nn.Linear(d_model, HD, bias=False)
        else:
            r = cfg.path_rank
            self.w_proj = nn.Sequential(nn.Linear(d_model, r, bias=False), nn.Linear(r, HD, bias=False))
        # depthwise over time, one filter per channel; causal by left padding only
        self.w_conv = nn.Conv1d(HD, HD, cfg.conv_size, groups=HD, bias=False) if cfg.conv_size else None
        self.beta_proj = nn.Linear(d_model, n_heads, bias=True)
        init_weights(self, cfg.learned_init_std)

    def householder(self, x: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Args: x ``[B, T, d_model]``; tokens ``[B, T]`` (unused). Returns ``w [B, H, T, D]`` with unit rows and
        ``beta [B, H, T]`` in (0, beta_max], both float32 (float64 if x is)."""
        B, T, _ = x.shape
        dt = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = x.to(dt)
            w = _linear(self.w_proj, x)  # [B, T, H·D]
            if self.w_conv is not None:
                width = self.w_conv.kernel_size[0]
                w = F.pad(w.transpose(1, 2), (width - 1, 0))  # [B, H·D, T + width − 1]
                w = F.conv1d(w, self.w_conv.weight.to(dt), groups=self.w_conv.groups)  # [B, H·D, T]
                w = F.silu(w).transpose(1, 2)  # [B, T, H·D]
            w = F.normalize(w.view(B, T, self.n_heads, self.head_dim), dim=-1, eps=1e-6)  # [B, T, H, D]
            beta = self.cfg.beta_max * torch.sigmoid(_linear(self.beta_proj, x))  # [B, T, H]
        return w.transpose(1, 2), beta.transpose(1, 2)  # [B, H, T, D], [B, H, T]

    def describe(self) -> dict:
        return {
            "beta_max": self.cfg.beta_max,
            "path_rank": self.cfg.path_rank,
            "conv_size": self.cfg.conv_size,
            "learned_init_std": self.cfg.learned_init_std,
            "chunk_size": self.cfg.chunk_size,
            "path_kernel": self.cfg.path_kernel,
        }

    # cached decoding: w's short convolution keeps its last conv_size − 1 inputs
    def decode_state(self, x: torch.Tensor, tokens: torch.Tensor) -> dict:
        """``{"tail": [B, conv_size − 1, H·D]}``: the last inputs of w's convolution after the prompt (zeros before the
        start); nothing without a convolution."""
        if self.w_conv is None:
            return {}
        dt = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            w = _linear(self.w_proj, x.to(dt))  # [B, T, H·D]
        width = self.w_conv.kernel_size[0]
        padded = F.pad(w, (0, 0, width - 1, 0))  # [B, T + width − 1, H·D]
        return {"tail": padded[:, padded.shape[1] - (width - 1):]}

    def decode_householder(self, x: torch.Tensor, tokens: torch.Tensor, state: dict
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`householder` of the new positions (``x [B, n, d_model]``) after those ``state`` has seen."""
        B, n, _ = x.shape
        dt = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = x.to(dt)
            w = _linear(self.w_proj, x)  # [B, n, H·D]
            if self.w_conv is not None:
                width = self.w_conv.kernel_size[0]
                padded = torch.cat((state["tail"].to(dt), w), 1)  # [B, width − 1 + n, H·D]
                state["tail"] = padded[:, padded.shape[1] - (width - 1):]
                w = F.conv1d(padded.transpose(1, 2), self.w_conv.weight.to(dt), groups=self.w_conv.groups)
                w = F.silu(w).transpose(1, 2)  # [B, n, H·D]
            w = F.normalize(w.reshape(B, n, self.n_heads, self.head_dim), dim=-1, eps=1e-6)  # [B, n, H, D]
            beta = self.cfg.beta_max * torch.sigmoid(_linear(self.beta_proj, x))  # [B, n, H]
        return w.transpose(1, 2), beta.transpose(1, 2)  # [B, H, n, D], [B, H, n]


def _linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Apply a Linear (or a Sequential of Linears) with its weights cast to x's dtype (float32 under any autocast)."""
    for layer in module if isinstance(module, nn.Sequential) else (module,):
        bias = None if layer.bias is None else layer.bias.to(x.dtype)
        x = F.linear(x, layer.weight.to(x.dtype), bias)
    return x

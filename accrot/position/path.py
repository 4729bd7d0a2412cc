"""PaTH: data-dependent Householder-like transforms accumulated along the path s → t.

    H_j = I − β_j w_j w_jᵀ,  ℓ_ts = D^−1/2 q_tᵀ H_t H_{t−1} ⋯ H_{s+1} k_s   (+ b_ts with far_mass, PaTH-FoX)

By default the layer is fla's ``PaTHAttention``: w_j comes from a rank-32 projection of the layer input
(d_model → 32 → H·D, no bias; ``path_rank``), a short causal depthwise convolution of width 3 over time with SiLU
and no bias (``conv_size``; fla's ShortConvolution), then per-head L2 normalisation; β_j = beta_max ·
sigmoid(linear(x_j)) ∈ (0, beta_max], beta_max = 2; every weight starts N(0, 0.02) and the β bias at 0 (fla's
``_init_weights``; ``learned_init_std``), so β ≈ 1 at init. ``path_rank=0, conv_size=0, learned_init_std=null``
is accrot's earlier, plain form: one full-rank projection of x_j alone (w_j is then a function of one token)
with PyTorch's default init. With β ∈ (0, 2) H_j contracts along w_j; at β = 2 it is a reflection (orthogonal,
H² = I). ``beta_max=1`` keeps every β in (0, 1): contractions only (eigenvalue 1 − β ∈ (0, 1) along w, no
negative eigenvalue); ``path_beta="reflection"`` fixes β = 2 for every token (no β projection): pure reflections,
the orthogonal Householder products the theory's premise is about.

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
from accrot.position.walk import path_walk


@register_rotation("path")
class PathRotation(RotationPart):
    """PaTH's rotation part: ``householder(x, tokens) -> (w [B, H, T, D] unit rows, beta [B, H, T])``."""

    kind = "path"
    accumulates = True  # H_t ⋯ H_{s+1}: a product of per-token Householder factors
    commutes = False
    learned = True
    reads = ("beta_max", "path_beta", "path_rank", "chunk_size", "path_kernel", "conv_size", "learned_init_std")
    unread = ("block_size",)  # its chunked walk takes the far-mass bias itself: the biased kernel never runs

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
        # β from the input (fla's PaTH), or none at all: with path_beta='reflection' every factor reflects (β = 2)
        self.beta_proj = nn.Linear(d_model, n_heads, bias=True) if cfg.path_beta == "learned" else None
        init_weights(self, cfg.learned_init_std)

    def householder(self, x: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Args: x ``[B, T, d_model]``; tokens ``[B, T]`` (unused). Returns ``w [B, H, T, D]`` with unit rows and
        ``beta [B, H, T]`` in (0, beta_max], both float32 (float64 if x is)."""
        return self._factors(x)

    def _factors(self, x: torch.Tensor, state: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(w [B, H, n, D], beta [B, H, n])`` of the positions of ``x [B, n, d_model]``: after zeros (a forward from
        the start) or, with a decoding ``state``, after the inputs its ``tail`` holds (which it then advances)."""
        B, n, _ = x.shape
        dt = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = x.to(dt)
            w = _linear(self.w_proj, x)  # [B, n, H·D]
            if self.w_conv is not None:
                width = self.w_conv.kernel_size[0]
                if state is None:  # causal: zeros before the first position
                    padded = F.pad(w.transpose(1, 2), (width - 1, 0))  # [B, H·D, n + width − 1]
                else:  # the prompt's last inputs before the new positions
                    joined = torch.cat((state["tail"].to(dt), w), 1)  # [B, width − 1 + n, H·D]
                    state["tail"] = joined[:, joined.shape[1] - (width - 1):]
                    padded = joined.transpose(1, 2)
                w = F.conv1d(padded, self.w_conv.weight.to(dt), groups=self.w_conv.groups)  # [B, H·D, n]
                w = F.silu(w).transpose(1, 2)  # [B, n, H·D]
            w = F.normalize(w.reshape(B, n, self.n_heads, self.head_dim), dim=-1, eps=1e-6)  # [B, n, H, D]
            beta = self._beta(x)  # [B, n, H]
        return w.transpose(1, 2), beta.transpose(1, 2)  # [B, H, n, D], [B, H, n]

    def _beta(self, x: torch.Tensor) -> torch.Tensor:
        """β of every position of ``x [B, n, d_model]`` (in its working dtype), ``[B, n, H]``: beta_max · sigmoid of
        the β projection, or 2 everywhere for reflections (H_j = I − 2 w_j w_jᵀ, orthogonal)."""
        if self.beta_proj is None:
            return x.new_full((*x.shape[:2], self.n_heads), 2.0)
        return self.cfg.beta_max * torch.sigmoid(_linear(self.beta_proj, x))

    def describe(self) -> dict:
        return {
            "beta_max": self.cfg.beta_max,
            "path_beta": self.cfg.path_beta,
            "path_rank": self.cfg.path_rank,
            "conv_size": self.cfg.conv_size,
            "learned_init_std": self.cfg.learned_init_std,
            "chunk_size": self.cfg.chunk_size,
            "path_kernel": self.cfg.path_kernel,
        }

    def transported_scores(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
                           rows: torch.Tensor) -> torch.Tensor:
        """D^−1/2 q_tᵀ H_t ⋯ H_{s+1} k_s of ascending query ``rows [R]`` over every key, ``[B, H, R, T]`` float64,
        by the per-query walk (:func:`accrot.position.walk.path_walk`) in q's precision, float32 or wider (entries
        s > t are meaningless)."""
        B, H, T, D = q.shape
        dt = torch.promote_types(q.dtype, torch.float32)
        q, k = q.to(dt).contiguous(), k.to(dt).contiguous()
        w, beta = self.householder(x, tokens)  # [B, H, T, D], [B, H, T]
        w, beta = w.to(dt).contiguous(), beta.to(dt).contiguous()
        by_dist = q.new_zeros(B, H, rows.numel(), T)  # [B, H, R, T] ℓᴹ(t, t − Δ) at [.., t, Δ]
        for d, start, lm in path_walk(q, k, w, beta, rows, T - 1):
            by_dist[:, :, start:, d] = lm
        keys = torch.arange(T, device=q.device)
        back = (rows[:, None] - keys[None, :]).clamp(min=0)  # [R, T] Δ = t − s
        scores = by_dist.gather(-1, back.expand(B, H, -1, -1))  # [B, H, R, T]
        return scores.double() * D**-0.5


    def factored_pairs(self, q, k, x, tokens, theta=None) -> None:
        return None  # H_t ⋯ H_{s+1} is no product of one transform per position: walk it (walked_pairs)

    def walked_pairs(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
                     rows: torch.Tensor, max_distance: int, wanted: set[int] | None = None):
        w, beta = self.householder(x, tokens)  # [B, H, T, D], [B, H, T]
        w, beta = w.to(q.dtype).contiguous(), beta.to(q.dtype).contiguous()
        yield from path_walk(q, k, w, beta, rows, max_distance, wanted=wanted)

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
        return self._factors(x, state)


def _linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Apply a Linear (or a Sequential of Linears) with its weights cast to x's dtype (float32 under any autocast)."""
    for layer in module if isinstance(module, nn.Sequential) else (module,):
        bias = None if layer.bias is None else layer.bias.to(x.dtype)
        x = F.linear(x, layer.weight.to(x.dtype), bias)
    return x

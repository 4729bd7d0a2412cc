"""RoPE: rotary position embedding (Su et al., 2021, *RoFormer*, arXiv:2104.09864).

Pair i of q_t and k_t (half-split layout) is rotated by θ_t,i = t·ω_i with ω_i = b^(−i/(D/2)), i = 0..D/2−1,
so the logit q_tᵀ R((s − t)ω) k_s depends on the offset t − s only. In the path picture every step applies
the same rotation R(ω): M_{t,s} = R(ω)^{t−s}. Positions start at t = 0.
"""

from __future__ import annotations

import torch

from accrot.ops.rotary import rope_frequencies, wrap_angle
from accrot.position.base import SO2Rotation
from accrot.position.config import SchemeConfig
from accrot.position.rope_scaling import logit_scale, scaled_frequencies
from accrot.position.scheme import register_rotation

__all__ = ["RoPE", "rope_frequencies"]  # rope_frequencies lives in accrot.ops.rotary; importable from here too


@register_rotation("rope")
class RoPE(SO2Rotation):
    """``angles(x, tokens) -> [1, H, T, D/2]`` float32: t·ω_i computed in float64, wrapped to [−π, π).

    The table depends only on (T, device); one table per device is cached and grown on demand, and shorter
    lengths read its prefix (the entries are elementwise, so a prefix equals a fresh table).
    """

    kind = "so2"
    reads = ("rope_base",)

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int) -> None:
        super().__init__(cfg, d_model, n_heads)
        # a plain tensor, not a buffer: Module.to(bf16) must never round the frequencies
        self.omega = rope_frequencies(self.head_dim, cfg.rope_base)  # [P] float64
        self.scaling = None  # an evaluation-time length extension (accrot.position.rope_scaling), off in training
        self._tables: dict[tuple[torch.device, float], torch.Tensor] = {}

    def predicted_coherence(self, distances: torch.Tensor) -> torch.Tensor:
        """mean_i cos(Δ ω_i): every pair keeps turning, none mixes."""
        return torch.cos(distances * rope_frequencies(self.head_dim, self.cfg.rope_base)).mean(-1)  # [n]

    def prediction_basis(self) -> str:
        return "isotropic"

    def set_scaling(self, scaling) -> None:
        self.scaling = scaling
        self._tables.clear()

    def frequencies(self, T: int) -> tuple[torch.Tensor, float]:
        """(ω' ``[P]`` float64, the scaling factor s) for a forward of length T; (ω, 1) without scaling."""
        if self.scaling is None:
            return self.omega, 1.0
        s = self.scaling.factor_at(T)
        return scaled_frequencies(self.omega, self.scaling.kind, s, self.scaling.train_length, self.cfg.rope_base), s

    def logit_scale(self, T: int) -> float:
        """What multiplies the attention logits at length T (YaRN's temperature; 1 otherwise)."""
        if self.scaling is None:
            return 1.0
        return logit_scale(self.scaling.kind, self.scaling.factor_at(T))

    def angles(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        omega, s = self.frequencies(T)
        key = (x.device, s)  # a dynamic factor (T / L) has one table per length
        table = self._tables.get(key)
        if table is None or table.shape[-2] < T:
            t = torch.arange(T, dtype=torch.float64, device=x.device)  # [T]
            theta = wrap_angle(t[:, None] * omega.to(x.device))  # [T, P] float64
            table = theta.to(torch.float32)[None, None]  # [1, 1, T, P]
            self._tables[key] = table
        return table[:, :, :T].expand(1, self.n_heads, T, -1)  # [1, H, T, P]

    def describe(self) -> dict:
        info = {"rope_frequencies": self.omega.tolist()}
        if self.scaling is not None:
            info["rope_scaling"] = self.scaling.label()
        return info

    def decode_angles(self, x: torch.Tensor, tokens: torch.Tensor, start: int, state: dict) -> torch.Tensor:
        """θ of positions ``start..start+n−1``, ``[1, H, n, D/2]``: the entries of :meth:`angles`' table there (the
        same elementwise float64 product and wrap, so the same bits)."""
        n = tokens.shape[1]
        omega, _ = self.frequencies(start + n)
        t = torch.arange(start, start + n, dtype=torch.float64, device=x.device)  # [n]
        theta = wrap_angle(t[:, None] * omega.to(x.device)).to(torch.float32)  # [n, P]
        return theta[None, None].expand(1, self.n_heads, n, -1)  # [1, H, n, P]

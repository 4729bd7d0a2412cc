"""ALiBi: attention with linear biases (Press et al., 2022, *Train Short, Test Long*, arXiv:2108.12409).

Every step costs head h a constant log f_j = −m_h, so the bias of key s seen from query t is −m_h·(t − s).
Slopes m_h = 2^(−8h/H), h = 1..H, when H is a power of two; otherwise the reference interleaving rule: take
the slopes of the closest power of two n < H, then every other slope of 2n for the remaining H − n heads
(as in ``ofirpress/attention_with_linear_biases``).
"""

from __future__ import annotations

import math

import torch

from accrot.position.base import FarMassPart
from accrot.position.config import SchemeConfig
from accrot.position.scheme import register_far_mass


def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi's per-head slopes m_h (positive; the bias is −m_h per step)."""

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    n = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(n) + alibi_slopes(2 * n)[0::2][: n_heads - n]


@register_far_mass("alibi")
class ALiBi(FarMassPart):
    """``log_decay(x, tokens) -> [1, H, T]`` float32, the constant −m_h at every step."""

    controls_far_mass = True  # −m_h·(t − s): grows with distance
    reads = ("block_size",)

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int) -> None:
        super().__init__(cfg, d_model, n_heads)
        self.slopes = alibi_slopes(n_heads)  # plain floats: Module.to(bf16) must never round them
        self._log_f: dict[torch.device, torch.Tensor] = {}  # −m_h per device, built once

    def log_decay(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        if x.device not in self._log_f:
            self._log_f[x.device] = -torch.tensor(self.slopes, dtype=torch.float32).view(1, -1, 1).to(x.device)
        return self._log_f[x.device].expand(1, self.n_heads, T)  # [1, H, T]

    def describe(self) -> dict:
        return {"alibi_slopes": list(self.slopes)}

"""FoX forget gate (Lin et al., 2025, *Forgetting Transformer*, arXiv:2503.02130).

Per head, log f_j = logsigmoid(w_h·x_j + b_h) ≤ 0, so the bias of key s seen from query t is
Σ_{j=s+1..t} log f_j: a data-dependent ALiBi. Two initialisations (``cfg.forget_init``):

* ``fox`` (the default, FoX's own: its ``fgate_proj`` is an ``nn.Linear`` under the model's ``_init_weights``):
  w ~ N(0, 0.02), b = 0, so every head starts forgetting about half per token (f ≈ 1/2) and learns how much
  to keep;
* ``alibi``: w = 0 and b_h = −log(e^{m_h} − 1), where logsigmoid(b_h) = −m_h with ALiBi's slope m_h: at
  initialisation (and for any fixed gate with w = 0) the scheme is exactly ALiBi, a strong prior toward a flat
  curve that everything measured on the cell inherits.

``cfg.forget_bias_init`` overrides b_h for every head. The gate is computed in float32 whatever the autocast or
parameter dtype. Reference: zhixuan-lin/forgetting-transformer
``src/forgetting_transformer/model/forgetting_transformer/modeling_forgetting_transformer.py`` (fgate_type="full").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from accrot.position.alibi import alibi_slopes
from accrot.position.base import FarMassPart
from accrot.position.config import SchemeConfig
from accrot.position.scheme import register_far_mass

FOX_INIT_STD = 0.02  # FoX's initializer_range


def alibi_matching_bias(n_heads: int) -> list[float]:
    """b_h = −log(e^{m_h} − 1), so that logsigmoid(b_h) = −m_h (ALiBi's slope)."""
    return [-math.log(math.expm1(m)) for m in alibi_slopes(n_heads)]


@register_far_mass("forget")
class ForgetGate(FarMassPart):
    """``log_decay(x, tokens) -> [B, H, T]`` float32, logsigmoid(w_h·x_j + b_h)."""

    controls_far_mass = True  # Σ_{j=s+1..t} log f_j ≤ 0: grows with distance
    reads = ("forget_bias_init", "forget_init", "block_size")

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int) -> None:
        super().__init__(cfg, d_model, n_heads)
        self.proj = nn.Linear(d_model, n_heads)
        if cfg.forget_init == "fox":
            nn.init.normal_(self.proj.weight, std=FOX_INIT_STD)
            bias = [0.0] * n_heads
        else:
            nn.init.zeros_(self.proj.weight)  # a fixed gate at init: exactly ALiBi (or the constant forget_bias_init)
            bias = alibi_matching_bias(n_heads)
        if cfg.forget_bias_init is not None:
            bias = [cfg.forget_bias_init] * n_heads
        with torch.no_grad():
            self.proj.bias.copy_(torch.tensor(bias))

    def log_decay(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            z = F.linear(x.float(), self.proj.weight.float(), self.proj.bias.float())  # [B, T, H]
            return F.logsigmoid(z).transpose(1, 2)  # [B, H, T]

    def describe(self) -> dict:
        return {"forget_init": self.cfg.forget_init, "forget_bias": self.proj.bias.detach().float().tolist()}

"""Output gate: a sigmoid of the layer input on the attention output (Qiu et al., 2025, *Gated Attention for Large
Language Models: Non-linearity, Sparsity, and Attention-Sink-Free*, arXiv:2505.06708).

    out_t = g_t ⊙ Σ_s a_ts (R(θ_t − θ_s)) v_s,     g_t = σ(W x_t + b)  per head

``elementwise``: one gate per output coordinate, W: d_model → H·D (the paper's best variant, G1 elementwise after
SDPA: it adds a non-linearity between the value and output projections and lets each query switch its head off,
which removes the attention sink); ``headwise``: one scalar per head, W: d_model → H (nearly as good there, H/(H·D)
of the parameters). The gate multiplies the attention output after everything the scheme does (value transport
included), before the backbone's output projection, so it is independent of the rotation and the far mass.

Far mass and the gate: softmax must give every query a unit of attention, which the far set takes over as the
context grows (the lower bound); a gate near 0 lets a query discard that output instead of spending it on a sink.

Initialisation: W = 0, b = 0, so every gate is 1/2 at the start (the ungated model with its output halved) and
what a gate learns is a function of x; the paper's gate starts near 1/2 too (small random W, no bias). The gate is
computed under the autocast like the q, k, v projections (it is a projection, nothing accumulates in it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from accrot.position.base import OutputGatePart
from accrot.position.config import SchemeConfig
from accrot.position.scheme import register_output_gate


@register_output_gate("elementwise")
@register_output_gate("headwise")
class OutputGate(OutputGatePart):
    """``gate(x, tokens) -> [B, H, T, D]``: σ(W x + b), one value per coordinate (elementwise) or per head
    (headwise: every coordinate of a head's row shares it; the result is an expanded view)."""

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.kind, self.n_heads, self.head_dim = cfg.output_gate, n_heads, d_model // n_heads
        self.width = self.head_dim if cfg.output_gate == "elementwise" else 1  # gates per head
        self.proj = nn.Linear(d_model, n_heads * self.width)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def gate(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        w, b = self.proj.weight.to(x.dtype), self.proj.bias.to(x.dtype)  # (autocast casts both again)
        g = torch.sigmoid(F.linear(x, w, b))  # [B, T, H·width]
        # token-major in memory, like the attention output it multiplies: the product stays a [B, T, H, D] layout
        g = g.view(B, T, self.n_heads, self.width).transpose(1, 2)  # [B, H, T, width]
        return g.expand(B, self.n_heads, T, self.head_dim)  # [B, H, T, D]

    def describe(self) -> dict:
        return {"output_gate": self.kind}

"""The composed position scheme: one ``nn.Module`` per attention layer (DESIGN §2).

A scheme is ``rotation × far_mass × rotate_values``. :class:`PositionScheme` owns one rotation part
and one far-mass part, exposes what defines them (``angles``, ``householder``, ``log_decay``) and
dispatches the attention to the matching kernel in :mod:`accrot.ops`:

* rotation ∈ {none, rope, accum}: rotate q, k (and v / out) by the absolute angles θ_t, then fused
  causal SDPA (far_mass = none) or the blockwise biased kernel (alibi / forget);
* rotation = path: the chunked PaTH kernel, with the far-mass bias folded in.

Parts are small modules with one job each:

* a rotation part implements ``angles(x, tokens) -> [B, H, T, D/2]`` (SO(2) kinds) or
  ``householder(x, tokens) -> (w [B, H, T, D], beta [B, H, T])`` (path);
* a far-mass part implements ``log_decay(x, tokens) -> [B, H, T]`` (log f_j ≤ 0, float32).
"""

from __future__ import annotations

import torch
from torch import nn

from accrot.position.config import SchemeConfig


class RotationPart(nn.Module):
    """Base of rotation parts. ``kind`` is ``"so2"`` (angles), ``"path"`` (Householder) or ``"none"``."""

    kind = "none"

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.cfg, self.d_model, self.n_heads = cfg, d_model, n_heads
        self.head_dim = d_model // n_heads

    def describe(self) -> dict:
        """Facts worth logging at construction (e.g. predicted mixing windows)."""
        return {}


class FarMassPart(nn.Module):
    """Base of far-mass parts: ``log_decay(x, tokens)`` gives per-step log f_j, ``[B, H, T]`` float32."""

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.cfg, self.d_model, self.n_heads = cfg, d_model, n_heads

    def log_decay(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> dict:
        return {}


def init_weights(module: nn.Module, std: float | None) -> None:
    """Every linear and convolution weight of ``module`` N(0, std), every bias 0 (as the reference models' own
    ``_init_weights``); PyTorch's default init where ``std`` is None."""
    if std is None:
        return
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv1d)):
            nn.init.normal_(layer.weight, std=std)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

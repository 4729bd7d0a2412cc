"""The composed position scheme: one ``nn.Module`` per attention layer.

A scheme is ``rotation × far_mass × rotate_values`` (× an optional output gate). :class:`PositionScheme` owns one
rotation part, one far-mass part and the gate, exposes what defines them (``angles``, ``householder``,
``log_decay``, ``logit_scale``, ``output_gate``) and dispatches the attention to the matching kernel in
:mod:`accrot.ops`:

* rotation ∈ {none, rope, accum}: rotate q, k (and v / out) by the absolute angles θ_t, then fused
  causal SDPA (far_mass = none or ssmax, whose per-row logit factor is folded into q) or the blockwise biased
  kernel (alibi / forget);
* rotation = path: the chunked PaTH kernel, with the far-mass bias folded in (ssmax: into q);
* the output gate, if any, multiplies the result.

Parts are small modules with one job each:

* a rotation part implements ``angles(x, tokens) -> [B, H, T, D/2]`` (SO(2) kinds) or
  ``householder(x, tokens) -> (w [B, H, T, D], beta [B, H, T])`` (path);
* a far-mass part implements ``log_decay(x, tokens) -> [B, H, T]`` (log f_j ≤ 0, float32), or, where it is not
  additive (scalable softmax), ``logit_scale(x, tokens) -> [B, H, T]`` (a factor on every logit of row t) and no bias;
* an output gate implements ``gate(x, tokens) -> [B, H, T, D]`` (in (0, 1), multiplying the attention output).
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

    # what the backbone tells a scheme: a rotation with no randomness of its own has nothing to do with it
    def set_stream(self, layer: int) -> None:
        """This part belongs to layer ``layer`` of the model: parts that draw randomness take that layer's own
        draws, so no two layers share one."""

    def set_data_shard(self, rank: int, world: int) -> None:
        """Under DDP this process trains on rows ``rank``, ``rank + world``, … of the global batch: parts that draw
        per row keep the global batch's draws of those rows."""

    # cached decoding (accrot.position.decode): what a part carries from one position to the next
    def decode_state(self, x: torch.Tensor, tokens: torch.Tensor) -> dict:
        """The carry after a prompt (``x [B, T, d_model]``, ``tokens [B, T]``) that the decoding steps read; a part
        whose quantities at a position depend on that position's input alone carries nothing."""
        return {}

    def decode_angles(self, x: torch.Tensor, tokens: torch.Tensor, start: int, state: dict) -> torch.Tensor:
        """θ of the new positions ``start..start+n−1`` (``x [B, n, d_model]``), ``[B|1, H, n, D/2]`` float32, the bits
        the forward gives there; updates ``state`` (SO(2) kinds)."""
        raise NotImplementedError(f"{type(self).__name__} has no angles")

    def decode_householder(self, x: torch.Tensor, tokens: torch.Tensor, state: dict
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(w [B, H, n, D], beta [B, H, n])`` of the new positions; updates ``state`` (path)."""
        raise NotImplementedError(f"{type(self).__name__} has no Householder factors")


class FarMassPart(nn.Module):
    """Base of far-mass parts: ``log_decay(x, tokens)`` gives per-step log f_j, ``[B, H, T]`` float32.

    ``additive`` parts (ALiBi, forget gate) add the bias b_ts = Σ_{j=s+1..t} log f_j; the others (scalable softmax)
    have no bias (``log_decay`` is 0) and scale each query row's logits by ``logit_scale(x, tokens)``."""

    additive = True

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.cfg, self.d_model, self.n_heads = cfg, d_model, n_heads

    def log_decay(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def logit_scale(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor | None:
        """The factor on row t's logits, ``[B|1, H, T]`` float32, or None for none (the additive parts)."""
        return None

    def describe(self) -> dict:
        return {}

    def decode_logit_scale(self, x: torch.Tensor, tokens: torch.Tensor, start: int) -> torch.Tensor | None:
        """:meth:`logit_scale` of the new positions ``start..start+n−1`` alone, ``[B|1, H, n]``, or None (cached
        decoding; ``log_decay`` of a position depends on its own input only, so decoding reads it as it is)."""
        return None


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


class DeviceConstants:
    """Small float tensors kept on the CPU in full precision (never cast by ``Module.to``) and copied once per
    device, so a forward pass on an accelerator does no host-to-device copy."""

    def __init__(self, **tensors: torch.Tensor) -> None:
        self._by_device: dict[torch.device, dict[str, torch.Tensor]] = {torch.device("cpu"): tensors}

    def on(self, device: torch.device) -> dict[str, torch.Tensor]:
        if device not in self._by_device:
            self._by_device[device] = {k: t.to(device) for k, t in self._by_device[torch.device("cpu")].items()}
        return self._by_device[device]

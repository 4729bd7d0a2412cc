"""Registry and the composed per-layer scheme module.

``build(cfg, d_model, n_heads, layer)`` looks the rotation, the far-mass part and the output gate up in three
registries, so a new family is one file with a ``@register_rotation`` / ``@register_far_mass`` /
``@register_output_gate`` class (an increment source of the accumulated rotation: ``@register_increments``), never a
new flag. ``layer`` picks the layer's entry of ``cfg.layer_pattern``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from accrot.errors import ConfigError
from accrot.ops.attention import causal_attention
from accrot.ops.rotary import cos_sin, rotate_pairs_cs, rotate_pairs_many
from accrot.position.base import FarMassPart, IncrementSource, RotationPart
from accrot.position.config import SchemeConfig

ROTATIONS: dict[str, type[RotationPart]] = {}
FAR_MASS: dict[str, type[FarMassPart]] = {}
OUTPUT_GATES: dict[str, type[nn.Module]] = {}
INCREMENTS: dict[str, type[IncrementSource]] = {}  # the accumulated rotation's increment sources (cfg.increments)


def register_rotation(name: str) -> Callable[[type[RotationPart]], type[RotationPart]]:
    def deco(cls: type[RotationPart]) -> type[RotationPart]:
        ROTATIONS[name] = cls
        return cls

    return deco


def register_far_mass(name: str) -> Callable[[type[FarMassPart]], type[FarMassPart]]:
    def deco(cls: type[FarMassPart]) -> type[FarMassPart]:
        FAR_MASS[name] = cls
        return cls

    return deco


def register_increments(name: str) -> Callable[[type[IncrementSource]], type[IncrementSource]]:
    def deco(cls: type[IncrementSource]) -> type[IncrementSource]:
        INCREMENTS[name] = cls
        return cls

    return deco


def register_output_gate(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    def deco(cls: type[nn.Module]) -> type[nn.Module]:
        OUTPUT_GATES[name] = cls
        return cls

    return deco


class PositionScheme(nn.Module):
    """Attention with one position scheme: ``forward(q, k, v, x, tokens) -> [B, H, T, D]``.

    Args (forward):
        q, k, v: ``[B, H, T, D]`` projections (any float dtype; the output has q's dtype).
        x: ``[B, T, d_model]`` the layer input, from which data-dependent parts are computed.
        tokens: ``[B, T]`` token ids (``random_token`` increments index a table with them).

    Attributes:
        cfg: this layer's scheme (the cell, or its position-free version where ``cell.layer_pattern`` says so).
        cell: the configured scheme of the model, ``layer_pattern`` included; ``layer``: this layer's index.
    """

    def __init__(self, cfg: SchemeConfig, rotation: RotationPart, far_mass: FarMassPart | None,
                 gate: nn.Module | None = None, cell: SchemeConfig | None = None, layer: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.cell, self.layer = (cfg if cell is None else cell), layer
        self.rotation = rotation
        self.far_mass = far_mass
        self.gate = gate

    # -- exposed quantities -------------------------------------------------------------
    def angles(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Absolute accumulated angles θ_t, ``[B, H, T, D/2]`` float32 (rope, accum; zeros for none)."""
        if self.rotation.kind == "path":
            raise ConfigError("angles() is defined for SO(2) rotations (none, rope, accum), not rotation='path'")
        if self.rotation.kind == "none":
            B, T = tokens.shape
            return x.new_zeros(B, self.rotation.n_heads, T, self.rotation.head_dim // 2, dtype=torch.float32)
        return self.rotation.angles(x, tokens).expand(tokens.shape[0], self.rotation.n_heads, -1, -1)

    def householder(self, x: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """PaTH's ``(w [B, H, T, D] unit rows, beta [B, H, T])`` in float32 (path only)."""
        if self.rotation.kind != "path":
            raise ConfigError(f"householder() is defined for rotation='path', not rotation={self.cfg.rotation!r}")
        return self.rotation.householder(x, tokens)

    def log_decay(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Per-step log f_j ≤ 0, ``[B, H, T]`` float32; b_ts = Σ_{j=s+1..t} log f_j (zeros for none and ssmax)."""
        if self.far_mass is None or not self.far_mass.additive:
            B, T = tokens.shape
            return x.new_zeros(B, self.rotation.n_heads, T, dtype=torch.float32)
        return self.far_mass.log_decay(x, tokens).expand(tokens.shape[0], -1, -1)

    def logit_scale(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The factor c_t on every logit of query row t, ``[B, H, T]`` float32 (or wider):
        ℓ_ts = c_t·D^−1/2 q_tᵀ M_{t,s} k_s + b_ts. ssmax: s_h·log(t + 1); an evaluation-time RoPE extension's
        temperature (YaRN) multiplies it; ones otherwise."""
        B, T = tokens.shape
        row = self._row_scale(x, tokens)  # [B|1, H, T] or None
        if row is None:
            row = x.new_ones(1, self.rotation.n_heads, T, dtype=torch.float32)
        return (row * self._temperature(T)).expand(B, -1, -1)

    def output_gate(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The gate g_t in (0, 1) on the attention output, ``[B, H, T, D]`` (out_t = g_t ⊙ Σ_s a_ts ·); ones
        without a gate; per head (every coordinate of a head's row equal) for ``output_gate="headwise"``."""
        if self.gate is None:
            B, T = tokens.shape
            return x.new_ones(1, 1, 1, 1).expand(B, self.rotation.n_heads, T, self.rotation.head_dim)
        return self.gate.gate(x, tokens)

    # -- what the backbone tells the scheme ------------------------------------------------------------
    def set_stream(self, layer: int) -> None:
        """Draw layer ``layer``'s own random increments (training stream, evaluation draws, token table); a scheme
        without randomness ignores it. ``build`` leaves every scheme on stream 0, so a model tells each its own."""
        self.rotation.set_stream(layer)

    def set_data_shard(self, rank: int, world: int) -> None:
        """This process trains on rows ``rank``, ``rank + world``, … of the global batch (DDP), so that random
        training draws are the global batch's, of which it keeps its rows; a scheme without them ignores it."""
        self.rotation.set_data_shard(rank, world)

    def _row_scale(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor | None:
        return None if self.far_mass is None else self.far_mass.logit_scale(x, tokens)

    def _temperature(self, T: int) -> float:
        return self.rotation.logit_scale(T) if hasattr(self.rotation, "logit_scale") else 1.0

    def describe(self) -> dict:
        info = {"rotation": self.cfg.rotation, "far_mass": self.cfg.far_mass, "rotate_values": self.cfg.rotate_values}
        info.update(self.rotation.describe())
        if self.far_mass is not None:
            info.update(self.far_mass.describe())
        if self.gate is not None:
            info.update(self.gate.describe())
        if self.cell.layer_pattern is not None:  # this layer's place in the model's pattern
            info.update(layer=self.layer, layer_pattern=list(self.cell.layer_pattern), cell=self.cell.label())
        return info

    # -- attention ----------------------------------------------------------------------------------
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor
    ) -> torch.Tensor:
        out = self._attend(q, k, v, x, tokens)  # [B, H, T, D]
        if self.gate is not None:
            out = out * self.gate.gate(x, tokens).to(out.dtype)  # the output gate, after the value transport
        return out

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor
    ) -> torch.Tensor:
        additive = self.far_mass is not None and self.far_mass.additive
        log_f = self.far_mass.log_decay(x, tokens) if additive else None  # [B|1, H, T] fp32
        # a per-row factor on the logits (ssmax) folds into the query: the kernel stays the fused one
        row = self._row_scale(x, tokens)  # [B|1, H, T] fp32 or None
        if self.rotation.kind == "path":
            from accrot.ops.path import path_attention

            w, beta = self.rotation.householder(x, tokens)  # [B, H, T, D], [B, H, T]
            if row is not None:
                q = q * row.unsqueeze(-1).to(q.dtype)  # [B, H, T, D]
            return path_attention(
                q, k, v, w, beta, log_f, chunk_size=self.cfg.chunk_size, kernel=self.cfg.path_kernel
            )
        cs = None
        if self.rotation.kind == "so2":
            # one draw per forward: random increments redrawn in training must rotate q, k, v alike
            theta = self.rotation.angles(x, tokens)  # [B|1, H|1, T, D/2] float32
            # one evaluation of cos/sin shared by q, k, v and the output; learned angles get their gradient
            # from each rotation directly (rotate_pairs_cs's theta), never through cos/sin
            cos, sin = cs = cos_sin(theta.detach(), q.dtype)
            th = theta if theta.requires_grad else None
            q, k = rotate_pairs_many((q, k), cos, sin, theta=th)  # one pass, one summed angle gradient
            scale = self.rotation.logit_scale(q.shape[-2]) if hasattr(self.rotation, "logit_scale") else 1.0
            if scale != 1.0:  # an evaluation-time RoPE extension's temperature (YaRN)
                q = q * scale
            if self.cfg.rotate_values:
                v = rotate_pairs_cs(v, cos, sin, inverse=True, theta=th)  # value of s leaves at −θ_s ...
        if row is not None:
            q = q * row.unsqueeze(-1).to(q.dtype)  # [B, H, T, D]
        out = causal_attention(q, k, v, log_f, block_size=self.cfg.block_size)  # [B, H, T, D]
        if cs is not None and self.cfg.rotate_values:
            out = rotate_pairs_cs(out, *cs, theta=th)  # ... and arrives at t rotated by +θ_t
        return out

    # -- cached decoding (accrot.position.decode) -----------------------------------------------------------
    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor):
        """:meth:`forward` over a prompt, and the cache a decoding step reads: ``(out [B, H, T, D], cache)``."""
        from accrot.position.decode import prefill

        return prefill(self, q, k, v, x, tokens)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
             cache) -> torch.Tensor:
        """One new position (``q, k, v [B, H, 1, D]``, ``x [B, 1, d_model]``, ``tokens [B, 1]``) after the cache of
        :meth:`prefill` (extended in place): the output ``[B, H, 1, D]`` the forward gives at that position, at a
        cost of O(cache length × D) per head."""
        from accrot.position.decode import step

        return step(self, q, k, v, x, tokens, cache)


def build(cfg: SchemeConfig, d_model: int, n_heads: int, layer: int = 0) -> PositionScheme:
    """Build the scheme module of layer ``layer`` for ``cfg`` (head dim D = d_model // n_heads): the cell itself, or
    the position-free layer ``cfg.layer_pattern`` puts there (:meth:`SchemeConfig.for_layer`)."""
    if not isinstance(cfg, SchemeConfig):
        raise ConfigError(f"build() takes a SchemeConfig, not {type(cfg).__name__}")
    if n_heads < 1 or d_model % n_heads:
        raise ConfigError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    head_dim = d_model // n_heads
    if cfg.rotation in ("rope", "accum") and head_dim % 2:
        raise ConfigError(
            f"head dim {head_dim} (d_model={d_model} / n_heads={n_heads}) is odd; rotation={cfg.rotation!r} "
            "pairs coordinates, so it needs an even head dim"
        )
    if cfg.rotation not in ROTATIONS:
        raise ConfigError(f"rotation={cfg.rotation!r} is not built yet; built: {', '.join(sorted(ROTATIONS))}")
    if cfg.far_mass != "none" and cfg.far_mass not in FAR_MASS:
        raise ConfigError(f"far_mass={cfg.far_mass!r} is not built yet; built: none, {', '.join(sorted(FAR_MASS))}")
    if cfg.output_gate != "none" and cfg.output_gate not in OUTPUT_GATES:
        raise ConfigError(f"output_gate={cfg.output_gate!r} is not built yet; built: none, "
                          f"{', '.join(sorted(OUTPUT_GATES))}")
    own = cfg.for_layer(layer)
    rotation = ROTATIONS[own.rotation](own, d_model, n_heads)
    far_mass = None if own.far_mass == "none" else FAR_MASS[own.far_mass](own, d_model, n_heads)
    gate = None if own.output_gate == "none" else OUTPUT_GATES[own.output_gate](own, d_model, n_heads)
    return PositionScheme(own, rotation, far_mass, gate, cell=cfg, layer=layer)

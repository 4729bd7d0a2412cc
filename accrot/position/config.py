"""Typed configuration of a position scheme: rotation × far_mass × rotate_values (DESIGN §2).

Every choice is a ``Literal``; cross-field checks run at construction so an impossible cell can
never reach the model. Errors are :class:`ConfigError` (a ``ValueError``) with a one-line message
that names the offending field and what would be valid.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from accrot.errors import ConfigError, check_choice

Rotation = Literal["none", "rope", "accum", "path"]
FarMass = Literal["none", "alibi", "forget", "ssmax"]
Increments = Literal["random_position", "random_token", "learned"]
IncrementMean = Literal["zero", "rope"]
IncrementSpread = Literal["constant", "ladder"]
IncrementFamily = Literal["gaussian", "uniform"]
PathKernel = Literal["chunked", "recurrent", "fla"]
OutputGate = Literal["none", "elementwise", "headwise"]
LayerKind = Literal["cell", "none"]  # a layer_pattern entry: the cell's own rotation, or no rotation (NoPE)


MAX_WINDOW = 1 << 24  # the longest mixing window accepted, in tokens


def _accum(c: SchemeConfig) -> bool:
    return c.rotation == "accum"


def _accum_learned(c: SchemeConfig) -> bool:
    return c.rotation == "accum" and c.increments == "learned"


_PATH = ("rotation='path'", lambda c: c.rotation == "path")
_ACCUM = ("rotation='accum'", _accum)
# the options only some schemes read: field -> (who reads it, whether this config's scheme does). A value other than
# the default on a scheme that never reads it is a warning (SchemeConfig.ignored): the run would not be what it says
_READ_BY = {
    "rope_base": ("rotation='rope' or 'accum'", lambda c: c.rotation in ("rope", "accum")),
    "increment_mean": _ACCUM, "increment_spread": _ACCUM, "increment_family": _ACCUM, "window": _ACCUM,
    "sigma": _ACCUM, "window_eps": _ACCUM, "increment_rank": _ACCUM, "learned_ladder": _ACCUM,
    "resample": ("rotation='accum' with random_position increments (or a learned mixing floor)",
                 lambda c: _accum(c) and (c.increments == "random_position" or c.window is not None
                                          or c.sigma is not None)),
    "max_increment": ("increments='learned'", _accum_learned),
    "learned_init_std": ("increments='learned'", _accum_learned),
    "conv_size": ("rotation='path' or increments='learned'", lambda c: c.rotation == "path" or _accum_learned(c)),
    "forget_bias_init": ("far_mass='forget'", lambda c: c.far_mass == "forget"),
    "beta_max": _PATH, "path_rank": _PATH, "chunk_size": _PATH, "path_kernel": _PATH,
    "block_size": ("far_mass='alibi' or 'forget' without rotation='path'",
                   lambda c: c.far_mass != "none" and c.rotation != "path"),
}


@dataclass
class SchemeConfig:
    """One cell of the ablation grid plus the knobs of its parts.

    Attributes:
        rotation: how the q·k pairing is transported along the path s → t.
        far_mass: additive log-decay bias Σ_{j=s+1..t} log f_j (ALiBi: constant per head; forget: data-dependent).
        rotate_values: SO(2) rotations only; value of s arrives at t rotated by θ_t − θ_s.
        rope_base: RoPE's base b, ω_i = b^(−i/(D/2)) for pair i.
        increments: kind of accumulated increment δ_j (``rotation="accum"`` only).
        increment_mean: ``zero`` or RoPE's ω_i (the drift control that breaks the regularity condition).
        increment_spread: ``constant`` (one σ for every pair) or ``ladder`` (σ_i = c·ω_i / ω_0).
        increment_family: distribution of random increments.
        window: mixing window W in tokens: σ is chosen so |E[e^{iδ}]|^W = window_eps (random kinds).
        sigma: spread set directly (mutually exclusive with ``window``).
        window_eps: the ε of the mixing window.
        resample: redraw ``random_position`` increments every training batch.
        seed: seed of the random increments (training streams, evaluation draws, ``random_token`` tables; each
            layer its own). None (the default) follows the run's ``seed_everything``, so seeds are replicates.
        vocab_size: rows of the ``random_token`` table; token ids must lie in [0, vocab_size).
        max_increment: bound of learned increments, δ = max_increment · tanh(·).
        increment_rank: low-rank bottleneck of learned projections (None = full rank).
        conv_size: width of the short causal convolution before learned projections (0 = none).
        learned_ladder: scale learned increments by RoPE's frequency ladder (Selective-RoPE style).
        learned_init_std: init std of the last learned-increment projection.
        forget_bias_init: initial bias of the forget gate; None = log-sigmoid matching ALiBi's slopes.
        beta_max: PaTH's β_j = beta_max · sigmoid(·), in (0, 2].
        path_rank: low-rank bottleneck of PaTH's w projection (None = full rank).
        chunk_size: PaTH chunk length c.
        path_kernel: PaTH implementation.
        block_size: query/key block of the biased (far-mass) attention kernel.
        ssmax_init: initial s of scalable softmax (``far_mass="ssmax"``): row t's logits are multiplied by
            s_h·log(t + 1), with one learned s per head.
        output_gate: a sigmoid gate on the attention output, σ(x W + b) per head: ``elementwise`` (one gate per
            output coordinate) or ``headwise`` (one per head); ``none`` = ungated.
        layer_pattern: per-layer rotation, repeated over the layers: layer i takes entry i mod len; ``cell`` keeps
            the cell's rotation, ``none`` drops it (a position-free layer; far mass and gate stay the cell's).
            ``[cell, cell, cell, none]``: every 4th layer NoPE. None (the default): every layer the cell.
    """

    rotation: Rotation = "none"
    far_mass: FarMass = "none"
    rotate_values: bool = False
    # rope
    rope_base: float = 10000.0
    # accum
    increments: Increments | None = None
    increment_mean: IncrementMean = "zero"
    increment_spread: IncrementSpread = "constant"
    increment_family: IncrementFamily = "gaussian"
    window: float | None = None
    sigma: float | None = None
    window_eps: float = 0.05
    resample: bool = True
    seed: int | None = None
    vocab_size: int = 256
    max_increment: float = 1.0
    increment_rank: int | None = None
    conv_size: int = 0
    learned_ladder: bool = False
    learned_init_std: float = 0.02
    # forget gate
    forget_bias_init: float | None = None
    # path
    beta_max: float = 2.0
    path_rank: int | None = None
    chunk_size: int = 32
    path_kernel: PathKernel = "chunked"
    # kernels
    block_size: int = 128
    # scalable softmax, output gate, per-layer pattern
    ssmax_init: float = 0.43
    output_gate: OutputGate = "none"
    layer_pattern: list[str] | None = None

    def __post_init__(self) -> None:
        self._check_choices()
        self._check_numbers()
        self._check_ranges()
        self._check_gate_and_layers()

    def _check_choices(self) -> None:
        """Every Literal field holds one of its values, and the fields that need another agree with it."""
        check_choice("rotation", self.rotation, Rotation)
        check_choice("far_mass", self.far_mass, FarMass)
        if not isinstance(self.rotate_values, bool):
            raise ConfigError(f"rotate_values={self.rotate_values!r} is not valid; use true or false")
        check_choice("increment_mean", self.increment_mean, IncrementMean)
        check_choice("increment_spread", self.increment_spread, IncrementSpread)
        check_choice("increment_family", self.increment_family, IncrementFamily)
        check_choice("path_kernel", self.path_kernel, PathKernel)
        if self.rotation == "accum":
            if self.increments is None:
                self.increments = "random_position"
            check_choice("increments", self.increments, Increments)
        elif self.increments is not None:
            raise ConfigError(
                f"increments={self.increments!r} needs rotation='accum' (got rotation={self.rotation!r}); "
                "drop increments or set rotation=accum"
            )
        if self.rotate_values and self.rotation not in ("rope", "accum"):
            raise ConfigError(
                f"rotate_values=true needs an SO(2) rotation (rope or accum), not rotation={self.rotation!r}"
            )

    def _check_numbers(self) -> None:
        """Positive where a size or a scale is meant, integers where a count is."""
        positive = ["rope_base", "max_increment", "chunk_size", "block_size", "vocab_size"]
        positive += [n for n in ("window", "sigma", "increment_rank", "path_rank") if getattr(self, n) is not None]
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or math.isinf(value):
                raise ConfigError(f"{name}={value!r} is not valid; it must be a positive number")
        for name in ("chunk_size", "block_size", "increment_rank", "path_rank", "conv_size", "seed", "vocab_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{name}={value!r} is not valid; it must be an integer")

    def _check_ranges(self) -> None:
        if self.conv_size < 0:
            raise ConfigError(f"conv_size={self.conv_size!r} is not valid; it must be 0 (off) or a positive width")
        if self.learned_init_std < 0:
            raise ConfigError(f"learned_init_std={self.learned_init_std!r} is not valid; it must be >= 0")
        if not 0.0 < self.window_eps < 1.0:
            raise ConfigError(f"window_eps={self.window_eps!r} is not valid; it must lie in (0, 1)")
        if not 0.0 < self.beta_max <= 2.0:
            raise ConfigError(f"beta_max={self.beta_max!r} is not valid; it must lie in (0, 2]")
        if self.window is not None and self.sigma is not None:
            raise ConfigError("window and sigma both set; set the spread by one of them")
        if self.window is not None and self.window > MAX_WINDOW:
            raise ConfigError(f"window={self.window!r} is not valid; at most 2^24 = {MAX_WINDOW} tokens (float32 holds "
                              "positions exactly up to 2^24; a longer window mixes nothing at any length accrot "
                              "evaluates: use rotation=rope for fixed angles)")

    def _check_gate_and_layers(self) -> None:
        check_choice("output_gate", self.output_gate, OutputGate)
        s = self.ssmax_init
        if not isinstance(s, (int, float)) or isinstance(s, bool) or not 0 < s < math.inf:
            raise ConfigError(f"ssmax_init={s!r} is not valid; it must be a positive number")
        pattern = self.layer_pattern
        if pattern is None:
            return
        if isinstance(pattern, str) or not isinstance(pattern, (list, tuple)) or not pattern:
            raise ConfigError(f"layer_pattern={pattern!r} is not valid; give a list of 'cell' / 'none', e.g. "
                              "[cell, cell, cell, none] (every 4th layer NoPE), or null")
        for entry in pattern:
            check_choice("layer_pattern entry", entry, LayerKind)
        self.layer_pattern = list(pattern)
        if self.rotation == "none":
            raise ConfigError(f"layer_pattern={self.layer_pattern!r} needs a rotation to interleave; with "
                              "rotation='none' every layer is position-free already: drop layer_pattern")
        if "none" not in pattern:
            raise ConfigError(f"layer_pattern={self.layer_pattern!r} changes no layer; add a 'none' entry or drop it")

    def for_layer(self, layer: int) -> SchemeConfig:
        """The scheme of layer ``layer`` (0-based): the cell itself, or its position-free version where the
        ``layer_pattern`` says ``none`` (rotation none, no increments, no value rotation; far mass and gate kept).
        Its own ``layer_pattern`` is None: it describes one layer."""
        if self.layer_pattern is None:
            return self
        if self.layer_pattern[layer % len(self.layer_pattern)] == "cell":
            return replace(self, layer_pattern=None)
        return replace(self, rotation="none", increments=None, rotate_values=False, layer_pattern=None)

    def label(self) -> str:
        """The cell of the ablation grid, ``rotation[:increments]/far_mass[+values][+gate][(pattern)]``:
        ``accum:learned/forget+values``, ``rope/ssmax``, ``rope/none+gate`` (``+headgate``: one gate per head),
        ``rope/none(cell,none)`` (every 2nd layer NoPE; parentheses: rich's tables read brackets as markup).
        Figures, tables, sweeps and error messages name a scheme by it."""
        rotation = f"{self.rotation}:{self.increments}" if self.increments else self.rotation
        label = f"{rotation}/{self.far_mass}" + ("+values" if self.rotate_values else "")
        label += {"none": "", "elementwise": "+gate", "headwise": "+headgate"}[self.output_gate]
        return label + (f"({','.join(self.layer_pattern)})" if self.layer_pattern else "")

    def ignored(self) -> list[tuple[str, str]]:
        """``(field, who reads it)`` for every option set to other than its default that this scheme never reads
        (``window`` with ``rotation='rope'``): the run would silently not be what its config says."""
        defaults = {f.name: f.default for f in fields(self)}
        return [(name, reader) for name, (reader, reads) in _READ_BY.items()
                if getattr(self, name) != defaults[name] and not reads(self)]

    @classmethod
    def of(cls, scheme: Mapping[str, Any] | None) -> SchemeConfig | None:
        """The config a saved dict describes (a checkpoint's or a trial's hyperparameters; keys this version does
        not know are dropped), or None where it describes no valid scheme."""
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in (scheme or {}).items() if k in known})
        except (ConfigError, TypeError):
            return None

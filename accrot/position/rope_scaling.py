"""Evaluation-time RoPE length extensions: the baselines an extrapolation study is asked to beat.

RoPE evaluated past its training length L without an extension is the weakest baseline; practice scales the
frequencies ω_i = b^(−2i/D) (pair i of D/2) by a factor s, set from the evaluation length (s = T / L, never
below 1: dynamic) or given:

- position interpolation (PI; Chen et al., 2023, arXiv:2306.15595): ω'_i = ω_i / s, positions squeezed into
  the trained range;
- NTK-aware base scaling (bloc97, 2023): b' = b · s^(D/(D−2)), so the lowest frequency is interpolated by s and
  the highest (ω_0 = 1) kept;
- YaRN (Peng et al., 2023, arXiv:2309.00071): per pair, the number of its wavelengths in L, r_i = L ω_i / 2π,
  sets a ramp γ_i = clamp((r_i − α) / (β − α), 0, 1) (α = 1, β = 32); ω'_i = (1 − γ_i) ω_i / s + γ_i ω_i, so
  pairs that turn many times in L keep their frequency and pairs that turn less than once are interpolated; the
  attention logits are multiplied by (0.1 ln s + 1)² (its temperature √(1/t) = 0.1 ln s + 1).

At s = 1 every scaling is the identity. The model is never retrained: these are rows computed from RoPE
checkpoints, labelled "eval-time extension".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from accrot.errors import ConfigError
from accrot.ops.rotary import rope_frequencies

Scaling = Literal["pi", "ntk", "yarn"]
SCALINGS = ("pi", "ntk", "yarn")
YARN_ALPHA, YARN_BETA = 1.0, 32.0


@dataclass(frozen=True)
class RopeScaling:
    """``kind`` at ``factor`` (None: s = T / ``train_length`` for a forward of length T, at least 1)."""

    kind: str
    train_length: int
    factor: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in SCALINGS:
            raise ConfigError(f"rope_scaling={self.kind!r} is not valid; choose one of {', '.join(SCALINGS)}")
        if self.factor is not None and not (isinstance(self.factor, (int, float)) and self.factor > 0):
            raise ConfigError(f"rope_factor={self.factor!r} is not valid; a positive number (or none: T / L)")
        if not isinstance(self.train_length, int) or self.train_length <= 0:
            raise ConfigError(f"train_length={self.train_length!r} is not valid; a positive integer")

    def factor_at(self, T: int) -> float:
        return float(self.factor) if self.factor is not None else max(1.0, T / self.train_length)

    def label(self) -> str:
        s = "T/L" if self.factor is None else f"{self.factor:g}"
        return f"RoPE+{self.kind.upper() if self.kind != 'yarn' else 'YaRN'} (s={s}, eval-time extension)"


def scaled_frequencies(omega: torch.Tensor, kind: str, factor: float, train_length: int,
                       base: float = 10000.0) -> torch.Tensor:
    """``ω'`` of ``kind`` at ``factor`` from RoPE's ``omega`` ``[D/2]`` float64 (base ``base``)."""
    P = omega.shape[-1]
    D = 2 * P
    if kind == "pi":
        return omega / factor
    if kind == "ntk":
        return rope_frequencies(D, base * factor ** (D / (D - 2)) if D > 2 else base).to(omega.device)
    if kind == "yarn":
        turns = train_length * omega / (2 * math.pi)  # wavelengths of pair i within L
        gamma = ((turns - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA)).clamp(0.0, 1.0)
        return (1 - gamma) * omega / factor + gamma * omega
    raise ConfigError(f"rope_scaling={kind!r} is not valid; choose one of {', '.join(SCALINGS)}")


def logit_scale(kind: str, factor: float) -> float:
    """What multiplies the attention logits: YaRN's (0.1 ln s + 1)² (1 for s ≤ 1), 1 for PI and NTK."""
    if kind != "yarn" or factor <= 1:
        return 1.0
    return (0.1 * math.log(factor) + 1.0) ** 2


def apply_rope_scaling(model: torch.nn.Module, scaling: RopeScaling | None) -> int:
    """Set (or, with None, remove) ``scaling`` on every RoPE part of ``model``; how many. A model without RoPE is
    a one-line ConfigError: the extensions are defined for RoPE only."""
    # RoPE's parts take a scaling (set_scaling); found by that, so this module needs nothing of rope.py's, which
    # imports it
    parts = [m for m in model.modules() if callable(getattr(m, "set_scaling", None))]
    if scaling is not None and not parts:
        cell = getattr(getattr(model, "scheme_config", None), "label", None)  # a LitLM names its scheme's cell
        what = f"this model is {cell()}" if cell else "this model has no RoPE part"
        raise ConfigError(f"rope_scaling={scaling.kind!r} needs a RoPE model (rotation=rope); {what}: the extensions "
                          "rescale RoPE's fixed frequencies, which other schemes do not have")
    for part in parts:
        part.set_scaling(scaling)
    return len(parts)

"""Evaluation-time RoPE length extensions: the baselines an extrapolation study is asked to beat.

RoPE evaluated past its training length L without an extension is the weakest baseline; practice scales the
frequencies ω_i = b^(−2i/D) (pair i of P = D/2) by a factor s, set from the evaluation length (s = T / L, never
below 1: dynamic) or given. Each kind is written as the code behind the field's published numbers computes it
(Hugging Face ``transformers.modeling_rope_utils``, the YaRN authors' repository, vLLM), and a test compares every
kind with ``transformers``' own rope-init functions over a grid of head dims, lengths and factors:

- ``pi``, position interpolation (Chen et al., 2023, arXiv:2306.15595; transformers' ``linear``): ω'_i = ω_i / s.
- ``ntk``, NTK-aware base scaling (bloc97, 2023): b' = b · s^(D/(D−2)), the lowest frequency interpolated by s and
  the highest (ω_0 = 1) kept. With the dynamic factor s = T / L this is transformers' ``dynamic`` at factor 1.
- ``yarn``, YaRN as its code computes it (Peng et al., 2023, arXiv:2309.00071; transformers' ``yarn``, the
  authors' ``find_correction_range``): the pair index d(r) at which a pair turns r times within L,
  d(r) = D·ln(L / (2π r)) / (2 ln b), gives the range [⌊d(β_fast = 32)⌋, ⌈d(β_slow = 1)⌉], clamped to [0, D − 1];
  the share kept, γ_i = 1 − clamp((i − low) / (high − low), 0, 1), is a linear ramp **in the pair index**, and
  ω'_i = γ_i ω_i + (1 − γ_i) ω_i / s. The logits are multiplied by (0.1 ln s + 1)² (transformers multiplies cos
  and sin by the attention factor 0.1 ln s + 1, so every q·k product carries its square).
- ``yarn-paper``, YaRN as its paper's equation writes it: the ramp is linear in the pair's number of turns within
  L, r_i = L ω_i / 2π: γ_i = clamp((r_i − 1) / (32 − 1), 0, 1), the same temperature. The two agree where the fast
  pairs turn 32 times or more in L (long training lengths); at a short L even the fastest pair turns fewer than 32
  times, so the paper form partly interpolates every pair while the code form, whose range is clamped at index 0,
  keeps pair 0 whole and ramps over the first few indices. Kept as a labelled option, never the default.
- ``llama3``, Llama 3.1's frequency-dependent scaling (transformers' ``llama3``, low_freq_factor 1,
  high_freq_factor 4, original context L): pairs whose wavelength is under L/4 are kept, over L divided by s, and
  in between ω'_i = (1 − σ_i) ω_i / s + σ_i ω_i with σ_i = (L / λ_i − 1) / (4 − 1).

At s = 1 every scaling is the identity. The model is never retrained: these are rows computed from RoPE
checkpoints, labelled "eval-time extension".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from accrot.errors import ConfigError
from accrot.ops.rotary import rope_frequencies

YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # turns within L: at least β_fast kept, at most β_slow interpolated
LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR = 1.0, 4.0  # Llama 3.1's published settings


def _pi(omega: torch.Tensor, s: float, L: int, base: float) -> torch.Tensor:
    return omega / s


def _ntk(omega: torch.Tensor, s: float, L: int, base: float) -> torch.Tensor:
    D = 2 * omega.shape[-1]
    return rope_frequencies(D, base * s ** (D / (D - 2)) if D > 2 else base).to(omega.device)


def _yarn_correction_dim(turns: float, D: int, L: int, base: float) -> float:
    """The (fractional) pair index at which a pair turns ``turns`` times within L: L ω_d / 2π = turns."""
    return D * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))


def yarn_kept_share(P: int, L: int, base: float) -> torch.Tensor:
    """``[P]`` float64 γ_i of the code form: 1 where pair i keeps its frequency, 0 where it is interpolated, a
    linear ramp in i between the floor of β_fast's correction dim and the ceiling of β_slow's (clamped to
    [0, D − 1]; a zero-width range widened by 0.001, as the reference does)."""
    D = 2 * P
    low = max(math.floor(_yarn_correction_dim(YARN_BETA_FAST, D, L, base)), 0)
    high = min(math.ceil(_yarn_correction_dim(YARN_BETA_SLOW, D, L, base)), D - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(P, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)  # [P]
    return 1.0 - ramp


def _yarn(omega: torch.Tensor, s: float, L: int, base: float) -> torch.Tensor:
    gamma = yarn_kept_share(omega.shape[-1], L, base).to(omega.device)  # [P]
    return gamma * omega + (1 - gamma) * omega / s


def _yarn_paper(omega: torch.Tensor, s: float, L: int, base: float) -> torch.Tensor:
    turns = L * omega / (2 * math.pi)  # wavelengths of pair i within L
    gamma = ((turns - YARN_BETA_SLOW) / (YARN_BETA_FAST - YARN_BETA_SLOW)).clamp(0.0, 1.0)
    return gamma * omega + (1 - gamma) * omega / s


def _llama3(omega: torch.Tensor, s: float, L: int, base: float) -> torch.Tensor:
    low, high = LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR
    wavelength = 2 * math.pi / omega  # [P]
    smooth = ((L / wavelength - low) / (high - low))  # [P], in [0, 1] on the medium band
    medium = (1 - smooth) * omega / s + smooth * omega
    out = torch.where(wavelength > L / low, omega / s, omega)
    return torch.where((wavelength >= L / high) & (wavelength <= L / low), medium, out)


def _yarn_temperature(s: float) -> float:
    return 1.0 if s <= 1 else (0.1 * math.log(s) + 1.0) ** 2


@dataclass(frozen=True)
class ScalingKind:
    """One extension: its name on the command line, its label in tables, the frequencies ω' from (ω, s, L, b), the
    factor on the logits from s, and ``definition``, the form an evaluation records (an evaluation written under
    another definition of the same name is stale: the study evaluates it again)."""

    name: str
    label: str
    frequencies: Callable[[torch.Tensor, float, int, float], torch.Tensor]
    definition: str
    temperature: Callable[[float], float] = lambda s: 1.0
    note: str = ""


KINDS: dict[str, ScalingKind] = {k.name: k for k in (
    ScalingKind("pi", "PI", _pi, "pi", note="position interpolation: every frequency divided by s"),
    ScalingKind("ntk", "NTK", _ntk, "ntk", note="NTK-aware base scaling b·s^(D/(D−2))"),
    ScalingKind("yarn", "YaRN", _yarn, "yarn-code", _yarn_temperature,
                note="YaRN as the field's code computes it (transformers, the authors' repository): the ramp is "
                     "linear in the pair index"),
    ScalingKind("yarn-paper", "YaRN-paper", _yarn_paper, "yarn-paper", _yarn_temperature,
                note="YaRN as its paper's equation writes it: the ramp is linear in a pair's turns within L"),
    ScalingKind("llama3", "Llama3", _llama3, "llama3", note="Llama 3.1's frequency bands (low 1, high 4)"),
)}
SCALINGS = tuple(KINDS)
# what an evaluation that records no definition was computed with: accrot's "yarn" was the paper's form until the
# code form became the default
UNRECORDED_DEFINITION = {"pi": "pi", "ntk": "ntk", "yarn": "yarn-paper"}


def written_definition(record: dict) -> str | None:
    """The definition an evaluation's ``rope_scaling`` record was computed with (None: unknown)."""
    return record.get("definition", UNRECORDED_DEFINITION.get(record.get("kind", "")))


def _kind(kind: str) -> ScalingKind:
    if kind not in KINDS:
        raise ConfigError(f"rope_scaling={kind!r} is not valid; choose one of {', '.join(SCALINGS)}")
    return KINDS[kind]


@dataclass(frozen=True)
class RopeScaling:
    """``kind`` at ``factor`` (None: s = T / ``train_length`` for a forward of length T, at least 1)."""

    kind: str
    train_length: int
    factor: float | None = None

    def __post_init__(self) -> None:
        _kind(self.kind)
        if self.factor is not None and not (isinstance(self.factor, (int, float)) and self.factor > 0):
            raise ConfigError(f"rope_factor={self.factor!r} is not valid; a positive number (or none: T / L)")
        if not isinstance(self.train_length, int) or self.train_length <= 0:
            raise ConfigError(f"train_length={self.train_length!r} is not valid; a positive integer")

    def factor_at(self, T: int) -> float:
        return float(self.factor) if self.factor is not None else max(1.0, T / self.train_length)

    def label(self) -> str:
        s = "T/L" if self.factor is None else f"{self.factor:g}"
        return f"RoPE+{KINDS[self.kind].label} (s={s}, eval-time extension)"

    def record(self) -> dict:
        """What an evaluation writes of the extension it ran: kind, factor, label, definition and what it is."""
        kind = KINDS[self.kind]
        return {"kind": self.kind, "factor": self.factor, "label": self.label(), "definition": kind.definition,
                "form": kind.note}


def scaled_frequencies(omega: torch.Tensor, kind: str, factor: float, train_length: int,
                       base: float = 10000.0) -> torch.Tensor:
    """``ω'`` ``[D/2]`` of ``kind`` at ``factor`` from RoPE's ``omega`` ``[D/2]`` float64 (base ``base``)."""
    return _kind(kind).frequencies(omega, factor, train_length, base)


def logit_scale(kind: str, factor: float) -> float:
    """What multiplies the attention logits: YaRN's (0.1 ln s + 1)² (1 for s ≤ 1), 1 for the others."""
    return _kind(kind).temperature(factor)


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

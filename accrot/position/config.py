"""Typed configuration of a position scheme: rotation × far_mass × rotate_values.

Every choice is a ``Literal``; cross-field checks run at construction so an impossible cell can
never reach the model. Errors are :class:`ConfigError` (a ``ValueError``) with a one-line message
that names the offending field and what would be valid.

Defaults follow the reference implementations, and the options whose reference value depends on the scheme are
``None`` until construction fills them in for the rotation in use (:data:`REFERENCE`): learned increments as
Selective RoPE builds them (timurcarstensen/selective-rope ``src/selective_rope/modules/rotary.py``: a rank-16
projection of the per-head L2-normalised input, a width-4 causal convolution, RoPE's frequency ladder at base
500 000), PaTH as fla builds it (fla-org/flash-linear-attention ``fla/layers/path_attn.py``: a rank-32 w
projection, a width-3 causal convolution with SiLU before the L2 norm, β = 2·sigmoid), and the forget gate as FoX
builds it (zhixuan-lin/forgetting-transformer: a default-initialised linear gate). accrot's earlier, simpler
settings remain reachable by value (``increment_rank=0``, ``conv_size=0``, ``learned_form="plain"`` ...); a scheme
dict saved before these defaults existed loads as what it was (:func:`saved_scheme`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from accrot.errors import ConfigError, check_choice
from accrot.position.reference import REFERENCE

Rotation = Literal["none", "rope", "accum", "path"]
# the rotations by angles (rotate_values transports values along them); the config imports no part, so it names them
SO2_ROTATIONS = ("rope", "accum")
FarMass = Literal["none", "alibi", "forget", "ssmax"]
Increments = Literal["random_position", "random_token", "learned", "softplus"]
IncrementMean = Literal["zero", "rope"]
IncrementSpread = Literal["constant", "ladder"]
IncrementFamily = Literal["gaussian", "uniform"]
PathKernel = Literal["chunked", "recurrent", "fla"]
PathBeta = Literal["learned", "reflection"]
OutputGate = Literal["none", "elementwise", "headwise"]
LayerKind = Literal["cell", "none"]  # a layer_pattern entry: the cell's own rotation, or no rotation (NoPE)
LearnedForm = Literal["selective", "plain"]
ForgetInit = Literal["fox", "alibi"]


MAX_WINDOW = 1 << 24  # the longest mixing window accepted, in tokens

@dataclass
class SchemeConfig:
    """One cell of the ablation grid plus the knobs of its parts.

    Attributes:
        rotation: how the q·k pairing is transported along the path s → t.
        far_mass: additive log-decay bias Σ_{j=s+1..t} log f_j (ALiBi: constant per head; forget: data-dependent).
        rotate_values: SO(2) rotations only; value of s arrives at t rotated by θ_t − θ_s.
        rope_base: RoPE's base b, ω_i = b^(−i/(D/2)) for pair i.
        increments: kind of accumulated increment δ_j (``rotation="accum"`` only).
        increment_mean: ``zero`` or RoPE's ω_i (a drift: random increments still mix at |φ|, "RoPE plus jitter").
        increment_spread: ``constant`` (one σ for every pair) or ``ladder`` (σ_i = c·ω_i / ω_0).
        increment_family: distribution of random increments.
        window: mixing window W in tokens: σ is chosen so |E[e^{iδ}]|^W = window_eps (random kinds).
        sigma: spread set directly (mutually exclusive with ``window``).
        window_eps: the ε of the mixing window.
        resample: redraw ``random_position`` increments every training batch.
        seed: seed of the random increments (training streams, evaluation draws, ``random_token`` tables; each
            layer its own). None (the default) follows the run's ``seed_everything``, so seeds are replicates.
        vocab_size: rows of the ``random_token`` table; token ids must lie in [0, vocab_size).
        max_increment: bound M of learned increments, δ = ℓ_i · M · tanh(u / M): slope 1 at 0 (the unbounded
            reference's δ = ℓ_i · u while |u| ≪ M), never more than M·ℓ_i. π by default: a step of π on the
            fastest pair already reaches every rotation of its plane, so the bound clips nothing that could not
            be written as a smaller angle, and at init (|u| ~ 1e-4) it is the identity.
        learned_form: ``selective`` (the reference): the projection reads the per-head L2-normalised input and
            has no bias; ``plain``: the raw input and a zero-initialised bias (accrot's earlier form).
        increment_rank: rank of the learned-increment projection's bottleneck; 0 = one full-rank projection.
            None: the reference's (16).
        conv_size: width of the short causal depthwise convolution after the learned projection (increments:
            none after it; PaTH: SiLU after it), 0 = none. None: the reference's (learned 4, PaTH 3).
        learned_ladder: scale learned increments by RoPE's frequency ladder ℓ_i = b^(−2i/D), b = ``ladder_base``.
            None: the reference's (on).
        ladder_base: base b of that ladder (learned; None: Selective RoPE's 500 000), or of the softplus
            increments' learnable ladder at init (None: ``rope_base``).
        learned_init_std: init std of the rotation's learned weights (every factor and the convolution of learned
            increments' and of PaTH's w, and PaTH's β projection, whose bias starts at 0; the references' 0.02);
            None = PyTorch's default init. Softplus increments start as GRAPE's (gate weight 0, rate 10⁻³).
        forget_bias_init: initial bias of the forget gate; None = as ``forget_init`` says.
        forget_init: ``fox`` (FoX's default linear init: weight N(0, 0.02), bias 0, f ≈ 1/2 at init) or
            ``alibi`` (weight 0, bias such that the gate starts as ALiBi's slopes exactly).
        beta_max: PaTH's β_j = beta_max · sigmoid(·), in (0, 2]; 1 makes every factor a contraction only
            (eigenvalue 1 − β ∈ (0, 1) along w, as DeltaNet without negative eigenvalues).
        path_beta: ``learned`` (β_j = beta_max · sigmoid(linear(x_j)), fla's PaTH) or ``reflection`` (β_j = 2 for
            every token: each factor I − 2 w wᵀ is a reflection, orthogonal, the Householder products the theory's
            premise describes; no β projection, beta_max unread).
        path_rank: rank of PaTH's w projection's bottleneck; 0 = one full-rank projection. None: the reference's
            (32).
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
    max_increment: float = math.pi
    learned_form: LearnedForm = "selective"
    increment_rank: int | None = None
    conv_size: int | None = None
    learned_ladder: bool | None = None
    ladder_base: float | None = None
    learned_init_std: float | None = 0.02
    # forget gate
    forget_bias_init: float | None = None
    forget_init: ForgetInit = "fox"
    # path
    beta_max: float = 2.0
    path_rank: int | None = None
    chunk_size: int = 32
    path_kernel: PathKernel = "chunked"
    path_beta: PathBeta = "learned"
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
        self._fill_reference()

    def _fill_reference(self) -> None:
        """Options left None take the reference's value for the part in use; the others stay None."""
        part = self.increments if self.rotation == "accum" else self.rotation
        for name, value in REFERENCE.get(part, {}).items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if part == "softplus" and self.ladder_base is None:
            self.ladder_base = self.rope_base

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
        check_choice("path_beta", self.path_beta, PathBeta)
        check_choice("learned_form", self.learned_form, LearnedForm)
        check_choice("forget_init", self.forget_init, ForgetInit)
        if self.learned_ladder is not None and not isinstance(self.learned_ladder, bool):
            raise ConfigError(f"learned_ladder={self.learned_ladder!r} is not valid; use true, false or null")
        if self.rotation == "accum":
            if self.increments is None:
                self.increments = "random_position"
            check_choice("increments", self.increments, Increments)
        elif self.increments is not None:
            raise ConfigError(
                f"increments={self.increments!r} needs rotation='accum' (got rotation={self.rotation!r}); "
                "drop increments or set rotation=accum"
            )
        if self.rotate_values and self.rotation not in SO2_ROTATIONS:
            raise ConfigError(
                f"rotate_values=true needs an SO(2) rotation (rope or accum), not rotation={self.rotation!r}"
            )

    def _check_numbers(self) -> None:
        """Positive where a size or a scale is meant, integers where a count is."""
        positive = ["rope_base", "max_increment", "chunk_size", "block_size", "vocab_size"]
        positive += [n for n in ("window", "sigma", "ladder_base") if getattr(self, n) is not None]
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or math.isinf(value):
                raise ConfigError(f"{name}={value!r} is not valid; it must be a positive number")
        for name in ("chunk_size", "block_size", "increment_rank", "path_rank", "conv_size", "seed", "vocab_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{name}={value!r} is not valid; it must be an integer")

    def _check_ranges(self) -> None:
        if self.conv_size is not None and self.conv_size < 0:
            raise ConfigError(f"conv_size={self.conv_size!r} is not valid; it must be 0 (off) or a positive width")
        for name in ("increment_rank", "path_rank"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name}={value!r} is not valid; it must be 0 (one full-rank projection) or a "
                                  "positive rank")
        if self.learned_init_std is not None and not self.learned_init_std >= 0:
            raise ConfigError(f"learned_init_std={self.learned_init_std!r} is not valid; it must be >= 0 (or null: "
                              "PyTorch's default init)")
        if not 0.0 < self.window_eps < 1.0:
            raise ConfigError(f"window_eps={self.window_eps!r} is not valid; it must lie in (0, 1)")
        if not 0.0 < self.beta_max <= 2.0:
            raise ConfigError(f"beta_max={self.beta_max!r} is not valid; it must lie in (0, 2]")
        if self.path_beta == "reflection" and self.beta_max != 2.0:
            raise ConfigError(f"beta_max={self.beta_max!r} does nothing with path_beta='reflection' (every β is 2); "
                              "drop beta_max, or use path_beta='learned'")
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
        """The scheme's one name (:func:`accrot.position.naming.label`): its cell of the ablation grid,
        ``rotation[:increments]/far_mass[+values][+gate][(pattern)]``, and in braces every setting that makes it
        another scheme than the cell's reference (``rope/none{base500000}``). Figures, tables, sweeps, the bench and
        error messages name a scheme by it; its run folder (:meth:`run_name`) spells the same tokens."""
        from accrot.position.naming import label

        return label(self)

    def run_name(self) -> str:
        """The folder name of a run of this scheme: the tokens of :meth:`label` joined by ``-``."""
        from accrot.position.naming import run_name

        return run_name(self)

    @classmethod
    def of(cls, scheme: Mapping[str, Any] | None) -> SchemeConfig | None:
        """The config a saved dict describes (a checkpoint's or a trial's hyperparameters; keys this version does
        not know are dropped, a dict saved before the reference defaults means what it meant then), or None where
        it describes no valid scheme."""
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in saved_scheme(scheme).items() if k in known})
        except (ConfigError, TypeError):
            return None


# Every field a scheme dict saved before the reference defaults holds (a checkpoint's hyperparameters are the
# whole asdict of the config), and the values that make such a dict mean what it meant when it was saved: one
# full-rank projection where the rank was None, learned increments in the plain form, the ALiBi-initialised gate.
_BEFORE_REFERENCE = frozenset((
    "rotation", "far_mass", "rotate_values", "rope_base", "increments", "increment_mean", "increment_spread",
    "increment_family", "window", "sigma", "window_eps", "resample", "seed", "vocab_size", "max_increment",
    "increment_rank", "conv_size", "learned_ladder", "learned_init_std", "forget_bias_init", "beta_max",
    "path_rank", "chunk_size", "path_kernel", "block_size"))
_LEGACY = {"learned_form": "plain", "forget_init": "alibi"}


def saved_scheme(scheme: Mapping[str, Any] | None) -> dict[str, Any]:
    """A saved scheme dict as this version reads it: unchanged, unless it was saved before the reference defaults
    (it names every field of that version and none of the new ones), when the options whose default changed take
    the values it was trained with."""
    d = dict(scheme or {})
    if not _BEFORE_REFERENCE <= d.keys() or "learned_form" in d:
        return d
    for name in ("increment_rank", "path_rank"):
        if d[name] is None:
            d[name] = 0
    d.update(_LEGACY)
    if d.get("learned_init_std") is not None and d.get("rotation") == "path":
        d["learned_init_std"] = None  # PaTH's projections had PyTorch's default init
    return d

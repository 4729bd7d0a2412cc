"""The study as data, one frozen record each: the variants it compares (:class:`Variant`: a set of ``model.scheme``
overrides and nothing else), RoPE's eval-time extension rows (:class:`Extension`), the data sets (:class:`Dataset`)
and the size presets (:class:`Size`: the shipped config each starts from, seeds, lengths, and what each was
measured to cost). The name-keyed views other modules read (``VARIANTS``, ``DATASETS``, ``DEFAULT_VARIANTS``, ...)
are derived from the records."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar


@dataclass(frozen=True)
class Variant:
    """One variant of the study: a set of ``model.scheme`` overrides and nothing else (every variant shares the rest
    of the recipe), with the one sentence the report prints for it."""

    name: str  # the report's label
    scheme: Mapping[str, Any] = field(hash=False)  # model.scheme overrides
    description: str  # one sentence: what it is and, for a control, which side of the regularity condition it is on
    optional: bool = False  # `accrot ablation` runs it only when --variants names it
    windowed: bool = False  # random increments whose mixing window the spec sets to WINDOW_FRACTION × L

    def __post_init__(self) -> None:
        object.__setattr__(self, "scheme", MappingProxyType(dict(self.scheme)))


@dataclass(frozen=True)
class Extension:
    """An evaluation-time extension of RoPE: no training of its own, every complete run of ``of`` evaluated again
    with ``rope_scaling`` of ``kind`` (accrot.position.rope_scaling; accrot/study/extensions.py)."""

    name: str  # e.g. RoPE+PI
    kind: str  # the rope_scaling kind
    of: str = "RoPE"  # the trained variant it evaluates

    @property
    def label(self) -> str:
        """The row's name wherever a variant name is printed: it says the row is no trained variant."""
        return f"{self.name} (eval-time extension)"


@dataclass(frozen=True)
class Dataset:
    """One data set of the study: the overrides that select its data module, and what the report reads on it."""

    name: str
    overrides: Mapping[str, Any] = field(hash=False)  # dotted `accrot fit` overrides (data, data.init_args.*)
    title: str  # the report's heading
    min_seq_len: int = 0  # the shortest training length its sequences fit in (0: any)
    answers_only: bool = False  # only the answers are scored: NLL and accuracy of the answers
    state: bool = False  # a state-tracking task (the claims S1–S3 read it)
    default: bool = False  # `accrot ablation` runs it without --datasets
    variants: tuple[str, ...] | None = None  # what it runs without --variants (None: every selected variant)

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))


R = TypeVar("R", Variant, Dataset)


def by_name(records: Iterable[R]) -> dict[str, R]:
    """``{record.name: record}`` in the records' order; two records of one name are an error, not one lost."""
    out = {}
    for r in records:
        if r.name in out:
            raise ValueError(f"two study records are named {r.name!r}")
        out[r.name] = r
    return out


# The names are the report's; every variant shares everything else. Each scheme's defaults are its reference
# implementation's (Selective RoPE's learned angles, fla's PaTH layer, FoX's gate: accrot/position/config.py);
# "-plain" marks accrot's earlier, simpler settings, kept as labelled ablations. Optional: the variants `accrot
# ablation` runs only when --variants names them (the default study fits an hour on 2 CPU cores): the earlier
# settings (to attribute a moved verdict to the parameterisation), the large-base RoPE, the field's other far-mass
# designs, RoPE+jitter (it mixes like accum-random: it tests the drift, not the condition) and the forget gate
# initialised as ALiBi (a prior toward flatness; the default cell takes FoX's own init). The descriptions say, for
# the controls, which side of the regularity condition (every pair mixes: |E[e^{iδ_i}]| < 1 bounded away from 1)
# they stand on.
PLAIN_LEARNED = {"learned_form": "plain", "increment_rank": 0, "conv_size": 0, "learned_ladder": False,
                 "max_increment": 1.0}
PLAIN_PATH = {"path_rank": 0, "conv_size": 0, "learned_init_std": None}
_LEARNED_VALUES = {"rotation": "accum", "increments": "learned", "rotate_values": True}
NO_LADDER = {"learned_ladder": False}
VARIANT_RECORDS: dict[str, Variant] = by_name((
    Variant("NoPE", {}, "No position scheme: causal attention alone (the negative control)."),
    Variant("RoPE", {"rotation": "rope"},
            "Rotary embedding: every pair turns by its fixed frequency ω_i per token, so no pair ever mixes."),
    Variant("ALiBi", {"far_mass": "alibi"},
            "A fixed linear bias −m_h·(t − s) per head: far-mass control without any rotation."),
    # zero-mean random increments whose mixing window is just under L (set per size: WINDOW_FRACTION)
    Variant("accum-random", {"rotation": "accum", "increments": "random_position"},
            "Zero-mean random increments with one spread for every pair, mixing window 0.75 L: the regularity "
            "condition holds by construction.", windowed=True),
    # RoPE's angles plus zero-mean jitter: it mixes at the jitter's |φ| exactly like accum-random
    Variant("RoPE+jitter", {"rotation": "accum", "increments": "random_position", "increment_mean": "rope"},
            "RoPE's angles plus zero-mean random jitter of the same spread as accum-random: it mixes at the "
            "jitter's |φ| exactly as accum-random does (the drift changes the phase, not |E[e^{iδ}]|), so the "
            "condition holds; it tests the drift, not the condition.", optional=True, windowed=True),
    # the control that breaks the regularity condition: the spread follows RoPE's ladder, the slow pairs never mix
    Variant("accum-random-ladder", {"rotation": "accum", "increments": "random_position",
                                    "increment_spread": "ladder"},
            "Zero-mean random increments whose spread follows RoPE's ladder (σ_i = σ·ω_i/ω_0): pair 0 mixes within "
            "0.75 L but the slow pairs' windows run far past 64× L, the control that breaks the regularity "
            "condition.", windowed=True),
    Variant("accum-token", {"rotation": "accum", "increments": "random_token"},
            "A frozen random angle table indexed by token id (window 0.75 L when the tokens on a path are "
            "independent).", windowed=True),
    Variant("accum-learned", {"rotation": "accum", "increments": "learned"},
            "Selective RoPE's learned angles: a rank-16 projection of the per-head-normalised input, a width-4 "
            "causal convolution, RoPE's ladder at base 500 000, bounded softly at π."),
    Variant("accum-learned-plain", {"rotation": "accum", "increments": "learned", **PLAIN_LEARNED},
            "accrot's earlier learned angles: one full-rank projection of the raw input with a bias, no "
            "convolution, no ladder, bounded to ±1 rad.", optional=True),
    Variant("accum-learned+values", _LEARNED_VALUES,
            "accum-learned with values transported along the same rotations."),
    # the learned rotation the claims on learned increments are read on: Selective RoPE's form without its ladder,
    # so every pair's bound (π, softly) lets it mix within L; accum-learned stays as the labelled reference row
    Variant("accum-learned-noladder", {"rotation": "accum", "increments": "learned", **NO_LADDER},
            "Selective RoPE's learned angles without RoPE's ladder: every pair bounded softly at π, so every pair "
            "can mix within L (with the ladder, the slow pairs' largest steps keep them coherent past 64× L)."),
    Variant("accum-learned-noladder+values", {**_LEARNED_VALUES, **NO_LADDER},
            "accum-learned-noladder with values transported along the same rotations."),
    Variant("accum-random+values", {"rotation": "accum", "increments": "random_position", "rotate_values": True},
            "accum-random with values transported along the same rotations: value rotation where every pair mixes "
            "by construction.", windowed=True),
    # GRAPE's contextual phase: a learned drift (softplus ≥ 0 on a learnable ladder), which should not mix
    Variant("accum-grape", {"rotation": "accum", "increments": "softplus"},
            "GRAPE's contextual phase: a non-negative softplus rate per token on a learnable RoPE ladder (exclusive "
            "sum), a learned drift whose slow pairs stay coherent: the learned rotation the regularity condition "
            "says should not extrapolate."),
    Variant("PaTH", {"rotation": "path"},
            "fla's PaTH layer: Householder transforms from a rank-32 projection, a width-3 causal convolution with "
            "SiLU and an L2 norm, β = 2·sigmoid."),
    Variant("PaTH-plain", {"rotation": "path", **PLAIN_PATH},
            "accrot's earlier PaTH: w from one full-rank projection of the token alone, no convolution, PyTorch's "
            "default init.", optional=True),
    Variant("PaTH-FoX", {"rotation": "path", "far_mass": "forget"},
            "PaTH with FoX's forget gate (default linear init, as fla builds PaTH-FoX)."),
    # contraction apart from rotation: β ∈ (0, 1) has no negative eigenvalue (it cannot flip a state), β = 2 only
    # reflects (orthogonal, nothing contracts); run with --variants, e.g. on the state-tracking tasks
    Variant("PaTH-contract", {"rotation": "path", "beta_max": 1.0},
            "PaTH with β ∈ (0, 1): every factor only contracts along w (eigenvalues in (0, 1], none negative), as "
            "DeltaNet without negative eigenvalues.", optional=True),
    Variant("PaTH-reflect", {"rotation": "path", "path_beta": "reflection"},
            "PaTH with β = 2 for every token: pure reflections, orthogonal Householder products (no β projection).",
            optional=True),
    # the cells the lower bound points to: accumulated rotations with far-mass control
    Variant("accum-learned+values+forget", {**_LEARNED_VALUES, "far_mass": "forget"},
            "accum-learned+values with FoX's forget gate at its default init (f ≈ 1/2)."),
    Variant("accum-learned+values+forget-alibi-init", {**_LEARNED_VALUES, "far_mass": "forget",
                                                       "forget_init": "alibi"},
            "accum-learned+values with the forget gate initialised as ALiBi exactly: a prior toward a flat curve.",
            optional=True),
    Variant("accum-learned+values+alibi", {**_LEARNED_VALUES, "far_mass": "alibi"},
            "accum-learned+values with ALiBi's fixed bias."),
    Variant("accum-random+alibi", {"rotation": "accum", "increments": "random_position", "far_mass": "alibi"},
            "accum-random with ALiBi's fixed bias.", windowed=True),
    # RoPE trained with a large base (the train-time extension practice)
    Variant("RoPE-base500k", {"rotation": "rope", "rope_base": 500000.0},
            "RoPE with base 500 000, the train-time extension practice.", optional=True),
    # the field's other far-mass designs, alone on RoPE and with the accumulated rotation the lower bound is about:
    # scalable softmax (logits × s·log n), the sigmoid output gate, NoPE/RoPE interleaving (every 2nd layer NoPE,
    # so a 2-layer model has one of each; iRoPE-style 3:1 is layer_pattern [cell, cell, cell, none] from 4 layers)
    Variant("RoPE+ssmax", {"rotation": "rope", "far_mass": "ssmax"},
            "RoPE with scalable softmax: logits times s_h·log n (n keys seen), a learned s per head.", optional=True),
    Variant("RoPE+gate", {"rotation": "rope", "output_gate": "elementwise"},
            "RoPE with a sigmoid gate of the layer input on each head's output (elementwise).", optional=True),
    Variant("RoPE-NoPE-interleaved", {"rotation": "rope", "layer_pattern": ["cell", "none"]},
            "RoPE and NoPE layers alternating (layer pattern cell, none), as iRoPE / RNoPE interleave them.",
            optional=True),
    Variant("accum-learned+values+ssmax", {**_LEARNED_VALUES, "far_mass": "ssmax"},
            "accum-learned+values with scalable softmax.", optional=True),
    Variant("accum-learned+values+gate", {**_LEARNED_VALUES, "output_gate": "elementwise"},
            "accum-learned+values with the elementwise output gate.", optional=True),
))
WINDOW_FRACTION = 0.75  # the windowed variants' mixing window, as a fraction of L: just under the training length

# RoPE's evaluation-time extension rows. No extra training: every complete RoPE run evaluated again
# (accrot/study/extensions.py); the label says what the row is wherever a variant name is printed, a run's
# `extension` field says it to the code
EXTENSION_RECORDS: tuple[Extension, ...] = (Extension("RoPE+PI", "pi"), Extension("RoPE+NTK", "ntk"),
                                            Extension("RoPE+YaRN", "yarn"))

# The data sets' default selections. The local task runs what its claims read (N1's cells, their comparator and
# ALiBi; C4's siblings) and the anchors; the controls that test the theory's condition (RoPE+jitter, the ladder,
# GRAPE, token tables) are read on the corpus's diagnostics. A state-tracking task runs the variants S1–S3 compare:
# the anchors RoPE and NoPE, the SO(2) accumulations (S1, S2), PaTH (S2), and far-mass control with and without
# rotation (S3); flip-flop, where S3 reads far-mass control, also runs the field's other far-mass designs crossed
# with a rotation (a bias, scalable softmax, an output gate, NoPE layers interleaved with RoPE ones). --variants
# runs every named variant on every data set.
LOCAL_VARIANTS = ("NoPE", "RoPE", "ALiBi", "accum-random", "accum-learned", "accum-learned+values", "PaTH",
                  "PaTH-FoX", "accum-learned+values+forget", "accum-learned+values+alibi", "accum-random+alibi")
STATE_BASE = ["NoPE", "RoPE", "accum-learned", "accum-learned+values", "PaTH", "PaTH-FoX", "accum-learned+values+forget"]
STATE_FAR_MASS = ["accum-learned+values+alibi", "accum-learned+values+ssmax", "accum-learned+values+gate",
                  "RoPE-NoPE-interleaved"]
_STATE = {"answers_only": True, "state": True, "variants": tuple(STATE_BASE)}
_FLIPFLOP = {**_STATE, "variants": (*STATE_BASE, *STATE_FAR_MASS)}
_EVERY_BIT = {"data.init_args.query_rate": 1.0}
_WORDS = {"data": "data_modules.WordProblemDataModule", "data.init_args.elements": "generators", **_EVERY_BIT}

# "corpus": the embedded stdlib bytes (the recipe's data); "local": the offset-copy task, where only answers within
# K = 8 tokens are scored and only the distractors grow with the length. The others run when --datasets names them:
# "prose", narrative text (the King James Bible from Debian's bible-kjv); "text", a folder of your own .txt files
# (--text_root); and the retrieval tasks, whose only scored tokens are the answers (accuracy per key depth and
# length: the report's heatmaps; three needles and their question take about 200 bytes, so at L = 128 those tasks
# train at 256); and the state-tracking tasks (bytes, answers only): flip-flop trained at ignore density 0.8 and
# evaluated at the sparse 0.98 ("flipflop") or the dense 0.1 ("flipflop-dense"; the same training), where what grows
# with the length is the far set before each read; parity and counting mod 3 of a bit stream answered after every
# bit, the S3, S5 and A5 word problems (a stream of transpositions or 3-cycles, the running product answered after
# each), where the model does not read the answers, so each needs the whole prefix, which grows with the length;
# and 4-back recall.
DATASET_RECORDS: dict[str, Dataset] = by_name((
    Dataset("corpus", {}, "embedded corpus (Python stdlib bytes)", default=True),
    Dataset("local", {"data": "data_modules.LocalDependencyDataModule"}, "local-dependency task (offset copy)",
            answers_only=True, default=True, variants=LOCAL_VARIANTS),
    Dataset("prose", {"data": "data_modules.KJVDataModule"}, "prose (King James Bible, Debian bible-kjv)"),
    # + data.init_args.root: --text_root
    Dataset("text", {"data": "data_modules.StdlibDataModule", "data.init_args.glob": "**/*.txt"},
            "your text (.txt files, --text_root)"),
    Dataset("passkey", {"data": "data_modules.PasskeyDataModule"}, "passkey retrieval", answers_only=True),
    Dataset("needle", {"data": "data_modules.MultiKeyNeedleDataModule", "data.init_args.n_keys": 3},
            "multi-key needle retrieval", min_seq_len=256, answers_only=True),
    Dataset("multivalue", {"data": "data_modules.MultiValueDataModule"}, "multi-value needle retrieval",
            min_seq_len=256, answers_only=True),
    Dataset("vartrack", {"data": "data_modules.VariableTrackingDataModule"}, "variable tracking", min_seq_len=256,
            answers_only=True),
    Dataset("flipflop", {"data": "data_modules.FlipFlopDataModule", "data.init_args.eval_p_ignore": 0.98},
            "flip-flop, sparse evaluation (ignore density 0.98; trained at 0.8)", **_FLIPFLOP),
    Dataset("flipflop-dense", {"data": "data_modules.FlipFlopDataModule", "data.init_args.eval_p_ignore": 0.1},
            "flip-flop, dense evaluation (ignore density 0.1; trained at 0.8)", **_FLIPFLOP),
    Dataset("parity", {"data": "data_modules.ModCountDataModule", "data.init_args.modulus": 2, **_EVERY_BIT},
            "parity of a bit stream", **_STATE),
    Dataset("modcount", {"data": "data_modules.ModCountDataModule", "data.init_args.modulus": 3, **_EVERY_BIT},
            "counting mod 3 of a bit stream", **_STATE),
    Dataset("s3", {"data": _WORDS["data"], "data.init_args.group": "S3", **_WORDS},
            "S3 word problem (running product of transpositions of 3 objects)", **_STATE),
    Dataset("s5", {"data": _WORDS["data"], "data.init_args.group": "S5", **_WORDS},
            "S5 word problem (running product of transpositions)", **_STATE),
    Dataset("a5", {"data": _WORDS["data"], "data.init_args.group": "A5", **_WORDS},
            "A5 word problem (running product of 3-cycles)", **_STATE),
    Dataset("nback", {"data": "data_modules.NBackDataModule", "data.init_args.n_back": 4,
                      "data.init_args.query_rate": 0.25}, "4-back recall", **_STATE),
    # a Hugging Face data set, bytes-tokenised: `hf:NAME` (a hub name, cached when offline) or `hf:PATH` (local
    # text / JSONL / Parquet files) in --datasets or --corpus; the source becomes data.init_args.path
    Dataset("hf", {"data": "data_modules.HFDataModule"}, "Hugging Face data set (hf:NAME or hf:FILES)"),
))

# Derived views, in record order, for the modules that read a name's one attribute
VARIANTS: dict[str, dict[str, Any]] = {v.name: dict(v.scheme) for v in VARIANT_RECORDS.values()}
DESCRIPTIONS: dict[str, str] = {v.name: v.description for v in VARIANT_RECORDS.values()}
OPTIONAL = tuple(v.name for v in VARIANT_RECORDS.values() if v.optional)
DEFAULT_VARIANTS = [v.name for v in VARIANT_RECORDS.values() if not v.optional]
WINDOWED = tuple(v.name for v in VARIANT_RECORDS.values() if v.windowed)
STATE_VARIANTS = STATE_BASE + STATE_FAR_MASS  # the default selection of a study of state-tracking tasks only
EXTENSIONS: dict[str, str] = {e.label: e.kind for e in EXTENSION_RECORDS}  # row label -> rope_scaling kind
DATASETS: dict[str, dict[str, Any]] = {d.name: dict(d.overrides) for d in DATASET_RECORDS.values()}
DATASET_TITLES: dict[str, str] = {d.name: d.title for d in DATASET_RECORDS.values()}
DEFAULT_DATASETS = tuple(d.name for d in DATASET_RECORDS.values() if d.default)
MIN_SEQ_LEN: dict[str, int] = {d.name: d.min_seq_len for d in DATASET_RECORDS.values() if d.min_seq_len}
STATE_TASKS = tuple(d.name for d in DATASET_RECORDS.values() if d.state)
ANSWER_TASKS = tuple(d.name for d in DATASET_RECORDS.values() if d.answers_only)  # NLL and accuracy of answers only
DATASET_VARIANTS: dict[str, list[str]] = {d.name: list(d.variants) for d in DATASET_RECORDS.values()
                                          if d.variants is not None}


def extension_of(label: str) -> Extension | None:
    """The eval-time extension a row label names (None: a trained variant's name)."""
    return next((e for e in EXTENSION_RECORDS if e.label == label), None)


@dataclass(frozen=True)
class Size:
    """A preset: the shipped config it starts from and what the ablation changes in it."""

    base: str
    seq_len: int
    seeds: int
    lr: float
    overrides: dict[str, Any] = field(default_factory=dict)
    multipliers: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64)
    diagnostics: tuple[float, ...] = (1, 8, 64)
    fresh_draws: int = 32  # increment draws per block for the coherence of random increments (FRESH_DRAWS)
    # blocks per diagnosed length, spread over the validation split: the replicates of each head's window and its
    # jackknife interval (2 blocks would leave 1 degree of freedom)
    diagnostic_blocks: int = 16
    cost: str = ""
    tune_lr: bool = False  # a learning-rate grid per variant before the seeds (`accrot ablation --tune_lr`)
    variants: tuple[str, ...] | None = None  # the preset's own selection when --variants is not given
    datasets: tuple[str, ...] | None = None  # and data sets when --datasets is not given
    diagnose: bool = True  # the theory diagnostics on the claims' data set (off: only the NLL claims are read)


# The default, "study", was chosen by measurement on a quiet 2-core machine (earlier variant selections): the
# tiny recipe at 3 seeds took 37 min and left C1 inside the seeds' spread (4× NLL, accum-random − RoPE:
# −0.22 ± 0.26); at d_model 96 the same 3 seeds resolve it (−0.12 ± 0.09: RoPE's seeds agree more), for 1.35× the
# run time (about 50 min), the cost of a fourth tiny seed. "tiny" is the quick look: half the steps and budget,
# lengths up to 32× and 8 fresh increment draws in the coherence instrument, not 32 (the measured costs: the 64×
# evaluation and the diagnostics' fresh draws are what PaTH and the random variants spend most on).
# The deciding size's variants: C1 (accum-random, RoPE), C2 (the learned rotation whose pairs mix, RoPE; NoPE its
# null), C3 (each +values variant and its q/k-only twin). A 1-seed probe at 300 and 900 steps showed the verdicts'
# directions unmoved by a 3× budget (every learned rotation rises more with it), so seeds, not steps, decide
DECIDING_VARIANTS = ("NoPE", "RoPE", "accum-random", "accum-random+values", "accum-learned-noladder",
                     "accum-learned-noladder+values")
_STUDY_RECIPE = {"model.d_model": 96, "extrapolation.budget_tokens": 32768, "extrapolation.min_blocks": 8}
SIZES: dict[str, Size] = {
    "study": Size(base="tiny", seq_len=128, seeds=3, lr=3e-3, overrides=dict(_STUDY_RECIPE),
                  cost="300 steps per run (d96, 2 layers, L = 128); its default selection, 84 runs, takes about "
                       "50 min with 2 workers on 2 CPU cores (75 runs took 40; the local task's diagnostics add about 4); 3 seeds: every claim at a first "
                       "look; --size decide resolves C1–C3"),
    # C1–C3 decided on 2 cores: the variants they compare (and NoPE, C2's null) on the corpus, at the study's
    # recipe, no theory diagnostics, 10 seeds (a second batch: --seeds 5 first, then the plain command adds 5)
    "decide": Size(base="tiny", seq_len=128, seeds=10, lr=3e-3, overrides=dict(_STUDY_RECIPE),
                   variants=DECIDING_VARIANTS, datasets=("corpus",), diagnose=False,
                   cost="the study's runs (300 steps, d96, 2 layers, L = 128) of the 6 variants C1–C3 compare, 10 "
                        "seeds, no theory diagnostics: 60 runs, about 40 min with 2 workers on 2 CPU cores "
                        "(measured: 19 min for a first batch of 5 seeds, 16 for the second, the report's eval-time "
                        "extension rows included); it resolves C1–C3 (C3 on the random pair; the learned pair's "
                        "seeds-needed lines ask 80–110 seeds at this size, and --seeds N batches resume)"),
    "tiny": Size(base="tiny", seq_len=128, seeds=2, lr=3e-3,
                 overrides={"trainer.max_steps": 150, "trainer.val_check_interval": 75,
                            "extrapolation.budget_tokens": 16384},
                 multipliers=(1, 2, 4, 8, 16, 32), diagnostics=(1, 8, 32), fresh_draws=8,
                 cost="150 steps per run (d64, 2 layers, L = 128, up to 32× L); its default selection, 50 runs, "
                      "takes about 12 min with 2 workers on 2 CPU cores; 2 seeds and half the training: a quick "
                      "look, most verdicts stay inconclusive"),
    # the GPU sizes: 5 seeds (a paired interval over 5 seeds is (t₄/√5)/(t₂/√3) = 0.50 of one over 3), each variant
    # at its own learning rate from a 3-point grid (1 seed; --no_tune_lr: the size's lr for every variant)
    "small": Size(base="small", seq_len=512, seeds=5, lr=1e-3,
                  overrides={"extrapolation.budget_tokens": 131072}, tune_lr=True,
                  cost="5 seeds × every variant × data set of 5000 steps (d256, 6 layers, L = 512), after a 3-point "
                       "learning-rate grid per variant and data set (1 seed, evaluated at 1× only): a GPU; see the "
                       "README"),
    "paper": Size(base="small", seq_len=512, seeds=5, lr=1e-3,
                  overrides={"trainer.max_steps": 20000, "trainer.val_check_interval": 2000,
                             "data.init_args.batch_size": 32, "extrapolation.budget_tokens": 262144}, tune_lr=True,
                  cost="5 seeds × every variant × data set of 20 000 steps × 32 × 512 tokens, after a 3-point "
                       "learning-rate grid per variant and data set (1 seed): a GPU node or a cluster; see the README"),
}

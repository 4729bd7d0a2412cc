"""The study as data: the variants it compares (each a set of ``model.scheme`` overrides and nothing else), the data
sets, and the size presets (the shipped config each starts from, seeds, lengths, and what each was measured to
cost)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# label -> model.scheme overrides. The names are the report's; every variant shares everything else. Each scheme's
# defaults are its reference implementation's (Selective RoPE's learned angles, fla's PaTH layer, FoX's gate:
# accrot/position/config.py); "-plain" marks accrot's earlier, simpler settings, kept as labelled ablations.
PLAIN_LEARNED = {"learned_form": "plain", "increment_rank": 0, "conv_size": 0, "learned_ladder": False,
                 "max_increment": 1.0}
PLAIN_PATH = {"path_rank": 0, "conv_size": 0, "learned_init_std": None}
VARIANTS: dict[str, dict[str, Any]] = {
    "NoPE": {},
    "RoPE": {"rotation": "rope"},
    "ALiBi": {"far_mass": "alibi"},
    # zero-mean random increments whose mixing window is just under L (set per size below)
    "accum-random": {"rotation": "accum", "increments": "random_position"},
    # RoPE's angles plus zero-mean jitter: it mixes at the jitter's |φ| exactly like accum-random
    "RoPE+jitter": {"rotation": "accum", "increments": "random_position", "increment_mean": "rope"},
    # the control that breaks the regularity condition: the spread follows RoPE's ladder, the slow pairs never mix
    "accum-random-ladder": {"rotation": "accum", "increments": "random_position", "increment_spread": "ladder"},
    "accum-token": {"rotation": "accum", "increments": "random_token"},
    "accum-learned": {"rotation": "accum", "increments": "learned"},
    "accum-learned-plain": {"rotation": "accum", "increments": "learned", **PLAIN_LEARNED},
    "accum-learned+values": {"rotation": "accum", "increments": "learned", "rotate_values": True},
    # GRAPE's contextual phase: a learned drift (softplus ≥ 0 on a learnable ladder), which should not mix
    "accum-grape": {"rotation": "accum", "increments": "softplus"},
    "PaTH": {"rotation": "path"},
    "PaTH-plain": {"rotation": "path", **PLAIN_PATH},
    "PaTH-FoX": {"rotation": "path", "far_mass": "forget"},
    # the cells the lower bound points to: accumulated rotations with far-mass control
    "accum-learned+values+forget": {"rotation": "accum", "increments": "learned", "rotate_values": True,
                                    "far_mass": "forget"},
    "accum-learned+values+forget-alibi-init": {"rotation": "accum", "increments": "learned", "rotate_values": True,
                                               "far_mass": "forget", "forget_init": "alibi"},
    "accum-learned+values+alibi": {"rotation": "accum", "increments": "learned", "rotate_values": True,
                                   "far_mass": "alibi"},
    "accum-random+alibi": {"rotation": "accum", "increments": "random_position", "far_mass": "alibi"},
    # RoPE trained with a large base (the train-time extension practice); off by default: --variants adds it
    "RoPE-base500k": {"rotation": "rope", "rope_base": 500000.0},
    # the field's other far-mass designs, alone on RoPE and with the accumulated rotation the lower bound is about:
    # scalable softmax (logits × s·log n), the sigmoid output gate, NoPE/RoPE interleaving (every 2nd layer NoPE,
    # so a 2-layer model has one of each; iRoPE-style 3:1 is layer_pattern [cell, cell, cell, none] from 4 layers)
    "RoPE+ssmax": {"rotation": "rope", "far_mass": "ssmax"},
    "RoPE+gate": {"rotation": "rope", "output_gate": "elementwise"},
    "RoPE-NoPE-interleaved": {"rotation": "rope", "layer_pattern": ["cell", "none"]},
    "accum-learned+values+ssmax": {"rotation": "accum", "increments": "learned", "rotate_values": True,
                                   "far_mass": "ssmax"},
    "accum-learned+values+gate": {"rotation": "accum", "increments": "learned", "rotate_values": True,
                                  "output_gate": "elementwise"},
}
# One sentence per variant, for the report: what it is and, for the controls, which side of the regularity
# condition (every pair mixes: |E[e^{iδ_i}]| < 1 bounded away from 1) it stands on.
DESCRIPTIONS: dict[str, str] = {
    "NoPE": "No position scheme: causal attention alone (the negative control).",
    "RoPE": "Rotary embedding: every pair turns by its fixed frequency ω_i per token, so no pair ever mixes.",
    "ALiBi": "A fixed linear bias −m_h·(t − s) per head: far-mass control without any rotation.",
    "accum-random": "Zero-mean random increments with one spread for every pair, mixing window 0.75 L: the "
                    "regularity condition holds by construction.",
    "RoPE+jitter": "RoPE's angles plus zero-mean random jitter of the same spread as accum-random: it mixes at "
                   "the jitter's |φ| exactly as accum-random does (the drift changes the phase, not |E[e^{iδ}]|), so "
                   "the condition holds; it tests the drift, not the condition.",
    "accum-random-ladder": "Zero-mean random increments whose spread follows RoPE's ladder (σ_i = σ·ω_i/ω_0): pair 0 "
                           "mixes within 0.75 L but the slow pairs' windows run far past 64× L, the control that "
                           "breaks the regularity condition.",
    "accum-token": "A frozen random angle table indexed by token id (window 0.75 L when the tokens on a path are independent).",
    "accum-learned": "Selective RoPE's learned angles: a rank-16 projection of the per-head-normalised input, a "
                     "width-4 causal convolution, RoPE's ladder at base 500 000, bounded softly at π.",
    "accum-learned-plain": "accrot's earlier learned angles: one full-rank projection of the raw input with a bias, "
                           "no convolution, no ladder, bounded to ±1 rad.",
    "accum-learned+values": "accum-learned with values transported along the same rotations.",
    "accum-grape": "GRAPE's contextual phase: a non-negative softplus rate per token on a learnable RoPE ladder "
                   "(exclusive sum), a learned drift whose slow pairs stay coherent: the learned rotation the "
                   "regularity condition says should not extrapolate.",
    "PaTH": "fla's PaTH layer: Householder transforms from a rank-32 projection, a width-3 causal convolution with "
            "SiLU and an L2 norm, β = 2·sigmoid.",
    "PaTH-plain": "accrot's earlier PaTH: w from one full-rank projection of the token alone, no convolution, "
                  "PyTorch's default init.",
    "PaTH-FoX": "PaTH with FoX's forget gate (default linear init, as fla builds PaTH-FoX).",
    "accum-learned+values+forget": "accum-learned+values with FoX's forget gate at its default init (f ≈ 1/2).",
    "accum-learned+values+forget-alibi-init": "accum-learned+values with the forget gate initialised as ALiBi "
                                              "exactly: a prior toward a flat curve.",
    "accum-learned+values+alibi": "accum-learned+values with ALiBi's fixed bias.",
    "accum-random+alibi": "accum-random with ALiBi's fixed bias.",
    "RoPE-base500k": "RoPE with base 500 000, the train-time extension practice.",
    "RoPE+ssmax": "RoPE with scalable softmax: logits times s_h·log n (n keys seen), a learned s per head.",
    "RoPE+gate": "RoPE with a sigmoid gate of the layer input on each head's output (elementwise).",
    "RoPE-NoPE-interleaved": "RoPE and NoPE layers alternating (layer pattern cell, none), as iRoPE / RNoPE interleave them.",
    "accum-learned+values+ssmax": "accum-learned+values with scalable softmax.",
    "accum-learned+values+gate": "accum-learned+values with the elementwise output gate.",
}
# variants `accrot ablation` runs only when --variants names them (the default study fits an hour on 2 CPU cores):
# the earlier settings (to attribute a moved verdict to the parameterisation), the large-base RoPE, the field's other
# far-mass designs, RoPE+jitter (it mixes like accum-random: it tests the drift, not the condition) and the forget gate
# initialised as ALiBi (a prior toward flatness; the default cell takes FoX's own init)
OPTIONAL = ("accum-learned-plain", "PaTH-plain", "RoPE-base500k", "RoPE+ssmax", "RoPE+gate", "RoPE-NoPE-interleaved",
            "accum-learned+values+ssmax", "accum-learned+values+gate", "RoPE+jitter",
            "accum-learned+values+forget-alibi-init")
DEFAULT_VARIANTS = [v for v in VARIANTS if v not in OPTIONAL]
# the local task by default runs what its claims read (N1's cells, their comparator and ALiBi; C4's siblings) and the
# anchors; the controls that test the theory's condition (RoPE+jitter, the ladder, GRAPE, token tables) are read on
# the corpus's diagnostics. --variants runs every named variant on every data set.
DATASET_VARIANTS = {"local": ["NoPE", "RoPE", "ALiBi", "accum-random", "accum-learned", "accum-learned+values", "PaTH",
                              "PaTH-FoX", "accum-learned+values+forget", "accum-learned+values+alibi",
                              "accum-random+alibi"]}
# a study of state-tracking tasks only (`--datasets flipflop parity s3 s5`): the variants S1–S3 compare — the anchors
# RoPE and NoPE, the SO(2) accumulations (S1, S2), PaTH (S2), and far-mass control with and without rotation (S3);
# flip-flop, where S3 reads far-mass control, also runs the field's other far-mass designs crossed with a rotation
# (a bias, scalable softmax, an output gate, NoPE layers interleaved with RoPE ones)
STATE_BASE = ["NoPE", "RoPE", "accum-learned", "accum-learned+values", "PaTH", "PaTH-FoX", "accum-learned+values+forget"]
STATE_FAR_MASS = ["accum-learned+values+alibi", "accum-learned+values+ssmax", "accum-learned+values+gate",
                  "RoPE-NoPE-interleaved"]
STATE_VARIANTS = STATE_BASE + STATE_FAR_MASS
# RoPE's evaluation-time extension rows: row label -> rope_scaling kind (accrot.position.rope_scaling). No extra
# training: every complete RoPE run evaluated again (accrot/study/extensions.py); the label says what the row is
# wherever a variant name is printed
EXTENSIONS = {"RoPE+PI (eval-time extension)": "pi", "RoPE+NTK (eval-time extension)": "ntk",
              "RoPE+YaRN (eval-time extension)": "yarn"}
WINDOWED = ("accum-random", "RoPE+jitter", "accum-random-ladder", "accum-token", "accum-random+alibi")
WINDOW_FRACTION = 0.75  # their mixing window, as a fraction of L: just under the training length

# data set -> overrides. "corpus": the embedded stdlib bytes (the recipe's data); "local": the offset-copy task,
# where only answers within K = 8 tokens are scored and only the distractors grow with the length. The others run
# when --datasets names them: "prose", narrative text (the King James Bible from Debian's bible-kjv); "text", a
# folder of your own .txt files (--text_root); and the retrieval tasks, whose only scored tokens are the answers
# (accuracy per key depth and length: the report's heatmaps); and the state-tracking tasks (bytes, answers only):
# flip-flop trained at ignore density 0.8 and evaluated at the sparse 0.98 ("flipflop") or the dense 0.1
# ("flipflop-dense"; the same training), where what grows with the length is the far set before each read; parity
# and counting mod 3 of a bit stream answered after every bit, the S3, S5 and A5 word problems (a stream of
# transpositions or 3-cycles, the running product answered after each), where the model does not read the answers,
# so each needs the whole prefix, which grows with the length; and 4-back recall.
DATASETS: dict[str, dict[str, Any]] = {
    "corpus": {},
    "local": {"data": "data_modules.LocalDependencyDataModule"},
    "prose": {"data": "data_modules.KJVDataModule"},
    "text": {"data": "data_modules.StdlibDataModule", "data.init_args.glob": "**/*.txt"},  # + root: --text_root
    "passkey": {"data": "data_modules.PasskeyDataModule"},
    "needle": {"data": "data_modules.MultiKeyNeedleDataModule", "data.init_args.n_keys": 3},
    "multivalue": {"data": "data_modules.MultiValueDataModule"},
    "vartrack": {"data": "data_modules.VariableTrackingDataModule"},
    "flipflop": {"data": "data_modules.FlipFlopDataModule", "data.init_args.eval_p_ignore": 0.98},
    "flipflop-dense": {"data": "data_modules.FlipFlopDataModule", "data.init_args.eval_p_ignore": 0.1},
    "parity": {"data": "data_modules.ModCountDataModule", "data.init_args.modulus": 2,
               "data.init_args.query_rate": 1.0},
    "modcount": {"data": "data_modules.ModCountDataModule", "data.init_args.modulus": 3,
                 "data.init_args.query_rate": 1.0},
    "s3": {"data": "data_modules.WordProblemDataModule", "data.init_args.group": "S3",
           "data.init_args.elements": "generators", "data.init_args.query_rate": 1.0},
    "s5": {"data": "data_modules.WordProblemDataModule", "data.init_args.group": "S5",
           "data.init_args.elements": "generators", "data.init_args.query_rate": 1.0},
    "a5": {"data": "data_modules.WordProblemDataModule", "data.init_args.group": "A5",
           "data.init_args.elements": "generators", "data.init_args.query_rate": 1.0},
    "nback": {"data": "data_modules.NBackDataModule", "data.init_args.n_back": 4, "data.init_args.query_rate": 0.25},
    # a Hugging Face data set, bytes-tokenised: `hf:NAME` (a hub name, cached when offline) or `hf:PATH` (local
    # text / JSONL / Parquet files) in --datasets or --corpus; the source becomes data.init_args.path
    "hf": {"data": "data_modules.HFDataModule"},
}
DEFAULT_DATASETS = ("corpus", "local")
# the shortest training length a data set's sequences fit in (its data module says so in one line otherwise):
# three needles and their question take about 200 bytes, so at L = 128 these tasks train at 256
MIN_SEQ_LEN = {"needle": 256, "multivalue": 256, "vartrack": 256}
STATE_TASKS = ("flipflop", "flipflop-dense", "parity", "modcount", "s3", "s5", "a5", "nback")
DATASET_VARIANTS.update({t: STATE_BASE + (STATE_FAR_MASS if t.startswith("flipflop") else []) for t in STATE_TASKS})
ANSWER_TASKS = ("local", "passkey", "needle", "multivalue", "vartrack", *STATE_TASKS)  # NLL and accuracy of answers only
DATASET_TITLES = {
    "corpus": "embedded corpus (Python stdlib bytes)",
    "local": "local-dependency task (offset copy)",
    "prose": "prose (King James Bible, Debian bible-kjv)",
    "text": "your text (.txt files, --text_root)",
    "passkey": "passkey retrieval",
    "needle": "multi-key needle retrieval",
    "multivalue": "multi-value needle retrieval",
    "vartrack": "variable tracking",
    "flipflop": "flip-flop, sparse evaluation (ignore density 0.98; trained at 0.8)",
    "flipflop-dense": "flip-flop, dense evaluation (ignore density 0.1; trained at 0.8)",
    "parity": "parity of a bit stream",
    "modcount": "counting mod 3 of a bit stream",
    "s3": "S3 word problem (running product of transpositions of 3 objects)",
    "s5": "S5 word problem (running product of transpositions)",
    "a5": "A5 word problem (running product of 3-cycles)",
    "nback": "4-back recall",
    "hf": "Hugging Face data set (hf:NAME or hf:FILES)",
}


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


# The default, "study", was chosen by measurement on a quiet 2-core machine (earlier variant selections): the
# tiny recipe at 3 seeds took 37 min and left C1 inside the seeds' spread (4× NLL, accum-random − RoPE:
# −0.22 ± 0.26); at d_model 96 the same 3 seeds resolve it (−0.12 ± 0.09: RoPE's seeds agree more), for 1.35× the
# run time (about 50 min), the cost of a fourth tiny seed. "tiny" is the quick look: half the steps and budget,
# lengths up to 32× and 8 fresh increment draws in the coherence instrument, not 32 (the measured costs: the 64×
# evaluation and the diagnostics' fresh draws are what PaTH and the random variants spend most on).
SIZES: dict[str, Size] = {
    "study": Size(base="tiny", seq_len=128, seeds=3, lr=3e-3,
                  overrides={"model.d_model": 96, "extrapolation.budget_tokens": 32768, "extrapolation.min_blocks": 8},
                  cost="300 steps per run (d96, 2 layers, L = 128); its default selection, 75 runs, takes about "
                       "40 min with 2 workers on 2 CPU cores; 3 seeds: the size measured to resolve the claims on a "
                       "CPU"),
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

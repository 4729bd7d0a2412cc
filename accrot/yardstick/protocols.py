"""The field's protocols as accrot runs them: data, shape, budget, scoring, the published rows and the predictions.

Each :class:`Protocol` writes down every parameter and where it came from (``source``) and what 2 cores cut
(``cut``). The predictions (:func:`predict`) are fixed here, before any result: they follow from the algebra of
each cell's transport alone (``Cell.state``), never from a run.

Scoring: a problem's answer is the argmax of the model's logits over the task's classes only (the suite's models
have an output layer over its classes; a byte model's other 250 logits are not a class), so chance is 1/classes and
the scaled accuracy ``(acc − chance) / (1 − chance)`` is 0 at chance, 1 when every answer is right. Flip-flop
scores every read as a bit (argmax over ``0``/``1``) and reports the error rate, as its authors do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from accrot.yardstick.cells import ABELIAN, CONTRACT, FULL, NONE, Cell
from data_modules import FlipFlopDataModule, FormalLanguageDataModule
from data_modules.examples import scaled_accuracy

LEARNED = 0.9  # scaled accuracy at the training lengths from which a cell "learned the task" (the length gate)
SOLVED = 0.9  # mean scaled accuracy over the test lengths from which a cell "solves it beyond the training lengths"
EVAL_DATA_SEED = 0  # every run is scored on the same examples, whatever its own seed


@dataclass(frozen=True)
class Published:
    """One row of a paper's table, quoted as printed (None: the paper has no such number). Formal languages: ``a``
    the best of the seeds, ``b`` their median; flip-flop: error rates in distribution (``a``), sparse (``b``) and
    dense (``c``), as fractions."""

    model: str
    a: float | None
    b: float | None
    c: float | None
    source: str
    note: str


@dataclass(frozen=True)
class Protocol:
    name: str
    title: str
    kind: str  # "formal" (separate examples, scaled accuracy) or "flipflop" (error rate of reads)
    data: dict  # the data module's arguments (its seed is the run's)
    shape: dict  # d_model, n_layers, n_heads
    steps: int
    batch_size: int
    lrs: tuple[float, ...]  # the grid, tried on seed 0; seeds 1.. use the best at the training lengths
    warmup_steps: int
    train_sizes: tuple[int, ...] = ()  # formal: sizes scored as "at the training lengths"
    test_sizes: tuple[int, ...] = ()  # formal: sizes scored as "beyond" (their mean is the headline)
    eval_count: int = 128  # examples per size (formal) or sequences per density (flip-flop)
    densities: tuple[float, ...] = ()  # flip-flop: ignore densities evaluated (the first is the training one)
    source: str = ""  # where the parameters come from
    cut: str = ""  # what 2 cores cut from the paper's budget
    published: tuple[Published, ...] = ()
    default: bool = True  # in `accrot yardstick`'s default selection
    metric: str = "scaled accuracy"
    clock: str | None = None  # the task's exact clock (controls.CLOCKS); None: no fixed transport is exact here
    deviation: str = ""  # how this protocol departs from the published one (empty: it is the published one)

    def data_module(self, seed: int, **over):
        data = dict(self.data)
        fractions = data.pop("curriculum_fractions", None)
        if fractions is not None:  # stages at fractions of this protocol's steps (so --steps keeps their shape)
            data["curriculum"] = [[round(f * self.steps), lo, hi] for f, lo, hi in fractions]
        if self.kind == "formal":
            return FormalLanguageDataModule(**data, batch_size=self.batch_size, seed=seed, **over)
        return FlipFlopDataModule(**data, batch_size=self.batch_size, seed=seed, **over)

    @property
    def modulus(self) -> int:
        """Classes of a formal task (chance is 1/modulus)."""
        return 2 if self.data.get("task") == "parity" else 5

    def groups(self) -> dict[str, Sequence]:
        """The evaluation groups: ``train`` (the gate) and ``test`` (the headline), by size or density."""
        if self.kind == "formal":
            return {"train": self.train_sizes, "test": self.test_sizes}
        return {"train": self.densities[:1], "test": self.densities[1:]}


# --- scoring ---------------------------------------------------------------------------------------------------


@torch.no_grad()
def score_formal(model, protocol: Protocol, batch: int = 64) -> dict[str, float]:
    """``{str(size): accuracy}`` at every train and test size, on the shared evaluation examples."""
    dm = protocol.data_module(EVAL_DATA_SEED)
    classes = torch.tensor(dm.task.classes)
    out = {}
    for size in sorted({*protocol.train_sizes, *protocol.test_sizes}):
        inputs, targets, n = dm.eval_examples(size, protocol.eval_count)
        right = 0
        for i in range(0, len(inputs), batch):
            x, y = inputs[i:i + batch], targets[i:i + batch, n + 1]
            logits = model(x)[:, n + 1, classes]  # [b, classes]
            right += int((classes[logits.argmax(-1)] == y).sum())
        out[str(size)] = right / len(inputs)
    return out


@torch.no_grad()
def score_flipflop(model, protocol: Protocol, batch: int = 16) -> dict[str, float]:
    """``{str(density): read accuracy}`` at the training length, one evaluation set per ignore density."""
    bits = torch.tensor([ord("0"), ord("1")])
    out = {}
    for p in protocol.densities:
        dm = protocol.data_module(EVAL_DATA_SEED, eval_p_ignore=p)
        length = dm.seq_len
        blocks, mask = dm.eval_set(length, length * protocol.eval_count, record=False)
        right = total = 0
        for i in range(0, len(blocks), batch):
            b, m = blocks[i:i + batch], mask[i:i + batch]
            logits = model(b[:, :-1])[..., bits]  # [b, T, 2]
            pred = bits[logits.argmax(-1)]
            right += int(((pred == b[:, 1:]) & m).sum())
            total += int(m.sum())
        out[str(p)] = right / total
    return out


def score(model, protocol: Protocol) -> dict[str, float]:
    return score_formal(model, protocol) if protocol.kind == "formal" else score_flipflop(model, protocol)


def headline(protocol: Protocol, accuracy: dict[str, float], group: str) -> float:
    """The group's mean: scaled accuracy (formal) or error rate of the reads (flip-flop)."""
    keys = [str(k) for k in protocol.groups()[group]]
    values = [accuracy[k] for k in keys]
    if protocol.kind == "formal":
        return sum(scaled_accuracy(v, protocol.modulus) for v in values) / len(values)
    return sum(1 - v for v in values) / len(values)


# --- predictions, fixed before any result ---------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    beyond: str  # "yes" (solves it beyond the training lengths), "no", or "open" (the algebra allows, not forces)
    why: str


_MONOID = ("the automaton's transition monoid is solvable: translations mod 5 (+, −), the units of Z5 acting by "
           "multiplication (a cyclic group of order 4) and the reset × 0, so by Krohn–Rhodes a cascade of abelian "
           "groups and resets carries it, each layer reading the one below")
_PREDICT: dict[str, dict[str, Prediction]] = {
    "parity": {
        NONE: Prediction("no", "no running state: attention reads the share of b's, whose parity is lost once the "
                               "count exceeds what training resolved"),
        ABELIAN: Prediction("yes", "a half turn per b and none per a is an exact parity clock at any length (SO(2) "
                                   "rotations commute; parity is abelian)"),
        FULL: Prediction("yes", "a reflection (β → 2) per b flips the key's sign: (−1)^count at any length"),
        CONTRACT: Prediction("no", "eigenvalues in [0, 1) cannot flip a sign: products that only contract cannot "
                                   "count mod 2 (Grazzi et al., Theorem 1)"),
    },
    "modsum": {
        NONE: Prediction("no", "no running state: the sum mod 5 of n digits is lost once the share of each digit "
                               "no longer resolves it"),
        ABELIAN: Prediction("yes", "a turn of 2πd/5 per digit d is an exact clock of the sum mod 5 at any length"),
        FULL: Prediction("open", "a single reflection has order 2; a product of reflections along varying w can "
                                 "be a rotation of order 5 in a plane, which a learned w may or may not find"),
        CONTRACT: Prediction("no", "contractions have no eigenvalue on the unit circle but 1: they cannot count "
                                   "mod 5 (Grazzi et al.; Sarrof et al. 2024 for diagonal ones)"),
    },
    "modarith": {
        NONE: Prediction("no", "no running state: the value depends on every digit and operator in order"),
        ABELIAN: Prediction("open", f"{_MONOID}; commuting layers can be such a cascade (Mamba-3's complex-diagonal "
                                    "row reaches 0.985 with 3 layers): open with two or more layers, what the run "
                                    "shows is whether these learn it"),
        FULL: Prediction("open", f"{_MONOID}; non-commuting products hold the cascade in fewer layers (DeltaNet "
                                 "[−1, 1]: 0.971 with 3 layers): open with two or more layers"),
        CONTRACT: Prediction("no", "contractions alone carry only aperiodic (star-free) state, and the sum mod 5 is "
                                   "a cyclic group (Sarrof et al. 2024; DeltaNet [0, 1]: 0.314)"),
    },
    "modarith-brackets": {
        k: Prediction("no", "a context-free language: its state is a stack whose depth grows with the length, which "
                            "no fixed-size transport carries at every length") for k in (NONE, ABELIAN, FULL, CONTRACT)
    },
    "flipflop": {
        NONE: Prediction("open", "the latest write is a lookup, not a state: any cell can learn it; sparse reads "
                                 "(long gaps) and dense ones (many writes) are where Transformers glitch"),
        ABELIAN: Prediction("open", "as NoPE: a commuting rotation adds no way to forget an overwritten bit"),
        FULL: Prediction("yes", "a write's Householder factor can erase the older write along w (the PaTH authors' "
                                "explanation of their near-zero flip-flop error)"),
        CONTRACT: Prediction("yes", "contraction along w is exactly an erase (a delta-rule overwrite)"),
    },
}


def task_of(protocol: Protocol) -> str:
    """The prediction table a protocol reads: its task, a sum of digits being ``modsum``."""
    if protocol.kind != "formal":
        return "flipflop"
    if protocol.clock == "modsum":
        return "modsum"
    return protocol.data["task"]


def applies(protocol: Protocol, cell: Cell) -> bool:
    """A control runs only where its fixed transport is defined (a protocol with an exact clock)."""
    return not cell.control or protocol.clock is not None


def predict(protocol: Protocol, cell: Cell) -> Prediction:
    task = task_of(protocol)
    if cell.control:
        return _predict_control(protocol, cell)
    p = _PREDICT[task][cell.state]
    if task == "modarith" and cell.state in (ABELIAN, FULL) and protocol.shape["n_layers"] < 2:
        return Prediction("no", "one layer is no cascade: a single commuting (or single-layer) transport cannot "
                                "hold the reset and the multiplication's action together")
    if cell.name == "accum-token" and task in ("parity", "modsum"):
        return Prediction("no", "a frozen random table, never trained: a state only where its draw happens to turn "
                                "each symbol by its exact angle on some pair")
    return p


def _predict_control(protocol: Protocol, cell: Cell) -> Prediction:
    n = protocol.modulus
    if cell.control == "clock":
        return Prediction("yes", f"the exact clock is pinned (a turn of 2π·count/{n} per symbol): the state is in "
                                 "the transport at every length; only the readout is learned")
    if n == 2:
        return Prediction("yes", "a reflection along a fixed w per b is pinned: (−1)^count along w at any length")
    return Prediction("no", f"a reflection has order 2: pinned on the odd digits it carries the sum mod 2, not mod {n}"
                            " (a negative control)")


# --- the protocols ----------------------------------------------------------------------------------------------

_GRAZZI = ('Grazzi et al., "Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues" (ICLR 2025), '
           "Appendix E.1: tasks of Delétang et al.'s suite, trained on lengths 3–40, tested on 40–256, scaled "
           "accuracy, best (Table 3) and median (Table 5) of 3 seeds; AdamW, weight decay 0.1, cosine schedule after "
           "10 % warm-up, 100k steps of batch 1024, learning rates 1e-2, 1e-3, 5e-4, 1e-4; parity 2 layers of width "
           "128, modular arithmetic 3 layers")
_GRAZZI_CUT = ("Cut for 2 cores: 2 000 steps of batch 32 (1/1 600 of the paper's examples), width 64, 2 layers for "
               "every task; tested at 6 sizes of 128 examples each instead of 8 192 sequences")
_TABLE3, _TABLE5 = "Grazzi et al. 2025, Table 3 (best of 3)", "Table 5 (median of 3)"


def _grazzi(task: int) -> tuple[Published, ...]:
    """Grazzi et al.'s Table 3 (best of 3 seeds) and Table 5 (median) rows, column ``task`` (0 parity, 1 modular
    arithmetic without brackets, 2 with)."""
    best = {"Transformer": (0.022, 0.031, 0.067), "mLSTM": (0.087, 0.040, 0.114), "sLSTM": (1.000, 0.787, 0.178),
            "Mamba [0,1]": (0.000, 0.095, 0.123), "Mamba [−1,1]": (1.000, 0.241, 0.116),
            "DeltaNet [0,1]": (0.017, 0.314, 0.194), "DeltaNet [−1,1]": (1.000, 0.971, 0.260)}
    median = {"Transformer": (0.003, 0.018, 0.064), "mLSTM": (0.018, 0.027, 0.114), "sLSTM": (1.000, 0.124, 0.163),
              "Mamba [0,1]": (0.000, 0.066, 0.116), "Mamba [−1,1]": (1.000, 0.214, 0.098),
              "DeltaNet [0,1]": (0.010, 0.214, 0.162), "DeltaNet [−1,1]": (0.999, 0.826, 0.227)}
    return tuple(Published(m, best[m][task], median[m][task], None, _TABLE3, _TABLE5) for m in best)


_MAMBA3 = ('Lahoti et al., "Mamba-3: Improved Sequence Modeling using State Space Principles" (2026), Appendix D: a '
           "length curriculum, shortest 3, longest growing from 40 to 160, 10^4 steps per curriculum of batch 256, "
           "evaluated at 256; 1 layer for parity, 3 for modular arithmetic; d_model 32 or 64 and 8 learning rates "
           "log-spaced in [1e-4, 1e-2], the best validation accuracy reported (the stages and the seeds are not "
           "stated)")
_MAMBA3_CUT = ("The stages are accrot's choice (the paper does not state them): longest 40, 80, 120, 160 in four "
               "equal stages; cut for 2 cores to 500 steps per stage of batch 32, width 64")


def _mamba3(task: int) -> tuple[Published, ...]:
    rows = {"Mamba-3": (100.00, 98.51, 87.75), "Mamba-3 (w/ Std. RoPE)": (1.56, 20.70, 2.62),
            "Mamba-3 (w/o RoPE)": (2.27, 1.49, 0.72), "Mamba-2": (0.90, 47.81, 0.88),
            "GDN [−1,1]": (100.00, 99.25, 93.50)}
    return tuple(Published(m, v[task] / 100, None, None, "Lahoti et al. 2026, Table 5 (right), in %", "")
                 for m, v in rows.items())


_FORMAL = {
    "shape": {"d_model": 64, "n_layers": 2, "n_heads": 4},
    "steps": 2000, "batch_size": 32, "lrs": (3e-3, 1e-3), "warmup_steps": 50,
    "train_sizes": (3, 10, 20, 30, 40), "test_sizes": (40, 64, 96, 128, 192, 256),
    "source": _GRAZZI, "cut": _GRAZZI_CUT,
}
_STAGES = [[0, 3, 40], [500, 3, 80], [1000, 3, 120], [1500, 3, 160]]
_CURRICULUM = {
    "steps": 2000, "batch_size": 32, "lrs": (3e-3, 1e-3), "warmup_steps": 50,
    "train_sizes": (3, 40, 80, 120, 160), "test_sizes": (256,), "source": _MAMBA3, "cut": _MAMBA3_CUT,
    "default": False,
}
_DENSE_STAGES = [[0.0, 1, 10], [0.25, 1, 20], [0.5, 1, 40]]  # fractions of the steps, shortest 1
_DENSE = ("Deviations from the published protocol, labelled: (1) a short-first length curriculum starting below the "
          "published minimum of 3: sizes 1–10 for the first quarter of the steps, 1–20 for the second, 1–40 after; "
          "(2) dense prefix labels in training: the position reading symbol i is trained on the answer of symbols "
          "1..i (Grazzi et al. §5.2 and Merrill et al. supervise every prefix of their word problems). The inputs, "
          "the test sizes and the scoring (the final answer only) are the published ones")
_SUM = ("Counting mod 5 as a formal language: Delétang et al.'s modular arithmetic without brackets restricted to "
        "the operator +, so the answer is the sum of the digits mod 5, an abelian state whose exact clock turns digit "
        "d by 2πd/5; sizes and scoring as Grazzi et al.'s (no published row: no paper runs this restriction)")
PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (
    Protocol("parity", "Parity (regular)", "formal", {"task": "parity", "train_lengths": [3, 40]},
             published=_grazzi(0), clock="parity", **_FORMAL),
    Protocol("parity-dense", "Parity, learnable protocol (curriculum from size 1, dense prefix labels)", "formal",
             {"task": "parity", "prefix_labels": True, "curriculum_fractions": _DENSE_STAGES},
             published=_grazzi(0), clock="parity", deviation=_DENSE, default=False,
             **{**_FORMAL, "source": _GRAZZI + ". " + _DENSE}),
    Protocol("modsum", "Counting mod 5 (sums of digits, + only)", "formal",
             {"task": "modarith", "operators": "+", "train_lengths": [3, 40]}, clock="modsum",
             deviation="a restriction of the published task to one operator", default=False,
             **{**_FORMAL, "source": _SUM}),
    Protocol("modsum-dense", "Counting mod 5, learnable protocol (curriculum from size 1, dense prefix labels)",
             "formal", {"task": "modarith", "operators": "+", "prefix_labels": True,
                        "curriculum_fractions": _DENSE_STAGES},
             clock="modsum", deviation=_DENSE, default=False, **{**_FORMAL, "source": _SUM + ". " + _DENSE}),
    Protocol("modarith-dense", "Modular arithmetic without brackets, learnable protocol (curriculum from size 1, "
             "dense prefix labels)", "formal",
             {"task": "modarith", "prefix_labels": True, "curriculum_fractions": _DENSE_STAGES},
             published=_grazzi(1), deviation=_DENSE, default=False, **{**_FORMAL, "source": _GRAZZI + ". " + _DENSE}),
    Protocol("modarith", "Modular arithmetic without brackets (regular)", "formal",
             {"task": "modarith", "train_lengths": [3, 40]}, published=_grazzi(1), **_FORMAL),
    Protocol("modarith-brackets", "Modular arithmetic with brackets (context-free)", "formal",
             {"task": "modarith-brackets", "train_lengths": [3, 40]}, published=_grazzi(2), **_FORMAL),
    Protocol("flipflop", "Flip-flop language modelling", "flipflop",
             {"seq_len": 128, "p_ignore": 0.8}, shape={"d_model": 64, "n_layers": 1, "n_heads": 2},
             steps=1000, batch_size=16, lrs=(3e-3, 1e-3), warmup_steps=50, densities=(0.8, 0.98, 0.1), eval_count=256,
             metric="read error rate",
             source='Liu et al., "Exposing Attention Glitches with Flip-Flop Language Modeling" (NeurIPS 2023): '
                    "FFL(0.8) (256 instructions, 80 % ignore, 10 % read, 10 % write) for training, evaluated in "
                    "distribution, sparse FFL(0.98) and dense FFL(0.1); the PaTH authors' shape (Table 1: 1 layer, "
                    "2 heads, width 64)",
             cut="Cut for 2 cores: 64 instructions per sequence (128 tokens) instead of 256, 1 000 steps of batch 16; "
                 "the PaTH authors' training budget is not stated; 256 evaluation sequences per density",
             published=(Published("RoPE", 0.069, 0.403, 0.0001, "Yang et al. 2025 (PaTH), Table 1", "in %: 6.9 / "
                                  "40.3 / 0.01"),
                        Published("SBA", 0.096, 0.389, 0.0, "Yang et al. 2025 (PaTH), Table 1", "9.6 / 38.9 / 0"),
                        Published("FoX", 0.083, 0.363, 0.0, "Yang et al. 2025 (PaTH), Table 1", "8.3 / 36.3 / 0"),
                        Published("PaTH", 0.0, 0.000001, 0.0, "Yang et al. 2025 (PaTH), Table 1",
                                  "0 / 0.0001 / 0"))),
    Protocol("parity-curriculum", "Parity with a length curriculum (Mamba-3's protocol)", "formal",
             {"task": "parity", "curriculum": _STAGES}, shape={"d_model": 64, "n_layers": 1, "n_heads": 4},
             published=_mamba3(0), **_CURRICULUM),
    Protocol("modarith-curriculum", "Modular arithmetic with a length curriculum (Mamba-3's protocol)", "formal",
             {"task": "modarith", "curriculum": _STAGES}, shape={"d_model": 64, "n_layers": 3, "n_heads": 4},
             published=_mamba3(1), **_CURRICULUM),
)}
DEFAULT_PROTOCOLS = tuple(name for name, p in PROTOCOLS.items() if p.default)

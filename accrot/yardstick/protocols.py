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
    """One row of a paper's table, quoted: ``value`` as printed (None: the paper has no such column)."""

    model: str
    best: float | None
    mean: float | None
    paper: str
    table: str


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

    def data_module(self, seed: int, **over):
        if self.kind == "formal":
            return FormalLanguageDataModule(**self.data, batch_size=self.batch_size, seed=seed, **over)
        return FlipFlopDataModule(**self.data, batch_size=self.batch_size, seed=seed, **over)

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
        n = 2 if protocol.data.get("task") == "parity" else 5
        return sum(scaled_accuracy(v, n) for v in values) / len(values)
    return sum(1 - v for v in values) / len(values)


# --- predictions, fixed before any result ---------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    beyond: str  # "yes" (solves it beyond the training lengths), "no", or "open" (the algebra allows, not forces)
    why: str


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
    "modarith": {
        NONE: Prediction("no", "no running state"),
        ABELIAN: Prediction("no", "× and + do not commute (× 0 resets the state): a commuting rotation can carry a "
                                  "sum mod 5 but not this automaton"),
        FULL: Prediction("open", "non-commuting products with negative eigenvalues can represent the automaton's "
                                 "transitions with enough layers (Grazzi et al.), which 2 layers may not reach"),
        CONTRACT: Prediction("no", "contractions cannot represent a permutation of the state"),
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


def predict(protocol: Protocol, cell: Cell) -> Prediction:
    table = _PREDICT[protocol.data.get("task", "flipflop") if protocol.kind == "formal" else "flipflop"]
    p = table[cell.state]
    if cell.name == "accum-token" and protocol.data.get("task") == "parity":
        return Prediction("no", "a frozen random table, never trained: a state only where its draw turns b "
                                "against a by about π on some pair")
    return p


# --- the protocols ----------------------------------------------------------------------------------------------

_GRAZZI = ('Grazzi et al., "Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues" (ICLR 2025): '
           "tasks of Delétang et al.'s suite, trained on lengths 3–40, tested on 40–256, scaled accuracy averaged "
           "over the test lengths, best of 3 seeds")
_FORMAL = {
    "shape": {"d_model": 64, "n_layers": 2, "n_heads": 4},
    "steps": 2000, "batch_size": 32, "lrs": (3e-3, 1e-3), "warmup_steps": 50,
    "train_sizes": (3, 10, 20, 30, 40), "test_sizes": (40, 64, 96, 128, 192, 256),
    "source": _GRAZZI,
    "cut": "",
}
PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (
    Protocol("parity", "Parity (regular)", "formal", {"task": "parity", "train_lengths": [3, 40]}, **_FORMAL),
    Protocol("modarith", "Modular arithmetic without brackets (regular)", "formal",
             {"task": "modarith", "train_lengths": [3, 40]}, **_FORMAL),
    Protocol("modarith-brackets", "Modular arithmetic with brackets (context-free)", "formal",
             {"task": "modarith-brackets", "train_lengths": [3, 40]}, **_FORMAL),
    Protocol("flipflop", "Flip-flop language modelling", "flipflop",
             {"seq_len": 128, "p_ignore": 0.8}, shape={"d_model": 64, "n_layers": 1, "n_heads": 2},
             steps=1000, batch_size=16, lrs=(3e-3, 1e-3), warmup_steps=50, densities=(0.8, 0.98, 0.1), eval_count=256,
             metric="read error rate",
             source='Liu et al., "Exposing Attention Glitches with Flip-Flop Language Modeling" (NeurIPS 2023): '
                    "FFL(0.8) for training, evaluated in distribution, sparse FFL(0.98) and dense FFL(0.1); the "
                    "1-layer, 2-head shape of the PaTH authors' flip-flop experiment"),
)}
DEFAULT_PROTOCOLS = tuple(name for name, p in PROTOCOLS.items() if p.default)

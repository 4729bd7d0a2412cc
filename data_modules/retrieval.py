"""RULER-style retrieval tasks: multi-key needles, multi-value needles and variable tracking.

Byte-level tasks (vocab 256, :class:`ByteTokenizer`) in the passkey filler of :mod:`data_modules.synthetic`, with
its generation machinery: sample i of (task, seed, split, length) comes from the same ``_generator``, batches are
``(inputs [B, T], targets [B, T])`` int64 with ``targets = -100`` off the answers, evaluation block i is the same
whatever the budget, and the fingerprint (task, parameters, seed, ``GENERATOR_VERSION``, sample bytes) is the
base class's.

Common layout. A sequence of n = ℓ + 1 bytes is ``filler`` with k *needles* (whole sentences) inserted at k
distinct sentence boundaries P_1 < … < P_k of the filler, then a question and the answer:
``filler[:P_1] + N_1 + filler[P_1:P_2] + N_2 + … + N_k + filler[P_k:] + QUERY + answer``. ``filler`` is
synthetic.py's (the last F bytes of :data:`FILLER` repeated) and its boundaries are ``_boundaries(F)`` (every
whole sentence's start, and F), where F = n − (the needles, the question and the answer); every needle has a
fixed length, so F depends only on ℓ and the task's parameters. One needle *anchors* the depth. For evaluation
block i it sits at the boundary nearest to ``depths[i % len(depths)] · F`` (ties: the earlier) among the
boundaries that leave room for the needles that must follow it (the multi-value and variable-tracking tasks; so
within one sentence, ≤ 22 bytes, of its depth unless the depth is within those needles' sentences of the end);
for training it is uniform over the same boundaries; all other draws are the same in both splits. Only the
answer's digits are scored. Values are ``digits`` uniform decimal digits; the scored values are split once for
all seeds as the pass keys are: a value is reserved for evaluation iff ``sha256(value)[0] < 32`` (1/8), and a
scored value is redrawn until it is reserved iff the split is not ``train`` (:func:`is_eval_value`), so no
training answer is ever an evaluation answer.

**Multi-key needles** (:class:`MultiKeyNeedleDataModule`, task ``multikey_needle``). ``n_keys`` needles
``"The magic number for {name} is {value}. "``; the names are distinct, a uniformly drawn ordered subset of
the 16 four-letter words :data:`NAMES` (the first one drawn is queried). The queried needle is the anchor; the
others go to distinct boundaries drawn uniformly from the rest. The queried value is drawn from the split's
values; the others uniformly from all values, all values distinct. The question is
``"What is the magic number for {name}? The magic number for {name} is "`` and the answer the queried value.

**Multi-value needles** (:class:`MultiValueDataModule`, task ``multivalue_needle``). One name, uniform over
:data:`NAMES`, with ``n_values`` needles ``"The magic number for {name} is {value}. "`` of distinct values, each
drawn from the split's values. The first needle is the anchor (among the boundaries with at least
``n_values − 1`` after it); the others go to ``n_values − 1`` distinct boundaries drawn uniformly from the later
ones. The question is ``"What are all the magic numbers for {name}? They are "`` and the answer the values in
order of appearance joined by ``", "``; every digit is scored, the separators are not.

**Variable tracking** (:class:`VariableTrackingDataModule`, task ``variable_tracking``). ``n_chains`` chains of
``hops`` assignments ``"VAR {X_1} = {value}. "``, ``"VAR {X_2} = {X_1}. "``, …, ``"VAR {X_h} = {X_(h-1)}. "``;
the ``hops · n_chains`` names are distinct uniform three-letter uppercase strings (never ``VAR``), the values
distinct, the queried chain's (chain 0) from the split's values, the others' uniform over all values. Chain 0's
first assignment is the anchor (among the boundaries with at least ``hops − 1`` after it) and its other
assignments go to ``hops − 1`` distinct boundaries drawn uniformly from the later ones; the other chains'
``(n_chains − 1) · hops`` assignments go to distinct boundaries drawn uniformly from the remaining ones, each
chain's in order (so the chains interleave). The question is ``"What is the value of {X_h}? {X_h} = "`` and the
answer chain 0's value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from accrot.errors import DataError
from data_modules.streams import check_int
from data_modules.synthetic import (
    EVAL_KEY_BYTE,
    FILLER,
    DepthTaskDataModule,
    PasskeyTask,
    _boundaries,
    _filler,
)
from data_modules.tokenizer import ByteTokenizer

NAMES = ("bear", "bird", "boat", "cake", "coin", "desk", "drum", "fish",
         "frog", "gold", "lamp", "leaf", "moon", "rock", "ship", "wolf")  # same length: fixed-size needles
NEEDLE = "The magic number for {name} is {value}. "
KEY_QUERY = "What is the magic number for {name}? The magic number for {name} is "
VALUES_QUERY = "What are all the magic numbers for {name}? They are "
VALUE_SEPARATOR = ", "
ASSIGNMENT = "VAR {name} = {value}. "  # value: the chain's digits (first hop) or the previous name
TRACK_QUERY = "What is the value of {name}? {name} = "
VARIABLE_LETTERS = 3
MAX_DIGITS = 32
MAX_NEEDLES = 16  # per count argument (n_keys is bounded by len(NAMES) too)

_SENTENCES = tuple(len(s) + 2 for s in FILLER.split(". ") if s)  # bytes of each FILLER sentence, ". " included


def _min_filler(count: int) -> int:
    """The smallest F whose filler ``_filler(F)`` has ``count`` sentence boundaries (F itself is always one).

    The filler ends on a sentence end, so it is the last ``count − 1`` sentences of FILLER repeated.
    """
    back = _SENTENCES[::-1]
    return sum(back[i % len(back)] for i in range(count - 1))


def is_eval_value(value: str) -> bool:
    """Whether a value is reserved for evaluation: the pass-key split, ``sha256(value)[0] < 32`` (1/8 of values)."""
    return PasskeyTask.is_eval_key(value)


def _draw_value(g: torch.Generator, digits: int, taken: set[str], split: str | None) -> str:
    """``digits`` uniform decimal digits not in ``taken`` (added to it); ``split`` set: one of that split's values."""
    while True:  # 8/7 draws on average for a training value, 8 for an evaluation value
        value = "".join(map(str, torch.randint(10, (digits,), generator=g).tolist()))
        if value not in taken and (split is None or is_eval_value(value) == (split != "train")):
            taken.add(value)
            return value


def _pick(g: torch.Generator, pool: Sequence[int], k: int) -> list[int]:
    """``k`` distinct elements of ``pool``, a uniformly drawn ordered subset."""
    return [pool[j] for j in torch.randperm(len(pool), generator=g)[:k].tolist()]


def _anchor(g: torch.Generator | None, bounds: Sequence[int], F: int, room: int, depth: float | None) -> int:
    """Index into ``bounds`` of the anchor needle, leaving ``room`` boundaries after it: nearest to depth·F (ties:
    the earlier), or uniform for ``depth=None`` (training; the only case that draws from ``g``)."""
    allowed = len(bounds) - room  # >= 1: the length check guarantees enough boundaries
    if depth is None:
        return int(torch.randint(allowed, (), generator=g))
    return min(range(allowed), key=lambda j: (abs(bounds[j] - depth * F), bounds[j]))


def _compose(
    F: int, needles: dict[int, str], query: str, answer: str, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x [ℓ+1], mask [ℓ])``: the filler of F bytes with ``needles`` (boundary → sentence) inserted, the query
    and the answer; the mask marks the answer's digits in targets = x[1:]."""
    f, parts, at = _filler(F), [], 0
    for P in sorted(needles):
        parts += [f[at:P], needles[P].encode()]
        at = P
    text = b"".join([*parts, f[at:], query.encode(), answer.encode()])
    x = torch.tensor(list(text), dtype=torch.long)  # [ℓ+1]
    mask = torch.zeros(length, dtype=torch.bool)
    mask[length - len(answer) :] = torch.tensor([c.isdigit() for c in answer])  # target ℓ-a+k is answer[k]
    return x, mask


def _depth(depths: tuple[float, ...], split: str, index: int) -> float | None:
    return None if split == "train" else depths[index % len(depths)]


# ---------------------------------------------------------------------------------------------------
# the tasks: pure, picklable sample generators
# ---------------------------------------------------------------------------------------------------
class _NeedleLayout:
    """What the three tasks share, from their ``needles``, ``room`` (boundaries the anchor leaves after it) and
    ``fixed_bytes`` (everything that is not filler): the shortest length, the filler size and the anchor's offset."""

    @property
    def min_length(self) -> int:
        return self.fixed_bytes + _min_filler(self.needles) - 1  # n = ℓ + 1 bytes, a boundary per needle

    def filler_bytes(self, length: int) -> int:
        return length + 1 - self.fixed_bytes

    def anchor_position(self, length: int, depth: float) -> int:
        """Filler offset of the anchor (the queried needle, the first value, the queried chain's first assignment)
        of an evaluation block at ``depth``."""
        F = self.filler_bytes(length)
        bounds = _boundaries(F)
        return bounds[_anchor(None, bounds, F, self.room, depth)]


@dataclass(frozen=True)
class MultiKeyTask(_NeedleLayout):
    """The multi-key needle generator (module docstring)."""

    n_keys: int
    digits: int
    depths: tuple[float, ...]

    name = "multikey_needle"
    vocab_size = 256

    @property
    def needles(self) -> int:
        return self.n_keys

    @property
    def room(self) -> int:
        return 0  # boundaries the anchor must leave after it

    @property
    def fixed_bytes(self) -> int:
        """Bytes that are not filler: the needles, the question and the answer."""
        needle = len(NEEDLE.format(name=NAMES[0], value="0" * self.digits))
        return self.n_keys * needle + len(KEY_QUERY.format(name=NAMES[0])) + self.digits

    def sample(self, g: torch.Generator, length: int, split: str, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x [ℓ+1] int64 bytes, mask [ℓ] bool)``; evaluation block ``index`` sits at depths[index % len]."""
        names = [NAMES[j] for j in torch.randperm(len(NAMES), generator=g)[: self.n_keys].tolist()]  # [0]: queried
        taken: set[str] = set()
        values = [_draw_value(g, self.digits, taken, split)]
        values += [_draw_value(g, self.digits, taken, None) for _ in range(self.n_keys - 1)]
        F = self.filler_bytes(length)
        bounds = _boundaries(F)
        a = _anchor(g, bounds, F, self.room, _depth(self.depths, split, index))
        positions = [bounds[a], *_pick(g, bounds[:a] + bounds[a + 1 :], self.n_keys - 1)]
        needles = {P: NEEDLE.format(name=n, value=v) for P, n, v in zip(positions, names, values, strict=True)}
        return _compose(F, needles, KEY_QUERY.format(name=names[0]), values[0], length)


@dataclass(frozen=True)
class MultiValueTask(_NeedleLayout):
    """The multi-value needle generator (module docstring)."""

    n_values: int
    digits: int
    depths: tuple[float, ...]

    name = "multivalue_needle"
    vocab_size = 256

    @property
    def needles(self) -> int:
        return self.n_values

    @property
    def room(self) -> int:
        return self.n_values - 1

    @property
    def answer_bytes(self) -> int:
        return self.n_values * self.digits + (self.n_values - 1) * len(VALUE_SEPARATOR)

    @property
    def fixed_bytes(self) -> int:
        needle = len(NEEDLE.format(name=NAMES[0], value="0" * self.digits))
        return self.n_values * needle + len(VALUES_QUERY.format(name=NAMES[0])) + self.answer_bytes

    def sample(self, g: torch.Generator, length: int, split: str, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x [ℓ+1] int64 bytes, mask [ℓ] bool)``; evaluation block ``index`` sits at depths[index % len]."""
        name = NAMES[int(torch.randint(len(NAMES), (), generator=g))]
        taken: set[str] = set()
        values = [_draw_value(g, self.digits, taken, split) for _ in range(self.n_values)]  # in order of appearance
        F = self.filler_bytes(length)
        bounds = _boundaries(F)
        a = _anchor(g, bounds, F, self.room, _depth(self.depths, split, index))
        positions = [bounds[a], *sorted(_pick(g, bounds[a + 1 :], self.n_values - 1))]
        needles = {P: NEEDLE.format(name=name, value=v) for P, v in zip(positions, values, strict=True)}
        return _compose(F, needles, VALUES_QUERY.format(name=name), VALUE_SEPARATOR.join(values), length)


@dataclass(frozen=True)
class VariableTrackingTask(_NeedleLayout):
    """The variable-tracking generator (module docstring)."""

    hops: int
    n_chains: int
    digits: int
    depths: tuple[float, ...]

    name = "variable_tracking"
    vocab_size = 256

    @property
    def needles(self) -> int:
        return self.hops * self.n_chains

    @property
    def room(self) -> int:
        return self.hops - 1

    @property
    def fixed_bytes(self) -> int:
        name = "X" * VARIABLE_LETTERS
        chain = (len(ASSIGNMENT.format(name=name, value="0" * self.digits))
                 + (self.hops - 1) * len(ASSIGNMENT.format(name=name, value=name)))
        return self.n_chains * chain + len(TRACK_QUERY.format(name=name)) + self.digits

    @staticmethod
    def draw_names(g: torch.Generator, k: int) -> list[str]:
        """``k`` distinct uniform three-letter uppercase names, never ``VAR``."""
        names: list[str] = []
        while len(names) < k:
            letters = torch.randint(26, (VARIABLE_LETTERS,), generator=g).tolist()
            name = "".join(chr(ord("A") + c) for c in letters)
            if name != "VAR" and name not in names:
                names.append(name)
        return names

    def sample(self, g: torch.Generator, length: int, split: str, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x [ℓ+1] int64 bytes, mask [ℓ] bool)``; evaluation block ``index`` sits at depths[index % len]."""
        h = self.hops
        names = self.draw_names(g, self.needles)  # chain c: names[c·h : (c+1)·h]; chain 0 is queried
        taken: set[str] = set()
        values = [_draw_value(g, self.digits, taken, split)]
        values += [_draw_value(g, self.digits, taken, None) for _ in range(self.n_chains - 1)]
        F = self.filler_bytes(length)
        bounds = _boundaries(F)
        a = _anchor(g, bounds, F, self.room, _depth(self.depths, split, index))
        first = [bounds[a], *sorted(_pick(g, bounds[a + 1 :], h - 1))]
        rest = _pick(g, [b for b in bounds if b not in first], (self.n_chains - 1) * h)
        positions = first + [P for c in range(self.n_chains - 1) for P in sorted(rest[c * h : (c + 1) * h])]
        needles = {}
        for c in range(self.n_chains):
            chain = names[c * h : (c + 1) * h]
            for j, (P, name) in enumerate(zip(positions[c * h : (c + 1) * h], chain, strict=True)):
                needles[P] = ASSIGNMENT.format(name=name, value=values[c] if j == 0 else chain[j - 1])
        return _compose(F, needles, TRACK_QUERY.format(name=names[h - 1]), values[0], length)


RetrievalTask = MultiKeyTask | MultiValueTask | VariableTrackingTask


# ---------------------------------------------------------------------------------------------------
# the data modules
# ---------------------------------------------------------------------------------------------------
def _check_digits(digits: object) -> None:
    check_int("digits", digits, 3)
    if digits > MAX_DIGITS:
        raise DataError(f"digits={digits} is not valid; use an integer in 3..{MAX_DIGITS}")


def _check_count(name: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise DataError(f"{name}={value!r} is not valid; use an integer in 1..{maximum}")


def _check_depths(depths: object) -> tuple[float, ...]:
    if (
        not isinstance(depths, (list, tuple))
        or not depths
        or any(isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 1 for d in depths)
    ):
        raise DataError(f"depths={depths!r} is not valid; use a non-empty list of fractions in [0, 1]")
    return tuple(float(d) for d in depths)


def _settings(task: RetrievalTask) -> str:
    return ", ".join(f"{k}={v}" for k, v in asdict(task).items() if k != "depths")


def _cannot_hold(task: RetrievalTask) -> str:
    return f"cannot hold the {task.needles} needle{'s' if task.needles != 1 else ''} and the question of {task.name}"


def _check_seq_len(seq_len: object, task: RetrievalTask) -> None:
    check_int("seq_len", seq_len, 1)
    if seq_len < task.min_length:
        raise DataError(f"seq_len={seq_len} {_cannot_hold(task)}; "
                        f"use seq_len >= {task.min_length} for {_settings(task)}")


class _RetrievalDataModule(DepthTaskDataModule):
    """What the three retrieval modules share beyond passkey's: the anchor's position and the length check."""

    task: RetrievalTask

    def _init_task(self, task: RetrievalTask) -> None:
        self.task = task
        self.depths = list(task.depths)
        self.tokenizer = ByteTokenizer()

    def anchor_position(self, length: int, depth: float) -> int:
        """Filler offset of the depth-defining needle in an evaluation block of ``length`` at ``depth``."""
        self._check_length("evaluation length", length)
        return self.task.anchor_position(length, depth)

    def _common_parameters(self) -> dict:
        return {**asdict(self.task), "depths": list(self.task.depths), "filler": FILLER,
                "eval_value_fraction": EVAL_KEY_BYTE / 256}

    def _check_length(self, name: str, length: int) -> None:
        check_int(name, length, 1)
        if length < self.task.min_length:
            raise DataError(f"{name} {length} {_cannot_hold(self.task)}; "
                            f"the minimum is {self.task.min_length} for {_settings(self.task)}")


class MultiKeyNeedleDataModule(_RetrievalDataModule):
    """Multi-key needles in byte-level filler: the queried name's value at the end is the only scored target.

    Generation rules: module docstring. Evaluation block i puts the queried needle at ``depths[i % len(depths)]``
    (:meth:`eval_depths`); training puts every needle at a uniformly drawn boundary.

    Args:
        seq_len: training length T; at least :attr:`min_length` (260 bytes for the defaults).
        n_keys: needles (distinct names from :data:`NAMES`), 1..16; one is queried.
        digits: length of each value (3..32).
        depths: depths of the queried needle, fractions of the filler in [0, 1], cycled over the blocks.
        batch_size, seed, num_workers, val_blocks: as in :class:`TokenStreamDataModule`.
    """

    def __init__(
        self,
        seq_len: int = 512,
        n_keys: int = 4,
        digits: int = 4,
        depths: list[float] = [0.0, 0.25, 0.5, 0.75, 1.0],  # noqa: B006 - jsonargparse shows the default
        batch_size: int = 16,
        seed: int = 0,
        num_workers: int = 0,
        val_blocks: int = 32,
    ) -> None:
        _check_count("n_keys", n_keys, len(NAMES))
        _check_digits(digits)
        task = MultiKeyTask(n_keys=n_keys, digits=digits, depths=_check_depths(depths))
        _check_seq_len(seq_len, task)
        super().__init__(seq_len, batch_size, num_workers, seed, val_blocks)
        self.n_keys, self.digits = n_keys, digits
        self._init_task(task)

    def task_parameters(self) -> dict:
        return {**self._common_parameters(), "names": list(NAMES), "needle": NEEDLE, "query": KEY_QUERY}


class MultiValueDataModule(_RetrievalDataModule):
    """Multi-value needles: every digit of one name's values, in order of appearance, is scored.

    Generation rules: module docstring. Evaluation block i puts the first needle at ``depths[i % len(depths)]``
    (:meth:`eval_depths`; near the end, as late as leaves room for the others); training draws it uniformly.

    Args:
        seq_len: training length T; at least :attr:`min_length` (204 bytes for the defaults).
        n_values: needles of the one name (distinct values), 1..16.
        digits: length of each value (3..32).
        depths: depths of the first needle, fractions of the filler in [0, 1], cycled over the blocks.
        batch_size, seed, num_workers, val_blocks: as in :class:`TokenStreamDataModule`.
    """

    def __init__(
        self,
        seq_len: int = 512,
        n_values: int = 3,
        digits: int = 4,
        depths: list[float] = [0.0, 0.25, 0.5, 0.75, 1.0],  # noqa: B006 - jsonargparse shows the default
        batch_size: int = 16,
        seed: int = 0,
        num_workers: int = 0,
        val_blocks: int = 32,
    ) -> None:
        _check_count("n_values", n_values, MAX_NEEDLES)
        _check_digits(digits)
        task = MultiValueTask(n_values=n_values, digits=digits, depths=_check_depths(depths))
        _check_seq_len(seq_len, task)
        super().__init__(seq_len, batch_size, num_workers, seed, val_blocks)
        self.n_values, self.digits = n_values, digits
        self._init_task(task)

    def task_parameters(self) -> dict:
        return {**self._common_parameters(), "names": list(NAMES), "needle": NEEDLE, "query": VALUES_QUERY,
                "separator": VALUE_SEPARATOR}


class VariableTrackingDataModule(_RetrievalDataModule):
    """Variable tracking: resolve a chain of ``hops`` assignments among distractor chains; its value is scored.

    Generation rules: module docstring. Evaluation block i puts the queried chain's first assignment at
    ``depths[i % len(depths)]`` (:meth:`eval_depths`; near the end, as late as leaves room for its other hops);
    training draws it uniformly.

    Args:
        seq_len: training length T; at least :attr:`min_length` (217 bytes for the defaults).
        hops: assignments per chain, 1..16 (the first binds the value, each later one the previous name).
        n_chains: chains, 1..16; chain 0 is queried, the others are distractors.
        digits: length of each value (3..32).
        depths: depths of the queried chain's first assignment, fractions of the filler in [0, 1], cycled.
        batch_size, seed, num_workers, val_blocks: as in :class:`TokenStreamDataModule`.
    """

    def __init__(
        self,
        seq_len: int = 512,
        hops: int = 3,
        n_chains: int = 2,
        digits: int = 4,
        depths: list[float] = [0.0, 0.25, 0.5, 0.75, 1.0],  # noqa: B006 - jsonargparse shows the default
        batch_size: int = 16,
        seed: int = 0,
        num_workers: int = 0,
        val_blocks: int = 32,
    ) -> None:
        _check_count("hops", hops, MAX_NEEDLES)
        _check_count("n_chains", n_chains, MAX_NEEDLES)
        _check_digits(digits)
        task = VariableTrackingTask(hops=hops, n_chains=n_chains, digits=digits, depths=_check_depths(depths))
        _check_seq_len(seq_len, task)
        super().__init__(seq_len, batch_size, num_workers, seed, val_blocks)
        self.hops, self.n_chains, self.digits = hops, n_chains, digits
        self._init_task(task)

    def task_parameters(self) -> dict:
        return {**self._common_parameters(), "assignment": ASSIGNMENT, "query": TRACK_QUERY,
                "name_letters": VARIABLE_LETTERS}

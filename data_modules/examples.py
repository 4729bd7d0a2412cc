"""Separate examples, one per row: the layout of the field's length-generalisation protocols (formal languages).

A *problem* of size n (the protocol's own length: n bits of a parity string, n characters of an expression) is
written as one row ``START, s_1 … s_n, QUERY, answer`` (n + 3 bytes) and right-padded with PAD. The model reads
``row[:-1]`` and predicts ``row[1:]``; the only scored target is the answer, at the QUERY's position (index n + 1 of
the inputs), so the loss and the accuracy are those of one classification per example. Padding only ever follows
the answer, so under causal attention it cannot change what the model computes at the answer; its targets are
-100 (never scored). START gives a relative scheme the example's origin (a problem's state starts there).

**Lengths per example.** Training item i draws its size uniformly from the range the :class:`LengthCurriculum`
gives its step, from a generator seeded by ``sha256("accrot.synthetic/<task>/<seed>/train/examples/<i>")``, and is
padded to that range's longest row, so a batch (whose rows share a step) has one width. Item i's step is
``i // (batch_size · world_size)``: the sampler (:class:`ExampleSampler`) hands rank r of W the items
r, r + W, … of the global order 0, 1, 2, …, so a global batch is the same items under any W, and a run resumed
mid-way (the loader's position is checkpointed like every other training loader's) continues the schedule where
it stopped. Evaluation at size n (:meth:`ExampleDataModule.eval_examples`) is every example at exactly that size,
from the ``eval`` split's seeds (never a training seed), the same examples for every model.

The pipeline's own evaluation (the extrapolation callback, ``accrot eval``) asks for blocks of ℓ + 1 tokens at
multiples of ``seq_len`` (here the longest training row's input width, longest size + 2): a block is one example of
the largest valid size that fits, right-padded, scored on its answer.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.utils.data import Dataset, TensorDataset

from accrot.errors import DataError
from data_modules.streams import ResumableLoader, ResumableSampler, check_int
from data_modules.synthetic import (
    GENERATOR_VERSION,
    IGNORE_INDEX,
    TRAIN_SAMPLES,
    SyntheticDataModule,
    _generator,
)

START = 0xFD  # the first byte of every row: the example's origin
QUERY = ord("=")  # after the problem: the model answers at this position
PAD = 0x00  # after the answer, never scored
OVERHEAD = 3  # START, QUERY and the answer around a problem of size n


class ExampleTask(Protocol):
    """A problem generator (:mod:`data_modules.formal`): bytes in, one answer byte out."""

    name: str
    classes: tuple[int, ...]  # the answer bytes, one per class (chance = 1 / len(classes))
    min_size: int

    def valid_size(self, size: int) -> int:
        """The largest size <= ``size`` the task can make (e.g. odd, for an expression of numbers and operators)."""
        ...

    def problem(self, g: torch.Generator, size: int) -> tuple[list[int], int]:
        """``(the problem's bytes [valid_size(size)], the answer byte)``."""
        ...

    # optional: ``prefix_answers(symbols [n]) -> [n]`` the answer byte of each prefix s_1..s_i, None where the
    # prefix is not a problem of its own (dense prefix labels, :class:`ExampleSamples`)


@dataclass(frozen=True)
class LengthCurriculum:
    """Which problem sizes training draws at each step: ``stages`` of ``(first step, shortest, longest)``, the first
    at step 0, steps increasing; a stage holds until the next one's first step. One stage is no curriculum."""

    stages: tuple[tuple[int, int, int], ...]

    @classmethod
    def parse(cls, stages: Sequence[Sequence[int]], min_size: int) -> LengthCurriculum:
        """From a config's ``[[first_step, shortest, longest], ...]``; one line naming the bad stage otherwise."""
        out = []
        for k, stage in enumerate(stages):
            if (not isinstance(stage, (list, tuple)) or len(stage) != 3
                    or any(isinstance(v, bool) or not isinstance(v, int) for v in stage)):
                raise DataError(f"curriculum stage {k} is {stage!r}; use [first_step, shortest, longest] (integers)")
            step, lo, hi = stage
            if k == 0 and step != 0:
                raise DataError(f"the curriculum's first stage starts at step {step}; it must start at step 0")
            if k and step <= out[-1][0]:
                raise DataError(f"curriculum stage {k} starts at step {step}, not after stage {k - 1} ({out[-1][0]})")
            if not min_size <= lo <= hi:
                raise DataError(f"curriculum stage {k} draws sizes {lo}..{hi}; use {min_size} <= shortest <= longest")
            out.append((step, lo, hi))
        if not out:
            raise DataError("the curriculum has no stages; give at least [[0, shortest, longest]]")
        return cls(tuple(out))

    def at(self, step: int) -> tuple[int, int]:
        """``(shortest, longest)`` size drawn at ``step``."""
        lo, hi = self.stages[0][1:]
        for first, a, b in self.stages:
            if step >= first:
                lo, hi = a, b
        return lo, hi

    @property
    def longest(self) -> int:
        return max(hi for _, _, hi in self.stages)

    @property
    def shortest(self) -> int:
        return min(lo for _, lo, _ in self.stages)


def row(task: ExampleTask, g: torch.Generator, size: int, width: int) -> tuple[torch.Tensor, int]:
    """``(START, problem, QUERY, answer, PAD … [width], the problem's size)``; ``width >= size + 3``."""
    symbols, answer = task.problem(g, size)
    body = [START, *symbols, QUERY, answer]
    if len(body) > width:
        raise DataError(f"a {task.name} problem of size {len(symbols)} needs {len(body)} tokens, more than {width}")
    return torch.tensor(body + [PAD] * (width - len(body)), dtype=torch.long), len(symbols)


def split_row(x: torch.Tensor, size: int, task: ExampleTask | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs [W-1], targets [W-1])`` of a row ``x [W]`` holding a problem of ``size``: only the answer scored,
    or with ``task`` (dense prefix labels) also the position reading s_i, whose target is the answer of s_1..s_i.
    A prefix label depends on s_1..s_i alone, so it tells nothing of the size or of the symbols still to come;
    padding stays unscored either way."""
    targets = torch.full((x.numel() - 1,), IGNORE_INDEX, dtype=torch.long)
    if task is not None:
        for i, answer in enumerate(task.prefix_answers(x[1:size + 1].tolist())):
            if answer is not None:
                targets[i + 1] = answer  # input i + 1 is s_{i+1}: the prefix s_1..s_{i+1} is read there
    targets[size + 1] = x[size + 2]  # the QUERY's position predicts the answer
    return x[:-1], targets


class ExampleSamples(Dataset):
    """Training item j (any j >= 0: the sampler numbers items across epochs) = ``(inputs [W], targets [W])``,
    its size drawn from the curriculum at step ``j // rows`` (``rows``: examples per global batch); with
    ``prefix_labels`` every prefix that is a problem is labelled too (:func:`split_row`)."""

    def __init__(self, task: ExampleTask, seed: int, curriculum: LengthCurriculum, rows: int,
                 prefix_labels: bool = False) -> None:
        self.task, self.seed, self.curriculum, self.rows = task, seed, curriculum, rows
        self.prefix_labels = prefix_labels

    def __len__(self) -> int:
        return TRAIN_SAMPLES

    def step_of(self, j: int) -> int:
        return j // self.rows

    def size_of(self, j: int) -> tuple[int, int, torch.Generator]:
        """``(drawn size, the stage's longest, the item's generator)``."""
        lo, hi = self.curriculum.at(self.step_of(j))
        g = _generator(self.task.name, self.seed, "train", "examples", j)
        return lo + int(torch.randint(hi - lo + 1, (), generator=g)), hi, g

    def __getitem__(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        if j < 0:
            raise IndexError(f"training example {j} does not exist")
        size, hi, g = self.size_of(j)
        x, made = row(self.task, g, size, self.task.valid_size(hi) + OVERHEAD)
        return split_row(x, made, self.task if self.prefix_labels else None)


class ExampleSampler(ResumableSampler):
    """Rank r of W takes items r, r + W, r + 2W, … of the global order 0, 1, 2, … (epoch e continues at
    e · total); resumable like :class:`ResumableSampler` (same state, same skipping)."""

    def __iter__(self) -> Iterator[int]:
        start = self.epoch * self.total_size + self.rank + self.skipped() * self.batch_size * self.num_replicas
        self._skip = None
        return iter(range(start, (self.epoch + 1) * self.total_size, self.num_replicas))


class ExampleDataModule(SyntheticDataModule):
    """Separate examples of a problem generator (module docstring): sizes drawn per example from ``train_lengths``
    or a ``curriculum``; scored on the answer only. Subclasses set ``self.task`` (an :class:`ExampleTask`) before
    calling :meth:`_init_lengths`."""

    task: ExampleTask

    def _init_lengths(self, train_lengths: Sequence[int], curriculum: Sequence[Sequence[int]] | None) -> None:
        if (not isinstance(train_lengths, (list, tuple)) or len(train_lengths) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) for v in train_lengths)):
            raise DataError(f"train_lengths={train_lengths!r} is not valid; use [shortest, longest] problem sizes")
        stages = curriculum if curriculum is not None else [[0, *train_lengths]]
        self.curriculum = LengthCurriculum.parse(stages, self.task.min_size)
        self.seq_len = self.task.valid_size(self.curriculum.longest) + OVERHEAD - 1  # the widest training inputs

    @property
    def vocab_size(self) -> int:
        return 256  # bytes

    @property
    def min_length(self) -> int:
        return self.task.min_size + OVERHEAD - 1

    def _check_length(self, name: str, length: int) -> None:
        check_int(name, length, 1)
        if length < self.min_length:
            raise DataError(f"{name} {length} cannot hold a {self.task.name} problem with its answer; "
                            f"the minimum is {self.min_length}")

    def train_dataset(self) -> ExampleSamples:
        trainer = self.trainer
        world = trainer.world_size if trainer is not None else 1
        return ExampleSamples(self.task, self.seed, self.curriculum, self.batch_size * world,
                              getattr(self, "prefix_labels", False))

    def train_dataloader(self) -> ResumableLoader:
        trainer = self.trainer
        replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        dataset = self.train_dataset()
        return ResumableLoader(
            dataset, batch_size=self.batch_size,
            sampler=ExampleSampler(dataset, self.batch_size, self.seed, replicas, rank),
            drop_last=True, num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
            progress=self._trained_batches,
        )

    def val_dataset(self) -> TensorDataset:
        """The first ``val_blocks`` evaluation examples at the longest training size (one width)."""
        inputs, targets, _ = self.eval_examples(self.curriculum.longest, self.val_blocks)
        return TensorDataset(inputs, targets)

    # --- evaluation ------------------------------------------------------------------------------

    def eval_examples(self, size: int, count: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(inputs [count, n + 2], targets [count, n + 2] (-100 but at the answer), n)`` for problems of
        ``valid_size(size)`` = n; example i depends on (task, seed, n, i) only."""
        check_int("problem size", size, self.task.min_size)
        check_int("count", count, 1)
        n = self.task.valid_size(size)
        pairs = [split_row(*row(self.task, _generator(self.task.name, self.seed, "eval", "examples", n, i), n,
                                n + OVERHEAD)) for i in range(count)]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs]), n

    def sample_block(self, length: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Evaluation block ``index`` at ``length`` (ℓ + 1 tokens): one example of the largest size that fits."""
        n = self.task.valid_size(length + 1 - OVERHEAD)
        x, made = row(self.task, _generator(self.task.name, self.seed, "eval", "examples", n, index), n, length + 1)
        mask = torch.zeros(length, dtype=torch.bool)
        mask[made + 1] = True
        return x, mask

    def _blocks(self, length: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if (length, n) not in self._eval_sets:
            samples = [self.sample_block(length, i) for i in range(n)]
            blocks = torch.stack([x for x, _ in samples])
            self._eval_sets[(length, n)] = (blocks, torch.stack([m for _, m in samples]), blocks[:, 1:].clone())
        return self._eval_sets[(length, n)]

    # --- records ---------------------------------------------------------------------------------

    def task_parameters(self) -> dict:
        return {"curriculum": [list(s) for s in self.curriculum.stages], "layout": "START problem QUERY answer PAD",
                "classes": "".join(map(chr, self.task.classes)), "chance": 1 / len(self.task.classes)}

    @property
    def fingerprint(self) -> str:
        """sha256 of the task, its parameters, the seed and the generator version, plus the bytes of a few training
        rows and evaluation examples (a change in a rule or in torch's RNG shows up)."""
        if self._fingerprint is None:
            h = hashlib.sha256(json.dumps({"task": self.task.name, "version": GENERATOR_VERSION, "seed": self.seed,
                                           "parameters": self.task_parameters()}, sort_keys=True).encode())
            train = ExampleSamples(self.task, self.seed, self.curriculum, 1, getattr(self, "prefix_labels", False))
            for j in range(4):
                h.update(train[j][0].numpy().tobytes())
                if train.prefix_labels:
                    h.update(train[j][1].numpy().tobytes())
            h.update(self.eval_examples(self.curriculum.shortest, 2)[0].numpy().tobytes())
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def describe(self) -> dict:
        return {"task": self.task.name, "parameters": self.task_parameters(), "seed": self.seed,
                "fingerprint": self.fingerprint, "generator_version": GENERATOR_VERSION,
                "tokenizer": self.tokenizer.describe(), "seq_len": self.seq_len, "min_length": self.min_length,
                "val_blocks": self.val_blocks,
                "eval_blocks": {str(k): dict(v) for k, v in sorted(self.eval_counts.items())}}


def scaled_accuracy(accuracy: float, n_classes: int) -> float:
    """``(acc − chance) / (1 − chance)``, chance = 1 / n_classes: 0 at chance, 1 when every answer is right."""
    chance = 1 / n_classes
    return (accuracy - chance) / (1 - chance) if math.isfinite(accuracy) else math.nan

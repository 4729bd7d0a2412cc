"""What the pipeline asks of a data module: :class:`Task` for every one, :class:`AnswerTask` for one that scores its
answers only.

Training reads the two loaders (batches ``(inputs [B, T], targets [B, T])`` int64, ``-100`` where nothing is
scored) and ``vocab_size`` (``model.vocab_size`` is linked to it); the evaluation callbacks, ``accrot eval`` and
``accrot diagnose`` cut their fixed blocks with ``eval_blocks`` at multiples of ``seq_len`` and write ``describe()``
into every record. Two members are optional and looked up where used: ``val_stream`` (``[N]`` token ids; a corpus:
the same-target rise and the sliding evaluation read it) and, for a retrieval task, ``eval_depths(length,
budget_tokens)`` (each block's key depth: the accuracy per depth). :class:`~data_modules.streams.TokenStreamDataModule`
and :class:`~data_modules.synthetic.SyntheticDataModule` implement them; a new corpus or task subclasses one of the
two (data_modules/README.md, "Adding a task").
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Task(Protocol):
    seq_len: int  # L, the training length: evaluation lengths are its multiples

    @property
    def vocab_size(self) -> int: ...

    def train_dataloader(self) -> Any: ...

    def val_dataloader(self) -> Any: ...

    def eval_blocks(self, length: int, budget_tokens: int, record: bool = True) -> torch.Tensor:
        """``[N, length + 1]`` int64, N = max(1, budget_tokens // length): the same blocks for every model;
        ``record=False`` leaves :meth:`describe`'s count of evaluation blocks as it is."""
        ...

    def describe(self) -> dict:
        """JSON-serialisable facts that identify the run's data (its fingerprint among them)."""
        ...


@runtime_checkable
class AnswerTask(Task, Protocol):
    """A task that scores only its answers: NLL and accuracy of the positions ``eval_mask`` marks."""

    def eval_mask(self, length: int, budget_tokens: int) -> torch.Tensor:
        """``[N, length]`` bool: the scored targets of :meth:`eval_blocks`."""
        ...

    def eval_targets(self, length: int, budget_tokens: int) -> torch.Tensor:
        """``[N, length]`` int64: the targets of :meth:`eval_blocks` (``blocks[:, 1:]`` unless the model does not read
        the answers)."""
        ...

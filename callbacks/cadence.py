"""What the in-training evaluations share: blocks cut once per data module before any training (so a length the
stream cannot fill fails fast), a run every ``every_n_steps`` optimiser steps and once at the end of training,
never twice at one step, and that step kept across a resume."""

from __future__ import annotations

import lightning as L

from accrot import phases


class Periodic(L.Callback):
    """Base of :class:`~callbacks.extrapolation.ExtrapolationCallback` and
    :class:`~callbacks.diagnostics.DiagnosticsCallback`: a subclass implements :meth:`cut` and :meth:`run`.

    ``setup_stages``: the stages whose ``setup`` cuts the blocks (None: every stage)."""

    setup_stages: tuple[str, ...] | None = None
    phase = "evaluation"  # the run's wall-time phase a run of this callback is charged to (accrot.phases)

    def __init__(self, every_n_steps: int = 0) -> None:
        super().__init__()
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 0:
            raise ValueError(f"every_n_steps={every_n_steps!r} is not valid; it must be an integer >= 0")
        self.every_n_steps = every_n_steps
        self._prepared_for: object | None = None
        self._last_step = -1

    def cut(self, dm) -> None:
        """Cut this callback's evaluation blocks from ``dm`` (``self.train_length`` is set); DataError if a length
        cannot be filled."""
        raise NotImplementedError

    def run(self, trainer: L.Trainer, pl_module: L.LightningModule):
        raise NotImplementedError

    def prepare(self, dm) -> None:
        """Cut the blocks once per data module."""
        if dm is None or not hasattr(dm, "eval_blocks"):
            raise ValueError(f"{type(self).__name__} needs a data module with eval_blocks(length, budget_tokens)")
        if self._prepared_for is dm:
            return
        self.train_length = int(dm.seq_len)
        self.cut(dm)
        self._prepared_for = dm

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.setup_stages is None or stage in self.setup_stages:
            self.prepare(trainer.datamodule)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every_n_steps and step % self.every_n_steps == 0 and step != self._last_step:
            self._last_step = step
            with phases.timed(self.phase):
                self.run(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_step != self._last_step:
            self._last_step = trainer.global_step
            with phases.timed(self.phase):
                self.run(trainer, pl_module)

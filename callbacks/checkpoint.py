"""Checkpoints that resume to exactly the run that was interrupted.

Lightning's ``ModelCheckpoint(every_n_train_steps=N)`` saves inside ``on_train_batch_end`` of step N, *before*
that step's metrics reach the loggers and before the validation that follows it; a run resumed from it skips
both (Lightning fast-forwards the validation counters), so its ``metrics.csv`` misses a training row and a
validation row that the uninterrupted run has. :class:`ResumableCheckpoint` takes the same decision at the
same step but writes the checkpoint once the step is over (at the start of the next batch, or at the end of
training), then records the loop counters exactly as Lightning's own ``on_train_batch_end`` checkpoint of
that step would have them. Restoring it, Lightning continues with the next batch, as it would from its own
checkpoint, and nothing of step N is lost or repeated.

``state_key`` is ModelCheckpoint's, so checkpoints of either class restore into the other. The accrot CLI
turns every plain ``ModelCheckpoint`` of a config into this class (:func:`make_resumable`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint


class ResumableCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose step-triggered saves land between steps (see the module docstring)."""

    _pending: tuple[int, int, int] | None = None  # (global step, epoch, batches of that epoch) of a deferred save
    _patch: tuple[int, int, int] | None = None  # the same, while that save is being written

    @property
    def state_key(self) -> str:
        return self._generate_state_key(
            monitor=self.monitor, mode=self.mode, every_n_train_steps=self._every_n_train_steps,
            every_n_epochs=self._every_n_epochs, train_time_interval=self._train_time_interval,
        ).replace(type(self).__qualname__, "ModelCheckpoint", 1)

    # -- when --------------------------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if not pl_module.automatic_optimization or self.monitor is not None:
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        due = self._every_n_train_steps >= 1 and trainer.global_step % self._every_n_train_steps == 0
        if self._train_time_interval is not None:
            now = time.monotonic()
            late = self._last_time_checked is not None and now - self._last_time_checked >= \
                self._train_time_interval.total_seconds()
            if trainer.strategy.broadcast(late):
                self._last_time_checked = now
                due = True
        if due and not self._should_skip_saving_checkpoint(trainer):
            progress = trainer.fit_loop.epoch_loop.batch_progress.current
            self._pending = (trainer.global_step, trainer.current_epoch, progress.processed)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self._flush(trainer, patch=True)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._flush(trainer, patch=False)  # training is over: the loops' own end state is the right one
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            # the run ended between two periodic saves (max_steps not a multiple of every_n_train_steps): last.ckpt
            # must hold the final weights, which an evaluation of it or a resume that trains further starts from
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        super().on_train_end(trainer, pl_module)

    def _flush(self, trainer: L.Trainer, patch: bool) -> None:
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        if trainer.global_step != pending[0]:
            return  # a step ran since (cannot happen with automatic optimisation): the moment has passed
        self._patch = pending if patch else None
        try:
            candidates = self._monitor_candidates(trainer)
            candidates["epoch"] = candidates["epoch"].new_tensor(pending[1])  # the epoch of the step, for names
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
        finally:
            self._patch = None

    # -- where -------------------------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A copied or moved run directory (``cp -a RUN RUN2``; ``--resume RUN2``): Lightning drops the saved
        paths when the directory differs, finds ``last.ckpt`` taken by a file it does not know and writes
        ``last-v1.ckpt`` beside it, leaving ``last.ckpt`` stale for the next resume. Paths under the saved
        directory are moved to this one instead, and ``last.ckpt`` stays the name of the newest checkpoint."""
        state_dict = dict(state_dict)
        old = state_dict.get("dirpath")
        if self.dirpath and old and os.path.abspath(old) != os.path.abspath(self.dirpath):
            def moved(path: str) -> str:
                inside = path and os.path.abspath(path).startswith(os.path.abspath(old) + os.sep)
                return os.path.join(self.dirpath, os.path.relpath(path, old)) if inside else path

            for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
                if key in state_dict:
                    state_dict[key] = moved(state_dict[key])
            state_dict["best_k_models"] = {moved(k): v for k, v in (state_dict.get("best_k_models") or {}).items()}
            state_dict["dirpath"] = self.dirpath
        if self.save_last and self.dirpath:
            state_dict["last_model_path"] = os.path.join(self.dirpath, self.CHECKPOINT_NAME_LAST + self.FILE_EXTENSION)
        super().load_state_dict(state_dict)

    # -- what --------------------------------------------------------------------------------------------
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self._patch is not None:
            as_batch_end(checkpoint, *self._patch)


def as_batch_end(checkpoint: dict[str, Any], step: int, epoch: int, batches: int) -> None:
    """Rewrite the fit loop's counters of a checkpoint taken once step ``step`` (batch ``batches`` of epoch
    ``epoch``) was over into those Lightning writes in ``on_train_batch_end`` of that step.

    Between the two moments Lightning has only: marked the batch completed, counted it in
    ``_batches_that_stepped``, fetched the next batch and, when it was the epoch's last batch, ended the
    epoch and started the next one. Everything else (weights, optimiser, schedulers, callbacks, the loader's
    position) is already what a resumed run must start from.
    """
    fit = checkpoint["loops"]["fit_loop"]
    batch = fit["epoch_loop.batch_progress"]
    trained = batch["total"]["processed"]  # batches trained on, all epochs, the last one included
    batch["total"].update(ready=trained, started=trained, processed=trained, completed=trained - 1)
    batch["current"].update(ready=batches, started=batches, processed=batches, completed=batches - 1)
    fit["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1
    ended = fit["epoch_progress"]["total"]["processed"] > epoch  # the step was the last of its epoch
    batch["is_last_batch"] = ended
    if ended:  # take the epoch's end and the next one's start back: epoch `epoch` is running, not done
        for scope in ("total", "current"):
            for name in ("ready", "started", "processed", "completed"):
                fit["epoch_progress"][scope][name] -= 1
    checkpoint["epoch"] = epoch


def make_resumable(callback: Any) -> Any:
    """A plain ``ModelCheckpoint`` becomes a :class:`ResumableCheckpoint` (same object, same settings)."""
    if type(callback) is ModelCheckpoint:
        callback.__class__ = ResumableCheckpoint
    return callback

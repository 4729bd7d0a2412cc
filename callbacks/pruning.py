"""Report extrapolation results to an Optuna trial while training, and stop the run when the pruner says so.

A thin callback over :class:`callbacks.extrapolation.ExtrapolationCallback`: whenever that callback has
evaluated (every ``extrapolation.every_n_steps``), the objective's metric at that step (e.g. ``nll@16x``) is
reported as the trial's intermediate value. Only global rank 0 talks to Optuna; its prune decision is
broadcast so every rank stops together. A pruned run saves ``checkpoints/pruned-step=N.ckpt`` (the run
directory stays complete and resumable) and raises :class:`optuna.TrialPruned` out of ``trainer.fit``.

The trial itself never travels through the config (a storage URL may carry a password): the sweep worker
registers its live trial with :func:`active_trial` around the in-process run, and the callback's init args
(``study``, ``trial``) only name it. Outside a sweep worker the callback is inert.

Metric names are those of :func:`accrot.metrics.parse_metric` (``nll@16x``, ...), shared with the sweep specs.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn

from accrot.metrics import metric_value, parse_metric
from callbacks.extrapolation import ExtrapolationCallback

_ACTIVE: dict[tuple[str, int], object] = {}  # (study name, trial number) -> optuna.trial.Trial in this process


@contextlib.contextmanager
def active_trial(study: str, trial) -> Iterator[None]:
    """Make ``trial`` (an ``optuna.trial.Trial``) reachable by :class:`OptunaPruning` for one in-process run."""
    key = (study, trial.number)
    _ACTIVE[key] = trial
    try:
        yield
    finally:
        _ACTIVE.pop(key, None)


class OptunaPruning(L.Callback):
    """Report ``metric`` after each extrapolation evaluation; prune when the study's pruner says so.

    Args:
        study: name of the Optuna study the run belongs to.
        trial: number of the trial within that study.
        metric: the reported metric, e.g. ``nll@16x`` (the study's first objective).
    """

    def __init__(self, study: str, trial: int, metric: str) -> None:
        super().__init__()
        parse_metric(metric)  # fail at construction on a bad name
        self.study = study
        self.trial = trial
        self.metric = metric
        self.reported: set[int] = set()  # steps already reported (by this callback)
        self._trial = None
        self._extrapolation: ExtrapolationCallback | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        found = [c for c in trainer.callbacks if isinstance(c, ExtrapolationCallback)]
        if not found:
            raise ValueError("OptunaPruning needs the ExtrapolationCallback (the `extrapolation` section)")
        self._extrapolation = found[0]
        if trainer.is_global_zero:
            self._trial = _ACTIVE.get((self.study, self.trial))
            if self._trial is None:
                rank_zero_warn(f"OptunaPruning: trial {self.trial} of study {self.study!r} is not active in this "
                               "process (not inside an accrot sweep worker); pruning is off for this run")

    # the extrapolation callback evaluates in on_train_batch_end, after this one: look at its history at the
    # start of the next batch (a final evaluation is reported by the worker, with the objective)
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        new = [h for h in self._extrapolation.history if h["step"] not in self.reported]
        if not new:  # every rank sees the same history, so every rank takes the same branch
            return
        reason = ""
        if trainer.is_global_zero and self._trial is not None:
            for entry in new:
                value = metric_value(entry["lengths"], self.metric)
                if not math.isfinite(value):  # a diverged run cannot recover: stop it now
                    reason = f"{self.metric}={value} at step {entry['step']}"
                    break
                self._trial.report(value, entry["step"])
                if self._trial.should_prune():
                    reason = f"{self.metric}={value:.4f} at step {entry['step']}"
        self.reported.update(h["step"] for h in new)
        reason = trainer.strategy.broadcast(reason, src=0)
        if reason:
            import optuna

            ckpt = Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints" / f"pruned-step={trainer.global_step}.ckpt"
            trainer.save_checkpoint(ckpt)  # every rank calls it; the strategy writes once
            raise optuna.TrialPruned(f"pruned: {reason}")

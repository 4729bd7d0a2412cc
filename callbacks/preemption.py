"""Preemption: on SLURM's warning signal (``#SBATCH --signal=USR1@90``), SIGTERM or Ctrl-C, checkpoint between
steps (and requeue under SLURM).

Lightning's :class:`~lightning.fabric.plugins.environments.SLURMEnvironment` names the warning signal
(``requeue_signal``) and whether the job requeues itself (``auto_requeue``); its own handler, though, saves an
``hpc_ckpt_N.ckpt`` *inside the signal handler*, in the middle of a step (a resumed run is then not the
uninterrupted one), and under DDP runs collectives from a handler that may fire while another rank is inside an
all-reduce. This callback takes the signal instead and acts between steps, with every rank together:

1. the handler (installed once training starts, over Lightning's) only notes the signal on the rank it hit;
2. at the end of every training batch the ranks agree whether any of them has one (one all-reduce of a flag,
   :meth:`on_train_batch_end`), and if so every rank raises Lightning's SIGTERM flag there, together; Lightning's
   own check right after the batch then raises ``SIGTERMException`` on every rank after the same step;
3. :meth:`on_exception` then writes ``checkpoints/last.ckpt`` exactly as a step-triggered
   :class:`callbacks.checkpoint.ResumableCheckpoint` of the last finished step would have it, and global rank 0
   runs ``scontrol requeue`` (when SLURM's ``auto_requeue`` is on).

The handler never raises Lightning's flag itself: Lightning checks it in two places (a broadcast of rank 0's flag
at the start of a batch, a local check at its end), so ranks the signal reached a moment apart would wait on
different collectives.

The requeued job runs the same command, whose ``--ckpt_path last`` continues the newest run of that name in
the same directory; ``run.json`` counts the resume (``resumes``) and said ``"status": "preempted"`` meanwhile.
Outside SLURM (a laptop, torchrun) SIGTERM still checkpoints; nothing is requeued. Ctrl-C (SIGINT) is taken the
same way, never requeued: the run stops after the step it is in with its exact checkpoint, ``run.json`` says
``interrupted``, and ``accrot`` exits 130; a second Ctrl-C, or one after the last step, stops at once. Under SLURM the warning
signal reaches the tasks alone; SIGTERM (preemption, ``scontrol requeue``) also reaches ``srun``, which may
SIGKILL the tasks before they finish the checkpoint, so there it is best effort and the periodic checkpoints
bound what is lost.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from callbacks.checkpoint import as_batch_end


def slurm_job_id() -> str | None:
    """``<array job>_<task>`` inside an array job, else ``SLURM_JOB_ID`` (what ``scontrol requeue`` takes)."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array is not None and os.environ.get("SLURM_ARRAY_TASK_ID") is not None:
        return f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def requeue(job_id: str) -> bool:
    """``scontrol requeue JOB``; False (with a warning) if it fails, e.g. the job is already being requeued."""
    if not re.fullmatch(r"[0-9_]+", job_id):
        return False
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        _say(f"accrot: warning: could not requeue SLURM job {job_id}: {err}")
        return False
    if result.returncode:
        _say(f"accrot: warning: could not requeue SLURM job {job_id}: {result.stderr.strip() or result.returncode}")
        return False
    _say(f"requeued SLURM job {job_id}")
    return True


@rank_zero_only
def _say(line: str) -> None:
    """One of the stop's own lines, on stderr (the terminal, or the job's log): what was saved and requeued belongs
    beside the command's last line, not in the run's console.log with Lightning's (accrot.logs)."""
    print(line, file=sys.stderr, flush=True)


class Preemption(L.Callback):
    """Checkpoint between steps and requeue on SLURM's warning signal or SIGTERM (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.signal: int | None = None  # the signal that asked for the stop, once one has
        self._step: tuple[int, int, int] | None = None  # (global step, epoch, batches of the epoch) last finished
        self._requeue = False

    # -- signals ----------------------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Replace the handlers Lightning has just registered (its teardown restores the ones from before fit,
        whatever way fit ends): its SIGTERM handler broadcasts from inside the handler, which pairs with
        whatever collective another rank is in."""
        if threading.current_thread() is not threading.main_thread():
            return
        env = getattr(trainer.strategy, "cluster_environment", None)  # single-device strategies have none
        self._requeue = isinstance(env, SLURMEnvironment) and env.auto_requeue
        warn = env.requeue_signal if isinstance(env, SLURMEnvironment) else signal.SIGUSR1
        # Ctrl-C (SIGINT) too: the run stops after the step it is in, checkpointed, instead of Lightning's
        # KeyboardInterrupt mid-step (no checkpoint, exit 1); a second Ctrl-C stops at once (_handler)
        for signum in {int(warn or signal.SIGUSR1), int(signal.SIGTERM), int(signal.SIGINT)}:
            signal.signal(signum, self._handler(trainer))
            # restart interrupted system calls: Python's default (EINTR) can fail a gloo collective on one rank,
            # which Lightning's per-batch SIGTERM broadcast swallows, and the ranks fall out of step
            signal.siginterrupt(signum, False)

    def _handler(self, trainer: L.Trainer):
        def handle(signum, frame) -> None:  # no collective, no I/O: on_train_batch_end acts on it
            if signum == signal.SIGINT and (self.signal == signal.SIGINT or trainer.fit_loop.done):
                # a second Ctrl-C, or one after the last step (the final evaluation): stop now, as Python would
                raise KeyboardInterrupt
            self.signal = self.signal or signum

        return handle

    # -- stopping between steps -------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        self._step = (trainer.global_step, trainer.current_epoch, progress.processed)
        signum = int(self.signal or 0)
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            # every rank, every batch: one all-reduce of the signal numbers (any rank's counts); the strategy's
            # reduce() would add a barrier before it
            # the flag lives on the device, made once: each batch fills it (no host-to-device copy) and reads it back
            flag = self._flag
            if flag is None or flag.device != trainer.strategy.root_device:
                flag = self._flag = torch.zeros(1, dtype=torch.long, device=trainer.strategy.root_device)
            flag.fill_(signum)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            signum = int(flag.item())
        if signum:  # every rank at once; Lightning raises SIGTERMException right after this batch
            self.signal = signum  # the same name in every rank's message, whichever rank the signal reached first
            trainer._signal_connector.received_sigterm = True

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        exception.signum = int(self.signal or signal.SIGTERM)  # the entry point names it (and exits 130 on Ctrl-C)
        path = self.checkpoint_path(trainer)
        self._patch = self._step if self._step is not None and self._step[0] == trainer.global_step else None
        try:
            trainer.save_checkpoint(path)  # every rank calls it; the strategy writes once
        finally:
            self._patch = None
        name = signal.Signals(self.signal).name if self.signal else "SIGTERM"
        _say(f"{name}: saved {path} at step {trainer.global_step}")
        if self._requeue and trainer.is_global_zero and slurm_job_id():
            requeue(slurm_job_id())

    _patch: tuple[int, int, int] | None = None
    _flag: torch.Tensor | None = None  # the per-batch signal flag of a multi-rank run, on the device

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if self._patch is None:
            return
        fit = checkpoint["loops"]["fit_loop"]["epoch_progress"]["total"]
        if fit["processed"] == fit["ready"]:  # stopped at an epoch's end, before the next began: as it is
            return
        as_batch_end(checkpoint, *self._patch)

    @staticmethod
    def checkpoint_path(trainer: L.Trainer) -> Path:
        """``last.ckpt`` of the run's ``save_last`` checkpoint callback, else ``<run>/checkpoints/last.ckpt``."""
        from lightning.pytorch.callbacks import ModelCheckpoint

        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.save_last and cb.dirpath:
                return Path(cb.dirpath) / f"{cb.CHECKPOINT_NAME_LAST}{cb.FILE_EXTENSION}"
        return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints" / "last.ckpt"

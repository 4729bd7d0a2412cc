"""Record what produced a run: git revision, data fingerprint, versions, seed, scheme facts.

``run.json`` also records the launch (``launch``: ranks, nodes, strategy, SLURM job) and says how the run went:
``status`` (``running``, ``finished``, ``preempted`` (SIGTERM, SLURM's warning), ``interrupted`` (Ctrl-C),
``failed`` with ``error``), the checkpoint it started from (``started_from``: ``--ckpt_path``, its whole training
state; ``init_from``: ``--init_from``, its weights only, with the source's step and run directory),
and ``resumes`` (how often ``accrot fit --resume`` or a requeued ``--ckpt_path last`` continued it, with the step
and command of each). Every checkpoint carries the ``accrot`` section a resumed run needs: how many rows
``metrics.csv`` held when it was taken (flushed first) and the wandb run to continue.
"""

from __future__ import annotations

import json
import platform
import signal
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from accrot import phases, runtime
from accrot.io import atomic_write_text, git_revision
from accrot.logs import release_startup_logs
from accrot.ops import cpu_kernels
from callbacks.preemption import Preemption

PACKAGES = ("torch", "lightning", "torchmetrics", "jsonargparse", "optuna", "wandb", "datasets", "numpy")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


class RunRecord(L.Callback):
    """Writes ``run.json`` into the run directory at the start of every stage and logs the scheme's facts.

    Args:
        resumed: this process continues the run in its own directory (``accrot fit --resume``).
        start: ``{"ckpt_path", "step"}`` of the checkpoint the command starts from, if any.
        init: ``{"ckpt_path", "step", "run_dir"}`` of the checkpoint whose weights began the run (``--init_from``).
        announce: a user's ``accrot fit``: when training starts, print ``run directory: RUN (announce)`` and send
            Lightning's lines to ``RUN/console.log`` (:func:`accrot.logs.release_startup_logs`).
    """

    def __init__(self, resumed: bool = False, start: dict | None = None, init: dict | None = None,
                 announce: str | None = None) -> None:
        super().__init__()
        self.resumed = resumed
        self.start = start
        self.init = init
        self.announce = announce
        self._record: dict[str, Any] = {}
        self._path: Path | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        dm = trainer.datamodule
        schemes = pl_module.model.schemes() if hasattr(pl_module, "model") else []
        out = Path(trainer.log_dir or trainer.default_root_dir)
        previous = _read(out / "run.json") if self.resumed else {}
        record = {
            "stage": stage,
            "status": "running" if stage == "fit" else None,
            "command": previous.get("command", sys.argv),
            "revision": git_revision(),
            "versions": versions(),
            # the compiled CPU rotation kernels and the eager formulas agree to rounding, not bit for bit
            "rotation_kernels": cpu_kernels.describe(trainer.strategy.root_device),
            "denormals": runtime.denormals(),  # IEEE (the default) or flushed to zero (ACCROT_DENORMALS=flush)
            "allocator": runtime.allocator(),  # glibc malloc tuned (the accrot command's default) or default
            "seed": _seed(),
            "hparams": dict(pl_module.hparams),
            "data": dm.describe() if dm is not None and hasattr(dm, "describe") else {},
            "scheme": schemes[0].describe() if schemes else {},
            # each layer's own scheme (they differ where the scheme has a layer_pattern)
            "scheme_layers": [scheme.cfg.label() for scheme in schemes],
            "parameters": sum(p.numel() for p in pl_module.parameters()),
            "launch": _launch(trainer),
            "ran": _ran(trainer, dm),
            "started_from": previous.get("started_from", None if self.resumed else self.start),
            "init_from": previous.get("init_from", None if self.resumed else self.init),
            "resumes": int(previous.get("resumes", 0)) + int(self.resumed),
            "resume_history": list(previous.get("resume_history", [])) + (
                [{"step": (self.start or {}).get("step"), "time": time.time(), "command": sys.argv}]
                if self.resumed else []),
        }
        hparams = {"revision": record["revision"], "data_fingerprint": record["data"].get("fingerprint")}
        window = record["scheme"].get("mixing_window")
        if isinstance(window, list) and window:  # random increments: predicted from the distribution
            hparams.update({"scheme/mixing_window_min": min(window), "scheme/mixing_window_max": max(window)})
            rank_zero_info(
                f"predicted mixing window per frequency pair (ε={record['scheme'].get('window_eps')}): "
                f"{min(window):.4g} … {max(window):.4g} tokens"
            )
        for logger in trainer.loggers:
            logger.log_hyperparams(hparams)
        self._record, self._path = record, out / "run.json"
        if trainer.is_global_zero:
            out.mkdir(parents=True, exist_ok=True)
            self._write()

    def _write(self) -> None:
        atomic_write_text(self._path, json.dumps(self._record, indent=1, default=str))

    def _finish(self, trainer: L.Trainer, **fields: Any) -> None:
        if trainer.is_global_zero and self._path is not None:
            self._record.update(fields, timing=phases.clock().snapshot())  # seconds per phase, so far
            self._write()

    # the run's wall-time phases (accrot.phases): setup ends where fit starts; validation inside training
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        phases.clock().exit("setup")
        phases.clock().enter("training")
        # the data is set up and the model built (before Lightning's model summary): the input was good, so
        # Lightning's start-up lines (seed, devices) and accrot's warnings may print now
        if self.announce is None:
            release_startup_logs()
            return
        out = Path(trainer.log_dir or trainer.default_root_dir)  # rank 0's directory on every rank
        if trainer.is_global_zero:
            print(f"run directory: {out} ({self.announce})", flush=True)
        release_startup_logs(to=out / "console.log")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        phases.clock().enter("validation")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        phases.clock().exit("validation")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        phases.clock().exit("training")
        phases.clock().enter("after")
        self._finish(trainer, status="finished", step=trainer.global_step)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if isinstance(exception, SIGTERMException):  # a signal, checkpointed between steps (callbacks.preemption)
            signum = next((cb.signal for cb in trainer.callbacks if isinstance(cb, Preemption)), None)
            status = "interrupted" if signum == signal.SIGINT else "preempted"
            self._finish(trainer, status=status, step=trainer.global_step)
            return
        if isinstance(exception, KeyboardInterrupt):  # a second Ctrl-C: stopped mid-step, no new checkpoint
            self._finish(trainer, status="interrupted", step=trainer.global_step)
            return
        self._finish(trainer, status="failed", step=trainer.global_step,
                     error=f"{type(exception).__name__}: {' '.join(str(exception).split())[:500]}")

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """What a resumed run needs beside Lightning's state; the CSV rows are flushed first, so every row
        the count covers is on disk before the checkpoint is."""
        from accrot.resume import RECORD_KEY, ResumableCSVLogger

        section: dict[str, Any] = {"resumes": self._record.get("resumes", 0)}
        for logger in trainer.loggers:
            if isinstance(logger, ResumableCSVLogger) and trainer.is_global_zero:
                logger.save()
                section["metrics_rows"] = logger.rows
            elif type(logger).__name__ == "WandbLogger" and trainer.is_global_zero:
                section["wandb_id"] = logger.version
        checkpoint[RECORD_KEY] = section


def _ran(trainer: L.Trainer, dm) -> dict[str, Any]:
    """What the trainer resolved, which may differ from what the config asked (a precision Lightning falls back
    from): the precision, the device, the GPU kernels' switch and the data's vocabulary."""
    from accrot.ops import gpu_kernels

    return {"precision": str(trainer.precision), "device": str(trainer.strategy.root_device),
            "gpu_kernels": gpu_kernels.mode(), "vocab_size": getattr(dm, "vocab_size", None)}


def _launch(trainer: L.Trainer) -> dict[str, Any]:
    """How the processes were laid out: ranks, nodes, strategy, cluster environment, the SLURM job."""
    import os

    env = getattr(trainer.strategy, "cluster_environment", None)
    out = {"world_size": trainer.world_size, "num_nodes": trainer.num_nodes, "devices": trainer.num_devices,
           "strategy": type(trainer.strategy).__name__, "environment": type(env).__name__ if env else None}
    if os.environ.get("SLURM_JOB_ID"):
        out.update(slurm_job=os.environ["SLURM_JOB_ID"], slurm_nodes=os.environ.get("SLURM_JOB_NODELIST"),
                   slurm_restarts=int(os.environ.get("SLURM_RESTART_COUNT", 0)))
    return out


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _seed() -> int | None:
    import os

    value = os.environ.get("PL_GLOBAL_SEED")
    return int(value) if value is not None else None

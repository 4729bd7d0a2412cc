"""Record what produced a run (STYLE §12): git revision, data fingerprint, versions, seed, scheme facts."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from accrot.report import atomic_write_text

PACKAGES = ("torch", "lightning", "torchmetrics", "jsonargparse", "optuna", "wandb", "datasets", "numpy")


def git_revision(path: str | Path | None = None) -> str:
    """``<sha>`` or ``<sha>-dirty``; ``unknown`` outside a git checkout."""
    cwd = Path(path or Path(__file__).resolve().parent)
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        if sha.returncode:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


class RunRecord(L.Callback):
    """Writes ``run.json`` into the run directory at the start of every stage and logs the scheme's facts."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        dm = trainer.datamodule
        schemes = pl_module.model.schemes() if hasattr(pl_module, "model") else []
        record = {
            "stage": stage,
            "command": sys.argv,
            "revision": git_revision(),
            "versions": versions(),
            "seed": _seed(),
            "hparams": dict(pl_module.hparams),
            "data": dm.describe() if dm is not None and hasattr(dm, "describe") else {},
            "scheme": schemes[0].describe() if schemes else {},
            "parameters": sum(p.numel() for p in pl_module.parameters()),
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
        if trainer.is_global_zero:
            out = Path(trainer.log_dir or trainer.default_root_dir)
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / "run.json", json.dumps(record, indent=1, default=str))


def _seed() -> int | None:
    import os

    value = os.environ.get("PL_GLOBAL_SEED")
    return int(value) if value is not None else None

"""Where a sweep's wall time went (printed at the end of ``accrot sweep`` and ``accrot ablation``).

Every trial carries its run's phase split (``timing``, :mod:`accrot.phases`) and each worker's first trial its
start-up (``worker_start_s``: interpreter, imports, the spec, the storage). The summary adds them over the trials
this invocation finished, and sets the workers' CPU time (``getrusage(RUSAGE_CHILDREN)``, reaped workers only)
against the wall time and the cores: how busy the machine was kept.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from accrot.phases import PHASES

LABELS = {"worker_start": "worker start (process, imports, storage)", "setup": "setup (config, model, data)",
          "training": "training", "validation": "validation", "evaluation": "evaluation (every length)",
          "diagnostics": "diagnostics", "checkpoint": "checkpoints", "after": "after fit (tables, loggers)",
          "other": "other (trial bookkeeping)"}


@dataclass
class LoadMeter:
    """Wall time and the CPU time of reaped child processes since it was made."""

    wall0: float
    cpu0: float

    @classmethod
    def start(cls) -> LoadMeter:
        return cls(time.monotonic(), _children_cpu())

    def read(self) -> dict[str, float]:
        wall = time.monotonic() - self.wall0
        cpu = _children_cpu() - self.cpu0
        cores = os.cpu_count() or 1
        return {"wall_s": wall, "cpu_s": cpu, "cores": cores, "busy": cpu / (wall * cores) if wall > 0 else 0.0}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def split(trials: Sequence[Any]) -> dict[str, Any]:
    """Seconds per phase summed over ``trials`` (Optuna FrozenTrials), their count and their summed duration."""
    total = {name: 0.0 for name in ("worker_start", *PHASES, "other")}
    counted = 0
    duration = 0.0
    for t in trials:
        timing = t.user_attrs.get("timing")
        if not isinstance(timing, dict):
            continue
        counted += 1
        for name in PHASES:
            total[name] += float(timing.get(name, 0.0))
        total["worker_start"] += float(t.user_attrs.get("worker_start_s", 0.0))
        if t.duration is not None:
            seconds = t.duration.total_seconds()
            duration += seconds
            total["other"] += max(0.0, seconds - float(timing.get("total", 0.0)))
    return {"seconds": total, "trials": counted, "trial_seconds": duration}


def timing_table(trials: Sequence[Any], load: dict[str, float] | None = None):
    """A rich table of :func:`split` (None when no trial carries a split), with the load in its caption."""
    from rich.table import Table

    parts = split(trials)
    n = parts["trials"]
    if not n:
        return None
    seconds = parts["seconds"]
    whole = sum(seconds.values()) or 1.0
    table = Table(title=f"where the time went: {n} trial(s) finished by this run")
    for col in ("phase", "seconds", "share", "per trial"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for name, value in seconds.items():
        if value > 0 or name in ("training", "evaluation", "diagnostics"):
            table.add_row(LABELS[name], f"{value:.1f}", f"{100 * value / whole:.0f}%", f"{value / n:.2f}")
    train = seconds["training"]
    measured = seconds["evaluation"] + seconds["diagnostics"]
    caption = [f"evaluation + diagnostics = {measured / train:.2f}× training" if train > 0 else "no training time"]
    if load is not None and load["wall_s"] > 0:
        caption.append(f"workers: {load['cpu_s']:.0f} CPU-s in {load['wall_s']:.0f} s on {load['cores']} core(s), "
                       f"{100 * load['busy']:.0f}% busy")
    table.caption = "; ".join(caption)
    return table

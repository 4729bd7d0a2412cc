"""Where a run's wall time goes: one clock per run (``run_lightning`` starts it), split into phases.

* ``setup``: from the start of ``run_lightning`` to the start of ``fit``: parsing the config, building the model,
  the data and the trainer, cutting the evaluation blocks;
* ``training``: the fit loop, less the phases timed inside it:
* ``validation`` (Lightning's validation loop), ``evaluation`` (the extrapolation curve at every length),
  ``diagnostics`` (the theory's instruments) and ``checkpoint`` (writing checkpoints);
* ``after``: from the end of ``fit`` until the snapshot (the final tables, closing the loggers).

A phase entered inside another is charged to itself only (the outer phase gets the rest), so the phases add up to
the run's wall time. ``run.json`` records the split (``timing``), sweep workers put it on their trials, and
``accrot sweep`` / ``accrot ablation`` print the sum at the end (:func:`accrot.sweep.report.timing_table`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

WORKER_SPAWNED_AT = "ACCROT_WORKER_SPAWNED_AT"  # env: the wall-clock time a sweep parent started a worker process
PHASES = ("setup", "training", "validation", "evaluation", "diagnostics", "checkpoint", "after")


class PhaseClock:
    """Seconds per phase since :meth:`__init__`, nested phases charged exclusively."""

    def __init__(self, now=time.perf_counter) -> None:
        self.now = now  # the time source (a test gives a fake one)
        self.started = now()
        self.spent: dict[str, float] = {}
        self._open: list[list] = []  # [name, entered at, seconds spent in phases inside it]

    def enter(self, name: str) -> None:
        self._open.append([name, self.now(), 0.0])

    def exit(self, name: str) -> None:
        """Close the innermost open phase ``name`` (a phase never entered, or closed already, is ignored)."""
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] == name:
                break
        else:
            return
        while len(self._open) > i:  # phases left open inside it (an exception) close with it
            inner_name, entered, inner = self._open.pop()
            elapsed = self.now() - entered
            self.spent[inner_name] = self.spent.get(inner_name, 0.0) + elapsed - inner
            if self._open:
                self._open[-1][2] += elapsed

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        self.enter(name)
        try:
            yield
        finally:
            self.exit(name)

    def snapshot(self) -> dict[str, float]:
        """``{phase: seconds, ..., "total": seconds}`` up to now; an open phase counts up to now, less its open
        child's time (charged to the child) and its closed children's (already in ``inner``)."""
        now = self.now()
        spent = dict(self.spent)
        for i, (name, entered, inner) in enumerate(self._open):
            child = now - self._open[i + 1][1] if i + 1 < len(self._open) else 0.0
            spent[name] = spent.get(name, 0.0) + (now - entered) - inner - child
        out = {name: spent.pop(name, 0.0) for name in PHASES} | spent
        out["total"] = now - self.started
        return {k: round(v, 4) for k, v in out.items()}


_clock = PhaseClock()


def start_run() -> PhaseClock:
    """A fresh clock for the run starting now (a worker trains several runs in one process)."""
    global _clock
    _clock = PhaseClock()
    return _clock


def clock() -> PhaseClock:
    return _clock


def timed(name: str):
    """``with timed("evaluation"): ...`` on the current run's clock."""
    return _clock.timed(name)

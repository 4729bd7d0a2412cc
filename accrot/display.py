"""What a command that trains many runs shows while it works (``accrot demo``, ``accrot sweep``, ``accrot
ablation``): on a terminal one rich live display (runs done of the total, failures, elapsed time and ETA, what
each worker is running and the last finished runs with their NLL near and far); with ``--quiet`` or when the
output is not a terminal (a log file, CI, a SLURM job) one plain line per finished run instead."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass


def plain_help(doc: str | None) -> str:
    """A docstring as a command's ``--help`` prints it: plain text, reStructuredText's markup removed (``code``,
    :mod:`module` and :func:`function` references, ``::`` before a literal block)."""
    text = re.sub(r":\w+:`~?([^`<]+?)(?: <[^>]+>)?`", r"\1", doc or "")
    text = re.sub(r"``([^`]+)``", r"\1", text)
    return text.replace("::\n", ":\n")


@dataclass(frozen=True)
class Running:
    """A run in progress: who runs it (``worker 0``), what it is, since when (``time.time()``)."""

    who: str
    what: str
    since: float


@dataclass(frozen=True)
class Finished:
    """A finished run: ``state`` complete, pruned or failed; NLL at the training length and at the longest."""

    what: str
    state: str = "complete"
    near: float | None = None
    far: float | None = None
    detail: str = ""  # why it failed or was pruned
    seconds: float | None = None


def clock(seconds: float | None) -> str:
    """``1:02:03`` / ``2:03``; ``-`` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "-"
    s = int(round(seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def _nll(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


class RunDisplay:
    """``with RunDisplay(title, total, console, near="1×", far="32×") as d: ... d.update(done, running, finished)``.

    ``update`` takes what is true now: how many runs are done (of ``total``), the runs in progress, and the runs
    that finished since the last call. Live mode redraws once a second (the clocks move without new data);
    line mode prints each finished run once, as ``[done/total] what: NLL ... (time)``, one line however long (a log
    file has no width to wrap at); a failed run, whose retry is still to come, is ``[-/total] what: failed: ...``."""

    def __init__(self, title: str, total: int, console, near: str = "1×", far: str = "longest",
                 quiet: bool = False, keep: int = 6, done: int = 0) -> None:
        self.title, self.total, self.console, self.near, self.far, self.keep = title, total, console, near, far, keep
        self.live = not quiet and console.is_terminal
        self.started = time.time()
        self.done0 = self.done = done  # runs already done when the command started (a resumed sweep)
        self.failed = 0
        self.running: list[Running] = []
        self.last: list[Finished] = []
        self._lock = threading.Lock()
        self._live = None

    def __enter__(self) -> RunDisplay:
        if self.live:
            from rich.live import Live

            self._live = Live(self, console=self.console, refresh_per_second=1, transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    # -- data ----------------------------------------------------------------------------------------
    def update(self, done: int | None = None, running: list[Running] | None = None,
               finished: list[Finished] = ()) -> None:
        with self._lock:
            if done is not None:
                self.done = done
            if running is not None:
                self.running = list(running)
            for f in finished:
                self.failed += f.state == "failed"
                self.last = [f, *self.last][: self.keep]
        if not self.live:  # each complete or pruned run numbered by its own place among the runs done
            n = max(1, self.done - sum(f.state != "failed" for f in finished) + 1)
            for f in finished:
                counted = f.state != "failed"
                self.console.print(self.line(f, n if counted else None), markup=False, highlight=False,
                                   soft_wrap=True)
                n += counted

    def eta(self) -> float | None:
        """Seconds left at this command's own pace (runs done before it started are not its pace)."""
        ran = self.done - self.done0
        if ran <= 0 or self.done >= self.total:
            return None if self.done < self.total else 0.0
        return (time.time() - self.started) / ran * (self.total - self.done)

    def line(self, f: Finished, n: int | None = None) -> str:
        """``[n/total] what: ...``; a failed run has no place among the runs done: ``[-/total]``."""
        took = f" ({clock(f.seconds)})" if f.seconds is not None else ""
        if f.state == "complete":
            what = f"NLL {_nll(f.near)} at {self.near}, {_nll(f.far)} at {self.far}"
        else:
            what = f"{f.state}: {f.detail}" if f.detail else f.state
        place = "-" if f.state == "failed" else self.done if n is None else n
        return f"[{place}/{self.total}] {f.what}: {what}{took}"

    # -- rendering (rich calls this at every refresh) ------------------------------------------------
    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        with self._lock:
            running, last, done, failed = list(self.running), list(self.last), self.done, self.failed
        now = time.time()
        head = Text.assemble((self.title, "bold"), f"  {done}/{self.total} runs done",
                             (f", {failed} failed" if failed else "", "red"),
                             f"  ·  elapsed {clock(now - self.started)}  ·  ETA {clock(self.eta())}")
        parts = [head]
        if running:
            table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
            for r in running:
                table.add_row(r.who, r.what, clock(now - r.since))
            parts.append(table)
        if last:
            table = Table(box=None, padding=(0, 2, 0, 0), title_justify="left")
            for col in ("last finished", f"NLL {self.near}", f"NLL {self.far}", "time"):
                table.add_column(col, justify="left" if col == "last finished" else "right")
            for f in last:
                if f.state == "complete":
                    table.add_row(f.what, _nll(f.near), _nll(f.far), clock(f.seconds))
                else:
                    table.add_row(Text(f"{f.what}: {f.state} {f.detail}"[:100], "red" if f.state == "failed" else ""),
                                  "", "", clock(f.seconds))
            parts.append(table)
        return Group(*parts)

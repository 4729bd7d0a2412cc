"""Lightning's start-up lines (and warnings) are held until training starts, so an error is the only line a user
sees.

Lightning logs "Seed set to 0", "GPU available: …" and its hints while LightingCLI parses and builds the
Trainer, which is also where accrot rejects bad input. :func:`hold_startup_logs` swaps the handlers of
Lightning's two top loggers for one that keeps the records; :func:`release_startup_logs` (called when training
starts, or when the command ends well) replays them through the original handlers in order; a command that
fails drops them, so nothing prints before its one-line error. Python warnings raised meanwhile (Lightning's
"The `srun` command is available on your system but is not used", from its SLURM detection) are held and replayed
or dropped the same way.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

LOGGERS = ("lightning.pytorch", "lightning.fabric")  # both have propagate=False and their own StreamHandler


class _Held(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[logging.Logger, logging.LogRecord]] = []
        self.warnings: list[warnings.WarningMessage] = []  # in order
        self.showwarning = warnings.showwarning

    def hold_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        self.warnings.append(warnings.WarningMessage(message, category, filename, lineno, file, line))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((logging.getLogger(record.name), record))


_held: _Held | None = None
_saved: dict[str, list[logging.Handler]] = {}


def release_startup_logs() -> None:
    """Give the loggers their handlers back and print what was held (no-op when nothing is held)."""
    global _held
    if _held is None:
        return
    held, _held = _held, None
    if warnings.showwarning == held.hold_warning:
        warnings.showwarning = held.showwarning
    for msg in held.warnings:  # the module's own dispatch: it honours catch_warnings(record=True) (pytest)
        warnings._showwarnmsg(msg)
    for name, handlers in _saved.items():
        logger = logging.getLogger(name)
        logger.removeHandler(held)
        for h in handlers:
            logger.addHandler(h)
    for _, record in held.records:
        for h in _saved.get(_top(record.name), []):
            if record.levelno >= h.level:
                h.handle(record)
    _saved.clear()


def _drop() -> None:
    global _held
    if _held is not None:
        _held.records.clear()
        _held.warnings.clear()
        release_startup_logs()


def _top(name: str) -> str:
    return next((top for top in LOGGERS if name == top or name.startswith(top + ".")), name)


@contextlib.contextmanager
def hold_startup_logs() -> Iterator[None]:
    """Hold Lightning's log lines for the body; released by training's start or a clean end, dropped on error."""
    global _held
    if _held is not None:  # nested (a sweep trial inside a command that holds already): the outer one decides
        yield
        return
    _held = _Held()
    warnings.showwarning = _held.hold_warning
    for name in LOGGERS:
        logger = logging.getLogger(name)
        _saved[name] = list(logger.handlers)
        for h in _saved[name]:
            logger.removeHandler(h)
        logger.addHandler(_held)
    try:
        yield
    except BaseException:
        _drop()
        raise
    release_startup_logs()


@contextlib.contextmanager
def run_log(path: Path) -> Iterator[None]:
    """Everything a run prints (Lightning's banners, summaries and hints, wandb's, library warnings, the
    end-of-fit table) goes to ``path`` instead of the terminal; accrot's own warnings (the ``accrot`` loggers) and
    every error still reach it. For commands that train many runs and print one line each (``accrot demo``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ours = logging.StreamHandler(sys.stderr)  # the terminal, taken before the redirect
    ours.setLevel(logging.WARNING)
    with open(path, "a", encoding="utf-8") as fh:
        to_file = logging.StreamHandler(fh)
        saved = {name: list(logging.getLogger(name).handlers) for name in LOGGERS}
        for name, handlers in saved.items():
            for h in handlers:
                logging.getLogger(name).removeHandler(h)
            logging.getLogger(name).addHandler(to_file)
        logging.getLogger("accrot").addHandler(ours)
        try:
            with contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
                yield
        finally:
            logging.getLogger("accrot").removeHandler(ours)
            for name, handlers in saved.items():
                logging.getLogger(name).removeHandler(to_file)
                for h in handlers:
                    logging.getLogger(name).addHandler(h)

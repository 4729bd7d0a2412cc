"""Lightning's start-up lines (and warnings) are held until training starts, so an error is the only line a user
sees.

Lightning logs "Seed set to 0", "GPU available: …" and its hints while LightingCLI parses and builds the
Trainer, which is also where accrot rejects bad input. :func:`hold_startup_logs` swaps the handlers of
Lightning's two top loggers for one that keeps the records; :func:`release_startup_logs` (called when training
starts, or when the command ends well) replays them through the original handlers in order; a command that
fails drops them, so nothing prints before its one-line error. Python warnings raised meanwhile (Lightning's
"The `srun` command is available on your system but is not used", from its SLURM detection) are held and replayed
or dropped the same way, and so are accrot's own warnings (the ``accrot`` loggers), which always reach the
terminal once the input proved good.

``release_startup_logs(to=RUN/console.log)`` (``accrot fit`` from a shell) writes Lightning's held lines and
warnings into the run's log instead, and keeps sending them there until the command ends: the terminal shows
accrot's own lines, the progress bar and the tables.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

LOGGERS = ("lightning.pytorch", "lightning.fabric")  # both have propagate=False and their own StreamHandler
OURS = ("accrot", "callbacks", "data_modules")  # accrot's own warnings ("accrot: warning: ..."), held the same way


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


class _RunLog:
    """Lightning's log lines and Python's warnings go to a run's ``console.log`` until :meth:`close`."""

    def __init__(self, path: Path, saved: dict[str, list[logging.Handler]]) -> None:
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open until the command ends (close)
        self.handler = logging.StreamHandler(self.file)
        self.saved = saved
        for name in saved:
            logging.getLogger(name).addHandler(self.handler)
        self.showwarning = warnings.showwarning
        warnings.showwarning = self.write_warning

    def write_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        self.file.write(warnings.formatwarning(message, category, filename, lineno, line))
        self.file.flush()

    def write(self, record: logging.LogRecord) -> None:
        self.handler.handle(record)

    def close(self) -> None:
        if warnings.showwarning == self.write_warning:
            warnings.showwarning = self.showwarning
        for name, handlers in self.saved.items():
            logger = logging.getLogger(name)
            logger.removeHandler(self.handler)
            for h in handlers:
                logger.addHandler(h)
        self.file.close()


_held: _Held | None = None
_saved: dict[str, list[logging.Handler]] = {}
_ours: dict[str, tuple[bool, list[logging.Handler]]] = {}  # accrot's loggers: propagate and handlers before the hold
_run_log: _RunLog | None = None


def release_startup_logs(to: Path | None = None) -> None:
    """Give the loggers their handlers back and print what was held (no-op when nothing is held). ``to``: a run's
    log file, which gets Lightning's held lines and warnings, and every later one until the command ends; accrot's
    own warnings still go to the terminal."""
    global _held, _run_log
    if _held is None:
        return
    held, _held = _held, None
    saved = _unhold(held)
    if to is not None:
        try:
            _run_log = _RunLog(Path(to), saved)
        except OSError:  # an unwritable log never stops a run: the lines go to the terminal instead
            _run_log = None
    if _run_log is None:
        for name, handlers in saved.items():
            for h in handlers:
                logging.getLogger(name).addHandler(h)
    _replay(held, saved, _run_log)


def _unhold(held: _Held) -> dict[str, list[logging.Handler]]:
    """Take the holding handler off every logger (and Python's warnings); Lightning's loggers' own handlers."""
    if warnings.showwarning == held.hold_warning:
        warnings.showwarning = held.showwarning
    for name in OURS:
        logger = logging.getLogger(name)
        logger.removeHandler(held)
        propagate, handlers = _ours.pop(name, (True, []))
        logger.propagate = propagate
        for h in handlers:
            logger.addHandler(h)
    saved = dict(_saved)
    _saved.clear()
    for name in saved:
        logging.getLogger(name).removeHandler(held)
    return saved


def _replay(held: _Held, saved: dict[str, list[logging.Handler]], log: _RunLog | None) -> None:
    """What was held, in order: Lightning's lines and the warnings to ``log`` (or their own handlers), accrot's
    through its loggers."""
    for msg in held.warnings:
        if log is not None:
            log.write_warning(msg.message, msg.category, msg.filename, msg.lineno, line=msg.line)
        else:  # the module's own dispatch: it honours catch_warnings(record=True) (pytest)
            warnings._showwarnmsg(msg)
    for logger, record in held.records:
        top = _top(record.name)
        if top not in saved:  # accrot's own: through its logger, as if it were logged now
            logger.handle(record)
        elif log is not None:
            log.write(record)
        else:
            for h in saved[top]:
                if record.levelno >= h.level:
                    h.handle(record)


def end_run_log() -> None:
    """Lightning's loggers and Python's warnings back to the terminal (the end of the command)."""
    global _run_log
    if _run_log is not None:
        log, _run_log = _run_log, None
        log.close()


def _drop() -> None:
    global _held
    if _held is not None:
        _held.records.clear()
        _held.warnings.clear()
        release_startup_logs()


def _top(name: str) -> str:
    return next((top for top in (*LOGGERS, *OURS) if name == top or name.startswith(top + ".")), name)


@contextlib.contextmanager
def hold_startup_logs() -> Iterator[None]:
    """Hold Lightning's log lines and accrot's warnings for the body; released by training's start or a clean end,
    dropped on error. A run log opened by the release is closed when the body ends."""
    global _held
    if _held is not None or _run_log is not None:  # nested (a sweep trial inside a command that holds already)
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
    for name in OURS:  # held once, then handled as usual at the release (pytest's caplog, the demo's terminal)
        logger = logging.getLogger(name)
        _ours[name] = (logger.propagate, list(logger.handlers))
        for h in _ours[name][1]:
            logger.removeHandler(h)
        logger.propagate = False
        logger.addHandler(_held)
    try:
        yield
    except BaseException:
        _drop()
        raise
    finally:
        end_run_log()
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


# what --wandb / the config's wandb take: auto (online where an API key is configured, else offline) or a mode
WANDB_MODES = ("auto", "online", "offline", "disabled")

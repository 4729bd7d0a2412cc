"""The run directory a command creates: named after the scheme cell it trains, kept inside ``--root``, made and
proven writable before any work (an unwritable or full folder is one line), and removed again when the command fails
before its first checkpoint (nothing half-written). The output folders of ``accrot eval`` and ``accrot diagnose``
are made and proven writable the same way, before their computing starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from accrot.errors import UsageError, declare_write_folder

NAME_MAX = 255  # bytes in one folder name on Linux's and macOS's filesystems


def default_run_name(scheme) -> str:
    """The folder name of a run of ``scheme`` (a SchemeConfig) under ``--root``: its one name spelled as a folder
    (:meth:`SchemeConfig.run_name`), ``rotation[-increments]-far_mass[-values]`` (``rope-none``,
    ``accum-learned-forget-values``) plus every setting that makes it another scheme than the cell's reference
    (``-mean_rope``, ``-plain``, ``-rank0``, ``-torchinit``, ``-alibi_init``, ``-base500000``, ...), an output gate
    (``-gate``, ``-headgate``) and a per-layer pattern (``-layers_cell_none``). Two different cells never share a
    folder."""
    return scheme.run_name()


def check_run_name(root: str, name: str) -> None:
    """``--name`` is a folder inside ``--root`` (it may nest: ``--name=long/rope``); one that leaves it
    (``../x``, an absolute path) or names the root itself is a one-line UsageError."""
    base = Path(root).expanduser().absolute()
    target = Path(os.path.normpath(base / Path(name).expanduser()))
    if not str(name).strip() or target == base or base not in target.parents:
        raise UsageError(f"--name={name!r} is not valid; a run name is a folder inside --root ({str(root)!r}), "
                         "without '..' or an absolute path (e.g. --name=rope-long)")
    longest = max(Path(name).parts, key=lambda part: len(os.fsencode(part)))
    if len(os.fsencode(longest)) > NAME_MAX:  # the filesystem's limit on one folder name
        raise UsageError(f"--name={str(name)[:40]!r}... is not valid; a folder name is at most {NAME_MAX} bytes (this "
                         f"one is {len(os.fsencode(longest))}); give a shorter --name")


LOCK_NAME = ".accrot.lock"


class FolderLock:
    """One writer per folder: an exclusive ``flock`` on ``<folder>/.accrot.lock`` held for the command's life (with
    ``beside``: on ``.<folder>.accrot.lock`` next to it, for a folder that must stay empty until its writer fills
    it, as a run directory must for Lightning's logger).

    A second command that would write the same folder (two ``fit --resume`` of one run, a requeue submitted twice,
    two ``eval`` into one ``--out``) is refused at once in one line naming the holder. The kernel drops the lock when
    its holder dies, so a stale lock of a dead process is taken over by the next command without a word; the file
    holds the holder's pid and host for the message, and is removed on release (before unlocking, so a command that
    opened it meanwhile still finds it held)."""

    def __init__(self, folder: Path, option: str, what: str, beside: bool = False) -> None:
        import fcntl
        import socket

        folder = Path(folder).resolve()  # a symlink to a folder is that folder: one lock, not two
        self.folder = folder
        self.path = folder.parent / f".{folder.name}{LOCK_NAME}" if beside else folder / LOCK_NAME
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self.fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(self.fd)
            other = "" if option == "--resume" else f", or pass another {option}"  # a run has one place
            raise UsageError(f"{option} {str(folder)!r}: {what} is being written by another accrot command "
                             f"(pid {holder}); wait for it to finish{other}") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()} on {socket.gethostname()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass
        os.close(self.fd)  # closing the last descriptor drops the flock
        self.fd = None


@contextlib.contextmanager
def holding(folder: Path, option: str, what: str) -> Iterator[Path]:
    """``folder`` made (with its parents) and locked for the body (:class:`FolderLock`: one writer per folder). What
    the body wrote stays, whatever happened (a study's or a report's folder holds earlier results); a folder this
    command made and left empty is removed again when the body fails (a refusal leaves nothing behind)."""
    folder = Path(folder).absolute()
    made, p = [], folder
    while not p.exists() and p != p.parent:
        made.append(p)
        p = p.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot write {what} {str(folder)!r} ({err.strerror or err}); pass a writable {option}") from None
    declare_write_folder(folder, option)
    lock = FolderLock(folder, option, what)
    try:
        yield folder
    except BaseException:
        lock.release()
        for path in made:  # innermost first; rmdir refuses a folder that holds anything
            try:
                path.rmdir()
            except OSError:
                break
        raise
    finally:
        lock.release()


class RunDirs:
    """The directories one command created (outermost first) and the run directory it writes, locked for the
    command's life (:class:`FolderLock`) until :meth:`release`."""

    def __init__(self) -> None:
        self.created: list[Path] = []
        self.run_dir: Path | None = None
        self.lock: FolderLock | None = None

    def make(self, run_dir: Path, option: str = "--root", what: str = "the run directory") -> None:
        """Create the run directory now (recording what this command created) and prove it writable; ``option``
        and ``what``: how the one-line error names the command's own option and the folder."""
        self.run_dir = Path(run_dir)
        declare_write_folder(run_dir, option)
        missing, p = [], Path(run_dir).absolute()
        while not p.exists() and p != p.parent:
            missing.append(p)
            p = p.parent
        self.created.extend(reversed(missing))
        try:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            write_probe(Path(run_dir) / f".accrot-write-probe-{os.getpid()}")
        except OSError as err:
            raise UsageError(f"cannot write {what} {str(run_dir)!r} ({err.strerror or err}); pass a writable "
                             f"{option} with free space") from None
        if self.lock is None or self.lock.folder != Path(run_dir).resolve():
            self.release()
            self.lock = FolderLock(Path(run_dir), option, what, beside=True)

    def hold(self, run_dir: Path, option: str, what: str) -> None:
        """Lock an existing run directory now (a resumed run: before anything reads its files), for :meth:`make`
        to find held."""
        self.release()
        self.lock = FolderLock(Path(run_dir), option, what, beside=True)

    def release(self) -> None:
        """Drop the folder's lock (the command is done writing it)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def remove_incomplete(self) -> None:
        """Remove the run directory unless it holds a checkpoint; a parent folder this command created only if
        that is empty (another process may be writing a run of its own beside). The lock goes first."""
        self.release()
        for path in reversed(self.created):
            if not path.exists():
                continue
            if self.run_dir is not None and path.resolve() == self.run_dir.resolve():
                if not any(path.glob("checkpoints/*.ckpt")):
                    shutil.rmtree(path, ignore_errors=True)
                continue
            try:
                path.rmdir()
            except OSError:
                pass


def write_probe(path: Path) -> None:
    """Write and fsync 4 KiB (an unwritable or full folder fails here), then remove it."""
    try:
        with open(path, "wb") as fh:
            fh.write(b"\0" * 4096)
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        if path.exists():
            path.unlink()

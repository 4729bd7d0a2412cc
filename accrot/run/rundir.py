"""The run directory a command creates: named after the scheme cell it trains, kept inside ``--root``, made and
proven writable before any work (an unwritable or full folder is one line), and removed again when the command fails
before its first checkpoint (nothing half-written). The output folders of ``accrot eval`` and ``accrot diagnose``
are made and proven writable the same way, before their computing starts.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from accrot.errors import UsageError

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


class RunDirs:
    """The directories one command created (outermost first) and the run directory it writes."""

    def __init__(self) -> None:
        self.created: list[Path] = []
        self.run_dir: Path | None = None

    def make(self, run_dir: Path, option: str = "--root", what: str = "the run directory") -> None:
        """Create the run directory now (recording what this command created) and prove it writable; ``option``
        and ``what``: how the one-line error names the command's own option and the folder."""
        self.run_dir = Path(run_dir)
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

    def remove_incomplete(self) -> None:
        """Remove the run directory unless it holds a checkpoint; a parent folder this command created only if
        that is empty (another process may be writing a run of its own beside)."""
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

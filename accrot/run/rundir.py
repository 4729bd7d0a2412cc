"""The run directory a command creates: made and proven writable before any work (an unwritable or full
folder is one line), and removed again when the command fails before its first checkpoint (nothing half-written).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from accrot.errors import UsageError


class RunDirs:
    """The directories one command created (outermost first) and the run directory it writes."""

    def __init__(self) -> None:
        self.created: list[Path] = []
        self.run_dir: Path | None = None

    def make(self, run_dir: Path) -> None:
        """Create the run directory now (recording what this command created) and prove it writable."""
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
            raise UsageError(f"cannot write the run directory {str(run_dir)!r} ({err.strerror or err}); pass a "
                             "writable --root with free space") from None

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

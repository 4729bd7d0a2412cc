"""Files a run or a report writes: atomic text and figures, and the git revision that produced them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# matplotlib's cache must never land in a read-only or shared home
os.environ.setdefault("MPLCONFIGDIR", str(Path(os.environ.get("TMPDIR", "/tmp")) / "accrot-mpl"))


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display is ever needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write via a sibling temp file and ``os.replace``: a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def atomic_savefig(fig, path: str | Path) -> None:
    """Save a figure the way :func:`atomic_write_text` writes text."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    os.replace(tmp, path)


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

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


def load_yaml(text: str):
    """``yaml.safe_load`` that refuses a key given twice in one mapping (at any depth): PyYAML would keep the last one
    without a word (a second ``model:`` section replacing the first). Raises a ``yaml.YAMLError`` naming the key and
    both lines, as for any other YAML mistake. Standard YAML otherwise: anchors, aliases and merge keys
    (``<<: *base``, whose keys a mapping's own keys override, as the YAML merge type defines) are read as PyYAML
    reads them."""
    import yaml

    merge = "tag:yaml.org,2002:merge"

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == merge:  # `<<`: merged keys may be overridden; flatten_mapping resolves them
                    continue
                key, mark = self.construct_object(key_node, deep=True), key_node.start_mark
                try:
                    first = seen.setdefault(key, mark)
                except TypeError:  # an unhashable key: PyYAML's own error names it
                    break
                if first is not mark:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice (lines {first.line + 1} and {mark.line + 1}); "
                        "keep one", mark)
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader

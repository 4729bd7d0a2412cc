"""Tables and figures from extrapolation results (one run, or several runs side by side)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.table import Table

# matplotlib's cache must never land in a read-only or shared home
os.environ.setdefault("MPLCONFIGDIR", str(Path(os.environ.get("TMPDIR", "/tmp")) / "accrot-mpl"))


def _pyplot():
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
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    os.replace(tmp, path)


def load_extrapolation(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def plot_curves(
    curves: Mapping[str, Sequence[Mapping]],
    train_length: int,
    path: str | Path,
    title: str = "",
) -> Path:
    """Two panels: NLL vs evaluation length (log₂ axis, training length marked) and per-position NLL.

    ``curves`` maps a label (a scheme, or a training step) to its list of per-length result dicts
    (the ``lengths`` entries of ``extrapolation.json``).
    """
    plt = _pyplot()
    fig, (ax_len, ax_pos) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, rows in curves.items():
        rows = sorted(rows, key=lambda r: r["length"])
        line = ax_len.plot([r["length"] for r in rows], [r["nll"] for r in rows], marker="o", label=label)[0]
        longest = rows[-1]
        width = longest["bucket_width"]
        xs = [(i + 0.5) * width for i in range(len(longest["bucket_nll"]))]
        ax_pos.plot(xs, longest["bucket_nll"], color=line.get_color(), label=f"{label} (ℓ={longest['length']})")
    for ax in (ax_len, ax_pos):
        ax.set_xscale("log", base=2)
        ax.axvline(train_length, color="grey", linestyle="--", linewidth=1)
        ax.grid(True, alpha=0.3)
    ax_len.set_xlabel("evaluation length (tokens)")
    ax_len.set_ylabel("mean NLL (nats/token)")
    ax_len.set_title("NLL vs length (dashed: training length)")
    ax_pos.set_xlabel("position in block")
    ax_pos.set_ylabel("NLL (nats/token)")
    ax_pos.set_title("per-position NLL at the longest length")
    ax_len.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    atomic_savefig(fig, path)
    plt.close(fig)
    return Path(path)


def nll_table(curves: Mapping[str, Sequence[Mapping]], train_length: int, title: str = "NLL per length") -> Table:
    """A rich table: one row per label, one column per evaluation length (multiple of the training length)."""
    lengths = sorted({r["length"] for rows in curves.values() for r in rows})
    table = Table(title=title)
    table.add_column("scheme")
    for ln in lengths:
        table.add_column(f"{ln / train_length:g}×", justify="right")
    for label, rows in curves.items():
        by_len = {r["length"]: r["nll"] for r in rows}
        table.add_row(label, *(f"{by_len[ln]:.3f}" if ln in by_len else "-" for ln in lengths))
    return table

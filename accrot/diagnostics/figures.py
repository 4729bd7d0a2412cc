"""The diagnostics' figures: coherence curves with their predictions, windows per length, far mass per length."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from accrot.diagnostics.bundle import or_nan
from accrot.io import atomic_savefig, pyplot


# -- figures -----------------------------------------------------------------------------------------------------------
def plot_diagnostics(result: Mapping, out_dir: str | Path) -> list[Path]:
    """PNGs (written atomically): ``coherence.png`` (c vs Δ per layer: measured solid at the first length, dotted at
    the others, predicted dashed, ε line), ``far_mass.png`` (vs length, log x, with the lower bound's prediction)
    and, for SO(2) rotations,
    ``value_far_norm.png``. Returns the paths written."""
    plt = pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    layers = result["layers"]
    written = []
    figures = {"coherence.png": _coherence(plt, result), "far_mass.png": _far_mass(plt, result)}
    if any(layer["value_far_norm"] for layer in layers):  # SO(2) rotations only
        figures["value_far_norm.png"] = _value_far_norm(plt, result)
    for name, fig in figures.items():
        atomic_savefig(fig, out_dir / name)
        plt.close(fig)
        written.append(out_dir / name)
    return written


def _coherence(plt, result: Mapping):
    """c vs Δ per layer: measured solid at L, dotted at the longest length, predicted dashed, the ε line."""
    layers, eps, L = result["layers"], result["eps"], result["train_length"]
    fig, axes = plt.subplots(1, len(layers), figsize=(4.5 * len(layers), 3.8), squeeze=False)
    for ax, layer in zip(axes[0], layers):
        for j, c in enumerate(layer["coherence"]):
            style = "-" if j == 0 else ":"
            dist = c["distances"]
            for h, curve in enumerate(c["curve"]):
                pts = [(d, or_nan(y)) for d, y in zip(dist, curve) if d > 0]
                ax.plot(*zip(*pts), style, color=f"C{h}", linewidth=1.2,
                        label=f"head {h} @{c['length']}" if j == 0 or h == 0 else None)
        pred = layer.get("predicted")
        if pred:
            pts = [(d, or_nan(y)) for d, y in zip(pred["distances"], pred["curve"][0]) if d > 0]
            ax.plot(*zip(*pts), "--", color="black", linewidth=1.6, zorder=5,
                    label=f"predicted ({result['prediction']})")
        ax.axhline(eps, color="grey", linewidth=0.8)
        ax.axvline(L, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_ylim(-0.25, 1.1)
        ax.set_xlabel("distance Δ (tokens)")
        ax.set_title(f"layer {layer['layer']}")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("coherence E[ℓᴹℓᴵ]/E[(ℓᴵ)²]")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"coherence (solid: length {L}, dotted: longest; grey: ε = {eps:g}, training length)")
    return fig



def _far_mass(plt, result: Mapping):
    """Far mass vs length per layer (mean over heads, each head faint), and the lower bound's prediction from L's
    statistics dashed."""
    layers, L = result["layers"], result["train_length"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for layer in layers:
        xs = [f["length"] for f in layer["far"]]
        per_head = list(zip(*[[or_nan(m) for m in f["mass"]] for f in layer["far"]]))
        mean = [sum(col) / len(col) for col in zip(*per_head)]
        line = ax.plot(xs, mean, marker="o", label=f"layer {layer['layer']} (mean over heads)")[0]
        for ys in per_head:
            ax.plot(xs, ys, color=line.get_color(), alpha=0.3, linewidth=0.8)
        pred = layer.get("far_prediction")
        if pred:
            ys = [sum(map(or_nan, m)) / len(m) for m in pred["mass"]]
            ax.plot(pred["lengths"], ys, "--", color=line.get_color(), label=f"layer {layer['layer']} predicted from L")
    ax.set_xscale("log", base=2)
    ax.axvline(L, color="grey", linestyle="--", linewidth=1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel(f"attention mass beyond each head's window (≥ {result['far_window']})")
    ax.set_title("far mass (last queries of each block)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _value_far_norm(plt, result: Mapping):
    layers = result["layers"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for layer in layers:
        rows = layer["value_far_norm"]
        if not rows:
            continue
        xs = [r["length"] for r in rows]

        def mean(key, rows=rows):
            return [sum(map(or_nan, r[key])) / len(r[key]) for r in rows]

        line = ax.plot(xs, mean("unrotated"), "--", marker="o", label=f"layer {layer['layer']} unrotated")[0]
        ax.plot(xs, mean("rotated"), "-", marker="o", color=line.get_color(), label=f"layer {layer['layer']} rotated")
        ax.plot(xs, mean("incoherent"), ":", color=line.get_color(), label=f"layer {layer['layer']} √Σa²‖v‖²")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("‖far part of the output‖ (mean over heads)")
    ax.set_title("value transport: far contributions")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return fig

"""The ablation's figures: NLL against length with the seeds' band, per-position NLL, the extrapolation horizon,
retrieval depth × length heatmaps, and the theory figures (far mass measured against the lower bound's prediction,
coherence against distance). Every variant keeps one look (accrot/study/looks.py) in every figure; the curves come
one panel per family of variants, the baselines faint in each, every legend outside the data."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from accrot.evaluation import smoothed_positions
from accrot.io import atomic_savefig, pyplot
from accrot.metrics import mean_std
from accrot.study.claims import HORIZON_TOLERANCE
from accrot.study.looks import FAMILIES, by_family, frame, look
from accrot.study.results import Results, Run, diag_layers, horizon, mean_of, times
from accrot.study.theory import kind, measured_far_mass, predicted_far_mass
from accrot.study.variants import DATASET_RECORDS, extension_of


def _band(ax, variant: str, points: Sequence[tuple[float, Sequence[float]]], faint: bool = False,
          intervals: Sequence[tuple[float, Sequence[Sequence[float]]]] | None = None) -> None:
    """The mean over seeds at each x as a line, ± one standard deviation as a shaded band (none for an evaluation
    of another variant's runs); ``faint``: the mean alone, thin and pale, unlabelled (a reference in another
    family's panel). ``intervals``: per x, each seed's own interval (the text's noise within a run, e.g. the
    anchors' interval of a same-target rise), drawn as error bars from the mean of their bounds: with one seed the
    band is empty and these bars are what says how far the line may be noise."""
    xs, ms, ss = [], [], []
    for x, vals in points:
        if vals:
            mean, std = mean_std(vals)
            xs.append(x), ms.append(mean), ss.append(std or 0.0)
    if not xs:  # nothing measured: no line, so no legend entry for a curve that is not there
        return
    lk = look(variant)
    if faint:
        ax.plot(xs, ms, color=lk.color, linestyle=lk.linestyle, lw=0.9, alpha=0.35, zorder=1)
        return
    ax.plot(xs, ms, ms=3.5, lw=1.3, label=variant, zorder=3, **lk.line())
    if not lk.evaluation_only:
        ax.fill_between(xs, [a - b for a, b in zip(ms, ss)], [a + b for a, b in zip(ms, ss)], color=lk.color,
                        alpha=0.15, lw=0, zorder=2)
    bars = [(x, m, [sum(b[0] for b in cis) / len(cis), sum(b[1] for b in cis) / len(cis)])
            for (x, cis), m in zip([(x, c) for x, c in (intervals or []) if c], ms) if cis]
    if bars:
        ax.errorbar([b[0] for b in bars], [b[1] for b in bars],
                    yerr=[[max(0.0, b[1] - b[2][0]) for b in bars], [max(0.0, b[2][1] - b[1]) for b in bars]],
                    fmt="none", ecolor=lk.color, elinewidth=0.9, capsize=2.5, alpha=0.8, zorder=3)


def _family_panels(plt, variants: Sequence[str], draw: Callable[[Any, str, bool], None], title: str, xlabel: str,
                   ylabel: str):
    """Small multiples: one panel per family of ``variants`` (shared axes), the baselines drawn faintly in every
    other panel as the reference, each panel's legend beside it, outside the data. ``draw(ax, variant, faint)``
    draws one variant. Returns ``(figure, the panels' axes)``."""
    from matplotlib.lines import Line2D

    groups = by_family(list(variants))
    cols = 1 if len(groups) == 1 else 2
    rows = math.ceil(len(groups) / cols)
    fig, grid = plt.subplots(rows, cols, figsize=(6.8 * cols, 3.3 * rows + 0.8), sharex=True, sharey=True,
                             squeeze=False, layout="constrained")
    axes = list(grid.flat)
    for ax in axes[len(groups):]:
        ax.set_visible(False)
        above = axes[axes.index(ax) - cols]  # the panel above an empty slot is its column's bottom one
        above.xaxis.set_tick_params(labelbottom=True)
    baselines = [v for v in groups.get("baseline", []) if not look(v).evaluation_only]  # the trained ones
    for ax, (family, members) in zip(axes, groups.items()):
        for v in baselines if family != "baseline" else []:
            draw(ax, v, True)
        for v in members:
            draw(ax, v, False)
        handles, labels = ax.get_legend_handles_labels()
        if family != "baseline" and baselines:
            handles.append(Line2D([], [], color="grey", alpha=0.5, lw=0.9))
            labels.append("faint: the baselines")
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                  frameon=False)
        ax.set_title(FAMILIES[family].title, fontsize=9)
        ax.grid(True, alpha=0.25, lw=0.5)
    fig.suptitle(title, fontsize=10)
    fig.supxlabel(xlabel, fontsize=9)
    fig.supylabel(ylabel, fontsize=9)
    return fig, axes[:len(groups)]


def _multiples_axis(ax) -> None:
    """A log₂ x axis of multiples of L, its ticks read as 1×, 2×, 4×, …"""
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}×"))


def plot_nll(res: Results, dataset: str, path: Path, field_: str = "nll") -> Path:
    """NLL (or ``field_``) against length, mean ± std over seeds: one panel per family of variants."""
    plt = pyplot()
    mults = res.multipliers(dataset)

    def draw(ax, v: str, faint: bool) -> None:
        _band(ax, v, [(m, res.values(dataset, v, field_, m)) for m in mults], faint)

    fig, axes = _family_panels(plt, res.variants(dataset), draw, f"{dataset_title(dataset)}: mean ± std over seeds",
                               "evaluation length / training length L (dotted: L)",
                               "NLL (nats/token)" if field_ == "nll" else field_)
    for ax in axes:
        _multiples_axis(ax)
        ax.axvline(1, color="grey", ls=":", lw=1)
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def plot_rise(res: Results, dataset: str, path: Path) -> Path | None:
    """The same-target rise NLL(m) − NLL(1×) against length, mean ± std over seeds, one panel per family (None
    when no run of ``dataset`` recorded one: an answer task, or runs from before it existed). The per-length
    NLL beside it scores other text at each length; this one the same targets, with m·L tokens before them."""
    mults = res.multipliers(dataset)
    if not any(res.values(dataset, v, "same_target_rise", m) for v in res.variants(dataset) for m in mults):
        return None
    plt = pyplot()

    def draw(ax, v: str, faint: bool) -> None:
        _band(ax, v, [(m, res.values(dataset, v, "same_target_rise", m)) for m in mults], faint,
              intervals=[(m, [ci for r in res.by.get((dataset, v), [])
                              if (ci := r.lengths.get(m, {}).get("same_target_rise_ci"))]) for m in mults])

    fig, axes = _family_panels(plt, res.variants(dataset), draw,
                               f"{dataset_title(dataset)}: the same targets at every length, rise over 1×, "
                               "mean over seeds (band: ± std over seeds; bars: the anchors' 95 % interval)",
                               "context length / training length L (dotted: L)",
                               "NLL(m·L) − NLL(L) on the same targets (nats)")
    for ax in axes:
        _multiples_axis(ax)
        ax.axvline(1, color="grey", ls=":", lw=1)
        ax.axhline(0, color="grey", lw=0.8)
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def dataset_title(dataset: str) -> str:
    record = DATASET_RECORDS.get(dataset)
    return record.title if record else dataset


def plot_per_position(res: Results, dataset: str, path: Path) -> Path | None:
    """Per-position NLL at the longest length, pooled over blocks and seeds, in log-spaced position bins: one panel
    per family of variants."""
    mults = res.multipliers(dataset)
    if not mults:
        return None
    longest = max(mults)
    curves = {v: c for v in res.variants(dataset) if (c := _position_curve(res, dataset, v, longest))}
    if not curves:
        return None
    plt = pyplot()

    def draw(ax, v: str, faint: bool) -> None:
        xs, ys = curves[v]
        lk = look(v)
        if faint:
            ax.plot(xs, ys, color=lk.color, linestyle=lk.linestyle, lw=0.9, alpha=0.35, zorder=1)
        else:
            ax.plot(xs, ys, lw=1.2, ms=3, label=v, zorder=3, **lk.line())

    fig, axes = _family_panels(plt, list(curves), draw, f"{dataset_title(dataset)}: per-position NLL at "
                               f"{times(longest)} L (pooled over blocks and seeds)",
                               "position in the block (tokens; log bins; dotted: L)", "NLL (nats/token)")
    for ax in axes:
        ax.axvline(res.runs[0].train_length, color="grey", ls=":", lw=1)
        ax.set_xscale("log", base=2)
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def _position_curve(res: Results, dataset: str, variant: str, mult: float) -> tuple[list[float], list[float]] | None:
    """The variant's per-position NLL at ``mult`` × L pooled over its seeds, in log bins; None without buckets."""
    curves, width = [], None
    for r in res.by.get((dataset, variant), []):
        row = r.lengths.get(mult) or {}
        buckets = row.get("bucket_nll")
        if buckets:
            curves.append(buckets[1] if isinstance(buckets[0], int) else buckets)
            width = row.get("bucket_width")
    if not curves or width is None:
        return None
    n = min(len(c) for c in curves)
    return smoothed_positions([mean_of(c[i] for c in curves) for i in range(n)], width)  # pooled over seeds


def plot_horizon(res: Results, dataset: str, path: Path) -> Path | None:
    """The extrapolation horizon (C2) per variant: each seed a dot, the mean a bar, log₂ scale."""
    variants = [v for v in res.variants(dataset) if res.per_seed(dataset, v, horizon)]
    if not variants:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 0.35 * len(variants) + 1.5))
    for i, v in enumerate(variants):
        hs = res.per_seed(dataset, v, horizon)
        lk = look(v)
        ax.barh(i, sum(math.log2(h) for h in hs) / len(hs), color=lk.color, alpha=0.45)
        ax.plot([math.log2(h) for h in hs], [i] * len(hs), lk.marker, color=lk.color, ms=4.5)
    longest = max(res.multipliers(dataset))
    ax.set_yticks(range(len(variants)), variants, fontsize=8)
    ax.set_xticks(range(int(math.log2(longest)) + 1), [f"{2**k}×" for k in range(int(math.log2(longest)) + 1)])
    ax.set_xlim(-0.3, math.log2(longest) + 0.3)  # a seed's dot at 1× or at the longest stays clear of the frame
    ax.set_xlabel(f"horizon: largest m with NLL within {HORIZON_TOLERANCE:.0%} of 1× up to m (≥ {times(longest)} "
                  "is the longest evaluated)")
    ax.set_title(f"{dataset_title(dataset)}: extrapolation horizon per seed")
    ax.invert_yaxis()
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def depth_accuracy(res: Results, dataset: str, variant: str) -> tuple[list[float], list[float], list[list[float]]]:
    """``(depths, multipliers, mean accuracy [depth][multiplier])`` over the variant's seeds (NaN where none):
    the retrieval tasks' accuracy per (key depth, evaluation length)."""
    runs = res.by.get((dataset, variant), [])
    mults = sorted({m for r in runs for m, row in r.lengths.items() if row.get("accuracy_by_depth")})
    depths = sorted({float(d) for r in runs for row in r.lengths.values() for d in (row.get("accuracy_by_depth") or {})})
    grid = []
    for d in depths:
        line = []
        for m in mults:
            vals = [float(acc) for r in runs for k, acc in ((r.lengths.get(m) or {}).get("accuracy_by_depth") or {}).items()
                    if float(k) == d]
            line.append(sum(vals) / len(vals) if vals else math.nan)
        grid.append(line)
    return depths, mults, grid


def plot_depth_heatmap(res: Results, dataset: str, path: Path) -> Path | None:
    """Retrieval accuracy per depth × length, one panel per variant (mean over seeds, the value in each cell)."""
    panels = [(v, *depth_accuracy(res, dataset, v)) for v in res.variants(dataset)]
    panels = [p for p in panels if p[1] and p[2]]
    if not panels:
        return None
    plt = pyplot()
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols + 1.2, 2.7 * rows + 0.7), squeeze=False,
                             layout="constrained")
    image = None
    for k, (ax, (v, depths, mults, grid)) in enumerate(zip(axes.flat, panels)):
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="upper")
        ax.set_xticks(range(len(mults)), [times(m) for m in mults], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths], fontsize=7)
        for i, line in enumerate(grid):
            for j, acc in enumerate(line):
                if math.isfinite(acc):
                    ax.text(j, i, f"{acc:.2f}", ha="center", va="center", fontsize=6,
                            color="black" if acc > 0.6 else "white")
        seeds = len(res.by.get((dataset, v), []))
        ext = extension_of(v)
        name = f"{ext.name}\n(eval-time extension)" if ext else v
        ax.set_title(f"{name}, {seeds} seed{'s' if seeds != 1 else ''}", fontsize=8)
        frame(ax, look(v).color)
        if k >= len(panels) - cols:  # the bottom panel of its column
            ax.set_xlabel("evaluation length / L", fontsize=7)
        if k % cols == 0:
            ax.set_ylabel("depth of the key", fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.colorbar(image, ax=axes, shrink=0.8, label="answer accuracy (mean over seeds)")  # one scale: 0 to 1
    fig.suptitle(f"{dataset_title(dataset)}: accuracy per key depth and length", fontsize=10)
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def _head_mean(rows: Sequence[Sequence[float | None]], i: int) -> float | None:
    return mean_of(h[i] for h in rows)


def plot_theory(res: Results, folder: Path) -> list[Path]:
    """``coherence.png``: small multiples, one panel per accumulated variant — the measured coherence (mean over
    layers, heads and seeds) at each length diagnosed, with its ± 1.96 standard-error band at the first, and the
    prediction dashed where the theory gives one, one legend of the line styles above the panels;
    ``far_mass.png``: far mass vs length, one panel per family of variants, measured (solid, ± std over seeds) and
    predicted from L alone (dashed)."""
    plt = pyplot()
    out = []
    accumulated = [v for v in res.variants(res.corpus) if (runs := res.diagnosed(v)) and kind(runs[0]) != "none"]
    if accumulated:
        cols = min(4, len(accumulated))
        rows = -(-len(accumulated) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows + 0.8), squeeze=False, sharey=True,
                                 layout="constrained")
        for ax, v in zip(axes.flat, accumulated):
            _coherence_panel(ax, v, res.diagnosed(v))
        for ax in list(axes.flat)[len(accumulated):]:
            ax.set_visible(False)
        handles, labels = _style_key(axes.flat)
        fig.legend(handles, labels, loc="outside upper center", ncol=len(labels), fontsize=7, frameon=False)
        fig.supxlabel("distance Δ = t − s (tokens, log)", fontsize=9)
        fig.supylabel("coherence E[ℓᴹℓᴵ] / E[(ℓᴵ)²]", fontsize=9)
        path = folder / "coherence.png"
        atomic_savefig(fig, path)
        out.append(path)
        plt.close(fig)
    path = _plot_far_mass(plt, res, folder / "far_mass.png")
    return out + ([path] if path else [])


def _style_key(axes) -> tuple[list, list[str]]:
    """One legend for every coherence panel: each line style once, in grey (the panels' colours are their
    variants'), the prediction in black as drawn."""
    from matplotlib.lines import Line2D

    key: dict[str, Any] = {}
    for ax in axes:
        for line in ax.get_lines():
            label = line.get_label()
            if not label.startswith("_") and label not in key:
                color = line.get_color() if line.get_gid() == "prediction" else "0.45"
                key[label] = Line2D([], [], color=color, linestyle=line.get_linestyle(), lw=1.1)
    return list(key.values()), list(key)


def _plot_far_mass(plt, res: Results, path: Path) -> Path | None:
    """Far mass vs length per family of variants: measured (± std over seeds) and predicted from L (dashed)."""
    variants = [v for v in res.variants(res.corpus) if res.diagnosed(v)]
    if not variants:
        return None

    def draw(ax, v: str, faint: bool) -> None:
        runs = res.diagnosed(v)
        L = runs[0].train_length
        mults = [n / L for n in runs[0].diag["lengths"]]
        _band(ax, v, [(m, [x for r in runs if (x := measured_far_mass(r, m)) is not None]) for m in mults], faint)
        pred = next((layer["far_prediction"] for layer in diag_layers(runs[0]) if layer.get("far_prediction")), None)
        if pred and not faint:
            xs = pred["multiples"]
            ys = [mean_of(predicted_far_mass(r, m) for r in runs) for m in xs]
            ax.plot(xs, [math.nan if y is None else y for y in ys], "--", lw=1, color=look(v).color, zorder=3)

    fig, axes = _family_panels(plt, variants, draw, f"{dataset_title(res.corpus)}: far mass vs length, measured "
                               "(solid, ± std over seeds) and predicted from L alone (dashed)", "length / L",
                               "attention mass on far keys (beyond the window; last queries)")
    for ax in axes:
        _multiples_axis(ax)
        ax.set_ylim(-0.02, 1.02)  # a head with no far mass draws on 0, clear of the frame
        ax.axhline(0.5, color="grey", lw=0.6, ls=":")
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def _coherence_panel(ax, variant: str, runs: Sequence[Run]) -> None:
    """One variant: the coherence at every length diagnosed (solid at the first, then dashed, dotted), the band
    at the first, the prediction in black where the theory has one."""
    diag = runs[0].diag
    L = diag["train_length"]
    color = look(variant).color
    styles = ("-", "--", ":", "-.")
    lengths = sorted({c["length"] for layer in diag_layers(runs[0]) for c in layer["coherence"]})
    for j, which in enumerate(lengths):
        per_seed, errs, dist, top = [], [], None, which
        for r in runs:
            found = [c for layer in diag_layers(r) for c in layer["coherence"] if c["length"] == which]
            if not found:
                continue
            dist, top = found[0]["distances"], (found[0].get("fit_range") or [1, which])[1]
            per_seed.append([mean_of(_head_mean(e["curve"], i) for e in found) for i in range(len(dist))])
            errs.append([mean_of(_head_mean(e["stderr"], i) for e in found) for i in range(len(dist))])
        if not per_seed or dist is None:
            continue
        keep = [i for i, d in enumerate(dist) if 1 <= d <= top]
        xs = [dist[i] for i in keep]
        mean = [mean_of(c[i] for c in per_seed) for i in keep]
        ax.plot(xs, [m if m is not None else math.nan for m in mean], styles[j % len(styles)], color=color, lw=1.1,
                label=f"measured at {times(which / L)}")
        if j == 0:
            err = [mean_of(e[i] for e in errs) for i in keep]
            lo = [(m or 0) - 1.96 * (e or 0) for m, e in zip(mean, err)]
            hi = [(m or 0) + 1.96 * (e or 0) for m, e in zip(mean, err)]
            ax.fill_between(xs, lo, hi, color=color, alpha=0.2, lw=0)
            pred = [c.get("predicted") for layer in diag_layers(runs[0]) for c in layer["coherence"]
                    if c["length"] == which and c.get("predicted")]
            if pred:
                ax.plot(xs, [mean_of(_head_mean(p, i) for p in pred) for i in keep], "--", color="black", lw=1,
                        label="prediction |φ|^Δ", gid="prediction")
    eps = diag.get("eps", 0.05)
    ax.axhline(eps, color="grey", lw=0.5, ls=":")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xscale("log")
    how = "fresh draws: a calibration" if kind(runs[0]) == "calibration" else "its own transport"
    ax.set_title(f"{variant} ({len(runs)} seed{'s' if len(runs) != 1 else ''}; {how})", fontsize=7)

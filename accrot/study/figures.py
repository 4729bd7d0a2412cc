"""The ablation's figures: NLL against length with the seeds' band, per-position NLL, the extrapolation horizon,
retrieval depth × length heatmaps, and the theory figures (far mass measured against the lower bound's prediction,
coherence against distance). Every variant keeps one colour in every figure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from accrot.io import atomic_savefig, pyplot
from accrot.metrics import mean_std
from accrot.study.claims import HORIZON_TOLERANCE
from accrot.study.results import Results, Run, diag_layers, horizon, mean_of, times
from accrot.study.theory import kind, measured_far_mass, predicted_far_mass


def _color(variant: str):
    """One fixed colour per variant in every figure (matplotlib's default cycle repeats after 10 lines)."""
    from matplotlib import colormaps

    from accrot.study.variants import VARIANTS

    names = list(VARIANTS)
    if "eval-time extension" in variant:
        variant = "RoPE"  # an extension of RoPE's runs: RoPE's colour, its own dash pattern (_band)
    i = names.index(variant) if variant in names else len(names) + sum(map(ord, variant)) % 9
    return colormaps["tab20"]((2 * i if i < 10 else 2 * (i - 10) + 1) % 20)


def _band(ax, variant: str, points: Sequence[tuple[float, Sequence[float]]]) -> None:
    """The mean over seeds at each x as a line, ± one standard deviation as a shaded band."""
    xs, ms, ss = [], [], []
    for x, vals in points:
        if vals:
            mean, std = mean_std(vals)
            xs.append(x), ms.append(mean), ss.append(std or 0.0)
    extension = "eval-time extension" in variant  # RoPE's: dashed, no band (they are evaluations, not trainings)
    style = {"ls": (0, (4, 2)) if variant.startswith("RoPE+PI") else (0, (1, 1.5)) if variant.startswith("RoPE+NTK")
             else (0, (6, 2, 1, 2)), "marker": "x"} if extension else {"marker": "o"}
    line, = ax.plot(xs, ms, ms=3, label=variant, color=_color(variant), **style)
    if not extension:
        ax.fill_between(xs, [a - b for a, b in zip(ms, ss)], [a + b for a, b in zip(ms, ss)],
                        color=line.get_color(), alpha=0.15)


def plot_nll(res: Results, dataset: str, path: Path, field_: str = "nll") -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for v in res.variants(dataset):
        _band(ax, v, [(m, res.values(dataset, v, field_, m)) for m in res.multipliers(dataset)])
    ax.set_xscale("log", base=2)
    ax.axvline(1, color="grey", ls=":", lw=1)
    ax.set_xlabel("evaluation length / training length L")
    ax.set_ylabel("NLL (nats/token)" if field_ == "nll" else field_)
    ax.set_title(f"{dataset_title(dataset)}: mean ± std over seeds")
    ax.legend(fontsize=7, ncol=2)
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def dataset_title(dataset: str) -> str:
    from accrot.study.variants import DATASET_TITLES

    return DATASET_TITLES.get(dataset, dataset)


def smoothed_positions(buckets: Sequence[float | None], width: int, n_bins: int = 24) -> tuple[list[float], list[float]]:
    """Per-position NLL buckets (each ``width`` tokens, already pooled over blocks) merged into ``n_bins``
    log-spaced position bins: ``(bin centres, mean NLL)``. At 64× L the raw curve has 256 noisy buckets;
    log bins keep the near positions resolved and average the far ones."""
    n = len(buckets)
    if n == 0:
        return [], []
    edges = sorted({0, *(int(round(x)) for x in _logspace(1, n, n_bins))} | {n})
    xs, ys = [], []
    for lo, hi in zip(edges, edges[1:]):
        vals = [b for b in buckets[lo:hi] if b is not None]
        if vals:
            xs.append(0.5 * (lo + hi) * width)
            ys.append(sum(vals) / len(vals))  # equal token counts per bucket: a plain mean pools them
    return xs, ys


def _logspace(lo: float, hi: float, n: int) -> list[float]:
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)] if n > 1 and hi > lo else [lo]


def plot_per_position(res: Results, dataset: str, path: Path) -> Path | None:
    """Per-position NLL at the longest length, pooled over blocks and seeds, in log-spaced position bins."""
    mults = res.multipliers(dataset)
    if not mults:
        return None
    longest = max(mults)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    drawn = False
    for v in res.variants(dataset):
        curves, width = [], None
        for r in res.by.get((dataset, v), []):
            row = r.lengths.get(longest) or {}
            buckets = row.get("bucket_nll")
            if buckets:
                curves.append(buckets[1] if isinstance(buckets[0], int) else buckets)
                width = row.get("bucket_width")
        if not curves or width is None:
            continue
        n = min(len(c) for c in curves)
        pooled = [mean_of(c[i] for c in curves) for i in range(n)]  # over seeds
        xs, ys = smoothed_positions(pooled, width)
        ax.plot(xs, ys, lw=1.2, marker=".", ms=3, label=v, color=_color(v))
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    train_length = res.runs[0].train_length
    ax.axvline(train_length, color="grey", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in the block (tokens; log bins)")
    ax.set_ylabel("NLL (nats/token)")
    ax.set_title(f"{dataset_title(dataset)}: per-position NLL at {times(longest)} L (pooled over blocks and seeds)")
    ax.legend(fontsize=7, ncol=2)
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def plot_horizon(res: Results, dataset: str, path: Path) -> Path | None:
    """The extrapolation horizon (C2) per variant: each seed a dot, the mean a bar, log₂ scale."""
    variants = [v for v in res.variants(dataset) if res.per_seed(dataset, v, horizon)]
    if not variants:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 0.35 * len(variants) + 1.5))
    for i, v in enumerate(variants):
        hs = res.per_seed(dataset, v, horizon)
        ax.barh(i, sum(math.log2(h) for h in hs) / len(hs), color=_color(v), alpha=0.5)
        ax.plot([math.log2(h) for h in hs], [i] * len(hs), "o", color=_color(v), ms=4)
    longest = max(res.multipliers(dataset))
    ax.set_yticks(range(len(variants)), variants, fontsize=8)
    ax.set_xticks(range(int(math.log2(longest)) + 1), [f"{2**k}×" for k in range(int(math.log2(longest)) + 1)])
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
        name = v.replace(" (eval-time extension)", "\n(eval-time extension)")
        ax.set_title(f"{name}, {seeds} seed{'s' if seeds != 1 else ''}", fontsize=8)
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
    prediction dashed where the theory gives one; ``far_mass.png``: far mass vs length, measured (solid, ± std
    over seeds) and predicted from L alone (dashed)."""
    plt = pyplot()
    out = []
    accumulated = [v for v in res.variants(res.corpus) if (runs := res.diagnosed(v)) and kind(runs[0]) != "none"]
    if accumulated:
        cols = min(4, len(accumulated))
        rows = -(-len(accumulated) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False, sharey=True)
        for ax, v in zip(axes.flat, accumulated):
            _coherence_panel(ax, v, res.diagnosed(v))
        for ax in list(axes.flat)[len(accumulated):]:
            ax.set_visible(False)
        axes[0][0].legend(fontsize=6, loc="lower left")
        fig.supxlabel("distance Δ = t − s (tokens, log)")
        fig.supylabel("coherence E[ℓᴹℓᴵ] / E[(ℓᴵ)²]")
        fig.tight_layout()
        path = folder / "coherence.png"
        atomic_savefig(fig, path)
        out.append(path)
        plt.close(fig)
    path = _plot_far_mass(plt, res, folder / "far_mass.png")
    return out + ([path] if path else [])


def _plot_far_mass(plt, res: Results, path: Path) -> Path | None:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    drawn = False
    for v in res.variants(res.corpus):
        runs = res.diagnosed(v)
        if not runs:
            continue
        L = runs[0].train_length
        mults = [n / L for n in runs[0].diag["lengths"]]
        _band(ax, v, [(m, [x for r in runs if (x := measured_far_mass(r, m)) is not None]) for m in mults])
        pred = next((layer["far_prediction"] for layer in diag_layers(runs[0]) if layer.get("far_prediction")), None)
        if pred:
            xs = pred["multiples"]
            ys = [mean_of(predicted_far_mass(r, m) for r in runs) for m in xs]
            ax.plot(xs, [math.nan if y is None else y for y in ys], "--", lw=1, color=_color(v))
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.02)
    ax.axhline(0.5, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("length / L")
    ax.set_ylabel("attention mass on far keys (beyond the window; last queries)")
    ax.set_title(f"{res.corpus}: far mass vs length: measured (solid, ± std over seeds), predicted from L alone "
                 "(dashed)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def _coherence_panel(ax, variant: str, runs: Sequence[Run]) -> None:
    """One variant: the coherence at every length diagnosed (solid at the first, then dashed, dotted), the band
    at the first, the prediction in black where the theory has one."""
    diag = runs[0].diag
    L = diag["train_length"]
    color = _color(variant)
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
                        label="prediction |φ|^Δ")
    eps = diag.get("eps", 0.05)
    ax.axhline(eps, color="grey", lw=0.5, ls=":")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xscale("log")
    how = "fresh draws: a calibration" if kind(runs[0]) == "calibration" else "its own transport"
    ax.set_title(f"{variant} ({len(runs)} seeds; {how})", fontsize=7)

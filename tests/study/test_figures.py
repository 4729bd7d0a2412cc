"""The study's figures read at a glance: any two default variants are apart by colour or by dash pattern, each
variant's look comes from its scheme (not its label), and on every figure the report, the demo and `accrot eval`
draw, no legend lies over a panel's data area and no label or legend over tick labels — on a synthetic study of
every default variant and RoPE's eval-time extensions."""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import combinations
from pathlib import Path

import pytest

from accrot.study.looks import FAMILIES, LOOKS, family_of, look, look_of_scheme
from accrot.study.results import Results, Run
from accrot.study.variants import DEFAULT_VARIANTS, EXTENSIONS, VARIANTS
from tests.study.test_verdicts import diagnostics

# CIE76 colour difference (CIELAB, sRGB under D65): 2.3 is just noticeable side by side; two thin lines in a panel
# read as different at a glance from about 20 (tab20's shades by place in the variant list put accum-grape and
# accum-learned+values+forget 16.6 apart, accum-learned+values+forget and +alibi 18.3)
APART = 20.0
SHADE_APART = 10.0  # two variants of one family with different markers: their shades still visibly differ
MULTS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
L = 128


def lab(color: str) -> tuple[float, float, float]:
    """CIELAB of a hex sRGB colour (D65 white)."""
    rgb = [int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb)
    xyz = (0.4124 * r + 0.3576 * g + 0.1805 * b, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           0.0193 * r + 0.1192 * g + 0.9505 * b)
    f = [t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116
         for t in (xyz[0] / 0.95047, xyz[1], xyz[2] / 1.08883)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def delta_e(a: str, b: str) -> float:
    return math.dist(lab(a), lab(b))


def test_the_colour_difference_is_cielab():
    """Known values: white L* = 100, black 0, pure red (53.2, 80.1, 67.2); so black–white ΔE = 100."""
    assert lab("#ffffff") == pytest.approx((100.0, 0.0, 0.0), abs=0.05)
    assert lab("#ff0000") == pytest.approx((53.24, 80.09, 67.20), abs=0.1)
    assert delta_e("#000000", "#ffffff") == pytest.approx(100.0, abs=0.05)


def test_any_two_default_variants_are_apart_by_colour_or_dash_pattern():
    names = [*DEFAULT_VARIANTS, *EXTENSIONS]
    close = [(a, b, round(delta_e(look(a).color, look(b).color), 1)) for a, b in combinations(names, 2)
             if delta_e(look(a).color, look(b).color) < APART and look(a).dashes == look(b).dashes]
    assert not close, f"drawn alike (ΔE < {APART}, the same line): {close}"


def test_every_variant_is_apart_from_its_family_by_marker_and_shade():
    """The optional variants too: within a family no two share a marker, and any two variants differ by ΔE ≥ 10
    or, where the shade repeats, by marker or dashes."""
    for family in FAMILIES:
        markers = [lk.marker for v, lk in LOOKS.items() if lk.family == family and not lk.evaluation_only]
        assert len(markers) == len(set(markers)), (family, markers)
    close = [(a, b) for a, b in combinations(list(VARIANTS), 2)
             if delta_e(look(a).color, look(b).color) < SHADE_APART
             and (look(a).marker, look(a).dashes) == (look(b).marker, look(b).dashes)]
    assert not close


def test_the_family_is_read_from_the_scheme_not_the_label():
    assert {v: look(v).family for v in ("NoPE", "RoPE", "ALiBi", "accum-random", "accum-grape", "PaTH", "PaTH-FoX",
                                         "accum-learned+values+forget", "accum-random+alibi", "RoPE+ssmax")} == {
        "NoPE": "baseline", "RoPE": "baseline", "ALiBi": "baseline", "accum-random": "so2", "accum-grape": "so2",
        "PaTH": "path", "PaTH-FoX": "path", "accum-learned+values+forget": "cell", "accum-random+alibi": "cell",
        "RoPE+ssmax": "baseline"}
    assert family_of({"rotation": "accum", "increments": "learned", "output_gate": "elementwise"}) == "cell"
    # the demo's own names for the study's schemes get the study's looks
    assert look_of_scheme({"rotation": "accum", "increments": "random_position"}) == look("accum-random")
    assert look_of_scheme({}) == look("NoPE")
    # the eval-time extensions: RoPE's colour, each its own dash pattern
    dashes = {look(e).dashes for e in EXTENSIONS}
    assert {look(e).color for e in EXTENSIONS} == {look("RoPE").color} and len(dashes) == 3 and None not in dashes
    # a name the study does not define: one look, the same every time, of no study family
    assert look("someone-else's scheme") == look("someone-else's scheme") and look("x").family == "other"


# ---------------------------------------------------------------------------------------------------
# the layout of every figure
# ---------------------------------------------------------------------------------------------------
def _overlap(a, b, tol: float = 1.0) -> bool:
    """Two display boxes share more than a pixel-wide sliver."""
    return min(a.x1, b.x1) - max(a.x0, b.x0) > tol and min(a.y1, b.y1) - max(a.y0, b.y0) > tol


def _tick_labels(ax) -> list:
    """The tick labels drawn: of ticks inside the view, shown, with text."""
    out = []
    for axis in (ax.xaxis, ax.yaxis):
        lo, hi = sorted(axis.get_view_interval())
        out += [t for tick in axis.get_major_ticks() if lo <= tick.get_loc() <= hi
                for t in (tick.label1, tick.label2) if t.get_visible() and t.get_text()]
    return out


def layout_faults(fig) -> list[str]:
    """What a first look trips on: a legend over an axes' data area or over tick labels; an axis label, title or
    figure label over a data area, over tick labels, or over another label or legend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # a closed pyplot figure keeps no renderer of its own
    canvas.draw()
    r = canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    ticks = [(f"tick {t.get_text()!r} of {ax.get_title()!r}", t.get_window_extent(r)) for ax in axes
             for t in _tick_labels(ax)]
    legends = [(f"legend of {ax.get_title()!r}", leg.get_window_extent(r)) for ax in axes if (leg := ax.get_legend())]
    legends += [("figure legend", leg.get_window_extent(r)) for leg in fig.legends]
    labels = [(f"{what} {t.get_text()!r}", t.get_window_extent(r)) for ax in axes
              for what, t in (("x-label", ax.xaxis.label), ("y-label", ax.yaxis.label), ("title", ax.title))
              if t.get_visible() and t.get_text()]
    labels += [(f"figure text {t.get_text()!r}", t.get_window_extent(r)) for t in fig.texts if t.get_text()]
    faults = []
    for name, box in legends + labels:
        faults += [f"{name} over the data of {ax.get_title()!r}" for ax in axes if _overlap(box, ax.bbox)]
        faults += [f"{name} over {tick}" for tick, tbox in ticks if _overlap(box, tbox)]
    for (a, abox), (b, bbox) in combinations(legends + labels, 2):
        if _overlap(abox, bbox):
            faults.append(f"{a} over {b}")
    return faults


def _curve_run(variant: str, seed: int, rise: float, dataset: str = "corpus", diag: bool = True) -> Run:
    """NLL 2 + ``rise`` per doubling (and the seed's offset), per-position buckets of 16 tokens that rise past L."""
    rows = {}
    for m in MULTS:
        nll = 2.0 + rise * math.log2(m) + 0.02 * seed
        buckets = [nll - 0.3 + rise * max(0.0, math.log2((i + 0.5) * 16 / L)) for i in range(int(m * L) // 16)]
        rows[m] = {"multiplier": m, "length": int(m * L), "nll": nll, "accuracy": 0.5, "bucket_width": 16,
                   "bucket_nll": buckets, "same_target_rise": 1.5 * rise * math.log2(m) + 0.01 * seed * (m > 1),
                   "same_target_nll": nll + 0.5 * rise * math.log2(m)}
    d = diagnostics(variant) if diag and variant in VARIANTS and dataset == "corpus" else None
    for c in (entry for layer in (d or {}).get("layers", []) for entry in layer["coherence"]):
        top = c["distances"][-1]  # a measured curve that dips below 0 far out, as noisy heads' do (wider ticks)
        c["curve"] = [[y - 0.3 * x / top for x, y in zip(c["distances"], head)] for head in c["curve"]]
    return Run(dataset, variant, seed, f"/runs/{dataset}/{variant}/{seed}", rows, L, d, extension=EXTENSIONS.get(variant))


@pytest.fixture(scope="module")
def study() -> Results:
    """Every default variant and RoPE's eval-time extensions, two seeds; the extensions rise the most (their
    curves run into the top-left corner, where a legend inside the axes used to sit)."""
    names = [*DEFAULT_VARIANTS, *EXTENSIONS]
    rises = {v: 0.05 * (i % 7) for i, v in enumerate(names)} | {e: 0.6 for e in EXTENSIONS}
    return Results([_curve_run(v, s, rises[v]) for v in names for s in (0, 1)])


@pytest.fixture
def drawn(monkeypatch) -> dict[str, object]:
    """Every figure the code under test saves, by file name (saved as usual, and kept to be measured)."""
    from accrot import evaluation, io
    from accrot.study import figures

    kept: dict[str, object] = {}
    save = io.atomic_savefig

    def keep(fig, path):
        save(fig, path)
        kept[Path(path).name] = fig

    for module in (io, figures, evaluation):  # the state heatmap imports it from accrot.io when it draws
        monkeypatch.setattr(module, "atomic_savefig", keep)
    return kept


def _depth_and_state_study() -> Results:
    """A retrieval task (accuracy per key depth) and a state task (accuracy per answer position), a few variants."""
    runs = []
    for i, v in enumerate(("NoPE", "RoPE", "accum-learned", "PaTH", "PaTH-FoX", "accum-learned+values+forget")):
        for seed in (0, 1):
            depth = {m: {"multiplier": m, "length": int(m * L), "nll": 1.0, "accuracy": 0.5, "bucket_width": 32,
                         "bucket_nll": [1.0] * int(4 * m),
                         "accuracy_by_depth": {str(d): max(0.0, 1 - 0.1 * i * d * m) for d in (0, 0.5, 1)}}
                     for m in (1.0, 2.0, 4.0)}
            runs.append(Run("passkey", v, seed, f"/runs/passkey/{v}/{seed}", depth, L))
            acc = {m: {"multiplier": m, "length": int(m * L), "nll": 1.0, "accuracy": 0.5, "bucket_width": 32,
                       "bucket_nll": [1.0] * int(4 * m), "bucket_accuracy": [1 - 0.05 * i * k / 4 for k in range(int(4 * m))]}
                   for m in (1.0, 2.0, 4.0)}
            runs.append(Run("s3", v, seed, f"/runs/s3/{v}/{seed}", acc, L))
    return Results(runs)


def _report_figures(res: Results, tmp: Path) -> None:
    from accrot.study.figures import plot_horizon, plot_nll, plot_per_position, plot_rise, plot_theory

    plot_nll(res, "corpus", tmp / "nll_corpus.png")
    plot_rise(res, "corpus", tmp / "rise_corpus.png")
    plot_per_position(res, "corpus", tmp / "per_position_corpus.png")
    plot_horizon(res, "corpus", tmp / "horizon_corpus.png")
    plot_theory(res, tmp)


def _heatmaps(_res: Results, tmp: Path) -> None:
    from accrot.study.figures import plot_depth_heatmap
    from accrot.study.state import plot_state_heatmap

    res = _depth_and_state_study()
    plot_depth_heatmap(res, "passkey", tmp / "depth_passkey.png")
    plot_state_heatmap(res, "s3", tmp / "state_s3.png", "S3 word problem")


def _demo_and_eval(res: Results, tmp: Path) -> None:
    """The demo's figure (its eight schemes in the study's looks) and one `accrot eval` curve."""
    from accrot.evaluation import plot_curves
    from accrot.study.demo import VARIANTS as DEMO

    curves = {n: [r for _, r in sorted(res.by[("corpus", n)][0].lengths.items())] for n in DEMO}
    plot_curves(curves, L, tmp / "demo.png", title="accrot demo",
                styles={n: look_of_scheme(DEMO[n]).line() for n in DEMO})
    plot_curves({"accum-learned (learned increments)": curves["accum-learned"]}, L, tmp / "extrapolation.png",
                title="/runs/corpus/accum-learned/0/checkpoints/last.ckpt")


FIGURES: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "report": (_report_figures, ("nll_corpus.png", "rise_corpus.png", "per_position_corpus.png", "horizon_corpus.png",
                                 "coherence.png", "far_mass.png")),
    "heatmaps": (_heatmaps, ("depth_passkey.png", "state_s3.png")),
    "demo-and-eval": (_demo_and_eval, ("demo.png", "extrapolation.png")),
}


@pytest.mark.parametrize("which", list(FIGURES))
def test_no_legend_or_label_lies_over_data_or_tick_labels(which, study, drawn, tmp_path):
    build, names = FIGURES[which]
    build(study, tmp_path)
    assert sorted(drawn) == sorted(names)  # every figure drawn, so none escapes the check
    faults = {name: f for name, fig in drawn.items() if (f := layout_faults(fig))}
    assert not faults


def test_the_curves_come_in_one_panel_per_family_with_the_baselines_faint_in_each(study, drawn, tmp_path):
    from accrot.study.figures import plot_nll

    plot_nll(study, "corpus", tmp_path / "nll_corpus.png")
    axes = [ax for ax in drawn["nll_corpus.png"].axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == [f.title for k, f in FAMILIES.items() if k != "other"]
    baselines = [v for v in DEFAULT_VARIANTS if look(v).family == "baseline"]
    for ax in axes:
        labelled = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
        members = [v for v in study.variants("corpus") if look(v).family == look(labelled[0]).family]
        assert labelled == members  # each variant once, in its family's panel
        faint = [line for line in ax.get_lines() if line.get_alpha() is not None and line.get_alpha() < 1]
        assert len(faint) == (0 if labelled[0] in baselines else len(baselines))
        assert all(line.get_color() == look(v).color for line, v in zip(ax.get_lines()[len(faint):], labelled))


def test_the_rise_figure_is_drawn_only_where_runs_recorded_the_same_targets(study, tmp_path):
    from accrot.study.figures import plot_rise

    assert plot_rise(study, "corpus", tmp_path / "rise.png") == tmp_path / "rise.png"
    without = Results([Run(r.dataset, r.variant, r.seed, r.run_dir,
                           {m: {k: v for k, v in row.items() if not k.startswith("same_target")}
                            for m, row in r.lengths.items()}, r.train_length, extension=r.extension)
                       for r in study.runs])
    assert plot_rise(without, "corpus", tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_a_run_reads_its_same_target_rise_beside_each_length_and_the_report_shows_it(tmp_path):
    """read_run puts extrapolation.json's same-target rise on each length's row; the report draws and tables it."""
    import json

    from accrot.study.report import write_report
    from accrot.study.results import read_run

    rows, rises = [], []
    for m in (1.0, 2.0, 4.0):
        rows.append({"multiplier": m, "length": int(m * L), "nll": 2.0 - 0.01 * m, "accuracy": 0.5,
                     "bucket_width": 16, "bucket_nll": [2.0] * int(m * L // 16)})
        rises.append({"length": int(m * L), "multiplier": m, "nll": 2.1 + 0.1 * (m - 1), "rise": 0.1 * (m - 1),
                      "rise_ci": [0.1 * (m - 1) - 0.01, 0.1 * (m - 1) + 0.01], "anchor_nll": [2.0, 2.2]})
    runs = []
    for v in ("NoPE", "RoPE"):
        folder = tmp_path / v
        folder.mkdir()
        (folder / "extrapolation.json").write_text(json.dumps(
            {"train_length": L, "final": {"step": 3, "lengths": rows,
                                          "same_targets": {"k": L // 4, "anchors": 2, "lengths": rises}}}))
        runs.append(read_run(folder, "corpus", v, 0))
    assert runs[0].lengths[4.0]["same_target_rise"] == pytest.approx(0.3)
    assert runs[0].lengths[2.0]["same_target_nll"] == pytest.approx(2.2) and runs[0].lengths[2.0]["nll"] == 1.98
    report = write_report(Results(runs), tmp_path / "report", {})
    text = report.read_text()
    assert "![same-target rise](rise_corpus.png)" in text and (tmp_path / "report" / "rise_corpus.png").is_file()
    assert "| NoPE |" in text.split("The same targets at every length")[1]

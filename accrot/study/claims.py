"""Every claim of PAPER.md checked against the ablation's runs: :func:`collect` reads the complete trials of a
study (their ``extrapolation.json`` and, for corpus models, ``diagnostics/diagnostics.json``) into :class:`Run`
records; :func:`check_claims` turns them into one :class:`~accrot.study.stats.Claim` per row of PAPER.md's table
(the verdict rule: :mod:`accrot.study.stats`)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accrot.study.stats import Claim, Comparison, compare_paired, compare_threshold, compare_variants, fmt

C2_TOLERANCE = 0.05  # "within a few %": NLL(16×) at most 5 % above NLL(1×)
C5_TOLERANCE = 0.02  # "flat": no length more than 2 % above NLL(1×)
T1_TOLERANCE = 0.10  # share of (layer, head, Δ) points where measured and predicted coherence disagree
T1_Z = 3.0  # a point disagrees when |measured − predicted| > T1_Z standard errors (honest ones: fresh draws)
T2_TOLERANCE = 0.25  # relative change of the mean mixing window from L to the longest length
T4_MIDPOINT = 0.5  # rotated far norm nearer the random-walk prediction (0) than the linear sum (1)
T5_GAP = 1.0  # near scores stand at least one far-spread above the far scores
T5_TOLERANCE = 0.25  # relative change of the score gap from L to the longest length
HORIZON_TOLERANCE = 0.05  # the extrapolation horizon: the largest m with NLL(m') ≤ 1.05·NLL(1×) for all m' ≤ m
ROTATION_ONLY = ("accum-random", "accum-token", "accum-learned", "accum-learned+values", "PaTH")
CONTROLLED = {"ALiBi": "NoPE", "PaTH-FoX": "PaTH", "accum-learned+values+forget": "accum-learned+values"}
# rotation + far-mass control (N1): the cells the lower bound points to
ROTATION_CONTROLLED = ("accum-random+alibi", "accum-learned+values+alibi", "accum-learned+values+forget")


@dataclass
class Run:
    """One complete trial: its evaluation per multiplier and, for corpus models, its diagnostics."""

    dataset: str
    variant: str
    seed: int
    run_dir: str
    lengths: dict[float, dict[str, Any]]  # multiplier -> the extrapolation.json row
    train_length: int
    diagnostics: dict | None = None

    def value(self, field_: str, mult: float) -> float | None:
        row = self.lengths.get(float(mult))
        return None if row is None or row.get(field_) is None else float(row[field_])


# ---------------------------------------------------------------------------------------------------
# the claims
# ---------------------------------------------------------------------------------------------------
class Results:
    """The runs of one ablation, indexed by (data set, variant)."""

    def __init__(self, runs: Iterable[Run]) -> None:
        self.runs = sorted(runs, key=lambda r: (r.dataset, r.variant, r.seed))
        self.by: dict[tuple[str, str], list[Run]] = {}
        for r in self.runs:
            self.by.setdefault((r.dataset, r.variant), []).append(r)

    def trained(self) -> int:
        """Runs that were trained (not RoPE's eval-time extension rows, which are evaluations of trained runs)."""
        return sum("eval-time extension" not in r.variant for r in self.runs)

    def datasets(self) -> list[str]:
        return sorted({r.dataset for r in self.runs}, key=lambda d: (d != "corpus", d))

    def variants(self, dataset: str) -> list[str]:
        from accrot.study.variants import VARIANTS

        present = {v for d, v in self.by if d == dataset}
        extensions = sorted(v for v in present if v.startswith("RoPE+"))  # eval-time extensions: right after RoPE
        known = [e for v in VARIANTS if v in present for e in ([v, *extensions] if v == "RoPE" else [v])]
        return known + sorted(present - set(known))

    def multipliers(self, dataset: str) -> list[float]:
        return sorted({m for r in self.runs if r.dataset == dataset for m in r.lengths})

    def values(self, dataset: str, variant: str, field_: str, mult: float) -> list[float]:
        out = [r.value(field_, mult) for r in self.by.get((dataset, variant), [])]
        return [v for v in out if v is not None and math.isfinite(v)]

    def per_seed(self, dataset: str, variant: str, fn: Callable[[Run], float | None]) -> list[float]:
        out = [fn(r) for r in self.by.get((dataset, variant), [])]
        return [v for v in out if v is not None and math.isfinite(v)]

    def seeded(self, dataset: str, variant: str, fn: Callable[[Run], float | None]) -> dict[int, float]:
        """``{seed: fn(run)}`` over the variant's runs with a finite value (paired comparisons read the seeds)."""
        out = {r.seed: fn(r) for r in self.by.get((dataset, variant), [])}
        return {k: v for k, v in out.items() if v is not None and math.isfinite(v)}

    def seeded_values(self, dataset: str, variant: str, field_: str, mult: float) -> dict[int, float]:
        return self.seeded(dataset, variant, lambda r: r.value(field_, mult))


def _lengths(res: Results, dataset: str, wanted: Sequence[float]) -> list[float]:
    have = res.multipliers(dataset)
    return [m for m in wanted if m in have]


def times(m: float) -> str:
    return f"{m:g}×"


CORPUS = "corpus"  # the claims are read on the embedded corpus (N1 on every data set)


def _longest(res: Results) -> float:
    return max(res.multipliers(CORPUS), default=1.0)


def check_claims(res: Results) -> list[Claim]:
    """One :class:`Claim` per row of PAPER.md's table, in its order."""
    claims = [check(res) for check in CLAIM_CHECKS]
    extended = _c1_extended(res)  # C1 is read against plain RoPE and, where the ablation made them, its extensions
    return claims[:1] + [extended] + claims[1:] if extended is not None else claims


def _c1(res: Results) -> Claim:
    d = CORPUS
    c = Claim("C1", "random accumulated rotations extrapolate much better than RoPE",
              "NLL at 4×–16× L: accum-random below RoPE (corpus)")
    for m in _lengths(res, d, (4, 8, 16)) or [4.0]:
        c.comparisons.append(compare_variants(f"NLL {times(m)}", "accum-random",
                                              res.seeded_values(d, "accum-random", "nll", m),
                                              "RoPE", res.seeded_values(d, "RoPE", "nll", m)))
    return c


def _c2(res: Results) -> Claim:
    d = CORPUS
    c = Claim("C2", "learned token-dependent rotations keep near-L perplexity far beyond L",
              f"extrapolation horizon (largest m with NLL within {HORIZON_TOLERANCE:.0%} of 1× up to m, per seed; "
              f"log₂): accum-learned above RoPE, and accum-learned's NLL(16×) within {C2_TOLERANCE:.0%} of 1×")
    c.comparisons.append(compare_variants(
        "horizon (log₂ m)", "accum-learned", res.seeded(d, "accum-learned", _log2_horizon),
        "RoPE", res.seeded(d, "RoPE", _log2_horizon), lower_is_for=False, digits=2))
    rise = res.per_seed(d, "accum-learned", lambda r: _ratio(r.value("nll", 16), r.value("nll", 1)))
    c.comparisons.append(compare_threshold("NLL 16× vs 1×", rise, C2_TOLERANCE, label="rise "))
    return c


def _c3(res: Results) -> Claim:
    d = CORPUS
    c = Claim("C3", "rotating values helps over q/k alone",
              "NLL at 16× and beyond (16×, 32×, 64× as evaluated): accum-learned+values at most accum-learned "
              "(corpus)")
    for m in _lengths(res, d, (16, 32, 64)) or [16.0]:
        c.comparisons.append(compare_variants(
            f"NLL {times(m)}", "accum-learned+values", res.seeded_values(d, "accum-learned+values", "nll", m),
            "accum-learned", res.seeded_values(d, "accum-learned", "nll", m)))
    return c


def _c4(res: Results) -> Claim:
    d, longest = CORPUS, _longest(res)
    c = Claim("C4", "rotation-only models still degrade at extreme lengths",
              f"per rotation-only variant: NLL({times(longest)}) above its best NLL up to 16× (per seed)",
              note="local task, as distractors grow: " + _local_rise(res, longest))
    for v in ROTATION_ONLY:
        c.comparisons.append(compare_paired(v, res.per_seed(d, v, lambda r: _rise_after(r, longest, 16)),
                                            label="rise "))
    return c


def _c5(res: Results) -> Claim:
    d = CORPUS
    c = Claim("C5", "ALiBi stays length-stable",
              f"ALiBi: max over lengths of NLL(m) / NLL(1×) − 1 ≤ {C5_TOLERANCE:.0%} (per seed)")
    c.comparisons.append(compare_threshold("ALiBi curve", res.per_seed(d, "ALiBi", _max_rise), C5_TOLERANCE,
                                           label="max rise "))
    return c


def _t1(res: Results) -> Claim:
    d = CORPUS
    c = Claim("T1", "products become incoherent after finitely many steps",
              "accum-random: coherence E[q·Mk] under fresh draws of its increments follows the prediction |φ|^Δ "
              f"— at most {T1_TOLERANCE:.0%} of (layer, head, 1 ≤ Δ ≤ 7L/8) points more than {T1_Z:g} standard "
              "errors off — and every head has a window inside the measured range")
    dev = res.per_seed(d, "accum-random", coherence_share)
    c.comparisons.append(compare_threshold("coherence vs |φ|^Δ", dev, T1_TOLERANCE, label="share outside "))
    finite = res.per_seed(d, "accum-random", lambda r: _finite_windows(r))
    c.comparisons.append(compare_threshold("heads whose window is censored (> 7L/8)", finite, 0.0, label="share "))
    return c


def _t2(res: Results) -> Claim:
    d, longest = CORPUS, _longest(res)
    c = Claim("T2", "a finite mixing window independent of context length",
              f"per accumulated-rotation variant: the fitted window (log-linear over 1 ≤ Δ ≤ 7L/8 at both lengths) "
              f"changes by at most {T2_TOLERANCE:g}: |window({times(longest)}) / window(1×) − 1|")
    for v in ("accum-random", "accum-token", "accum-learned", "accum-learned+values"):
        c.comparisons.append(compare_windows(v, [r for r in res.by.get((d, v), [])]))
    return c


def _t3(res: Results) -> Claim:
    d, longest = CORPUS, _longest(res)
    c = Claim("T3", "far-mass lower bound",
              f"attention mass beyond L/4 at {times(longest)} vs 1×: grows for rotation-only variants; lower with "
              "far-mass control than without (ALiBi vs NoPE, PaTH-FoX vs PaTH, +forget vs +values)")
    for v in ("accum-random", "accum-learned", "accum-learned+values", "PaTH"):
        c.comparisons.append(compare_paired(f"{v} grows", res.per_seed(
            d, v, lambda r: _far_mass_at(r, longest, rel=True)), label="Δ far mass "))
    for ctl, base in CONTROLLED.items():
        c.comparisons.append(compare_variants(
            f"{ctl} vs {base} at {times(longest)}", ctl, res.seeded(d, ctl, lambda r: _far_mass_at(r, longest)),
            base, res.seeded(d, base, lambda r: _far_mass_at(r, longest))))
    return c


def _t4(res: Results) -> Claim:
    d, longest = CORPUS, _longest(res)
    c = Claim("T4", "value rotation makes far contributions incoherent",
              f"+values variants at {times(longest)}: (rotated − random walk) / (linear sum − random walk) of the far "
              f"output norm below {T4_MIDPOINT:g}")
    for v in ("accum-learned+values", "accum-learned+values+forget"):
        c.comparisons.append(compare_threshold(v, res.per_seed(d, v, lambda r: _value_position(r, longest)),
                                               T4_MIDPOINT, label="position "))
    return c


def _t5(res: Results) -> Claim:
    d, longest = CORPUS, _longest(res)
    c = Claim("T5", "concentration gives a score gap",
              f"per accumulated variant: near scores (Δ ≤ L/4) stand more than {T5_GAP:g} far-spread above the far "
              f"scores at L, and the gap at {times(longest)} is within {T5_TOLERANCE:g} of it")
    for v in ("accum-random", "accum-learned", "accum-learned+values"):
        c.comparisons.append(compare_threshold(f"{v} gap at L", res.per_seed(d, v, lambda r: _score_gap(r, 1.0)),
                                               T5_GAP, below_is_for=False, label="gap "))
        c.comparisons.append(compare_threshold(
            f"{v} gap kept", res.per_seed(d, v, lambda r: _ratio_abs(_score_gap(r, longest), _score_gap(r, 1.0))),
            T5_TOLERANCE, label="change "))
    return c


def _n1(res: Results) -> Claim:
    c = Claim("N1", "rotation + far-mass control is both precise and length-stable (the question the lower "
              "bound leaves open)",
              "per accum + ALiBi / forget variant and data set: NLL at 1× below the best rotation-only variant's, "
              f"and every length within {C5_TOLERANCE:.0%} of 1× as C5 asks of ALiBi")
    for dataset in res.datasets():
        best = _best_at(res, dataset, ROTATION_ONLY, 1.0)
        for v in ROTATION_CONTROLLED:
            if best is not None:
                c.comparisons.append(compare_variants(
                    f"{dataset}: {v} vs {best} at 1×", v, res.seeded_values(dataset, v, "nll", 1), best,
                    res.seeded_values(dataset, best, "nll", 1)))
            c.comparisons.append(compare_threshold(f"{dataset}: {v} curve", res.per_seed(dataset, v, _max_rise),
                                                   C5_TOLERANCE, label="max rise "))
    if not c.comparisons:
        c.comparisons.append(Comparison("rotation + far-mass control", "not run", "missing"))
    return c


def _c1_extended(res: Results) -> Claim | None:
    """C1 against RoPE's best evaluation-time extension at each length (only when those rows exist)."""
    d = CORPUS
    extended = [v for v in res.variants(d) if v.startswith("RoPE+") and "eval-time extension" in v]
    if not extended:
        return None
    c = Claim("C1-ext", "... and better than RoPE with its best eval-time length extension",
              "NLL at 4×–16× L: accum-random below the best of RoPE+PI/NTK/YaRN at that length (corpus)")
    for m in _lengths(res, d, (4, 8, 16)) or [4.0]:
        best = _best_at(res, d, extended, m)  # None: no extension evaluated at m (a "not run" comparison)
        name = best.split(" (")[0] if best else "RoPE's extensions"
        c.comparisons.append(compare_variants(f"NLL {times(m)} vs {name}", "accum-random",
                                              res.seeded_values(d, "accum-random", "nll", m),
                                              name, res.seeded_values(d, best, "nll", m) if best else {}))
    return c


CLAIM_CHECKS = (_c1, _c2, _c3, _c4, _c5, _t1, _t2, _t3, _t4, _t5, _n1)


def horizon(run: Run, tolerance: float = HORIZON_TOLERANCE) -> float | None:
    """The largest evaluated multiple m whose NLL, and every shorter one's, is within ``tolerance`` of 1×'s."""
    base = run.value("nll", 1)
    if base is None:
        return None
    best = None
    for m in sorted(run.lengths):
        value = run.value("nll", m)
        if value is None or value > base * (1 + tolerance):
            break
        best = m
    return best


def _log2_horizon(run: Run) -> float | None:
    h = horizon(run)
    return None if h is None else math.log2(h)


def _ratio_abs(a: float | None, b: float | None) -> float | None:
    r = _ratio(a, b)
    return None if r is None else abs(r)


def _best_at(res: Results, dataset: str, variants: Sequence[str], mult: float) -> str | None:
    """The variant of ``variants`` with the lowest mean NLL at ``mult`` on ``dataset`` (None if none ran)."""
    means = {v: sum(vals) / len(vals) for v in variants if (vals := res.values(dataset, v, "nll", mult))}
    return min(means, key=means.get) if means else None


def _score_gap(run: Run, mult: float) -> float | None:
    """Mean over layers and heads of the score gap (diagnostics ``score_gap``) at ``mult`` × L."""
    diag = run.diagnostics or {}
    L = diag.get("train_length")
    if L is None:
        return None
    length = int(round(L * mult))
    return mean_of(g for layer in diag_layers(run) for e in layer.get("score_gap", []) if e["length"] == length
                 for g in e["gap"])


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b - 1.0


def _rise_after(run: Run, longest: float, upto: float) -> float | None:
    best = [run.value("nll", m) for m in run.lengths if m <= upto]
    best = [b for b in best if b is not None]
    last = run.value("nll", longest)
    return None if not best or last is None else last - min(best)


def _max_rise(run: Run) -> float | None:
    base = run.value("nll", 1)
    rises = [_ratio(run.value("nll", m), base) for m in run.lengths]
    rises = [r for r in rises if r is not None]
    return max(rises) if rises else None


def _local_rise(res: Results, longest: float) -> str:
    parts = []
    for v in ROTATION_ONLY + ("ALiBi",):
        a, b = res.values("local", v, "nll", 1), res.values("local", v, "nll", longest)
        if a and b:
            parts.append(f"{v} {fmt(a)} → {fmt(b)}")
    return "; ".join(parts) + f" (answer NLL, 1× → {times(longest)})" if parts else "not run"


def diag_layers(run: Run) -> list[dict]:
    return (run.diagnostics or {}).get("layers") or []


def mean_of(xs: Iterable[float | None]) -> float | None:
    vals = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return sum(vals) / len(vals) if vals else None


def coherence_disagreement(curve: Sequence[Sequence[float | None]], stderr: Sequence[Sequence[float | None]],
                           predicted: Sequence[Sequence[float | None]], distances: Sequence[int],
                           max_distance: int, z: float = T1_Z) -> tuple[int, int]:
    """``(outside, points)``: how many (head, 1 ≤ Δ ≤ max_distance) points have |measured − predicted| >
    z·stderr, of how many comparable ones (``[H][n]`` lists as in diagnostics.json)."""
    outside = points = 0
    for h, row in enumerate(curve):
        for i, dist in enumerate(distances):
            if 1 <= dist <= max_distance and None not in (row[i], predicted[h][i], stderr[h][i]):
                points += 1
                outside += abs(row[i] - predicted[h][i]) > z * stderr[h][i]
    return outside, points


def fit_range(run: Run) -> int | None:
    diag = run.diagnostics or {}
    span = diag.get("window_fit_range")
    L = diag.get("train_length")
    return span[1] if span else (None if L is None else 7 * L // 8)


def coherence_share(run: Run) -> float | None:
    """Share of (layer, head, 1 ≤ Δ ≤ 7L/8) points at L more than :data:`T1_Z` standard errors off |φ|^Δ."""
    L, top = (run.diagnostics or {}).get("train_length"), fit_range(run)
    outside = points = 0
    for layer in diag_layers(run):
        coh = next((c for c in layer["coherence"] if c["length"] == L), None)
        if coh is None or not coh.get("predicted"):
            continue
        o, n = coherence_disagreement(coh["curve"], coh["stderr"], coh["predicted"], coh["distances"], top)
        outside, points = outside + o, points + n
    return outside / points if points else None


def _finite_windows(run: Run) -> float | None:
    """Share of (layer, head) whose window at L is censored: not placed inside the measured range (0 = all are)."""
    L = (run.diagnostics or {}).get("train_length")
    flags = [f for layer in diag_layers(run) for c in layer["coherence"] if c["length"] == L for f in _censored(c)]
    return sum(flags) / len(flags) if flags else None


def _censored(coherence: dict) -> list[bool]:
    """Per head: is the window censored (diagnostics before the fitted window had only null windows)."""
    return [bool(f) for f in coherence.get("window_censored", [w is None for w in coherence["window"]])]


def _windows(run: Run, length: int) -> tuple[list[float], int]:
    """The fitted windows of every (layer, head) at ``length`` and how many of them are censored."""
    found, censored = [], 0
    for layer in diag_layers(run):
        for c in layer["coherence"]:
            if c["length"] == length:
                flags = _censored(c)
                censored += sum(flags)
                found += [w for w, f in zip(c["window"], flags) if not f and w is not None]
    return found, censored


def window_change(run: Run) -> tuple[float | None, str | None]:
    """``(|mean window(longest) / mean window(L) − 1|, None)``, or ``(None, why)`` when a window is censored
    or the diagnostics are missing — never a silent drop: the reason reaches the report."""
    diag = run.diagnostics or {}
    lengths = diag.get("lengths") or []
    if not lengths:
        return None, "no diagnostics"
    at_l, cens_l = _windows(run, diag.get("train_length"))
    at_long, cens_long = _windows(run, max(lengths))
    if cens_l or cens_long:
        return None, f"seed {run.seed}: {cens_l} windows censored at L, {cens_long} at the longest length"
    if not at_l or not at_long:
        return None, f"seed {run.seed}: no window measured"
    w1, w2 = sum(at_l) / len(at_l), sum(at_long) / len(at_long)
    return abs(w2 / w1 - 1.0), None


def compare_windows(variant: str, runs: Sequence[Run]) -> Comparison:
    """T2 for one variant: the per-seed window changes against :data:`T2_TOLERANCE`; a censored window makes
    the comparison *inside* (the data cannot place it) and says so."""
    changes, why = [], []
    for r in runs:
        value, reason = window_change(r)
        (changes.append(value) if value is not None else why.append(reason))
    if not runs:
        return Comparison(variant, "not run", "missing")
    comp = compare_threshold(variant, changes, T2_TOLERANCE, label="change ") if changes else \
        Comparison(variant, "no window placed", "inside")
    if why:
        comp = Comparison(variant, f"{comp.numbers}; {'; '.join(why)}", "inside" if comp.outcome == "for"
                          else comp.outcome)
    return comp


def far_mass(run: Run, length: int) -> float | None:
    return mean_of(m for layer in diag_layers(run) for f in layer["far_mass"] if f["length"] == length
                 for m in f["mass"])


def _far_mass_at(run: Run, mult: float, rel: bool = False) -> float | None:
    diag = run.diagnostics or {}
    L = diag.get("train_length")
    if L is None:
        return None
    far = far_mass(run, int(round(L * mult)))
    if not rel:
        return far
    base = far_mass(run, L)
    return None if far is None or base is None else far - base


def _value_position(run: Run, mult: float) -> float | None:
    diag = run.diagnostics or {}
    L = diag.get("train_length")
    if L is None:
        return None
    length = int(round(L * mult))
    pos = []
    for layer in diag_layers(run):
        for v in layer["value_far_norm"]:
            if v["length"] != length:
                continue
            for rot, lin, inc in zip(v["rotated"], v["unrotated"], v["incoherent"]):
                if None not in (rot, lin, inc) and lin - inc > 1e-9:
                    pos.append((rot - inc) / (lin - inc))
    return sum(pos) / len(pos) if pos else None


# ---------------------------------------------------------------------------------------------------
# reading a study
# ---------------------------------------------------------------------------------------------------
def collect(spec, ref) -> Results:
    """The complete trials of every stratum of an ablation spec, with their evaluation and diagnostics."""
    import optuna
    from optuna.trial import TrialState

    from accrot.sweep.storage import open_storage

    storage = open_storage(ref)
    runs = []
    for name, strata in spec.studies().items():
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            continue  # not created yet
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            # a study per variant, or one per data set whose trials carry their variant (shared_study)
            label = t.user_attrs.get("variant") if spec.shared_study else strata[0].variant
            dataset, _, variant = (label or "corpus.?").partition(".")
            run_dir = Path(t.user_attrs.get("run_dir", ""))
            ext = run_dir / "extrapolation.json"
            if not ext.is_file():
                continue
            doc = json.loads(ext.read_text())
            diag_path = run_dir / "diagnostics" / "diagnostics.json"
            runs.append(Run(
                dataset=dataset, variant=variant, seed=int(t.user_attrs.get("seed", 0)), run_dir=str(run_dir),
                lengths={float(r["multiplier"]): r for r in doc["final"]["lengths"]},
                train_length=int(doc["train_length"]),
                diagnostics=json.loads(diag_path.read_text()) if diag_path.is_file() else None,
            ))
    return Results(runs)

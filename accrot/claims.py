"""The ablation's report: tables, figures and every claim of PAPER.md checked against the runs (issue #8).

:func:`collect` reads the complete trials of an ablation study (their ``extrapolation.json`` and, for corpus
models, ``diagnostics/diagnostics.json``) into :class:`Run` records; :func:`check_claims` turns them into one
:class:`Claim` per row of PAPER.md's table; :func:`write_report` writes ``REPORT.md``, ``results.csv``,
``claims.json`` and the PNGs.

How a verdict is decided (also printed in the report). Every comparison is over seeds (replicates: each seed
is a new initialisation, data order and random-increment realisation), with a 95 % Student-t interval:

* two variants at one length: with the same seeds on both sides, the per-seed (paired) differences and their
  interval mean ± t₀.₉₇₅,ₙ₋₁·s/√n; otherwise Welch's interval for the difference of means. The difference is
  *resolved* when the interval excludes 0 — for or against the claim — and *inside* the noise otherwise;
* one variant against itself (NLL at 64× vs its best up to 16×, far mass at 64× vs 1×): the per-seed
  differences, resolved when their interval excludes 0;
* a threshold (within 5 %, flat within 2 %, ...): *for* when the interval of the mean lies under it, *against*
  when it lies over it, *inside* when it straddles it.

A claim is *supported* when every comparison it rests on is resolved in its favour, *not supported* when any is
resolved against it, and *inconclusive* otherwise — in particular with one seed (no interval), with two seeds
unless they agree closely (t₀.₉₇₅,₁ = 12.7), when a window is censored, or when a variant or length it needs was
not run. Three seeds or more are what resolves a claim (t₀.₉₇₅,₂ = 4.3).
"""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accrot.report import _pyplot, atomic_savefig, atomic_write_text, mean_std, pm

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
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
# statistics
# ---------------------------------------------------------------------------------------------------
def fmt(values: Sequence[float], digits: int = 3) -> str:
    return pm(values, digits, empty="–")


@dataclass
class Comparison:
    """One comparison a claim rests on: what, its numbers, and ``for`` / ``against`` / ``inside`` / ``missing``."""

    what: str
    numbers: str
    outcome: str


# two-sided 95 % quantiles of Student's t, df = 1..30 (beyond: the Cornish–Fisher series, within 1e-4)
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788,
         2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639,
         2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)


def t_quantile(df: float) -> float:
    """t_{0.975, df}: the half-width of a 95 % interval is this many standard errors (df ≥ 1; fractional df
    from Welch's formula round down, which widens the interval a little)."""
    if df < 1:
        raise ValueError(f"df={df} must be >= 1")
    if df < 31:
        return _T975[int(df) - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def interval(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95 % t-interval over seeds (None with one seed)."""
    mean, std = mean_std(values)
    if std is None:
        return mean, None
    return mean, t_quantile(len(values) - 1) * std / math.sqrt(len(values))


Values = Sequence[float] | Mapping[int, float]  # per-seed values; a mapping names the seeds (pairing)


def _as_list(values: Values) -> list[float]:
    return [values[k] for k in sorted(values)] if isinstance(values, Mapping) else list(values)


def compare_variants(what: str, a: str, va: Values, b: str, vb: Values, lower_is_for: bool = True,
                     digits: int = 3) -> Comparison:
    """Variant a against variant b on one quantity; the claim says a < b (``lower_is_for``) or a > b.

    With the same seeds on both sides (mappings seed → value with equal keys) the comparison is *paired*: the
    per-seed differences and their 95 % t-interval (seeds share the data order, so pairing removes that
    variance). Otherwise Welch's interval for the difference of means. Resolved when the interval excludes 0."""
    la, lb = _as_list(va), _as_list(vb)
    if not la or not lb:
        missing = a if not la else b
        return Comparison(what, f"{missing} not run", "missing")
    (ma, sa), (mb, sb) = mean_std(la), mean_std(lb)
    if sa is None or sb is None:
        return Comparison(what, f"{a} {fmt(la, digits)} vs {b} {fmt(lb, digits)}: one seed, no spread", "inside")
    paired = isinstance(va, Mapping) and isinstance(vb, Mapping) and set(va) == set(vb)
    if paired:
        diff, half = interval([va[k] - vb[k] for k in sorted(va)])
        how = f"paired over {len(la)} seeds"
    else:
        na, nb = len(la), len(lb)
        se2 = sa**2 / na + sb**2 / nb
        df = se2**2 / ((sa**2 / na) ** 2 / (na - 1) + (sb**2 / nb) ** 2 / (nb - 1)) if se2 > 0 else na + nb - 2
        diff, half = ma - mb, t_quantile(max(1.0, df)) * math.sqrt(se2)
        how = "Welch"
    numbers = (f"{a} {fmt(la, digits)} vs {b} {fmt(lb, digits)} (Δ {diff:+.{digits}f} ± {half:.{digits}f}, "
               f"95 %, {how})")
    if abs(diff) <= half:
        return Comparison(what, numbers, "inside")
    return Comparison(what, numbers, "for" if (diff < 0) == lower_is_for else "against")


def compare_paired(what: str, diffs: Sequence[float], positive_is_for: bool = True, digits: int = 3,
                   label: str = "Δ") -> Comparison:
    """Per-seed differences of one variant against itself; the claim says they are positive (or negative).
    Resolved when their 95 % t-interval excludes 0."""
    if not diffs:
        return Comparison(what, "not run", "missing")
    mean, half = interval(diffs)
    if half is None:
        return Comparison(what, f"{label}{mean:+.{digits}f}: one seed, no spread", "inside")
    numbers = f"{label}{mean:+.{digits}f} ± {half:.{digits}f} (95 %, {len(diffs)} seeds)"
    if abs(mean) <= half:
        return Comparison(what, numbers, "inside")
    return Comparison(what, numbers, "for" if (mean > 0) == positive_is_for else "against")


def compare_threshold(what: str, values: Sequence[float], limit: float, below_is_for: bool = True,
                      digits: int = 3, label: str = "") -> Comparison:
    """Per-seed values against a threshold; the claim says they lie below it (or above). *for* when the 95 %
    t-interval of the mean lies on the claim's side of the limit, *against* when it lies on the other."""
    if not values:
        return Comparison(what, "not run", "missing")
    mean, half = interval(values)
    head = f"{label}{mean:.{digits}f}"
    if half is None:
        return Comparison(what, f"{head} (limit {limit:g}): one seed, no spread", "inside")
    numbers = f"{head} ± {half:.{digits}f} (95 %, {len(values)} seeds; limit {limit:g})"
    if mean + half <= limit:
        return Comparison(what, numbers, "for" if below_is_for else "against")
    if mean - half > limit:
        return Comparison(what, numbers, "against" if below_is_for else "for")
    return Comparison(what, numbers, "inside")


@dataclass
class Claim:
    id: str
    claim: str
    test: str
    comparisons: list[Comparison] = field(default_factory=list)
    note: str = ""

    @property
    def verdict(self) -> str:
        outcomes = [c.outcome for c in self.comparisons]
        if not outcomes:
            return INCONCLUSIVE
        if "against" in outcomes:
            return NOT_SUPPORTED
        if all(o == "for" for o in outcomes):
            return SUPPORTED
        return INCONCLUSIVE

    def why(self) -> str:
        outcomes = [c.outcome for c in self.comparisons]
        if not outcomes:
            return "nothing to compare"
        if "against" in outcomes:
            return "a comparison is resolved against it"
        if "missing" in outcomes:
            return "a variant or length it needs was not run"
        if any("no spread" in c.numbers for c in self.comparisons):
            return "one seed: no spread to tell a difference from noise"
        if "inside" in outcomes:
            return "a difference lies inside the seeds' spread"
        return "every comparison is resolved in its favour"


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

    def datasets(self) -> list[str]:
        return sorted({r.dataset for r in self.runs}, key=lambda d: (d != "corpus", d))

    def variants(self, dataset: str) -> list[str]:
        from accrot.ablation import VARIANTS

        present = {v for d, v in self.by if d == dataset}
        return [v for v in VARIANTS if v in present] + sorted(present - set(VARIANTS))

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


def _x(m: float) -> str:
    return f"{m:g}×"


def check_claims(res: Results) -> list[Claim]:
    d = "corpus"
    longest = max(res.multipliers(d), default=1.0)
    claims = []

    c = Claim("C1", "random accumulated rotations extrapolate much better than RoPE",
              "NLL at 4×–16× L: accum-random below RoPE (corpus)")
    for m in _lengths(res, d, (4, 8, 16)) or [4.0]:
        c.comparisons.append(compare_variants(f"NLL {_x(m)}", "accum-random",
                                              res.seeded_values(d, "accum-random", "nll", m),
                                              "RoPE", res.seeded_values(d, "RoPE", "nll", m)))
    claims.append(c)

    c = Claim("C2", "learned token-dependent rotations keep near-L perplexity far beyond L",
              f"extrapolation horizon (largest m with NLL within {HORIZON_TOLERANCE:.0%} of 1× up to m, per seed; "
              f"log₂): accum-learned above RoPE, and accum-learned's NLL(16×) within {C2_TOLERANCE:.0%} of 1×")
    c.comparisons.append(compare_variants(
        "horizon (log₂ m)", "accum-learned", res.seeded(d, "accum-learned", _log2_horizon),
        "RoPE", res.seeded(d, "RoPE", _log2_horizon), lower_is_for=False, digits=2))
    rise = res.per_seed(d, "accum-learned", lambda r: _ratio(r.value("nll", 16), r.value("nll", 1)))
    c.comparisons.append(compare_threshold("NLL 16× vs 1×", rise, C2_TOLERANCE, label="rise "))
    claims.append(c)

    c = Claim("C3", "rotating values helps over q/k alone",
              "NLL at 16× and beyond (16×, 32×, 64× as evaluated): accum-learned+values at most accum-learned "
              "(corpus)")
    for m in _lengths(res, d, (16, 32, 64)) or [16.0]:
        c.comparisons.append(compare_variants(
            f"NLL {_x(m)}", "accum-learned+values", res.seeded_values(d, "accum-learned+values", "nll", m),
            "accum-learned", res.seeded_values(d, "accum-learned", "nll", m)))
    claims.append(c)

    c = Claim("C4", "rotation-only models still degrade at extreme lengths",
              f"per rotation-only variant: NLL({_x(longest)}) above its best NLL up to 16× (per seed)",
              note="local task, as distractors grow: " + _local_rise(res, longest))
    for v in ROTATION_ONLY:
        c.comparisons.append(compare_paired(v, res.per_seed(d, v, lambda r: _rise_after(r, longest, 16)),
                                            label="rise "))
    claims.append(c)

    c = Claim("C5", "ALiBi stays length-stable",
              f"ALiBi: max over lengths of NLL(m) / NLL(1×) − 1 ≤ {C5_TOLERANCE:.0%} (per seed)")
    c.comparisons.append(compare_threshold("ALiBi curve", res.per_seed(d, "ALiBi", _max_rise), C5_TOLERANCE,
                                           label="max rise "))
    claims.append(c)

    c = Claim("T1", "products become incoherent after finitely many steps",
              "accum-random: coherence E[q·Mk] under fresh draws of its increments follows the prediction |φ|^Δ "
              f"— at most {T1_TOLERANCE:.0%} of (layer, head, 1 ≤ Δ ≤ 7L/8) points more than {T1_Z:g} standard "
              "errors off — and every head has a window inside the measured range")
    dev = res.per_seed(d, "accum-random", coherence_share)
    c.comparisons.append(compare_threshold("coherence vs |φ|^Δ", dev, T1_TOLERANCE, label="share outside "))
    finite = res.per_seed(d, "accum-random", lambda r: _finite_windows(r))
    c.comparisons.append(compare_threshold("heads whose window is censored (> 7L/8)", finite, 0.0, label="share "))
    claims.append(c)

    c = Claim("T2", "a finite mixing window independent of context length",
              f"per accumulated-rotation variant: the fitted window (log-linear over 1 ≤ Δ ≤ 7L/8 at both lengths) "
              f"changes by at most {T2_TOLERANCE:g}: |window({_x(longest)}) / window(1×) − 1|")
    for v in ("accum-random", "accum-token", "accum-learned", "accum-learned+values"):
        c.comparisons.append(compare_windows(v, [r for r in res.by.get((d, v), [])]))
    claims.append(c)

    c = Claim("T3", "far-mass lower bound",
              f"attention mass beyond L/4 at {_x(longest)} vs 1×: grows for rotation-only variants; lower with "
              "far-mass control than without (ALiBi vs NoPE, PaTH-FoX vs PaTH, +forget vs +values)")
    for v in ("accum-random", "accum-learned", "accum-learned+values", "PaTH"):
        c.comparisons.append(compare_paired(f"{v} grows", res.per_seed(
            d, v, lambda r: _far_mass_at(r, longest, rel=True)), label="Δ far mass "))
    for ctl, base in CONTROLLED.items():
        c.comparisons.append(compare_variants(
            f"{ctl} vs {base} at {_x(longest)}", ctl, res.seeded(d, ctl, lambda r: _far_mass_at(r, longest)),
            base, res.seeded(d, base, lambda r: _far_mass_at(r, longest))))
    claims.append(c)

    c = Claim("T4", "value rotation makes far contributions incoherent",
              f"+values variants at {_x(longest)}: (rotated − random walk) / (linear sum − random walk) of the far "
              f"output norm below {T4_MIDPOINT:g}")
    for v in ("accum-learned+values", "accum-learned+values+forget"):
        c.comparisons.append(compare_threshold(v, res.per_seed(d, v, lambda r: _value_position(r, longest)),
                                               T4_MIDPOINT, label="position "))
    claims.append(c)

    c = Claim("T5", "concentration gives a score gap",
              f"per accumulated variant: near scores (Δ ≤ L/4) stand more than {T5_GAP:g} far-spread above the far "
              f"scores at L, and the gap at {_x(longest)} is within {T5_TOLERANCE:g} of it")
    for v in ("accum-random", "accum-learned", "accum-learned+values"):
        c.comparisons.append(compare_threshold(f"{v} gap at L", res.per_seed(d, v, lambda r: _score_gap(r, 1.0)),
                                               T5_GAP, below_is_for=False, label="gap "))
        c.comparisons.append(compare_threshold(
            f"{v} gap kept", res.per_seed(d, v, lambda r: _ratio_abs(_score_gap(r, longest), _score_gap(r, 1.0))),
            T5_TOLERANCE, label="change "))
    claims.append(c)

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
    claims.append(c)
    return claims


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
    return _mean(g for layer in _diag_layers(run) for e in layer.get("score_gap", []) if e["length"] == length
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
    return "; ".join(parts) + f" (answer NLL, 1× → {_x(longest)})" if parts else "not run"


def _diag_layers(run: Run) -> list[dict]:
    return (run.diagnostics or {}).get("layers") or []


def _mean(xs: Iterable[float | None]) -> float | None:
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


def _fit_range(run: Run) -> int | None:
    diag = run.diagnostics or {}
    span = diag.get("window_fit_range")
    L = diag.get("train_length")
    return span[1] if span else (None if L is None else 7 * L // 8)


def coherence_share(run: Run) -> float | None:
    """Share of (layer, head, 1 ≤ Δ ≤ 7L/8) points at L more than :data:`T1_Z` standard errors off |φ|^Δ."""
    L, top = (run.diagnostics or {}).get("train_length"), _fit_range(run)
    outside = points = 0
    for layer in _diag_layers(run):
        coh = next((c for c in layer["coherence"] if c["length"] == L), None)
        if coh is None or not coh.get("predicted"):
            continue
        o, n = coherence_disagreement(coh["curve"], coh["stderr"], coh["predicted"], coh["distances"], top)
        outside, points = outside + o, points + n
    return outside / points if points else None


def _finite_windows(run: Run) -> float | None:
    """Share of (layer, head) whose window at L is censored: not placed inside the measured range (0 = all are)."""
    L = (run.diagnostics or {}).get("train_length")
    flags = [f for layer in _diag_layers(run) for c in layer["coherence"] if c["length"] == L for f in _censored(c)]
    return sum(flags) / len(flags) if flags else None


def _censored(coherence: dict) -> list[bool]:
    """Per head: is the window censored (diagnostics before the fitted window had only null windows)."""
    return [bool(f) for f in coherence.get("window_censored", [w is None for w in coherence["window"]])]


def _windows(run: Run, length: int) -> tuple[list[float], int]:
    """The fitted windows of every (layer, head) at ``length`` and how many of them are censored."""
    found, censored = [], 0
    for layer in _diag_layers(run):
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


def _far_mass(run: Run, length: int) -> float | None:
    return _mean(m for layer in _diag_layers(run) for f in layer["far_mass"] if f["length"] == length
                 for m in f["mass"])


def _far_mass_at(run: Run, mult: float, rel: bool = False) -> float | None:
    diag = run.diagnostics or {}
    L = diag.get("train_length")
    if L is None:
        return None
    far = _far_mass(run, int(round(L * mult)))
    if not rel:
        return far
    base = _far_mass(run, L)
    return None if far is None or base is None else far - base


def _value_position(run: Run, mult: float) -> float | None:
    diag = run.diagnostics or {}
    L = diag.get("train_length")
    if L is None:
        return None
    length = int(round(L * mult))
    pos = []
    for layer in _diag_layers(run):
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

    from accrot.sweep import open_storage

    storage = open_storage(ref)
    runs = []
    for stratum in spec.strata():
        dataset, _, variant = (stratum.variant or "corpus.?").partition(".")
        try:
            study = optuna.load_study(study_name=stratum.study_name, storage=storage)
        except KeyError:
            continue  # not created yet
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
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


# ---------------------------------------------------------------------------------------------------
# writing the report
# ---------------------------------------------------------------------------------------------------
RULES = """How a verdict is decided. Every comparison is over seeds (each seed: a new initialisation, data order
and random-increment realisation) and uses a 95 % Student-t interval:

- two variants at one length: with the same seeds on both sides, the per-seed differences (paired) and the
  interval mean ± t·s/√n; otherwise Welch's interval for the difference of means. *Resolved* — *for* or
  *against* the claim — when the interval excludes 0, *inside* the noise otherwise;
- one variant against itself (NLL at the longest length vs its best up to 16×, far mass and windows at the
  longest length vs 1×): the per-seed differences, resolved when their interval excludes 0;
- a threshold (within 5 %, flat within 2 %, ...): *for* when the interval lies on the claim's side of the limit,
  *against* when it lies on the other side, *inside* when it straddles it.

A claim is *supported* when every comparison is *for*, *not supported* when any is *against*, and
*inconclusive* otherwise: a difference inside the noise, one seed (no interval), a censored mixing window, or a
variant or length that was not run. With two seeds t = 12.7 and little resolves; three seeds (t = 4.3) or more
are what a verdict needs.

The instruments: coherence of random increments under fresh draws of their own distribution (32 per block at
the default size, 8 for the tiny quick look; each run's diagnostics.json says how many), so |φ|^Δ is exact in
expectation, with standard errors across (block, draw) replicates; mixing windows fitted log-linearly over
1 ≤ Δ ≤ 7L/8 at every length, *censored* when the fit cannot place them in that range. Both are tested on
synthetic truth at the default size's geometry (tests/test_verdicts.py)."""


def _table(res: Results, dataset: str, field_: str, digits: int = 3) -> str:
    mults = res.multipliers(dataset)
    horizon_col = field_ == "nll"
    head = "| variant | seeds | " + " | ".join(_x(m) for m in mults) + (" | horizon |" if horizon_col else " |")
    lines = [head, "|" + "---|" * (len(mults) + 2 + horizon_col)]
    for v in res.variants(dataset):
        seeds = len(res.by.get((dataset, v), []))
        cells = [fmt(res.values(dataset, v, field_, m), digits) for m in mults]
        if field_ == "nll":
            cells.append(_horizon_cell(res, dataset, v))
        lines.append(f"| {v} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _horizon_cell(res: Results, dataset: str, variant: str) -> str:
    """The per-seed horizons (C2), e.g. ``8× 16× ≥64×`` (≥: it held at the longest length evaluated)."""
    longest = max(res.multipliers(dataset), default=None)
    hs = res.per_seed(dataset, variant, horizon)
    return " ".join(f"{'≥' if h == longest else ''}{h:g}×" for h in hs) or "–"


def _claims_md(claims: Sequence[Claim]) -> str:
    lines = ["| # | claim | test | verdict | why |", "|---|---|---|---|---|"]
    def cell(text: str) -> str:  # |φ|^Δ and |Δ| would split a markdown table's cells
        return text.replace("|", "\\|")

    for c in claims:
        lines.append(f"| {c.id} | {cell(c.claim)} | {cell(c.test)} | **{c.verdict}** | {cell(c.why())} |")
    lines.append("")
    for c in claims:
        lines.append(f"**{c.id} — {c.verdict}.** {c.claim}. Test: {c.test}.")
        for comp in c.comparisons:
            lines.append(f"- {comp.what}: {comp.numbers} → *{comp.outcome}*")
        if c.note:
            lines.append(f"- {c.note}")
        lines.append("")
    return "\n".join(lines)


def _color(variant: str):
    """One fixed colour per variant in every figure (matplotlib's default cycle repeats after 10 lines)."""
    from matplotlib import colormaps

    from accrot.ablation import VARIANTS

    names = list(VARIANTS)
    i = names.index(variant) if variant in names else len(names) + sum(map(ord, variant)) % 9
    return colormaps["tab20"]((2 * i if i < 10 else 2 * (i - 10) + 1) % 20)


def _band(ax, variant: str, points: Sequence[tuple[float, Sequence[float]]]) -> None:
    """The mean over seeds at each x as a line, ± one standard deviation as a shaded band."""
    xs, ms, ss = [], [], []
    for x, vals in points:
        if vals:
            mean, std = mean_std(vals)
            xs.append(x), ms.append(mean), ss.append(std or 0.0)
    line, = ax.plot(xs, ms, marker="o", ms=3, label=variant, color=_color(variant))
    ax.fill_between(xs, [a - b for a, b in zip(ms, ss)], [a + b for a, b in zip(ms, ss)],
                    color=line.get_color(), alpha=0.15)


def plot_nll(res: Results, dataset: str, path: Path, field_: str = "nll") -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for v in res.variants(dataset):
        _band(ax, v, [(m, res.values(dataset, v, field_, m)) for m in res.multipliers(dataset)])
    ax.set_xscale("log", base=2)
    ax.axvline(1, color="grey", ls=":", lw=1)
    ax.set_xlabel("evaluation length / training length L")
    ax.set_ylabel("NLL (nats/token)" if field_ == "nll" else field_)
    ax.set_title(f"{_title(dataset)}: mean ± std over seeds")
    ax.legend(fontsize=7, ncol=2)
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def _title(dataset: str) -> str:
    from accrot.ablation import DATASET_TITLES

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
    plt = _pyplot()
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
        pooled = [_mean(c[i] for c in curves) for i in range(n)]  # over seeds
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
    ax.set_title(f"{_title(dataset)}: per-position NLL at {_x(longest)} L (pooled over blocks and seeds)")
    ax.legend(fontsize=7, ncol=2)
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def plot_horizon(res: Results, dataset: str, path: Path) -> Path | None:
    """The extrapolation horizon (C2) per variant: each seed a dot, the mean a bar, log₂ scale."""
    variants = [v for v in res.variants(dataset) if res.per_seed(dataset, v, horizon)]
    if not variants:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 0.35 * len(variants) + 1.5))
    for i, v in enumerate(variants):
        hs = res.per_seed(dataset, v, horizon)
        ax.barh(i, sum(math.log2(h) for h in hs) / len(hs), color=_color(v), alpha=0.5)
        ax.plot([math.log2(h) for h in hs], [i] * len(hs), "o", color=_color(v), ms=4)
    longest = max(res.multipliers(dataset))
    ax.set_yticks(range(len(variants)), variants, fontsize=8)
    ax.set_xticks(range(int(math.log2(longest)) + 1), [f"{2**k}×" for k in range(int(math.log2(longest)) + 1)])
    ax.set_xlabel(f"horizon: largest m with NLL within {HORIZON_TOLERANCE:.0%} of 1× up to m (≥ {_x(longest)} "
                  "is the longest evaluated)")
    ax.set_title(f"{_title(dataset)}: extrapolation horizon per seed")
    ax.invert_yaxis()
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def _head_mean(rows: Sequence[Sequence[float | None]], i: int) -> float | None:
    return _mean(h[i] for h in rows)


def plot_theory(res: Results, folder: Path) -> list[Path]:
    """``coherence.png``: small multiples, one panel per accumulated variant — the measured coherence at L (mean
    over layers, heads and seeds, ± 1.96 standard errors) and at the longest length (dotted), the prediction
    dashed, Δ from 1 on a log axis; ``far_mass.png``: far mass vs length."""
    plt = _pyplot()
    out = []
    accumulated = [v for v in res.variants("corpus") if v.startswith(("accum", "PaTH"))
                   and any(r.diagnostics for r in res.by.get(("corpus", v), []))]
    if accumulated:
        cols = min(4, len(accumulated))
        rows = -(-len(accumulated) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False, sharey=True)
        for ax, v in zip(axes.flat, accumulated):
            _coherence_panel(ax, v, [r for r in res.by.get(("corpus", v), []) if r.diagnostics])
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

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    drawn = False
    for v in res.variants("corpus"):
        runs = [r for r in res.by.get(("corpus", v), []) if r.diagnostics]
        if not runs:
            continue
        lengths = runs[0].diagnostics["lengths"]
        _band(ax, v, [(length / runs[0].train_length,
                       [x for x in (_far_mass(r, length) for r in runs) if x is not None]) for length in lengths])
        drawn = True
    if drawn:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("length / L")
        ax.set_ylabel("attention mass beyond L/4 (last queries)")
        ax.set_title("far mass vs length (mean over layers and heads; ± std over seeds)")
        ax.legend(fontsize=7, ncol=2)
        path = folder / "far_mass.png"
        atomic_savefig(fig, path)
        out.append(path)
    plt.close(fig)
    return out


def _coherence_panel(ax, variant: str, runs: Sequence[Run]) -> None:
    """One variant: measured at L with its band, at the longest length dotted, prediction dashed."""
    diag = runs[0].diagnostics
    L, top = diag["train_length"], _fit_range(runs[0]) or diag["train_length"]
    color = _color(variant)
    for which, style in ((L, "-"), (max(diag["lengths"]), ":")):
        per_seed, errs, dist = [], [], None
        for r in runs:
            entries = [c for layer in _diag_layers(r) for c in layer["coherence"] if c["length"] == which]
            if not entries:
                continue
            dist = entries[0]["distances"]
            per_seed.append([_mean(_head_mean(e["curve"], i) for e in entries) for i in range(len(dist))])
            errs.append([_mean(_head_mean(e["stderr"], i) for e in entries) for i in range(len(dist))])
        if not per_seed or dist is None:
            continue
        keep = [i for i, d in enumerate(dist) if 1 <= d <= (top if which == L else dist[-1])]
        xs = [dist[i] for i in keep]
        mean = [_mean(c[i] for c in per_seed) for i in keep]
        err = [_mean(e[i] for e in errs) for i in keep]
        ax.plot(xs, [m if m is not None else math.nan for m in mean], style, color=color, lw=1.2,
                label=f"measured at {_x(which / L)}")
        if which == L:
            lo = [(m or 0) - 1.96 * (e or 0) for m, e in zip(mean, err)]
            hi = [(m or 0) + 1.96 * (e or 0) for m, e in zip(mean, err)]
            ax.fill_between(xs, lo, hi, color=color, alpha=0.2, lw=0)
            pred = [c.get("predicted") for layer in _diag_layers(runs[0]) for c in layer["coherence"]
                    if c["length"] == L and c.get("predicted")]
            if pred:
                ax.plot(xs, [_mean(_head_mean(p, i) for p in pred) for i in keep], "--", color="black", lw=1,
                        label="prediction |φ|^Δ")
    eps = diag.get("eps", 0.05)
    ax.axhline(eps, color="grey", lw=0.5, ls=":")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xscale("log")
    ax.set_title(f"{variant} ({len(runs)} seeds)", fontsize=8)


def results_csv(res: Results) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["dataset", "variant", "seed", "multiplier", "length", "nll", "accuracy", "last_window_nll", "run_dir"])
    for r in res.runs:
        for m, row in sorted(r.lengths.items()):
            w.writerow([r.dataset, r.variant, r.seed, m, row.get("length"), row.get("nll"), row.get("accuracy"),
                        row.get("last_window_nll"), r.run_dir])
    return buf.getvalue()


def write_report(res: Results, folder: Path, meta: Mapping[str, Any]) -> Path:
    """``REPORT.md`` + ``results.csv`` + ``claims.json`` + PNGs into ``folder``; returns the report's path."""
    folder.mkdir(parents=True, exist_ok=True)
    claims = check_claims(res)
    figures: list[Path] = []
    sections = []
    for dataset in res.datasets():
        figures.append(plot_nll(res, dataset, folder / f"nll_{dataset}.png"))
        pp = plot_per_position(res, dataset, folder / f"per_position_{dataset}.png")
        if pp:
            figures.append(pp)
        hz = plot_horizon(res, dataset, folder / f"horizon_{dataset}.png")
        if hz:
            figures.append(hz)
        part = [f"## {_title(dataset)}", "",
                "NLL (nats/token; on the local task: answers only) per evaluation length, mean ± std over seeds.", "",
                _table(res, dataset, "nll")]
        if dataset == "local":
            part += ["", "Answer accuracy:", "", _table(res, dataset, "accuracy")]
        part += ["", f"![NLL vs length](nll_{dataset}.png)"]
        if pp:
            part += ["", f"![per-position NLL]({pp.name})"]
        if hz:
            part += ["", f"Extrapolation horizon (C2): the largest multiple m whose NLL, and every shorter one's, "
                     f"stays within {HORIZON_TOLERANCE:.0%} of NLL(1×), per seed.", "", f"![horizon]({hz.name})"]
        sections.append("\n".join(part))
    theory = plot_theory(res, folder)
    figures += theory
    train_length = res.runs[0].train_length if res.runs else None
    wall = time.time() - meta["started"] if meta.get("started") else None
    head = [
        f"# {meta.get('study', folder.name)}: does accumulation explain extrapolation?", "",
        f"- command: `{meta.get('command', '')}`",
        f"- size: {meta.get('size', '?')} ({meta.get('size_cost', '')}); training length L = {train_length}; "
        f"seeds per variant: {meta.get('seeds', '?')}; complete runs: {len(res.runs)}",
        f"- revision: {_revision()}; written {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
        + (f"; this invocation took {wall / 60:.1f} min" if wall else ""),
        "- every variant: the same recipe, data, token budget, seeds and evaluation blocks; only the position "
        "scheme differs. Runs, configs and checkpoints: `runs/` below this folder; every number: `results.csv`.",
        "",
    ]
    seeds = min((len(runs) for runs in res.by.values()), default=0)
    caution = [] if seeds >= 3 else [
        f"> **{seeds} seed{'s' if seeds != 1 else ''} per variant**: a 95 % interval over "
        f"{'one seed does not exist' if seeds < 2 else 'two seeds is ±12.7 standard errors'}, so the claims this "
        "spread cannot resolve are marked inconclusive. Three seeds or more (`--seeds 3`) are what a verdict "
        "needs.", ""]
    claims_md = ["## Claims (PAPER.md)", "", *caution, _claims_md(claims), RULES, ""]
    if theory:
        claims_md += [f"![{p.stem}]({p.name})" for p in theory]
    text = "\n".join(head) + "\n" + "\n\n".join(sections) + "\n\n" + "\n".join(claims_md) + "\n"
    atomic_write_text(folder / "results.csv", results_csv(res))
    atomic_write_text(folder / "claims.json", json.dumps(
        [{**asdict(c), "verdict": c.verdict, "why": c.why()} for c in claims], indent=1))
    atomic_write_text(folder / "REPORT.md", text)
    return folder / "REPORT.md"


def _revision() -> str:
    from callbacks.run_record import git_revision

    try:
        return git_revision() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def build_report(spec, ref, folder: Path, meta: Mapping[str, Any]) -> Path:
    return write_report(collect(spec, ref), folder, {**meta, "study": spec.name})

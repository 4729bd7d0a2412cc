"""Comparisons over seeds and the verdicts they give.

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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from accrot.metrics import mean_std, pm

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
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

"""Comparisons over seeds and the verdicts they give.

How a verdict is decided (also printed in the report). Every comparison is over seeds (replicates: each seed
is a new initialisation, data order and random-increment realisation), with a 95 % Student-t interval, and
carries its two one-sided p-values (``p_for``: the evidence that it lies on the claim's side; ``p_against``: on
the other side):

* two variants at one length: with the same seeds on both sides, the per-seed (paired) differences and their
  interval mean ± t₀.₉₇₅,ₙ₋₁·s/√n; otherwise Welch's interval for the difference of means. The difference is
  *resolved* when the interval excludes 0 — for or against the claim — and *inside* the noise otherwise;
* one variant against itself (NLL at 64× vs 16×, far mass measured vs predicted): the per-seed differences,
  resolved when their interval excludes 0 (or the limit the claim names);
* a threshold (within 5 %, far mass past 0.5, ...): *for* when the interval of the mean lies on the claim's side
  of the limit, *against* when it lies on the other, *inside* when it straddles it;
* a band (two lengths agree within ±25 %, a ratio within [0.8, 1.25]; an equivalence test, TOST): *for* when the
  interval lies inside the band, *against* when it lies wholly outside it, *inside* otherwise.

A claim that asks every comparison (all of its variants, lengths) is *supported* when every one is *for*, and
*not supported* when one is *against* after Holm's correction over the claim's comparisons (on the against side:
with k comparisons the smallest one-sided p-value must be under 0.025/k, the next under 0.025/(k − 1), ...; an
*against* that does not survive it reads "inside (against before the correction)"); *inconclusive* otherwise.
A claim that asks for one case among several (N1: is there a cell that is both precise and flat?) is
*supported* when the best case is *for* on every criterion after Holm over the cases, *not supported* when every
case is *against* on some criterion (Holm within the case), inconclusive otherwise. One seed gives no interval;
two seeds rarely resolve anything (t₀.₉₇₅,₁ = 12.7); three or more are what a verdict needs. Every comparison
left inside the noise says how many seeds would resolve a difference of its observed size and spread with 80 %
power.

Every claim that has a null is also read, by the same rule, on data where the claim says its effect is absent: a
control variant in the subject's place (a rotation that accumulates nothing, a model without far-mass control, a
learned drift that breaks the regularity condition) or the two sides' labels exchanged on every other seed. A rule
that reads *for* there would read *for* whatever the models did: the claim is then *uninformative at this size*,
whatever its own comparisons say. A claim about what a model carries beyond L on a task (S1–S3) reads only the
variants that learned the task at L (scaled accuracy 0.9 or more); the others are *not tested*, and so is the
claim when none did.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scipy import stats as sps

from accrot.metrics import mean_std, pm

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
NOT_TESTED = "not tested"  # a claim about length whose variants never learned the task at L (and a comparison's)
NOT_APPLICABLE = "not applicable"  # a comparison outside the claim's premise (C4: a curve that never extrapolated)
UNINFORMATIVE = "uninformative at this size"  # the claim's rule reads for on its null: it decides nothing here
ALPHA = 0.025  # one-sided level of each comparison: the two-sided 95 % interval's tail
POWER = 0.8
MAX_SEEDS = 200  # "seeds needed" beyond this reads "> 200"


def fmt(values: Sequence[float], digits: int = 3) -> str:
    return pm(values, digits, empty="–")


@dataclass
class Comparison:
    """One comparison a claim rests on: what, its numbers, and ``for`` / ``against`` / ``inside`` / ``missing``;
    its one-sided p-values (None without an interval), the seeds it would need (``inside`` only) and whether the
    claim's correction turned an *against* into *inside* (``corrected``)."""

    what: str
    numbers: str
    outcome: str
    p_for: float | None = None
    p_against: float | None = None
    needed: int | None = None
    corrected: bool = False

    def line(self) -> str:
        """The report's line: what, numbers, outcome (and the correction or the seeds it would need)."""
        tail = ""
        if self.corrected:
            tail = " (against before the correction)"
        elif self.outcome == "inside" and self.needed is not None:
            tail = f"; about {self.needed} seeds would resolve it" if self.needed <= MAX_SEEDS else \
                f"; more than {MAX_SEEDS} seeds would be needed"
        return f"{self.what}: {self.numbers} → *{self.outcome}*{tail}"


def t_quantile(df: float, q: float = 0.975) -> float:
    """t_{q, df}: the half-width of a 95 % interval is t_{0.975, df} standard errors (df ≥ 1; Welch's
    fractional df are kept)."""
    if df < 1:
        raise ValueError(f"df={df} must be >= 1")
    return float(sps.t.ppf(q, df))


def interval(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95 % t-interval over seeds (None with one seed)."""
    mean, std = mean_std(values)
    if std is None:
        return mean, None
    return mean, t_quantile(len(values) - 1) * std / math.sqrt(len(values))


@dataclass(frozen=True)
class _Test:
    """A mean with its standard error and degrees of freedom (a t statistic's ingredients)."""

    mean: float
    se: float
    df: float
    sd: float  # the per-seed spread (for the seeds needed)
    n: int

    @property
    def half(self) -> float:
        return t_quantile(self.df) * self.se

    def below(self, limit: float) -> float:
        """One-sided p-value that the mean lies below ``limit``."""
        return _tail(self.mean - limit, self.se, self.df, lower=True)

    def above(self, limit: float) -> float:
        return _tail(self.mean - limit, self.se, self.df, lower=False)

    def needed(self, distance: float) -> int | None:
        """Seeds for 80 % power to resolve a difference of ``distance`` at this spread (one-sided 0.025)."""
        return seeds_needed(abs(distance), self.sd)


def _tail(diff: float, se: float, df: float, lower: bool) -> float:
    """P(T ≤ diff/se) (``lower``) or P(T ≥ diff/se); a zero spread decides by the sign."""
    if se <= 0:
        return 0.0 if (diff < 0) == lower and diff != 0 else 1.0
    t = diff / se
    return float(sps.t.cdf(t, df) if lower else sps.t.sf(t, df))


def seeds_needed(distance: float, sd: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """The smallest n ≥ 2 for which a one-sample t-test at one-sided level ``alpha`` detects a mean ``distance``
    away from its limit with probability ``power``, when seeds spread by ``sd`` (noncentral t); None when there is
    no difference to detect (distance 0 or no spread known); MAX_SEEDS + 1 beyond MAX_SEEDS."""
    import numpy as np

    if not (sd > 0 and distance > 0 and math.isfinite(sd) and math.isfinite(distance)):
        return None
    n = np.arange(2, MAX_SEEDS + 1)
    reached = sps.nct.sf(sps.t.ppf(1 - alpha, n - 1), n - 1, distance / sd * np.sqrt(n)) >= power  # every n at once
    return int(n[reached.argmax()]) if reached.any() else MAX_SEEDS + 1


def _one_sample(values: Sequence[float]) -> _Test | None:
    mean, std = mean_std(values)
    if std is None:
        return None
    n = len(values)
    return _Test(mean, std / math.sqrt(n), n - 1, std, n)


Values = Sequence[float] | Mapping[int, float]  # per-seed values; a mapping names the seeds (pairing)


def _as_list(values: Values) -> list[float]:
    return [values[k] for k in sorted(values)] if isinstance(values, Mapping) else list(values)


def _signed(what: str, numbers: str, test: _Test, limit: float, lower_is_for: bool) -> Comparison:
    """The outcome of ``test`` against ``limit`` when the claim says the mean lies below it (or above)."""
    p_below, p_above = test.below(limit), test.above(limit)
    p_for, p_against = (p_below, p_above) if lower_is_for else (p_above, p_below)
    outcome = "for" if p_for < ALPHA else "against" if p_against < ALPHA else "inside"
    needed = test.needed(test.mean - limit) if outcome == "inside" else None
    return Comparison(what, numbers, outcome, p_for, p_against, needed)


def compare_variants(what: str, a: str, va: Values, b: str, vb: Values, lower_is_for: bool = True,
                     digits: int = 3, margin: float = 0.0, pool: Pool | None = None,
                     blocks: tuple[Mapping[int, Sequence[float]], Mapping[int, Sequence[float]]] | None = None
                     ) -> Comparison:
    """Variant a against variant b on one quantity; the claim says a − b < ``margin`` (``lower_is_for``) or
    a − b > ``margin``.

    With a ``pool`` that holds both (the two-way variant × seed model of every variant at this length, and its
    variances pass the homogeneity check): the difference of means with the pooled residual variance,
    df = (V − 1)(S − 1). Otherwise paired on the seeds both sides ran (mappings seed → value; n is printed), which
    removes what a seed's data order and initialisation share; Welch's interval for the difference of means when
    they share fewer than two seeds. ``blocks``: each side's per-seed values per evaluation block; the text's own
    noise then enters too (a crossed bootstrap over seeds and blocks, :func:`crossed_bootstrap`): a difference
    is resolved only when both intervals exclude ``margin`` (0: a plain difference; else a non-inferiority margin).
    """
    la, lb = _as_list(va), _as_list(vb)
    if not la or not lb:
        missing = a if not la else b
        return Comparison(what, f"{missing} not run", "missing")
    common = sorted(set(va) & set(vb)) if isinstance(va, Mapping) and isinstance(vb, Mapping) else []
    test, how, why = None, "", ""
    if pool is not None and len(common) >= 2:
        test, how = pool.test(a, b), pool.how
        why = pool.why or ("" if a not in pool.variants or b not in pool.variants
                           else "this pair's own variance is above the pooled one")
    if test is None and len(common) >= 2:
        test = _one_sample([va[k] - vb[k] for k in common])
        how = f"paired over {len(common)} seeds" + (f"; not pooled: {why}" if why else "")
    elif test is None:
        test = _welch(la, lb)
        how = "Welch"
    if test is None:
        return Comparison(what, f"{a} {fmt(la, digits)} vs {b} {fmt(lb, digits)}: one seed, no spread", "inside")
    limit = f", margin {margin:+.{digits}f}" if margin else ""
    numbers = (f"{a} {fmt(la, digits)} vs {b} {fmt(lb, digits)} (Δ {test.mean:+.{digits}f} ± "
               f"{test.half:.{digits}f}, 95 %, {how}{limit})")
    comp = _signed(what, numbers, test, margin, lower_is_for)
    return _with_blocks(comp, blocks, common, margin, lower_is_for, digits) if blocks else comp


def _with_blocks(comp: Comparison, blocks, common, margin: float, lower_is_for: bool, digits: int) -> Comparison:
    """The crossed bootstrap's interval beside the seeds' one; a resolved outcome stands only if it agrees."""
    ba, bb = blocks
    seeds = [k for k in common if k in ba and k in bb and len(ba[k]) == len(bb[k]) and len(ba[k]) >= 2]
    if len(seeds) < 2:
        return comp
    lo, hi = crossed_bootstrap([[x - y for x, y in zip(ba[k], bb[k])] for k in seeds])
    comp.numbers = comp.numbers[:-1] + f"; seeds × blocks bootstrap [{lo:+.{digits}f}, {hi:+.{digits}f}])"
    below, above = hi < margin, lo > margin
    agrees = {"for": below if lower_is_for else above, "against": above if lower_is_for else below}
    if comp.outcome in agrees and not agrees[comp.outcome]:
        comp.outcome = "inside"
        comp.numbers += ": the text's own noise leaves it unresolved"
    # the bootstrap can only withhold a side: a p-value of a side it does not confirm no longer counts as evidence
    # (a claim that reads p-values, such as a one-case-among-several verdict, must not resolve what it overruled)
    if not agrees["for"]:
        comp.p_for = 1.0 if comp.p_for is not None else None
    if not agrees["against"]:
        comp.p_against = 1.0 if comp.p_against is not None else None
    return comp


def crossed_bootstrap(diffs: Sequence[Sequence[float]], reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of the grand mean of ``diffs [S seeds][B blocks]`` under a crossed (two-way)
    bootstrap: seeds and blocks resampled independently, every resampled seed read on the same resampled blocks
    (the blocks are one text shared by every seed and variant)."""
    import numpy as np

    d = np.asarray(diffs, dtype=np.float64)  # [S, B]
    rng = np.random.default_rng(seed)
    S, B = d.shape
    i = rng.integers(0, S, (reps, S))
    j = rng.integers(0, B, (reps, B))
    means = d[i[:, :, None], j[:, None, :]].mean((1, 2))  # [reps]
    lo, hi = np.quantile(means, [ALPHA, 1 - ALPHA])
    return float(lo), float(hi)


def cochran_p(variances, df: int) -> float:
    """Cochran's C test that the largest of k variances (each on ``df`` degrees of freedom) is no larger than the
    rest: C = max s² / Σ s²; P(C ≥ c) ≤ k·P(F ≥ (k − 1)·c / (1 − c)) with F on (df, (k − 1)·df) (the Bonferroni
    bound, tight in the upper tail)."""
    import numpy as np

    v = np.asarray(variances, dtype=np.float64)
    k, total = v.size, float(v.sum())
    if k < 2 or total <= 0:
        return 1.0
    c = float(v.max()) / total
    if c >= 1.0:
        return 0.0
    return float(min(1.0, k * sps.f.sf((k - 1) * c / (1 - c), df, (k - 1) * df)))


@dataclass
class Pool:
    """The two-way additive model y_vs = μ + α_v + β_s + ε of one quantity (an NLL at one length) over the
    variants that ran every one of the common seeds: a difference of two variants' means has variance 2σ²/S,
    σ² estimated from all V·S cells with (V − 1)(S − 1) degrees of freedom, where a pair alone has S − 1. Used
    only where no variant's residual variance stands out (Cochran's C test, p ≥ 0.05: with a few seeds per variant
    it is the check with power against the case that matters, one noisy variant; ``why`` says what failed) and,
    per pair, where the pair's own residual variance is not above the pooled one (:meth:`test`). Simulated on
    synthetic studies with one noisy variant (tests/study/test_statistics.py): coverage stays at 93 % or more."""

    variants: tuple[str, ...] = ()
    seeds: int = 0
    sigma2: float = math.nan
    df: int = 0
    why: str = ""
    means: dict[str, float] = field(default_factory=dict)  # each variant's mean over the common seeds
    variances: dict[str, float] = field(default_factory=dict)  # each variant's residual variance (df S − 1)

    @classmethod
    def fit(cls, table: Mapping[str, Mapping[int, float]]) -> Pool:
        import numpy as np

        seeds = sorted(set.intersection(*(set(v) for v in table.values()))) if table else []
        names = tuple(v for v in table if all(s in table[v] for s in seeds))
        V, S = len(names), len(seeds)
        if V < 3 or S < 2:
            return cls(why="fewer than 3 variants or 2 common seeds")
        y = np.array([[table[v][s] for s in seeds] for v in names], dtype=np.float64)  # [V, S]
        resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
        df = (V - 1) * (S - 1)
        sigma2 = float((resid**2).sum() / df)
        means = dict(zip(names, y.mean(1).tolist()))
        own = (resid**2).sum(1) / (S - 1)  # [V]
        p = cochran_p(own, S - 1)
        if not p >= 0.05:
            return cls(names, S, sigma2, df, f"one variant's residual variance stands out (Cochran's C, p = {p:.3f})")
        return cls(names, S, sigma2, df, means=means, variances=dict(zip(names, own.tolist())))

    @property
    def how(self) -> str:
        return f"pooled two-way variant × seed model, {len(self.variants)} variants × {self.seeds} seeds, df {self.df}"

    def test(self, a: str, b: str) -> _Test | None:
        """The pooled test of a − b, or None where this pair is better read on its own: either variant not in the
        model, variances that differ, or the pair's own residual variance above the pooled one (an F test at
        p < 0.5: pooling would then narrow the interval of exactly the noisier pairs)."""
        if self.why or a not in self.variants or b not in self.variants:
            return None
        pair = (self.variances[a] + self.variances[b]) / 2
        if self.sigma2 <= 0 or sps.f.sf(pair / self.sigma2, 2 * (self.seeds - 1), self.df) < 0.5:
            return None
        se = math.sqrt(2 * self.sigma2 / self.seeds)
        return _Test(self.means[a] - self.means[b], se, self.df, math.sqrt(2 * self.sigma2), self.seeds)


def _welch(la: list[float], lb: list[float]) -> _Test | None:
    (ma, sa), (mb, sb) = mean_std(la), mean_std(lb)
    if sa is None or sb is None:
        return None
    na, nb = len(la), len(lb)
    se2 = sa**2 / na + sb**2 / nb
    df = se2**2 / ((sa**2 / na) ** 2 / (na - 1) + (sb**2 / nb) ** 2 / (nb - 1)) if se2 > 0 else na + nb - 2
    # the seeds needed per side, as for a paired difference with the two spreads combined
    return _Test(ma - mb, math.sqrt(se2), max(1.0, df), math.sqrt(sa**2 + sb**2), min(na, nb))


def compare_paired(what: str, diffs: Sequence[float], positive_is_for: bool = True, digits: int = 3,
                   label: str = "Δ", limit: float = 0.0) -> Comparison:
    """Per-seed differences of one variant against itself; the claim says they exceed ``limit`` (or lie below
    it). Resolved when their 95 % t-interval excludes the limit."""
    if not diffs:
        return Comparison(what, "not run", "missing")
    test = _one_sample(diffs)
    if test is None:
        return Comparison(what, f"{label}{diffs[0]:+.{digits}f}: one seed, no spread", "inside")
    bound = f"; limit {limit:g}" if limit else ""
    numbers = f"{label}{test.mean:+.{digits}f} ± {test.half:.{digits}f} (95 %, {len(diffs)} seeds{bound})"
    return _signed(what, numbers, test, limit, lower_is_for=not positive_is_for)


def compare_threshold(what: str, values: Sequence[float], limit: float, below_is_for: bool = True,
                      digits: int = 3, label: str = "") -> Comparison:
    """Per-seed values against a threshold; the claim says they lie below it (or above). *for* when the 95 %
    t-interval of the mean lies on the claim's side of the limit, *against* when it lies on the other."""
    if not values:
        return Comparison(what, "not run", "missing")
    test = _one_sample(values)
    head = f"{label}{sum(values) / len(values):.{digits}f}"
    if test is None:
        return Comparison(what, f"{head} (limit {limit:g}): one seed, no spread", "inside")
    numbers = f"{head} ± {test.half:.{digits}f} (95 %, {len(values)} seeds; limit {limit:g})"
    return _signed(what, numbers, test, limit, below_is_for)


def compare_band(what: str, values: Sequence[float], low: float, high: float, digits: int = 3,
                 label: str = "", shown: str | None = None) -> Comparison:
    """Per-seed values that the claim says lie inside (``low``, ``high``): *for* when the 95 % interval lies
    inside the band (two one-sided tests), *against* when it lies wholly outside it, *inside* otherwise.
    ``shown``: how the band is printed (default ``[low, high]``)."""
    if not values:
        return Comparison(what, "not run", "missing")
    test = _one_sample(values)
    band = shown or f"[{low:g}, {high:g}]"
    head = f"{label}{sum(values) / len(values):+.{digits}f}"
    if test is None:
        return Comparison(what, f"{head} (band {band}): one seed, no spread", "inside")
    numbers = f"{head} ± {test.half:.{digits}f} (95 %, {len(values)} seeds; band {band})"
    p_for = max(test.above(low), test.below(high))
    p_against = min(test.below(low), test.above(high))
    outcome = "for" if p_for < ALPHA else "against" if p_against < ALPHA else "inside"
    needed = None
    if outcome == "inside":  # to decide: reach the nearer edge of the band (inside it) or clear it (outside)
        needed = test.needed(min(abs(test.mean - low), abs(test.mean - high)))
    return Comparison(what, numbers, outcome, p_for, p_against, needed)


def compare_share(what: str, placed: int, total: int, limit: float, above_is_for: bool = True,
                  label: str = "") -> Comparison:
    """A share counted over units (``placed`` of ``total``: every (seed, layer, head)) against ``limit``, with its
    exact (Clopper–Pearson) 95 % interval: *for* when the interval lies on the claim's side of the limit, *against*
    when it lies on the other, *inside* when it straddles it; the p-values are the exact one-sided binomial tests."""
    if total <= 0:
        return Comparison(what, "not run", "missing")
    test = sps.binomtest(placed, total, limit)
    low, high = test.proportion_ci(confidence_level=1 - 2 * ALPHA, method="exact")
    p_above = sps.binomtest(placed, total, limit, alternative="greater").pvalue
    p_below = sps.binomtest(placed, total, limit, alternative="less").pvalue
    p_for, p_against = (p_above, p_below) if above_is_for else (p_below, p_above)
    outcome = "for" if p_for < ALPHA else "against" if p_against < ALPHA else "inside"
    numbers = (f"{label}{placed}/{total} = {placed / total:.2f} [{low:.2f}, {high:.2f}] (exact binomial 95 %, every "
               f"seed × head; limit {limit:g})")
    return Comparison(what, numbers, outcome, p_for, p_against)


def holm(p_values: Sequence[float | None], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down test: which of the hypotheses (one per p-value; None: not tested) are rejected at
    family-wise level ``alpha``."""
    order = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    rejected = [False] * len(p_values)
    m = len(order)
    for rank, (p, i) in enumerate(order):
        if p > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected


def correct_against(comparisons: Sequence[Comparison]) -> None:
    """Holm over the comparisons' *against* side: an *against* whose p-value does not survive it becomes
    *inside*, marked ``corrected``."""
    keep = holm([c.p_against for c in comparisons])  # the family: every comparison the claim rests on
    for c, kept in zip(comparisons, keep):
        if c.outcome == "against" and not kept:
            c.outcome, c.corrected = "inside", True


@dataclass
class Claim:
    """A claim of the study: what it says, the quantity that decides it (``test``), its rule in one sentence,
    and the comparisons it rests on. ``cases``: for a claim that asks for one case among several (N1), the
    comparisons of each case by name (the verdict then reads them, :func:`case_verdict`)."""

    id: str
    claim: str
    test: str
    comparisons: list[Comparison] = field(default_factory=list)
    note: str = ""
    rule: str = ""
    cases: dict[str, list[Comparison]] = field(default_factory=dict)
    null: Claim | None = None  # the same rule read where the claim says its effect is absent
    null_what: str = ""  # that null in words ("" with no null)

    def __post_init__(self) -> None:
        self._final = False

    def finalize(self) -> None:
        """Apply the claim's correction once (Holm on the against side; :func:`case_verdict` corrects itself)."""
        if not self._final and not self.cases:
            correct_against(self.comparisons)
        if self.null is not None:
            self.null.finalize()
        self._final = True

    @property
    def verdict(self) -> str:
        """The rule's own verdict, or *uninformative at this size* when the same rule reads for on its null."""
        if self.null is not None and self.null.verdict == SUPPORTED:
            return UNINFORMATIVE
        return self.own_verdict

    @property
    def null_verdict(self) -> str:
        """What the rule reads on its null (``"no null"`` for a claim without one)."""
        if self.null is None:
            return "not read" if self.null_what else "no null"
        return self.null.verdict

    @property
    def own_verdict(self) -> str:
        """The verdict of the claim's comparisons alone, before its null is read."""
        if self.cases:
            return case_verdict(self.cases)
        self.finalize()
        everything = [c.outcome for c in self.comparisons]
        outcomes = [o for o in everything if o not in (NOT_TESTED, NOT_APPLICABLE)]  # the variants in the premise
        if everything and not outcomes:
            return NOT_TESTED
        if not outcomes:
            return INCONCLUSIVE
        if "against" in outcomes:
            return NOT_SUPPORTED
        if all(o == "for" for o in outcomes):
            return SUPPORTED
        return INCONCLUSIVE

    def _outside(self) -> str | None:
        """Why the claim decides nothing, where it does not: its null reads for, or nothing is inside its premise."""
        if self.verdict == UNINFORMATIVE:
            return (f"its rule reads for on its null ({self.null_what}), so it would read for whatever the models "
                    f"did; on its own data it reads {self.own_verdict}")
        if self.own_verdict == NOT_TESTED:
            if any(c.outcome == NOT_APPLICABLE for c in self.comparisons):
                return "no variant it reads is inside its premise (none extrapolated first): not tested"
            return "no variant it reads learned the task at L: what it carries beyond L is not tested"
        return None

    def why(self) -> str:
        if (outside := self._outside()) is not None:
            return outside
        verdict = self.own_verdict
        outcomes = [c.outcome for c in self.comparisons if c.outcome not in (NOT_TESTED, NOT_APPLICABLE)]
        if self.cases:
            return {SUPPORTED: "a case is for on every criterion (Holm over the cases)",
                    NOT_SUPPORTED: "every case is against on some criterion (Holm within each)"}.get(
                verdict, "no case resolved for on every criterion, not every case resolved against")
        if not outcomes:
            return "nothing to compare"
        if verdict == NOT_SUPPORTED:
            return "a comparison is resolved against it (Holm over its comparisons)"
        if "missing" in outcomes:
            return "a variant, length or measurement it needs is missing"
        if any("no spread" in c.numbers for c in self.comparisons):
            return "one seed: no spread to tell a difference from noise"
        if any(c.corrected for c in self.comparisons):
            return "an against that does not survive the correction; the rest lie inside the noise"
        if "inside" in outcomes:
            needed = [c.needed for c in self.comparisons if c.outcome == "inside" and c.needed]
            more = f" (the closest would need about {min(needed)} seeds)" if needed else ""
            return "a difference lies inside the seeds' spread" + more
        skipped = [c.what for c in self.comparisons if c.outcome in (NOT_TESTED, NOT_APPLICABLE)]
        return "every comparison is resolved in its favour" + (
            f" (outside the premise, not counted: {', '.join(skipped)})" if skipped else "")


def case_verdict(cases: Mapping[str, Sequence[Comparison]]) -> str:
    """Supported when one case is *for* on all its criteria after Holm over the cases (its p is the largest of
    its criteria's p_for: an intersection-union test); not supported when every case has a criterion *against*
    after Holm within the case; inconclusive otherwise (and with no cases)."""
    if not cases:
        return INCONCLUSIVE
    p_case = []
    for comps in cases.values():
        ps = [c.p_for for c in comps]
        if not comps or any(p is None for p in ps):
            p_case.append(None)
        else:  # a criterion whose outcome is not *for* (an interval the text's noise widened) gives its case no
            # evidence, and the case still counts in the family Holm corrects over
            p_case.append(max(ps) if all(c.outcome == "for" for c in comps) else 1.0)
    if any(holm(p_case)):
        return SUPPORTED
    against = []
    for comps in cases.values():
        kept = holm([c.p_against for c in comps])
        against.append(any(k and c.outcome == "against" for k, c in zip(kept, comps)))
    return NOT_SUPPORTED if all(against) else INCONCLUSIVE


RULES = __doc__.split("\n\n", 1)[1].strip()  # the rules above, as the report prints them

"""Every claim's rule on synthetic studies whose answer is known, at the geometry the ablation uses (L = 128,
4 heads, diagnostics at 1×, 8× and 64× L, three seeds): for each of C1–C5, T1–T5 and N1 one study where it holds
(supported), one where it fails (not supported) and one inside the noise (inconclusive); the instrument checks
likewise; and regression cases of the artefacts the earlier rules produced (one imprecise cell sinking N1, a curve
that never extrapolated credited by C4, a censored window read as inconclusive).

The instruments themselves (coherence, windows, the lower bound's prediction, the score gap) are tested on known
truth in tests/study/test_instruments.py.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest

from accrot.diagnostics.inputs import SCHEMA
from accrot.study.claims import check_calibration, check_claims
from accrot.study.results import Results, Run
from accrot.study.stats import (
    INCONCLUSIVE,
    NOT_APPLICABLE,
    NOT_SUPPORTED,
    NOT_TESTED,
    SUPPORTED,
    Comparison,
    case_verdict,
    holm,
)
from accrot.study.variants import EXTENSIONS, VARIANTS

L = 128
H = 4
MULTS = (1, 2, 4, 8, 16, 32, 64)
SEEDS = (0, 1, 2)
JITTER = (-0.01, 0.0, 0.01)  # per-seed noise of a "clear" study: far below the differences it must resolve
NOISY = (-0.3, 0.0, 0.3)


# ---------------------------------------------------------------------------------------------------
# a synthetic study
# ---------------------------------------------------------------------------------------------------
def diagnostics(variant: str, *, windows: tuple[float, float] = (7.0, 7.0), censored: tuple[bool, bool] = (False, False),
                common: tuple[float, float] | None = None, mixes: bool | None = True,
                far: tuple[float, float, float] = (0.3, 0.6, 0.8), predicted: tuple[float, float, float] | None = None,
                gap: tuple[float, float] = (3.0, 3.0), top_gap: float = 1.0, growth: float = 1.0,
                concentration: float = 1.0, value: float = 0.2,
                share: float = 0.0, fitted: float = 96.0, jitter: float = 0.0) -> dict:
    """A diagnostics.json of one run with the quantities the rules read set directly: own-transport windows at 8×
    and 64× L, each over its own length's range and over the 8× length's (``common``, default: the same windows)
    (or, for random position increments, the calibration at L and 8× L: ``share`` of its points 10 standard errors
    off |φ|^Δ and a ``fitted`` window against the predicted 96), far mass at 1×, 8×, 64× L
    measured and ``predicted`` from L (default: as measured), the attention-weighted score gap at 8× and 64×
    (shown, never read), whether the transport's own angles predict every head to mix (``mixes``; None: not
    recorded, as older diagnostics), the top near score over the far maximum (``top_gap``, in far spreads), the far maximum's
    growth 8× → 64× over the predicted (``growth``), the far spread's ratio
    to ‖q‖‖k‖/√D, the value far norm's position."""
    scheme = {"rotation": "none", "far_mass": "none", "rotate_values": False, **VARIANTS[variant]}
    lengths = [L, 8 * L, 64 * L]
    fresh = scheme.get("increments") == "random_position"
    if fresh:  # as describe() records it: one spread per rotation pair (a ladder: a spread per pair)
        scheme["increment_sigma"] = ([0.25 * 0.46**i for i in range(8)] if scheme.get("increment_spread") == "ladder"
                                     else [0.25] * 8)
    coherence = []
    for n in (lengths[:2] if fresh else lengths):
        top = 7 * n // 8
        dist = list(range(min(top, 200) + 1))
        pred = [[0.97**d for d in dist]] * H
        off = int(round(share * (len(dist) - 1)))
        curve = [[p + (0.1 if 1 <= d <= off else 0.0) for d, p in zip(dist, pred[0])]] * H
        if fresh:
            window, cens = fitted + jitter, False
        else:
            i = {L: 0, 8 * L: 0, 64 * L: 1}[n]
            window, cens = windows[i] * (1 + jitter), censored[i]
        coherence.append({"length": n, "instrument": "fresh draws" if fresh else "own transport", "distances": dist,
                          "curve": curve, "stderr": [[0.01] * len(dist)] * H, "predicted": pred if fresh else None,
                          "fit_range": [1, top], "window": [None if cens else window] * H,
                          "window_se": [None if cens else 0.5] * H, "window_censored": [cens] * H})
        if not fresh and n >= 8 * L:  # from the 8× length on, also fitted over its range (1 ≤ Δ ≤ 7/8 of 8× L)
            w = (common or windows)[{8 * L: 0, 64 * L: 1}[n]] * (1 + jitter)
            coherence[-1].update(common_range=[1, 7 * L], window_common=[None if cens else w] * H,
                                 window_common_se=[None if cens else 0.5] * H, window_common_censored=[cens] * H)
    predicted = predicted or far
    mass = dict(zip(lengths, far))
    layer = {
        "layer": 0, "coherence": coherence,
        "predicted": {"window_sustained": [96.0] * H} if fresh else None,
        # the far maximum 5 at L and 8×; from 8× to 64× it grows by ``growth`` × the 0.5 concentration predicts
        "far": [{"length": n, "mass": [mass[n] + jitter] * H, "gap": [g + jitter] * H, "top_gap": [top_gap + jitter] * H,
                 "far_max": [5.0 + (0.5 * (growth + jitter) if n == 64 * L else 0.0)] * H,
                 "far_max_predicted": [5.0 + (0.5 if n == 64 * L else 0.0)] * H,
                 "concentration_ratio": [concentration + jitter] * H}
                for n, g in zip(lengths, (gap[0], gap[0], gap[1]))],
        "far_prediction": {"multiples": list(map(float, MULTS)), "lengths": [int(m * L) for m in MULTS],
                           "mass": [[_log_interp(predicted, m) + jitter] * H for m in MULTS]},
        "value_far_norm": [{"length": 64 * L, "rotated": [value + jitter + 1.0], "unrotated": [2.0],
                            "incoherent": [1.0]}] if scheme.get("rotation") == "accum" else [],
    }
    if not fresh and scheme.get("rotation") in ("accum", "path") and mixes is not None:  # T1's own prediction
        layer["regularity"] = {"kind": "pairs", "mixes": [mixes] * H}
    # the study's two layers, alike (T1 counts its units over every seed, layer and head: 3 × 2 × 4)
    return {"schema": SCHEMA, "train_length": L, "lengths": lengths, "scheme": scheme,
            "layers": [layer, {**layer, "layer": 1}]}


def _log_interp(values: tuple[float, float, float], m: float) -> float:
    """``values`` at 1×, 8×, 64×, linear in log₂ m between them."""
    x = math.log2(m)
    return values[0] + (values[1] - values[0]) * x / 3 if x <= 3 else values[1] + (values[2] - values[1]) * (x - 3) / 3


Curve = tuple[float, float] | Callable[[float], float]


def nll_curve(spec: Curve, jitter: float) -> dict[float, float]:
    """NLL per multiple: a (base, rise per doubling) pair, or any function of m; plus the seed's jitter."""
    f = spec if callable(spec) else (lambda m, b=spec[0], r=spec[1]: b + r * math.log2(m))
    return {m: f(m) + jitter for m in MULTS}


def study(nll: dict[str, Curve], diag: dict[str, dict | list] | None = None, jitter: tuple[float, ...] = JITTER,
          datasets: tuple[str, ...] = ("corpus",), accuracy: dict[str, Curve] | None = None) -> Results:
    """Runs of each variant × seed: its NLL curve, diagnostics keyword arguments (one dict, or one per seed) and,
    on answer tasks, its accuracy curve."""
    runs = []
    for dataset in datasets:
        for i, (variant, spec) in enumerate(nll.items()):
            # each variant its own per-seed noise (a rotation of the jitter, mirrored every len(jitter) variants), so
            # that paired differences between variants vary across seeds too
            k, sign = i % len(jitter), -1 if (i // len(jitter)) % 2 else 1
            for seed, j in zip(SEEDS, [sign * x for x in jitter[k:] + jitter[:k]]):
                kwargs = (diag or {}).get(variant)
                if isinstance(kwargs, list):
                    kwargs = kwargs[seed]
                d = diagnostics(variant, **kwargs, jitter=j) if kwargs is not None and dataset == "corpus" else None
                acc = nll_curve((accuracy or {}).get(variant, (0.99, 0.0)), j / 10)
                rows = {float(m): {"multiplier": m, "length": int(L * m), "nll": v, "accuracy": acc[m],
                                   "last_window_nll": v} for m, v in nll_curve(spec, j).items()}
                runs.append(Run(dataset, variant, seed, f"/runs/{dataset}/{variant}/{seed}", rows, L, d,
                                extension=EXTENSIONS.get(variant)))  # an extension row says so, as extension_runs'
    return Results(runs)


def flat_then_rising(base: float, after: float, rise: float) -> Callable[[float], float]:
    """Flat up to ``after`` × L, then rising by ``rise`` nats per doubling."""
    return lambda m: base + rise * max(0.0, math.log2(m / after))


YARN, PI = "RoPE+YaRN (eval-time extension)", "RoPE+PI (eval-time extension)"
ROTATION_ONLY = ("accum-random", "accum-learned", "accum-learned+values", "PaTH")
BOUNDED = ("ALiBi", "PaTH-FoX", "accum-learned+values+forget", "accum-learned+values+alibi", "accum-random+alibi")
OWN = ("accum-token", "accum-learned", "accum-learned+values", "PaTH")
SO2 = ("accum-random", "accum-token", "accum-learned", "accum-learned+values")
CELLS = ("accum-random+alibi", "accum-learned+values+alibi", "accum-learned+values+forget")
C4_PAIRS = {"PaTH": "PaTH-FoX", "accum-learned+values": "accum-learned+values+forget"}
T3_ALL = (*ROTATION_ONLY, *BOUNDED, "NoPE")


LEARNED = "accum-learned-noladder"  # the learned rotation whose pairs can mix: what C2 and C3 read
C3_PAIRS = ((LEARNED + "+values", LEARNED), ("accum-random+values", "accum-random"))


def _c3(qk: Curve, values: Curve, jitter=JITTER) -> Results:
    return study({v: c for a, b in C3_PAIRS for v, c in ((b, qk), (a, values))}, jitter=jitter)


def _c4(rotation: Curve, sibling: Curve, jitter=JITTER) -> Results:
    return study({**{v: rotation for v in C4_PAIRS}, **{s: sibling for s in C4_PAIRS.values()}}, jitter=jitter)


def _c4_seeds(rises: tuple[float, ...]) -> Results:
    """C4's pairs with the rotation-only curve rising after 16× by a different amount per seed (the siblings flat)."""
    runs = []
    for seed, rise in zip(SEEDS, rises):
        for v, curve in [*((v, flat_then_rising(2.0, 16, rise)) for v in C4_PAIRS),
                         *((s, flat_then_rising(2.0, 16, 0.0)) for s in C4_PAIRS.values())]:
            rows = {float(m): {"multiplier": m, "nll": curve(m), "last_window_nll": curve(m)} for m in MULTS}
            runs.append(Run("corpus", v, seed, f"/r/{v}/{seed}", rows, L))
    return Results(runs)


def _t3(rot: dict, bounded: dict, jitter=JITTER) -> Results:
    return study({v: (2.0, 0.0) for v in T3_ALL},
                 {**{v: rot for v in (*ROTATION_ONLY, "NoPE")}, **{v: bounded for v in BOUNDED}}, jitter=jitter)


def _n1(cells: dict[str, float], comparator: float = 2.0, cell_rise: float = 0.0, alibi_rise: float = 0.0,
        jitter=JITTER, acc_drop: float = 0.0) -> Results:
    """N1's study on the corpus and the local task: the cells' NLL at 1× (flat unless ``cell_rise``), their
    rotation-only siblings accum-learned+values and accum-random (``comparator`` at 1×, rising 0.05 nats per
    doubling) and ALiBi, the cells' accuracy drop to the longest length."""
    nll = {"accum-learned+values": (comparator, 0.05), "accum-random": (comparator, 0.05), "ALiBi": (2.3, alibi_rise),
           **{c: (base, cell_rise) for c, base in cells.items()}}
    acc = {c: (0.99, -acc_drop / 6) for c in cells}
    return study(nll, jitter=jitter, datasets=("corpus", "local"), accuracy=acc)


CASES = {
    # claim: (holds, fails, inside the noise) — each a function returning Results
    "C1": (lambda: study({"RoPE": (2.0, 0.3), "accum-random": (2.0, 0.02)}),
           lambda: study({"RoPE": (2.0, 0.02), "accum-random": (2.0, 0.3)}),
           lambda: study({"RoPE": (2.0, 0.05), "accum-random": (2.0, 0.03)}, jitter=NOISY)),
    "C2": (lambda: study({"RoPE": (2.0, 0.3), LEARNED: (2.0, 0.005)}),
           lambda: study({"RoPE": (2.0, 0.005), LEARNED: (2.0, 0.3)}),
           lambda: study({"RoPE": (2.0, 0.02), LEARNED: (2.0, 0.02)}, jitter=(-0.05, 0.0, 0.05))),
    # C3: both pairs (learned without the ladder, random increments), +values below q/k only at every length
    "C3": (lambda: _c3((2.0, 0.2), (2.0, 0.1)),
           lambda: _c3((2.0, 0.1), (2.0, 0.2)),
           lambda: _c3((2.0, 0.1), (2.0, 0.11), jitter=NOISY)),
    # C4: extrapolated (flat to 16×), then rising more than the far-mass-controlled sibling
    "C4": (lambda: _c4(flat_then_rising(2.0, 16, 0.2), (2.0, 0.0)),
           lambda: _c4(flat_then_rising(2.0, 16, -0.1), (2.0, 0.0)),  # improving past 16×: no degradation
           lambda: _c4_seeds((-0.04, 0.02, 0.09))),
    "C5": (lambda: study({"ALiBi": (2.0, 0.0)}, jitter=(0.0, 0.001, 0.002)),
           lambda: study({"ALiBi": (2.0, 0.1)}),
           lambda: Results([Run("corpus", "ALiBi", s, "/r", {float(m): {"multiplier": m, "nll": 2.0 + r * math.log2(m)}
                                                              for m in MULTS}, L)
                            for s, r in zip(SEEDS, (0.0, 0.006, 0.012))])),
    # T1: every head of every own transport, predicted by its angles to mix, places its window at 8× and 64× L
    "T1": (lambda: study({v: (2.0, 0.0) for v in OWN}, {v: {} for v in OWN}),
           lambda: study({v: (2.0, 0.0) for v in OWN}, {v: {"censored": (True, True)} for v in OWN}),
           lambda: study({v: (2.0, 0.0) for v in OWN},
                         {v: [{"censored": c} for c in ((False, False), (True, True), (False, False))] for v in OWN})),
    "T2": (lambda: study({v: (2.0, 0.0) for v in OWN}, {v: {"windows": (7.0, 7.3)} for v in OWN}),
           lambda: study({v: (2.0, 0.0) for v in OWN}, {v: {"windows": (7.0, 21.0)} for v in OWN}),
           lambda: study({v: (2.0, 0.0) for v in OWN},
                         {v: [{"windows": (7.0, w)} for w in (7.0, 9.0, 11.5)] for v in OWN})),
    # T3: far mass as predicted from L; rotation-only growing 8× → 64×, controlled not (a limit below 1); fails
    # when the prediction misses, or when a controlled variant's far mass keeps growing; noise: a growth inside
    # the seeds' spread
    "T3": (lambda: _t3({"far": (0.3, 0.6, 0.8)}, {"far": (0.05, 0.08, 0.085)}),
           lambda: _t3({"far": (0.3, 0.6, 0.8), "predicted": (0.3, 0.35, 0.4)}, {"far": (0.05, 0.08, 0.1)}),
           lambda: _t3({"far": (0.3, 0.6, 0.8)}, {"far": (0.05, 0.08, 0.1)}, jitter=(-0.02, 0.0, 0.02))),
    "T4": (lambda: study({v: (2.0, 0.0) for v in ("accum-learned+values", "accum-learned+values+forget")},
                         {v: {"value": 0.1} for v in ("accum-learned+values", "accum-learned+values+forget")}),
           lambda: study({v: (2.0, 0.0) for v in ("accum-learned+values", "accum-learned+values+forget")},
                         {v: {"value": 0.9} for v in ("accum-learned+values", "accum-learned+values+forget")}),
           lambda: study({v: (2.0, 0.0) for v in ("accum-learned+values", "accum-learned+values+forget")},
                         {v: {"value": 0.5} for v in ("accum-learned+values", "accum-learned+values+forget")})),
    # T5: the top near score above the far maximum at 8×, the maximum growing as concentration predicts, far
    # spread ≈ ‖q‖‖k‖/√D; fails when the far maximum already wins at 8× (whatever the attention-weighted gap)
    "T5": (lambda: study({v: (2.0, 0.0) for v in SO2}, {v: {"top_gap": 1.0, "growth": 1.0} for v in SO2}),
           lambda: study({v: (2.0, 0.0) for v in SO2}, {v: {"top_gap": -1.0, "gap": (3.0, 3.0)} for v in SO2}),
           lambda: study({v: (2.0, 0.0) for v in SO2}, {v: {"growth": 1.25} for v in SO2},
                         jitter=(-0.3, 0.0, 0.3))),
    # N1: a cell both precise (1× within 0.01 of its rotation-only sibling) and flat (no more rise than ALiBi's)
    "N1": (lambda: _n1({c: 2.0 for c in CELLS}, jitter=(0.0, 0.001, 0.002)),
           lambda: _n1({c: 2.3 for c in CELLS}),
           lambda: _n1({c: 2.01 for c in CELLS}, jitter=(-0.05, 0.0, 0.05))),
    # C1 against RoPE's best eval-time extension: the extension (here YaRN) is better than plain RoPE far out, so the
    # rule must pick it; holds when accum-random beats it too, fails when the extension beats accum-random
    "C1-ext": (lambda: study({"RoPE": (2.0, 0.3), YARN: (2.0, 0.1), PI: (2.0, 0.2), "accum-random": (2.0, 0.02)}),
               lambda: study({"RoPE": (2.0, 0.3), YARN: (2.0, 0.01), PI: (2.0, 0.2), "accum-random": (2.0, 0.1)}),
               lambda: study({"RoPE": (2.0, 0.3), YARN: (2.0, 0.03), "accum-random": (2.0, 0.03)}, jitter=NOISY)),
}


def _state(task: str, accuracy: dict[str, Curve], jitter=JITTER) -> Results:
    """A state task's study: every variant's answer accuracy curve (NLL flat)."""
    return study({v: (1.0, 0.0) for v in accuracy}, jitter=jitter, datasets=(task,), accuracy=accuracy)


def _decay(at_l: float, per_doubling: float, floor: float = 0.0) -> Callable[[float], float]:
    return lambda m: max(floor, at_l - per_doubling * math.log2(m))


S_CASES = {
    # S1: accum-learned keeps parity past L where RoPE and NoPE fall to chance
    "S1": (lambda: _state("parity", {"accum-learned": (1.0, 0.0), "accum-learned+values": (1.0, 0.0),
                                     "RoPE": _decay(1.0, 0.2, 0.5), "NoPE": (0.5, 0.0)}),
           lambda: _state("parity", {"accum-learned": _decay(1.0, 0.2, 0.5), "accum-learned+values": _decay(1.0, 0.2, 0.5),
                                     "RoPE": (1.0, 0.0), "NoPE": (1.0, 0.0)}),
           lambda: _state("parity", {"accum-learned": _decay(1.0, 0.1, 0.5), "accum-learned+values": _decay(1.0, 0.1, 0.5),
                                     "RoPE": _decay(1.0, 0.1, 0.5), "NoPE": _decay(1.0, 0.1, 0.5)},
                          jitter=(-0.3, 0.0, 0.3))),
    # S2: PaTH tracks S5, the SO(2) accumulations stay at chance
    # (PaTH learned S5 at L in each: a PaTH at chance there leaves the claim not tested)
    "S2": (lambda: _state("s5", {"PaTH": (0.95, 0.02), "accum-learned": (0.01, 0.0), "accum-learned+values": (0.01, 0.0)}),
           lambda: _state("s5", {"PaTH": (0.95, 0.0), "accum-learned": (0.6, 0.0), "accum-learned+values": (0.6, 0.0)}),
           lambda: _state("s5", {"PaTH": (0.95, 0.0), "accum-learned": (0.06, 0.0), "accum-learned+values": (0.06, 0.0)},
                          jitter=(-0.3, 0.0, 0.3))),
    # S3: far-mass control reads the last write at 64×; rotation-only variants lose it
    "S3": (lambda: _state("flipflop", {"PaTH-FoX": (0.99, 0.0), "accum-learned+values+forget": (0.99, 0.0),
                                       "PaTH": _decay(1.0, 0.05), "accum-learned+values": _decay(1.0, 0.05)}),
           lambda: _state("flipflop", {"PaTH-FoX": _decay(1.0, 0.05), "accum-learned+values+forget": _decay(1.0, 0.05),
                                       "PaTH": (0.99, 0.0), "accum-learned+values": (0.99, 0.0)}),
           lambda: _state("flipflop", {v: _decay(1.0, 0.05 / 6) for v in ("PaTH-FoX", "accum-learned+values+forget",
                                                                          "PaTH", "accum-learned+values")},
                          jitter=(-0.3, 0.0, 0.3))),  # learned at L, at 0.95 ± noise at 64×
}
CASES.update(S_CASES)


def verdict(res: Results, claim_id: str):
    (claim,) = [c for c in [*check_claims(res), *check_calibration(res)] if c.id == claim_id]
    return claim


def lines(claim) -> list[str]:
    return [c.line() for c in claim.comparisons]


@pytest.mark.parametrize("claim_id", sorted(CASES))
@pytest.mark.parametrize("which, expect", [(0, SUPPORTED), (1, NOT_SUPPORTED), (2, INCONCLUSIVE)],
                         ids=["holds", "fails", "noise"])
def test_every_claim_resolves_the_right_way_on_a_synthetic_study(claim_id, which, expect):
    claim = verdict(CASES[claim_id][which](), claim_id)
    assert claim.verdict == expect, lines(claim)
    assert all(c.outcome != "missing" for c in claim.comparisons), lines(claim)  # every variant was read
    assert claim.rule and claim.test  # the report prints the rule and what decides it


@pytest.mark.parametrize("path, so2, expect", [(0.95, 1 / 3, SUPPORTED), (0.95, 0.6, NOT_SUPPORTED),
                                               (1 / 3, 1 / 6, NOT_TESTED)],
                         ids=["so2-sign-only", "so2-beyond", "path-sign-only"])
def test_s2_reads_each_group_against_its_commuting_limit(path, so2, expect):
    """On S3 a commuting state can hold the sign, so 1/3 is the limit, not chance (1/6): SO(2) accumulations at 1/3
    stay within it, at 0.6 they break it (which no commuting state can); and PaTH at the sign only is no evidence
    of a non-abelian state, however far it lies above SO(2) cells at chance: it did not learn S3 at L, so what it
    carries beyond is not tested."""
    res = _state("s3", {"PaTH": (path, 0.0), "accum-learned": (so2, 0.0), "accum-learned+values": (so2, 0.0)})
    claim = verdict(res, "S2")
    assert claim.verdict == expect, lines(claim)
    assert any(("commuting limit" if expect != NOT_TESTED else "not tested") in line for line in lines(claim))


# ---------------------------------------------------------------------------------------------------
# the instrument checks: apart from the claims
# ---------------------------------------------------------------------------------------------------
CALIBRATED = ("accum-random", "accum-random+alibi")


@pytest.mark.parametrize("kwargs, expect", [({}, SUPPORTED), ({"share": 0.5}, NOT_SUPPORTED),
                                            ({"fitted": 150.0}, NOT_SUPPORTED)],
                         ids=["recovers", "points-off", "window-off"])
def test_the_calibration_is_reported_apart_and_judged_on_its_own_rule(kwargs, expect):
    res = study({v: (2.0, 0.0) for v in CALIBRATED}, {v: kwargs for v in CALIBRATED})
    checks = {c.id: c for c in check_calibration(res)}
    worst = NOT_SUPPORTED if NOT_SUPPORTED in {c.verdict for c in checks.values()} else checks["I1"].verdict
    assert worst == expect, [lines(c) for c in checks.values()]
    # the random-increment variants are no evidence for T1 or T2: those read only the models' own transports
    claims = {c.id: c for c in check_claims(res)}
    assert [c.outcome for c in claims["T1"].comparisons] == ["missing"]
    assert [c.outcome for c in claims["T2"].comparisons] == ["missing"]


def test_the_calibration_checks_only_where_its_truth_is_model_free():
    """A spread per pair (the ladder) or a drift (RoPE+jitter): the mean coherence under fresh draws is a mixture
    weighted by the model's own q·k per pair, so |φ|^Δ is no truth there. Those variants are named, not checked
    (a trained ladder model measured 99 % of its points off the isotropic prediction); the exact one still is."""
    res = study({v: (2.0, 0.0) for v in ("accum-random", "accum-random-ladder", "RoPE+jitter")},
                {"accum-random": {}, "accum-random-ladder": {"share": 0.9}, "RoPE+jitter": {"share": 0.9}})
    checks = {c.id: c for c in check_calibration(res)}
    assert checks["I1"].verdict == SUPPORTED, lines(checks["I1"])
    assert all(c.what.startswith("accum-random at") for c in checks["I1"].comparisons)
    assert all(v in checks["I1"].note for v in ("accum-random-ladder", "RoPE+jitter")) and "model-free" in checks["I1"].note
    assert "accum-random," not in checks["I1"].note


# ---------------------------------------------------------------------------------------------------
# regressions: what the earlier rules got wrong
# ---------------------------------------------------------------------------------------------------
def test_n1_one_cell_precise_and_flat_is_enough_and_an_imprecise_cell_does_not_sink_it():
    """The earlier N1 asked every cell to be strictly better: accum-random+alibi, imprecise by design (0.24 nats
    worse at 1×), sank the claim while +forget was both precise and flat."""
    res = _n1({"accum-random+alibi": 2.24, "accum-learned+values+alibi": 2.0, "accum-learned+values+forget": 2.0},
              jitter=(0.0, 0.001, 0.002))
    n1 = verdict(res, "N1")
    assert n1.verdict == SUPPORTED, lines(n1)
    # 0.24 nats worse than its sibling accum-random, less the two variants' mean jitters (+0.001 and −0.001)
    assert "accum-random+alibi: corpus: not precise, flat (+0.238 nats at 1×)" in n1.note, n1.note
    assert "accum-learned+values+forget: corpus: precise, flat" in n1.note, n1.note
    # every cell imprecise: resolved against in each, not supported
    assert verdict(_n1({c: 2.24 for c in CELLS}), "N1").verdict == NOT_SUPPORTED
    # precise but rising more than ALiBi (by 0.05 nats per doubling): not flat
    rising = _n1({c: 2.0 for c in CELLS}, cell_rise=0.05, jitter=(0.0, 0.001, 0.002))
    assert verdict(rising, "N1").verdict == NOT_SUPPORTED, lines(verdict(rising, "N1"))


def test_n1_on_the_local_task_reads_the_accuracy_drop_against_alibi_s():
    """Answer tasks: flat when the accuracy drop 1× → longest exceeds ALiBi's by at most 2 points (an NLL
    threshold of a few thousandths of a nat would say nothing)."""
    good = verdict(_n1({c: 2.0 for c in CELLS}, jitter=(0.0, 0.001, 0.002), acc_drop=0.01), "N1")
    assert good.verdict == SUPPORTED and all("accuracy drop" in c.what for c in good.comparisons
                                             if c.what.startswith("local") and "flat" in c.what)
    dropped = verdict(_n1({c: 2.0 for c in CELLS}, jitter=(0.0, 0.001, 0.002), acc_drop=0.2), "N1")
    assert dropped.verdict == NOT_SUPPORTED, lines(dropped)


def test_n1_reads_precision_on_a_retrieval_task_within_l_where_the_study_ran_it():
    """With passkey retrieval in the study, each cell must also be precise there (its answers' NLL at 1× within the
    margin of its own rotation-only sibling's) and flat in accuracy: a cell that retrieves worse than its sibling
    within L is no longer "both"."""
    base = _n1({c: 2.0 for c in CELLS}, jitter=(0.0, 0.001, 0.002))
    n1 = verdict(base, "N1")
    assert n1.verdict == SUPPORTED and not any(c.what.startswith("passkey") for c in n1.comparisons)
    nll = {"accum-learned+values": (2.0, 0.05), "accum-random": (2.0, 0.05), "ALiBi": (2.3, 0.0),
           **{c: (2.2, 0.0) for c in CELLS}}  # every cell 0.2 nats worse than its sibling on the answers
    retrieval = study(nll, jitter=(0.0, 0.001, 0.002), datasets=("passkey",))
    both = verdict(Results(base.runs + retrieval.runs), "N1")
    assert any(c.what.startswith("passkey: ") and "precise" in c.what for c in both.comparisons), lines(both)
    assert both.verdict == NOT_SUPPORTED, lines(both)


def test_c4_without_the_far_mass_sibling_is_not_decided():
    """A rotation-only variant that extrapolated and then rises, with its far-mass-controlled sibling not run (a
    selection without it): the rise alone is no sign of missing far-mass control, so C4 is not supported by it."""
    rising = study({"accum-random": flat_then_rising(2.0, 16, 0.2)}, jitter=(0.0, 0.001, 0.002))
    c4 = verdict(rising, "C4")
    assert c4.verdict == INCONCLUSIVE, lines(c4)
    assert any(c.outcome == "missing" and "accum-random+alibi not run" in c.numbers for c in c4.comparisons)


def test_c4_does_not_credit_a_curve_that_never_extrapolated():
    """A RoPE-like curve, rising from 2× L, rises from 16× to 64× too: the earlier C4 credited it, and the one
    after counted it against. Now the variant must have extrapolated first (NLL(4×) within 5 % of 1×); one whose
    4× rise is resolved above that is not applicable, and a C4 with none inside its premise is not tested."""
    rope_like = _c4((2.0, 0.3), (2.0, 0.0))  # every rotation-only variant rises from 2×
    c4 = verdict(rope_like, "C4")
    assert c4.verdict == NOT_TESTED, lines(c4)  # none inside the premise: neither for nor against
    assert all(c.outcome == NOT_APPLICABLE and "never extrapolated" in c.numbers for c in c4.comparisons), lines(c4)
    # one variant that never extrapolated does not sink the pairs that show the pattern
    runs = [r for r in _c4(flat_then_rising(2.0, 16, 0.2), (2.0, 0.0)).runs if r.variant != "PaTH"]
    mixed = Results(runs + [r for r in rope_like.runs if r.variant == "PaTH"])
    c4 = verdict(mixed, "C4")
    assert c4.verdict == SUPPORTED and "outside the premise, not counted: PaTH: not applicable" in c4.why(), lines(c4)
    # RoPE itself is not among C4's variants: its curve never changes the verdict
    both = study({"RoPE": (2.0, 0.3), **{v: flat_then_rising(2.0, 16, 0.2) for v in C4_PAIRS},
                  **{s: (2.0, 0.0) for s in C4_PAIRS.values()}})
    assert verdict(both, "C4").verdict == SUPPORTED and not any("RoPE" == c.what.split()[0]
                                                               for c in verdict(both, "C4").comparisons)
    # rising no more than the sibling: not "degrades more than with far-mass control"
    same = _c4(flat_then_rising(2.0, 16, 0.2), flat_then_rising(2.0, 16, 0.2))
    assert verdict(same, "C4").verdict != SUPPORTED


def test_t1_reads_a_learned_drift_as_the_control_that_keeps_coherent_heads():
    """GRAPE's softplus drift breaks the regularity condition: its angles say its heads stay coherent, and T1
    expects them *not* to place a window; without the angles' prediction (older diagnostics) its declared drift
    says the same."""
    for grape in ({"mixes": False}, {"mixes": None}):
        res = study({v: (2.0, 0.0) for v in (*OWN, "accum-grape")},
                    {**{v: {} for v in OWN}, "accum-grape": {**grape, "censored": (True, True)}})
        t1 = verdict(res, "T1")
        assert t1.verdict == SUPPORTED, lines(t1)
        assert any("accum-grape" in c.what and "coherent" in c.what for c in t1.comparisons)
        mixing = study({v: (2.0, 0.0) for v in (*OWN, "accum-grape")},
                       {**{v: {} for v in OWN}, "accum-grape": grape})
        assert verdict(mixing, "T1").verdict == NOT_SUPPORTED
    assert not any("accum-grape" in c.what for c in verdict(res, "T2").comparisons)  # no window to compare


def test_t3_counts_nope_as_a_control_not_as_evidence():
    """NoPE's far mass grows without any rotation: it is shown, never counted (a rotation-only variant's growth
    alone is not specific)."""
    res = _t3({"far": (0.3, 0.6, 0.8)}, {"far": (0.05, 0.08, 0.085)})
    t3 = verdict(res, "T3")
    assert not any(c.what.startswith("NoPE") for c in t3.comparisons) and "NoPE" in t3.note


def test_t3_leaves_out_the_heads_whose_far_keys_lie_inside_their_own_window():
    """A learned head whose window is censored (or capped at 7L/8) keeps its "far" keys inside its own window: the
    bound is not about it. Such heads are left out of the means; a variant with no other head is outside the
    premise, shown in the note, not counted; the far mass of a bounded variant growing by 0.2 fails the rule."""
    res = _t3({"far": (0.3, 0.6, 0.8)}, {"far": (0.05, 0.25, 0.45)})
    assert verdict(res, "T3").verdict == NOT_SUPPORTED
    for r in res.runs:
        if r.variant in BOUNDED and r.diag:
            for layer in r.diag["layers"]:
                layer["far_window_source"] = ["censored at 1024; W = 32"] * H
    t3 = verdict(res, "T3")
    assert t3.verdict == SUPPORTED, lines(t3)
    assert all(f"{v} (every head's window reaches past the far range)" in t3.note for v in BOUNDED)
    # one head of four in the premise: the mean is that head's own
    from accrot.study.theory import in_premise, measured_far_mass

    run = next(r for r in res.runs if r.variant == "PaTH" and r.diag)
    for layer in run.diag["layers"]:
        layer["far_window_source"] = ["fitted at 1024; W = 40", *["fitted at 1024; W = 112 (capped at 7L/8)"] * 3]
        for f in layer["far"]:
            f["mass"] = [0.9, 0.1, 0.1, 0.1]
    assert in_premise(run) == [True, False, False, False] * 2
    assert measured_far_mass(run, 64.0) == pytest.approx(0.9)


# ---------------------------------------------------------------------------------------------------
# the correction and the "any case" rule
# ---------------------------------------------------------------------------------------------------
def test_holm_keeps_a_lone_boundary_against_from_sinking_a_claim_of_twelve_comparisons():
    """Twelve comparisons, one of them against at p = 0.02 (resolved alone, at 0.025): Holm's first step asks
    p < 0.025/12, so the claim stays inconclusive; at p = 0.001 it is not supported."""
    from accrot.study.stats import Claim

    def claim(p):
        comps = [Comparison(f"c{i}", "", "for", 0.001, 0.999) for i in range(11)]
        comps.append(Comparison("c11", "", "against", 0.98, p))
        c = Claim("X", "x", "x", comps)
        c.finalize()
        return c

    loose = claim(0.02)
    assert loose.verdict == INCONCLUSIVE and loose.comparisons[-1].corrected
    assert "against before the correction" in loose.comparisons[-1].line()
    assert claim(0.001).verdict == NOT_SUPPORTED
    assert holm([0.001, 0.02, 0.03], alpha=0.05) == [True, True, True]
    assert holm([0.001, 0.04, 0.03], alpha=0.05) == [True, False, False]  # 0.03 > 0.05/2: the steps stop


def test_case_verdict_is_supported_by_one_case_and_refuted_only_by_all():
    good = [Comparison("a", "", "for", 0.001, 0.99), Comparison("b", "", "for", 0.002, 0.99)]
    bad = [Comparison("a", "", "against", 0.99, 0.001), Comparison("b", "", "for", 0.001, 0.99)]
    open_ = [Comparison("a", "", "inside", 0.2, 0.2), Comparison("b", "", "for", 0.001, 0.99)]
    assert case_verdict({"x": good, "y": bad}) == SUPPORTED
    assert case_verdict({"x": bad, "y": bad}) == NOT_SUPPORTED
    assert case_verdict({"x": bad, "y": open_}) == INCONCLUSIVE
    # one case barely for (p = 0.02 < 0.025) among three: Holm over the cases asks 0.025/3
    weak = [Comparison("a", "", "for", 0.02, 0.98)]
    assert case_verdict({"x": weak, "y": bad, "z": bad}) != SUPPORTED


def test_the_extension_rows_follow_rope_and_c1_is_read_against_both():
    """RoPE's eval-time extensions sit right after RoPE in every table; C1 stays the comparison with plain RoPE and
    C1-ext, right after it, names the extension it was read against at each length; no extension rows, no C1-ext."""
    res = study({"NoPE": (2.0, 0.3), "RoPE": (2.0, 0.3), YARN: (2.0, 0.1), PI: (2.0, 0.2),
                 "accum-random": (2.0, 0.02)})
    assert res.variants("corpus") == ["NoPE", "RoPE", PI, YARN, "accum-random"]
    ids = [c.id for c in check_claims(res)]
    assert ids[:2] == ["C1", "C1-ext"]
    assert all(c.what.endswith("vs RoPE+YaRN") for c in verdict(res, "C1-ext").comparisons)
    assert "C1-ext" not in [c.id for c in check_claims(study({"RoPE": (2.0, 0.3), "accum-random": (2.0, 0.02)}))]


def test_a_state_tracking_study_alone_reads_only_its_own_claims():
    """No language corpus ran: the claims on NLL and the diagnostics have nothing to read, so the report lists
    S1–S3 alone instead of eleven rows of "missing"."""
    res = _state("parity", {"accum-learned": (1.0, 0.0), "accum-learned+values": (1.0, 0.0)})
    assert res.corpus not in res.datasets()
    assert [c.id for c in check_claims(res)] == ["S1"]


def _with_same_targets(res: Results, same: dict[str, Curve]) -> Results:
    """``res`` with each listed variant's same-target NLL per length (its rise: the curve minus its 1× value)."""
    runs = []
    for r in res.runs:
        rows = {m: dict(row) for m, row in r.lengths.items()}
        if r.variant in same:
            curve = nll_curve(same[r.variant], 0.0)
            for m, row in rows.items():
                row["same_target_nll"] = curve[m]
                row["same_target_rise"] = curve[m] - curve[1.0]
        runs.append(Run(r.dataset, r.variant, r.seed, r.run_dir, rows, r.train_length))
    return Results(runs)


def test_the_rises_read_the_same_targets_where_the_evaluation_scored_them():
    """Per-length blocks read different text at every length: a bounded model there can seem to rise (or fall) by
    the text alone. Where the same targets were scored at every length, C5, C2's rise and the horizon read them."""
    blocks_rise = study({"ALiBi": (2.0, 0.2)}, jitter=(0.0, 0.001, 0.002))  # different text per length: "rises"
    assert verdict(blocks_rise, "C5").verdict == NOT_SUPPORTED
    same = _with_same_targets(blocks_rise, {"ALiBi": (2.0, 0.0)})  # the same targets: no rise at all
    assert all(r.same_targets for r in same.runs)
    assert verdict(same, "C5").own_verdict == SUPPORTED, lines(verdict(same, "C5"))
    from accrot.study.results import horizon

    assert {horizon(r) for r in blocks_rise.runs} == {1.0} and {horizon(r) for r in same.runs} == {64.0}
    # and the other way: flat blocks, a real rise on the same targets
    c2 = _with_same_targets(study({"RoPE": (2.0, 0.3), LEARNED: (2.0, 0.0)}), {LEARNED: (2.0, 0.1),
                                                                               "RoPE": (2.0, 0.3)})
    assert verdict(c2, "C2").verdict == NOT_SUPPORTED, lines(verdict(c2, "C2"))


def test_a_claim_about_length_is_not_tested_where_its_variants_never_learned_the_task_at_l():
    """Parity at chance at L (0.51–0.54, as the study's first runs were) says nothing about state carried beyond
    L: S1 reads "not tested", not "inconclusive" or "not supported"; one variant learned and the other not: the
    learned one decides, and the reason names the other."""
    chance_at_l = _state("parity", {"accum-learned": (0.52, 0.0), "accum-learned+values": (0.53, 0.0),
                                    "RoPE": (0.5, 0.0), "NoPE": (0.5, 0.0)})
    s1 = verdict(chance_at_l, "S1")
    assert s1.verdict == NOT_TESTED and "not tested" in s1.why(), lines(s1)
    one = _state("parity", {"accum-learned": (1.0, 0.0), "accum-learned+values": (0.52, 0.0),
                            "RoPE": _decay(1.0, 0.2, 0.5), "NoPE": (0.5, 0.0)})
    s1 = verdict(one, "S1")
    assert s1.verdict == SUPPORTED and "parity: accum-learned+values learned at L" in s1.why(), s1.why()


def test_t1_counts_its_share_over_seeds_and_heads_with_an_exact_interval():
    """Every (seed, layer, head) is one unit: 24 of 24 placed resolves above 0.75 (0.75²⁴ ≈ 0.001), 12 of 12
    cannot (0.75¹² ≈ 0.03 > 0.025), however clean, and 16 of 24 straddles it."""
    from accrot.study.stats import compare_share

    assert compare_share("x", 24, 24, 0.75).outcome == "for"
    assert compare_share("x", 12, 12, 0.75).outcome == "inside"
    assert compare_share("x", 16, 24, 0.75).outcome == "inside"
    assert compare_share("x", 2, 24, 0.75).outcome == "against"
    assert compare_share("x", 2, 24, 0.75, above_is_for=False).outcome == "for"
    t1 = verdict(CASES["T1"][0](), "T1")
    assert all("24/24" in c.numbers for c in t1.comparisons), lines(t1)


def test_t2_compares_the_windows_fitted_over_one_range_at_both_lengths():
    """A mixture of rates fitted over 7/8 of each length gets a longer window at 64× by the longer range alone:
    T2 reads the windows both lengths fit over the 8× length's range. Per-length fits drifting 3× with the common
    ones equal: supported; the common ones drifting: not supported; diagnostics without the common fit: nothing
    to read (missing), never the per-length windows."""
    def t2(common):
        return verdict(study({v: (2.0, 0.0) for v in OWN}, {v: {"windows": (7.0, 21.0), "common": common}
                                                            for v in OWN}), "T2")

    assert t2((7.0, 7.2)).verdict == SUPPORTED, lines(t2((7.0, 7.2)))
    assert t2((7.0, 21.0)).verdict == NOT_SUPPORTED
    old = study({v: (2.0, 0.0) for v in OWN}, {v: {"windows": (7.0, 7.0)} for v in OWN})
    for r in old.runs:
        for layer in (r.diag or {}).get("layers", []):
            for c in layer["coherence"]:
                for k in ("common_range", "window_common", "window_common_se", "window_common_censored"):
                    c.pop(k, None)
    c = verdict(old, "T2")
    assert c.verdict != SUPPORTED and "older than that fit" in " ".join(x.numbers for x in c.comparisons), lines(c)


def test_t3_reads_the_local_task_s_diagnostics_too():
    """The local task's far keys are distractors by construction: T3 reads its diagnosed runs beside the corpus's,
    under their own names; a bounded variant whose far mass keeps growing there fails T3 although the corpus holds."""
    from dataclasses import replace

    def with_local(local_bounded: dict) -> Results:
        corpus = _t3({"far": (0.3, 0.6, 0.8)}, {"far": (0.05, 0.08, 0.085)}, jitter=(0.0, 0.001, 0.002))
        grown = _t3({"far": (0.3, 0.6, 0.8)}, local_bounded, jitter=(0.0, 0.001, 0.002))
        return Results([*corpus.runs, *(replace(r, dataset="local") for r in grown.runs)])

    holds = verdict(with_local({"far": (0.05, 0.08, 0.085)}), "T3")
    assert holds.verdict == SUPPORTED, lines(holds)
    assert any(c.what == "local: ALiBi bounded (does not grow)" for c in holds.comparisons)
    fails = verdict(with_local({"far": (0.05, 0.08, 0.3)}), "T3")
    assert fails.own_verdict == NOT_SUPPORTED, lines(fails)
    assert all(c.outcome == "for" for c in fails.comparisons if not c.what.startswith("local: "))


def test_t2_reads_only_the_layers_whose_transport_reads_the_context():
    """Layer 0's increments are computed from the token embeddings alone, so its window cannot depend on the length
    on stationary text: T2 reads layers past the first. A drift at layer 1 fails T2 whatever layer 0 shows; a
    drift at layer 0 alone does not; a token table (no function of the context) is shown, not read."""
    def drifting(layer: int) -> Results:
        res = study({v: (2.0, 0.0) for v in OWN}, {v: {"windows": (7.0, 7.1)} for v in OWN})
        for r in res.runs:
            if not r.diag:
                continue
            r.diag["layers"] = [copy.deepcopy(x) for x in r.diag["layers"]]  # the synthetic layers share curves
            for c in r.diag["layers"][layer]["coherence"]:
                if c["length"] == 64 * L:
                    c["window_common"] = [21.0] * H
        return res

    assert verdict(drifting(1), "T2").verdict == NOT_SUPPORTED, lines(verdict(drifting(1), "T2"))
    assert verdict(drifting(0), "T2").verdict == SUPPORTED, lines(verdict(drifting(0), "T2"))
    t2 = verdict(drifting(0), "T2")
    assert not any(c.what.startswith("accum-token") for c in t2.comparisons)
    assert "accum-token (no layer whose transport reads the context" in t2.note


def test_t1_checks_the_heads_against_what_their_own_angles_predict():
    """Heads whose angles say they stay coherent (a pair that never spreads) are predicted *not* to place a window:
    censored windows there are for the theorem, placed ones against it; without the prediction (older
    diagnostics) every head is expected placed, as before."""
    own = {v: (2.0, 0.0) for v in OWN}
    coherent_censored = study(own, {v: {"mixes": False, "censored": (True, True)} for v in OWN})
    assert verdict(coherent_censored, "T1").verdict == SUPPORTED, lines(verdict(coherent_censored, "T1"))
    coherent_placed = study(own, {v: {"mixes": False} for v in OWN})
    assert verdict(coherent_placed, "T1").verdict == NOT_SUPPORTED
    old = study(own, {v: {"mixes": None, "censored": (True, True)} for v in OWN})
    t1 = verdict(old, "T1")
    assert t1.verdict == NOT_SUPPORTED and "no regularity recorded" in t1.note, lines(t1)

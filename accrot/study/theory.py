"""The theory's claims (T1–T5) on the trained models' diagnostics, and the instrument checks apart from them.

What each rule reads (every value per seed; the comparisons and corrections: :mod:`accrot.study.stats`):

* **instrument checks** (random position increments, whose coherence under fresh draws of their distribution is
  |φ|^Δ for *any* model: it holds by construction, so it calibrates the estimator, it is no finding): the share
  of (layer, head, Δ) points more than 3 standard errors off |φ|^Δ (≤ 10 %), and the fitted window against the
  predicted one (within ±25 %) at L and 8× L.
* **T1**, **T2** and **T4** are about transports whose pairs can mix: a learned rotation whose own bound and ladder
  keep some pairs coherent past the longest length (Selective RoPE's) is read, shown as a labelled row, not counted.
* **T1** (the model's own transports — learned and token increments, PaTH — become incoherent where they are
  regular): per (seed, layer, head), the diagnostics read from the transport's own angles whether the head's
  pairs, each counted by the share of the head's score energy it carries (E|q_i|²·E|k_i|²), have phase
  differences that spread: the weighted resultant Σ_i w_i R_i(Δ) under ε within the longest length (PaTH: whether
  the mean Householder factor contracts), which predicts that head mixes or stays coherent; the rule asks the heads predicted to mix to place
  their window (fitted over 1 ≤ Δ ≤ 7/8 of the length, at both 8× and 64× L; share above :data:`T1_SHARE`) and
  the heads predicted coherent not to (share below 1 − :data:`T1_SHARE`).
* **T2** (the window does not depend on the context length): per variant, the mean over heads resolved at both
  lengths of log(W(64×) / W(8×)), both fitted over one Δ range (1 ≤ Δ ≤ 7/8 of the 8× length), within ±log 1.25.
* **T3** (the far-mass lower bound): the far mass (attention beyond each head's window, at least L/4) that the
  bound predicts at 64× L from statistics measured at L alone, against the mass measured there (within
  ±:data:`T3_AGREEMENT`), and its growth from 8× to 64× L: rotation-only variants' grows (its limit is 1),
  far-mass-controlled variants' does not (by at most :data:`T3_FLAT`: a limit below 1). Fixed levels decided
  nothing (any bias-free head with 8 000 far keys passes 0.5; a FoX-init gate sits at 0). Heads whose window is
  censored or runs past 7L/8 have far keys inside their own window, outside the bound's premise: left out. NoPE is shown as the negative control (it grows with no rotation at all), not counted; a scheme whose
  logit factor grows with the keys (scalable softmax) is neither (the bound's logits do not change scale with the
  length), so it is shown, not counted, like every variant that does not accumulate.
* **T4** (value rotation makes far contributions incoherent): the rotated far output norm nearer the random-walk
  prediction than the linear sum.
* **T5** (concentration gives a score gap; :data:`SO2_ACCUMULATED`, the accumulated SO(2) rotations that satisfy the
  regularity condition and have no far-mass design): beyond each variant's own window, the top near score above
  the far *maximum* at 8× L, the far maximum's growth from 8× to 64× L as concentration predicts it from the far
  scores' mean and spread (μ + σ√(2 ln n): measured / predicted growth in [0.8, 1.25]: which is how the far set
  eventually wins), and the far spread ≈ ‖q‖‖k‖/√D on the unscaled scores (ratio in [0.8, 1.25]). An
  attention-weighted near score above the far scores' mean is a softmax identity: it is no part of the rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from accrot.errors import ConfigError
from accrot.position import SchemeFacts, facts
from accrot.study.results import (
    ALSO_DIAGNOSED,
    Results,
    Run,
    diag_layers,
    entries,
    head_values,
    horizon,
    length_of,
    mean_of,
    outside_premise,
    times,
)
from accrot.study.stats import Claim, Comparison, compare_band, compare_share, compare_threshold
from accrot.study.variants import VARIANTS

CALIBRATION_TOLERANCE = 0.10  # share of (layer, head, Δ) points where measured and |φ|^Δ disagree
CALIBRATION_Z = 3.0  # a point disagrees when |measured − predicted| > this many (honest) standard errors
WINDOW_BAND = math.log(1.25)  # a window within ±25 % (of the prediction; of itself at another length)
T1_SHARE = 0.75  # the regularity's prediction right for at least three heads in four
T3_AGREEMENT = 0.10  # measured far mass within ±0.1 of the predicted
T3_FLAT = 0.02  # far mass growth 8× → longest: at most this is bounded, more is growing
T4_MIDPOINT = 0.5  # rotated far norm nearer the random-walk prediction (0) than the linear sum (1)
T5_CONCENTRATION = (0.8, 1.25)



def so2_accumulated(variants: dict[str, dict] = VARIANTS) -> tuple[str, ...]:
    """T5's variants: accumulated rotations that commute (SO(2)), where every pair mixes by construction or may by
    learning (not the controls that break the regularity condition: a spread on RoPE's ladder, a softplus drift),
    with no far-mass design (the bare rotation whose scores the concentration argument is about)."""
    return tuple(v for v, over in variants.items()
                 if (f := facts(over)).accumulates and f.commutes and not f.breaks_condition and not f.far_mass_design)


SO2_ACCUMULATED = so2_accumulated()


# ---------------------------------------------------------------------------------------------------
# what a run's diagnostics hold
# ---------------------------------------------------------------------------------------------------
def scheme_facts(run: Run) -> SchemeFacts:
    """The facts of the scheme a run's diagnostics describe (layer 0's ``describe()``); NoPE's where it records
    none, or none this version can read."""
    try:
        return facts(run.diag.get("scheme") or {})
    except ConfigError:
        return facts({})


def kind(run: Run) -> str:
    """``calibration`` (fresh draws of random position increments), ``own`` (the model's own accumulated
    transport), or ``none`` (no accumulated transport, or no diagnostics)."""
    coherence = [c for layer in diag_layers(run) for c in layer.get("coherence", [])]
    if not coherence:
        return "none"
    if any(c.get("instrument") == "fresh draws" for c in coherence):
        return "calibration"
    return "own" if scheme_facts(run).accumulates else "none"


def breaks_condition(run: Run) -> bool:
    """A transport that breaks the regularity condition by construction (GRAPE's non-negative softplus rate, a
    drift): the theory predicts coherent heads (T1's control), not a window."""
    return scheme_facts(run).breaks_condition


def variants_of(res: Results, which: str) -> list[str]:
    """The variants (in the report's order) whose diagnosed runs are of ``which`` :func:`kind`."""
    return [v for v in res.variants(res.corpus) if (runs := res.diagnosed(v)) and kind(runs[0]) == which]


def window_lengths(run: Run) -> tuple[int, int] | None:
    """The two lengths T1 and T2 read the windows at: the diagnosed length nearest 8× L, and the longest."""
    L, lengths = run.diag.get("train_length"), run.diag.get("lengths") or []
    if L is None or len(lengths) < 2:
        return None
    reference = min(lengths, key=lambda n: (abs(math.log(n / (8 * L))), -n))
    return (reference, max(lengths)) if reference != max(lengths) else None


def head_windows(run: Run, length: int, common: bool = False) -> list[tuple[str, float | None, float | None]]:
    """``(name, window or None when censored, jackknife se)`` of every (layer, head) at ``length``; ``common``: the
    window fitted over the range every length from the reference on shares (empty where the diagnostics predate
    it)."""
    out = []
    key = "window_common" if common else "window"
    for layer in diag_layers(run):
        for c in layer.get("coherence", []):
            if c["length"] != length or key not in c:
                continue
            censored = c.get(key + "_censored") or [w is None for w in c[key]]
            for h, (w, cen) in enumerate(zip(c[key], censored)):
                se = (c.get(key + "_se") or [None] * len(c[key]))[h]
                out.append((f"layer {layer['layer']} head {h}", None if cen or w is None else float(w), se))
    return out


# ---------------------------------------------------------------------------------------------------
# instrument checks
# ---------------------------------------------------------------------------------------------------
def coherence_disagreement(curve, stderr, predicted, distances, max_distance: int,
                           z: float = CALIBRATION_Z) -> tuple[int, int]:
    """``(outside, points)``: how many (head, 1 ≤ Δ ≤ max_distance) points have |measured − predicted| >
    z·stderr, of how many comparable ones (``[H][n]`` lists as in diagnostics.json)."""
    outside = points = 0
    for h, row in enumerate(curve):
        for i, dist in enumerate(distances):
            if 1 <= dist <= max_distance and None not in (row[i], predicted[h][i], stderr[h][i]):
                points += 1
                outside += abs(row[i] - predicted[h][i]) > z * stderr[h][i]
    return outside, points


def coherence_share(run: Run, length: int | None = None) -> float | None:
    """Share of (layer, head, 1 ≤ Δ ≤ 7/8 length) points at ``length`` (default L) more than
    :data:`CALIBRATION_Z` standard errors off the prediction."""
    length = length or run.diag.get("train_length")
    outside = points = 0
    for c in entries(run, "coherence", length):
        if c.get("predicted"):
            o, n = coherence_disagreement(c["curve"], c["stderr"], c["predicted"], c["distances"],
                                          (c.get("fit_range") or [1, 7 * length // 8])[1])
            outside, points = outside + o, points + n
    return outside / points if points else None


def predicted_window(run: Run) -> float | None:
    """The window the increment distribution predicts (the first layer's; every head alike)."""
    pred = (diag_layers(run) or [{}])[0].get("predicted") or {}
    windows = [w for w in pred.get("window_sustained") or [] if w is not None]
    return windows[0] if windows else None


def window_error(run: Run, length: int) -> float | None:
    """log(mean fitted window / predicted window) at ``length`` (None when a window is censored)."""
    fitted = [w for _, w, _ in head_windows(run, length)]
    truth = predicted_window(run)
    if not fitted or None in fitted or truth is None or truth <= 0:
        return None
    return math.log(sum(fitted) / len(fitted) / truth)


def check_calibration(res: Results) -> list[Claim]:
    """The instrument checks, on every variant with random position increments (they hold by construction)."""
    c1 = Claim("I1", "the coherence estimator recovers |φ|^Δ under fresh draws",
               f"share of (layer, head, 1 ≤ Δ ≤ 7L/8) points more than {CALIBRATION_Z:g} standard errors off "
               f"|φ|^Δ, at L and 8× L", rule=f"for when the share's interval lies under {CALIBRATION_TOLERANCE:.0%}")
    c2 = Claim("I2", "the fitted window recovers the predicted window",
               "log(fitted window / predicted window) at L and 8× L",
               rule="for when the interval lies within ±log 1.25 (the window within 25 % of the prediction)")
    inexact = []
    for v in variants_of(res, "calibration"):
        runs = res.diagnosed(v)
        if not exact_prediction(runs[0]):
            inexact.append(v)
            continue
        for m in (1.0, 8.0):
            length = length_of(runs[0], m)
            shares = [s for r in runs if (s := coherence_share(r, length)) is not None]
            if shares or m == 1.0:
                c1.comparisons.append(compare_threshold(f"{v} at {times(m)}", shares, CALIBRATION_TOLERANCE,
                                                        label="share outside "))
            errors = [e for r in runs if (e := window_error(r, length)) is not None]
            if errors or m == 1.0:
                c2.comparisons.append(compare_band(f"{v} at {times(m)}", errors, -WINDOW_BAND, WINDOW_BAND,
                                                   label="log ratio ", shown="±log 1.25"))
    if inexact:
        why = (f"not a check for {', '.join(inexact)}: pairs that mix at different rates (or drift) have a mean "
               "coherence weighted by the model's own q·k per pair, so |φ|^Δ is no model-free truth there")
        c1.note = c2.note = why
    return [c1, c2]


def exact_prediction(run: Run) -> bool:
    """Zero-mean random position increments with one spread for every pair: the only case whose coherence under
    fresh draws is |φ|^Δ whatever q and k (with a spread per pair, the pairs' mixture depends on the model)."""
    scheme = run.diag.get("scheme", {})
    sigma = scheme.get("increment_sigma") or []
    return (scheme_facts(run).fresh_draws and scheme.get("increment_mean", "zero") == "zero"
            and len(sigma) > 0 and max(sigma) - min(sigma) <= 1e-9 * max(sigma))


# ---------------------------------------------------------------------------------------------------
# T1, T2: the trained transports' windows
# ---------------------------------------------------------------------------------------------------
def resolved_heads(run: Run) -> tuple[int, int, list[str]]:
    """``(placed, heads, the heads not placed)``: of the run's (layer, head), those whose window is resolved at
    both window lengths (0, 0 where the run has no two window lengths)."""
    pair = window_lengths(run)
    if pair is None:
        return 0, 0, []
    at = [head_windows(run, n) for n in pair]
    if not at[0] or len(at[0]) != len(at[1]):
        return 0, 0, []
    bad = [f"{name} (censored at {', '.join(str(n) for n, w in zip(pair, ws) if w is None)})"
           for name, *ws in zip([a[0] for a in at[0]], [a[1] for a in at[0]], [b[1] for b in at[1]])
           if None in ws]
    return len(at[0]) - len(bad), len(at[0]), bad


def context_layers(run: Run) -> list[int]:
    """The layers whose transport can depend on the context length, the only ones T2 reads: a learned transport's
    layers past the first (layer 0's increments are computed from the token embeddings alone, which carry no
    position, so on stationary text its window is the same at any length by construction); none for a transport
    that is no function of the context (a token table, fresh draws)."""
    if not scheme_facts(run).learned:
        return []
    return [layer["layer"] for layer in diag_layers(run) if layer.get("layer", 0) >= 1]


def window_drift(run: Run) -> tuple[float | None, str]:
    """Mean over the heads of the context-reading layers (:func:`context_layers`) resolved at both window lengths
    of log(W(longest) / W(8×)), both fitted over one Δ range (1 ≤ Δ ≤ 7/8 of the 8× length: a longer range would
    lengthen a mixture of rates' window by itself), and how many heads agree within their jackknife intervals
    (|ΔW| ≤ 1.96 √(se₁² + se₂²))."""
    pair = window_lengths(run)
    if pair is None:
        return None, "no second window length"
    a, b = (head_windows(run, n, common=True) for n in pair)
    if not a or len(a) != len(b):
        return None, "no window fitted over one range at both lengths (diagnostics older than that fit: re-run them)"
    read = {f"layer {i} " for i in context_layers(run)}
    logs, agree = [], 0
    for (name, w1, s1), (_, w2, s2) in zip(a, b):
        if not any(name.startswith(x) for x in read):
            continue
        if w1 and w2:
            logs.append(math.log(w2 / w1))
            if s1 is not None and s2 is not None:
                agree += abs(w2 - w1) <= 1.96 * math.hypot(s1, s2)
    if not read:
        return None, "no layer past the first"
    if not logs:
        return None, "no head resolved at both lengths"
    return sum(logs) / len(logs), f"{agree}/{len(logs)} heads of layers ≥ 1 agree within their jackknife intervals"


def predicted_mixing(run: Run) -> list[bool] | None:
    """Per (layer, head), layer-major: whether the run's own transport mixes there (the score-weighted resultant of
    its pairs' phase differences falls under ε within the longest length, or every pair's does in diagnostics
    recorded before the weights; PaTH: the mean Householder factor contracts within it), read off its angles and
    factors by the diagnostics; None where they did not record it."""
    out = []
    for layer in diag_layers(run):
        reg = layer.get("regularity")
        if not reg or "mixes" not in reg:
            return None
        out += [bool(m) for m in reg["mixes"]]
    return out or None


def t1_counts(run: Run) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """``((placed, heads) among the heads predicted to mix, (placed, heads) among those predicted coherent)``, or
    None without a prediction or two window lengths."""
    predicted = predicted_mixing(run)
    pair = window_lengths(run)
    if predicted is None or pair is None:
        return None
    at = [head_windows(run, n) for n in pair]
    if len(at[0]) != len(predicted) or len(at[1]) != len(predicted):
        return None
    placed = [a[1] is not None and b[1] is not None for a, b in zip(*at)]
    mix = [(p, m) for p, m in zip(placed, predicted)]
    return ((sum(p for p, m in mix if m), sum(m for _, m in mix)),
            (sum(p for p, m in mix if not m), sum(not m for _, m in mix)))


def t1(res: Results) -> Claim:
    c = Claim("T1", "products become incoherent after finitely many steps",
              "the model's own transports (learned and token increments, PaTH; a variant whose own ladder keeps pairs "
              "from mixing within the longest length is a labelled row, not counted), per (seed, layer, head): "
              "predicted from the transport's own angles (its pairs' phase differences θ_t − θ_{t−Δ}, each pair "
              "weighted by its share of the head's score energy, spread under ε) or factors (PaTH: the mean Householder factor contracts) to mix or to stay coherent, against "
              "whether its window, fitted over 1 ≤ Δ ≤ 7/8 of the length, is placed at both 8× and 64× L",
              rule=f"for a variant when the heads predicted to mix place their window (the share's exact binomial "
                   f"interval above {T1_SHARE:g}) and the heads predicted coherent do not (below {1 - T1_SHARE:g}, "
                   "where there are any); every variant must be for. Without the prediction (older diagnostics): "
                   "every head is expected to place it (a learned drift that breaks the condition, GRAPE's: none)")
    missing, labelled, notes = [], [], []
    for v in variants_of(res, "own"):
        why = outside_premise(res, v)
        runs = res.diagnosed(v)
        counts = [t1_counts(r) for r in runs]
        comps = []
        if all(x is not None for x in counts):
            (k1, n1), (k2, n2) = (tuple(map(sum, zip(*(x[i] for x in counts)))) for i in (0, 1))
            if n1:
                comps.append(compare_share(f"{v}: heads predicted to mix", k1, n1, T1_SHARE, label="placed "))
            if n2:
                comps.append(compare_share(f"{v}: heads predicted coherent", k2, n2, 1 - T1_SHARE,
                                           above_is_for=False, label="placed "))
            notes.append(f"{v}: {n1} of {n1 + n2} (seed, layer, head) predicted to mix")
        else:  # the diagnostics predate the prediction
            placed = total = 0
            for r in runs:
                k, n, _ = resolved_heads(r)
                placed, total = placed + k, total + n
            if breaks_condition(runs[0]):
                comps.append(compare_share(f"{v} keeps coherent heads (a learned drift: the condition fails)",
                                           placed, total, T1_SHARE, above_is_for=False, label="placed "))
            else:
                comps.append(compare_share(v, placed, total, T1_SHARE, label="placed "))
            notes.append(f"{v}: no regularity recorded (older diagnostics): every head expected placed")
        bad = [f"seed {r.seed}: {h}" for r in runs for h in resolved_heads(r)[2]]
        if bad:
            missing.append(f"{v}: " + "; ".join(bad[:6]) + (f"; … {len(bad) - 6} more" if len(bad) > 6 else ""))
        if why:  # its ladder breaks the condition for some pairs: neither side of the claim
            labelled.append(f"{v} ({why}; not counted): " + "; ".join(x.numbers for x in comps))
            continue
        c.comparisons += comps
    if not c.comparisons:
        c.comparisons.append(Comparison("the model's own transports", "no such variant diagnosed", "missing"))
    c.note = "; ".join([*notes, ("heads not placed: " + " | ".join(missing)) if missing else
                        "every head placed at both lengths", *labelled])
    return c


def t2(res: Results) -> Claim:
    c = Claim("T2", "a finite mixing window independent of context length",
              "the model's own learned transports (a ladder that keeps pairs from mixing: a labelled row), the heads of "
              "layers past the first (layer 0's increments read the token embeddings alone, and a token table none of "
              "the context, so their windows cannot depend on the length: shown, not read): mean over heads placed "
              "at both lengths of log(W(64×) / W(8×)), both fitted over one range, 1 ≤ Δ ≤ 7/8 of 8× L",
              rule="for a variant when the interval lies within ±log 1.25; every variant must be for")
    labelled = []
    for v in variants_of(res, "own"):
        if breaks_condition(res.diagnosed(v)[0]):
            continue  # T1's control: no finite window to compare
        if not context_layers(res.diagnosed(v)[0]):  # a token table, or a single layer: nothing that reads context
            labelled.append(f"{v} (no layer whose transport reads the context; not counted)")
            continue
        drifts, notes = [], []
        for r in res.diagnosed(v):
            drift, note = window_drift(r)
            notes.append(f"seed {r.seed}: {note}")
            if drift is not None:
                drifts.append(drift)
        comp = compare_band(v, drifts, -WINDOW_BAND, WINDOW_BAND, label="log ratio ", shown="±log 1.25")
        comp.numbers += "; " + "; ".join(notes)
        if (why := outside_premise(res, v)) is not None:
            labelled.append(f"{v} ({why}; not counted): {comp.numbers}")
            continue
        c.comparisons.append(comp)
    c.note = "; ".join(labelled)
    if not c.comparisons:
        c.comparisons.append(Comparison("the model's own transports", "no such variant diagnosed", "missing"))
    return c


# ---------------------------------------------------------------------------------------------------
# T3: the lower bound, predicted from L and measured at length
# ---------------------------------------------------------------------------------------------------
def in_premise(run: Run) -> list[bool]:
    """Per (layer, head), layer-major: whether its far keys lie beyond its own window. A head whose window could
    not be placed (censored) or runs past 7/8 of L (capped there, so that L still has far keys to predict from)
    has far keys inside its window: the lower bound, which is about incoherent far keys, says nothing of it."""
    out = []
    for layer in diag_layers(run):
        sources = layer.get("far_window_source") or []
        heads = len(sources) or len((layer.get("far") or [{}])[0].get("mass") or [])
        out += [not (h < len(sources) and ("censored" in sources[h] or "capped" in sources[h]))
                for h in range(heads)]
    return out


def _premise_mean(run: Run, values: Sequence[float | None]) -> float | None:
    keep = in_premise(run)
    if len(keep) != len(values):
        return mean_of(values)
    return mean_of(v for v, k in zip(values, keep) if k)


def measured_far_mass(run: Run, mult: float) -> float | None:
    """Mean over the (layer, head) in the bound's premise (:func:`in_premise`) of the far mass measured at
    ``mult`` × L."""
    return _premise_mean(run, head_values(run, "far", "mass", length_of(run, mult)))


def predicted_far_mass(run: Run, mult: float) -> float | None:
    """Mean over the (layer, head) in the bound's premise of the far mass it predicts at ``mult`` × L from L's
    statistics."""
    values = []
    for layer in diag_layers(run):
        pred = layer.get("far_prediction") or {}
        for m, mass in zip(pred.get("multiples", []), pred.get("mass", [])):
            if abs(m - mult) < 1e-9:
                values += mass
    return _premise_mean(run, values)


def far_growth(run: Run, longest: float) -> float | None:
    """The far mass's growth from 8× to ``longest`` × L (heads in the premise)."""
    a, b = measured_far_mass(run, longest), measured_far_mass(run, 8.0)
    return a - b if a is not None and b is not None else None


def t3_rows(res: Results) -> list[dict]:
    """One row per diagnosed variant: far mass measured and predicted at 8× and the longest length, the
    measured horizon per seed (the report's table). No horizon is predicted: turning far mass into lost likelihood
    needs to know what the far keys' values are worth, and counting every unit as lost predicted NoPE +4 nats where
    it lost +0.11."""
    rows = []
    longest = res.longest()
    for v in res.variants(res.corpus):
        runs = res.diagnosed(v)
        if not runs:
            continue
        row = {"variant": v, "role": role(v, runs[0])}
        for m in (1.0, 8.0, longest):
            row[f"measured@{m:g}"] = [x for r in runs if (x := measured_far_mass(r, m)) is not None]
            row[f"predicted@{m:g}"] = [x for r in runs if (x := predicted_far_mass(r, m)) is not None]
        row["horizon"] = [horizon(r) for r in runs]
        rows.append(row)
    return rows


def role(variant: str, run: Run) -> str:
    """``bounded`` (far-mass control: a logit term growing with distance), ``rotation-only`` (an accumulated
    transport without it: :attr:`~accrot.position.SchemeFacts.rotation_only`), ``control`` (NoPE: no rotation and no
    far-mass design) or ``other`` (RoPE, scalable softmax, ...: shown, not counted). A study variant's role is its
    declared one (so a null that puts a control's runs in its place is judged as that variant); another label's,
    its run's recorded scheme."""
    f = facts(VARIANTS[variant]) if variant in VARIANTS else scheme_facts(run)
    if f.controls_far_mass:
        return "bounded"
    return "rotation-only" if f.rotation_only else "control" if not f.rotates and not f.far_mass_design else "other"


def t3(res: Results) -> Claim:
    longest = res.longest()
    c = Claim("T3", "far-mass lower bound",
              f"on the claims' data set and the local task (its distractors), far mass beyond each head's own "
              f"window (at least L/4; heads whose window is censored or runs past "
              f"7L/8 have far keys inside it: outside the bound's premise, left out) at {times(longest)}: measured "
              "against the mass the bound predicts from L's statistics alone (near partitions, far keys' mean "
              f"weight, the gate), and its growth 8× → {times(longest)}",
              rule=f"every variant: measured − predicted within ±{T3_AGREEMENT:g}; rotation-only: the far mass grows "
                   f"by more than {T3_FLAT:g} from 8× to {times(longest)} (its limit is 1); far-mass-controlled: it "
                   f"grows by less than {T3_FLAT:g} (a limit below 1); every one must be for (NoPE, the negative "
                   "control, is shown, not counted)")
    outside = []
    # also on the local task, where what grows with the length is distractors the answer never needs: the far keys
    # are irrelevant by construction there, the bound's cleanest case
    for d in (res.corpus, *(x for x in ALSO_DIAGNOSED if x != res.corpus)):
        prefix = "" if d == res.corpus else f"{d}: "
        for v in res.variants(d):
            runs = res.diagnosed(v, d)
            if not runs or role(v, runs[0]) not in ("rotation-only", "bounded"):
                continue
            if not any(any(in_premise(r)) for r in runs):
                outside.append(f"{prefix}{v} (every head's window reaches past the far range)")
                continue
            measured = res.seeded(d, v, lambda r: measured_far_mass(r, longest))
            diff = [measured[r.seed] - p for r in runs
                    if r.seed in measured and (p := predicted_far_mass(r, longest)) is not None]
            c.comparisons.append(compare_band(f"{prefix}{v} follows the prediction", diff, -T3_AGREEMENT,
                                              T3_AGREEMENT, label="measured − predicted "))
            growth = res.per_seed(d, v, lambda r: far_growth(r, longest))
            if role(v, runs[0]) == "rotation-only":
                c.comparisons.append(compare_threshold(f"{prefix}{v} grows toward 1", growth, T3_FLAT,
                                                       below_is_for=False, label=f"far mass 8× → {times(longest)} "))
            else:
                c.comparisons.append(compare_threshold(f"{prefix}{v} bounded (does not grow)", growth, T3_FLAT,
                                                       label=f"far mass 8× → {times(longest)} "))
    if not c.comparisons:
        c.comparisons.append(Comparison("far mass", "no diagnosed variant", "missing"))
    control = [x for r in res.diagnosed("NoPE") if (x := measured_far_mass(r, longest)) is not None]
    c.note = ("NoPE (negative control: no rotation, no bias): far mass "
              + (f"{sum(control) / len(control):.3f}" if control else "not run") + f" at {times(longest)}"
              + ("; outside the premise: " + ", ".join(outside) if outside else ""))
    return c


# ---------------------------------------------------------------------------------------------------
# T4, T5
# ---------------------------------------------------------------------------------------------------
def value_position(run: Run, mult: float) -> float | None:
    """(rotated − random walk) / (linear sum − random walk) of the far output norm, mean over layers and heads."""
    pos = []
    for v in entries(run, "value_far_norm", length_of(run, mult)):
        for rot, lin, inc in zip(v["rotated"], v["unrotated"], v["incoherent"]):
            if None not in (rot, lin, inc) and lin - inc > 1e-9:
                pos.append((rot - inc) / (lin - inc))
    return sum(pos) / len(pos) if pos else None


def t4(res: Results) -> Claim:
    longest = res.longest()
    c = Claim("T4", "value rotation makes far contributions incoherent",
              f"+values variants at {times(longest)} (a ladder that keeps pairs from mixing: a labelled row): "
              "(rotated − random walk) / (linear sum − random walk) of the far output norm",
              rule=f"for when the interval lies below {T4_MIDPOINT:g}")
    labelled = []
    for v in res.variants(res.corpus):
        runs = res.diagnosed(v)
        declared = facts(VARIANTS[v]) if v in VARIANTS else (scheme_facts(runs[0]) if runs else None)
        if runs and declared.rotates_values:  # declared: a null's stand-in is judged as the variant it replaces
            comp = compare_threshold(v, res.per_seed(res.corpus, v, lambda r: value_position(r, longest)),
                                     T4_MIDPOINT, label="position ")
            if (why := outside_premise(res, v)) is not None:  # on its slow pairs R ≈ I: rotated ≈ unrotated
                labelled.append(f"{v} ({why}; not counted): {comp.numbers}")
                continue
            c.comparisons.append(comp)
    c.note = "; ".join(labelled)
    if not c.comparisons:
        c.comparisons.append(Comparison("+values variants", "not run", "missing"))
    return c


def gap_stat(run: Run, name: str, mult: float) -> float | None:
    return mean_of(head_values(run, "far", name, length_of(run, mult)))


def t5(res: Results) -> Claim:
    longest = res.longest()
    low, high = T5_CONCENTRATION
    c = Claim("T5", "concentration gives a score gap",
              f"accumulated SO(2) variants, far keys beyond each head's own window, at 8× and {times(longest)}: "
              "(top near score − far maximum) / far spread at 8×; the far maximum's growth 8× → "
              f"{times(longest)} over the growth concentration predicts from the far scores' mean and spread "
              "(μ + σ√(2 ln n)); far spread / (‖q‖‖k‖/√D) (an attention-weighted near mean above the plain mean "
              "is a softmax identity, so it is shown, not read)",
              rule=f"for a variant when the top near score lies above the far maximum at 8×, measured growth / "
                   f"predicted growth within [{low:g}, {high:g}] and the spread ratio at {times(longest)} within "
                   f"[{low:g}, {high:g}]; all must be for")
    for v in SO2_ACCUMULATED:
        if not res.diagnosed(v):
            continue
        top = res.per_seed(res.corpus, v, lambda r: gap_stat(r, "top_gap", 8.0))
        if not top and any(gap_stat(r, "gap", 8.0) is not None for r in res.diagnosed(v)):
            c.comparisons.append(Comparison(f"{v} top near score vs far maximum", "diagnostics older than the far "
                                            "maximum: re-run them", "missing"))
            continue
        c.comparisons.append(compare_threshold(f"{v} top near score above the far maximum at 8×", top, 0.0,
                                               below_is_for=False, label="(top near − far max) / spread "))
        growth = res.per_seed(res.corpus, v, lambda r: _growth_ratio(r, longest))
        c.comparisons.append(compare_band(f"{v} far maximum grows as concentration predicts", growth, low, high,
                                          label="measured / predicted growth ", shown=f"[{low:g}, {high:g}]"))
        conc = res.per_seed(res.corpus, v, lambda r: _log(gap_stat(r, "concentration_ratio", longest)))
        c.comparisons.append(compare_band(f"{v} far spread vs ‖q‖‖k‖/√D", conc, math.log(low), math.log(high),
                                          label="log ratio ", shown=f"log [{low:g}, {high:g}]"))
    if not c.comparisons:
        c.comparisons.append(Comparison("accumulated SO(2) variants", "not run", "missing"))
    return c


def _growth_ratio(run: Run, longest: float) -> float | None:
    """The far maximum's growth from 8× to ``longest`` over the growth concentration predicts (None where the
    prediction does not grow); a maximum that fell gives a negative ratio, which the band reads as against."""
    a, b = gap_stat(run, "far_max", longest), gap_stat(run, "far_max", 8.0)
    pa, pb = gap_stat(run, "far_max_predicted", longest), gap_stat(run, "far_max_predicted", 8.0)
    if None in (a, b, pa, pb) or pa - pb <= 0:
        return None
    return (a - b) / (pa - pb)


def _log(x: float | None) -> float | None:
    return math.log(x) if x is not None and x > 0 else None


THEORY_CHECKS = (t1, t2, t3, t4, t5)


def by_seed(values: Sequence[float | None]) -> str:
    """Per-seed values as ``a b c`` (– for none)."""
    return " ".join("–" if v is None else f"{v:g}×" for v in values) or "–"

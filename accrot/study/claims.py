"""The study's claims checked against the ablation's runs: :func:`check_claims` turns the runs (:mod:`accrot.study
.results`) into one :class:`~accrot.study.stats.Claim` per claim (C1–C5, the theory's T1–T5 from
:mod:`accrot.study.theory`, N1), each with the rule that decides it in one sentence; :func:`check_calibration`
gives the instrument checks, which hold by construction and are reported apart. The claims and their
predictions: ``accrot/study/CLAIMS.md``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from accrot.position import FAR_MASS, facts
from accrot.study.results import Results, Run, best_at, horizon, times
from accrot.study.state import STATE_CHECKS
from accrot.study.stats import (
    NOT_APPLICABLE,
    Claim,
    Comparison,
    compare_paired,
    compare_threshold,
    compare_variants,
    fmt,
)
from accrot.study.theory import SO2_ACCUMULATED, THEORY_CHECKS, check_calibration
from accrot.study.variants import VARIANTS

C2_TOLERANCE = 0.05  # "within a few %": NLL(16×) at most 5 % above NLL(1×)
C5_TOLERANCE = 0.02  # "flat": no length more than 2 % above NLL(1×)
HORIZON_TOLERANCE = 0.05  # the extrapolation horizon: the largest m with NLL(m') ≤ 1.05·NLL(1×) for all m' ≤ m
C4_EXTRAPOLATED = 4.0  # a curve "extrapolated" when its NLL stayed within 5 % of 1× up to 4× L
# the rises C2, C4, C5, N1 and the horizon read (Run.rise): each length's NLL on the very targets 1× scores, with
# m·L tokens before them, wherever the evaluation scored them (per-length blocks read different text, and their 1×
# averages cold-start positions: a bounded model looked 5–6 % better at 16× than at 1× on them)
SAME = " (every rise on the same targets at every length, where the evaluation scored them)"


def siblings(variants: dict[str, dict] = VARIANTS) -> dict[str, tuple[str, ...]]:
    """C4's pairs, from the variants' declared facts: each rotation-only variant and its far-mass-controlled
    siblings, the variants whose overrides equal its own except in the options the far-mass parts read (the same
    rotation with a bias); only the variants that have one."""
    far = {"far_mass", *(name for cls in FAR_MASS.values() for name in cls.reads)}

    def rest(over: dict) -> dict:
        return {k: v for k, v in over.items() if k not in far}

    out = {}
    for v, over in variants.items():
        if facts(over).rotation_only:
            found = tuple(s for s, o in variants.items() if facts(o).controls_far_mass and rest(o) == rest(over))
            if found:
                out[v] = found
    return out


SIBLINGS = siblings()
# C4's local-task note: the rotation-only variants (accumulated transports without far-mass control) whose pairs
# mix by construction or may by learning (the controls that break the condition are not expected to extrapolate)
ROTATION_ONLY = tuple(v for v, over in VARIANTS.items() if (f := facts(over)).rotation_only and not f.breaks_condition)
# N1: the cells the lower bound points to (rotation + far-mass control), the fixed comparators
ROTATION_CONTROLLED = ("accum-random+alibi", "accum-learned+values+alibi", "accum-learned+values+forget")  # the anchors
N1_COMPARATOR = "accum-learned+values"  # precision, for a cell with no rotation-only sibling: non-inferior at 1×
N1_MARGIN = 0.01  # nats: the non-inferiority margin, and how much more an NLL curve may rise than ALiBi's
N1_ACCURACY = 0.02  # answer tasks: the accuracy drop 1× → longest at most ALiBi's + 2 points
# besides the claims' data set: the local task, and a retrieval task within L where the study ran it (its answers
# are the only scored tokens, so precision there is retrieval, not the text's other tokens)
N1_DATASETS = ("local", "passkey")
# C2 and C3 are about learned rotations whose pairs can mix within L (a finite window lets suppression learned at
# L transfer): Selective RoPE's form without its ladder, and the random increments that mix by construction.
# Selective RoPE's own form (its ladder keeps the slow pairs coherent past 64× L) is read as a labelled row
C2_LEARNED = "accum-learned-noladder"
REFERENCE_LEARNED = "accum-learned"
C3_PAIRS = (("accum-learned-noladder+values", "accum-learned-noladder"), ("accum-random+values", "accum-random"))
# C3's "helps": +values lower than its q/k-only twin by at least this share of the twin's own NLL at 1× (about 0.02
# nats at the study's size). Without a smallest effect, a pair whose true difference is 0 is never resolved either
# way (its seeds-needed line grows without bound); a help under 1 % of the in-distribution NLL is a fifth of the
# tolerance the horizon calls "near-L" and far below any effect the claim's "extending the range" means
C3_MARGIN = 0.01


def check_claims(res: Results, nulls: bool = True) -> list[Claim]:
    """One :class:`Claim` per claim of the study, in order; every multi-comparison claim corrected (Holm); each
    claim with a null (:data:`NULLS`) also read, by the same rule, on its null (``nulls=False``: not)."""
    claims: list[Claim] = []
    if res.corpus in res.datasets():  # a state-tracking study alone (no language corpus) reads S1–S3 only
        claims = [check(res) for check in CLAIM_CHECKS]
        extended = _c1_extended(res)  # C1 read against plain RoPE and, where the ablation made them, its extensions
        claims = claims[:1] + [extended] + claims[1:] if extended is not None else claims
    claims += [c for check in STATE_CHECKS if (c := check(res)) is not None]  # where state tasks ran
    if nulls:
        for c in claims:
            if (null := NULLS.get(c.id)) is not None:
                c.null, c.null_what = null.read(res, c.id), null.what
    for c in claims:
        c.finalize()
    return claims


# ---------------------------------------------------------------------------------------------------
# each claim's null: the same rule where the claim says its effect is absent
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Null:
    """Where a claim's effect is absent, as data the study already has: ``reads(res)`` gives the relabelling
    (``{target: source}``, :meth:`~accrot.study.results.Results.relabelled`) that puts a control in the place of
    the variants the claim is about, or ``swap`` names pairs of variants whose labels are exchanged on every other
    seed (each pair on its own seeds). ``what`` says it in words and why the claim's effect is absent there."""

    what: str
    reads: Callable[[Results], dict[str, str]] | None = None
    swap: tuple[tuple[str, str], ...] = ()
    # or builds the null's data itself (None: the study has no such data, and the null is not read)
    transform: Callable[[Results], Results | None] | None = None

    def data(self, res: Results) -> Results | None:
        if self.transform is not None:
            return self.transform(res)
        if self.swap:
            for a, b in self.swap:
                res = res.relabelled({a: b, b: a}, seeds=res.alternate_seeds(a, b))
            return res
        return res.relabelled(self.reads(res) if self.reads else {})

    def read(self, res: Results, claim_id: str) -> Claim | None:
        """The claim ``claim_id`` read by its own rule on this null's data (None where that data set did not run)."""
        data = self.data(res)
        if data is None:
            return None
        found = [c for c in check_claims(data, nulls=False) if c.id == claim_id]
        return found[0] if found else None


def rotation_only_of(variants: dict[str, dict] = VARIANTS) -> dict[str, str]:
    """``{far-mass-controlled variant: the same rotation without it}`` (the inverse of C4's pairs)."""
    return {s: v for v, found in siblings(variants).items() for s in found}


def _swap_text(a: str, b: str) -> str:
    return f"{a} and {b} exchanged on every other seed (a difference between them cannot survive that)"


NULLS: dict[str, Null] = {
    "C1": Null(_swap_text("accum-random", "RoPE"), swap=(("accum-random", "RoPE"),)),
    "C1-ext": Null("plain RoPE in accum-random's place: RoPE does not extrapolate better than its own "
                   "eval-time extensions", reads=lambda res: {"accum-random": "RoPE"}),
    "C2": Null(f"RoPE, a rotation that accumulates nothing, in {C2_LEARNED}'s place and NoPE in RoPE's: a "
               "position rotation is not what keeps near-L perplexity",
               reads=lambda res: {C2_LEARNED: "RoPE", "RoPE": "NoPE"}),
    "C3": Null("; ".join(_swap_text(a, b) for a, b in C3_PAIRS), swap=C3_PAIRS),
    "C4": Null("each rotation-only variant's far-mass-controlled sibling in its place, and ALiBi in the sibling's: "
               "far-mass control is what the claim says keeps a curve from degrading",
               reads=lambda res: {**{v: found[0] for v, found in SIBLINGS.items()},
                                  **{s: "ALiBi" for found in SIBLINGS.values() for s in found}}),
    "C5": Null("NoPE, with no bias, in ALiBi's place: the bias is what the claim credits for the flat curve",
               reads=lambda res: {"ALiBi": "NoPE"}),
    "N1": Null("each cell's own rotation-only sibling in its place: the lower bound says a rotation without far-mass "
               "control is not length-stable",
               reads=lambda res: {c: n1_sibling(c) for c in n1_cells(res)}),
    "S1": Null(_swap_text("accum-learned", "RoPE"), swap=(("accum-learned", "RoPE"),)),
    "S2": Null("accum-learned, a commuting accumulation, in PaTH's place: it holds no more than the group's sign, "
               "so it cannot pass the commuting limit", reads=lambda res: {"PaTH": "accum-learned"}),
    "S3": Null("each far-mass-controlled variant's rotation-only sibling in its place: without a term growing with "
               "distance the claim says reads are not exact", reads=lambda res: rotation_only_of()),
    "T1": Null("each head's coherence curves replaced, seed by seed, by those of a control its own angles say it is "
               "not: a transport that breaks the condition by construction (a learned drift, GRAPE's: no finite "
               "window) for the heads predicted to mix, one that mixes by construction (a random token table) for "
               "those predicted coherent; read against the transport's own prediction, a fit that still agrees "
               "with it would agree with any curve",
               transform=lambda res: graft_coherence(res, opposite=True)),
    "T2": Null("a learned drift's coherence curves (GRAPE's: no finite window) in place of each transport's, seed "
               "by seed: a rule that still "
               "reads a constant window there reads it from the fit, not from the model. (Swapping the two lengths' "
               "labels is no null here: the band is symmetric, so it always reads as the rule does)",
               transform=lambda res: graft_coherence(res)),
    "T3": Null("NoPE, whose far mass has no bound, in every far-mass-controlled variant's place and ALiBi, whose far "
               "mass cannot grow, in every rotation-only one's: the roles the bound predicts, exchanged",
               reads=lambda res: _t3_null(res)),
    "T4": Null("each +values variant's q/k-only twin in its place: its values are not transported, so the far norm "
               "the rule reads for it is what transporting them would give; reading for there, the rule measures the "
               "rotation's arithmetic on any values, not what transporting them during training did",
               reads=lambda res: _t4_null(res)),
    "T5": Null("RoPE, whose far scores are a fixed function of the distance (nothing mixes, nothing concentrates), "
               "in every accumulated SO(2) variant's place", reads=lambda res: {v: "RoPE" for v in SO2_ACCUMULATED}),
}


# the per-head fields of a coherence entry (one value or curve per head); the rest (length, distances, ranges) are
# the diagnostics' settings, the same for every run of a study
HEAD_FIELDS = ("curve", "stderr", "predicted", "window", "window_se", "window_censored", "window_common",
               "window_common_se", "window_common_censored")


def graft_coherence(res: Results, opposite: bool = False) -> Results | None:
    """T1's and T2's null: every own transport the theory reads keeps its diagnostics (its scheme, its prediction
    from its own angles) except its coherence curves and windows, which are, head by head, those of the same seed's
    run of a control: a transport that breaks the regularity condition by construction (a learned drift: no finite
    window) or, with ``opposite``, for the heads the transport's angles predict to stay coherent, one whose
    increments mix by construction (a random token table) — each head gets the control its prediction says it is
    not. Seeds a control did not run are left out; None where the study diagnosed no such control."""
    import copy
    from dataclasses import replace

    from accrot.study.theory import breaks_condition, kind, predicted_mixing, scheme_facts, variants_of

    own = variants_of(res, "own")
    drift = [v for v in own if breaks_condition(res.diagnosed(v)[0])]
    mixing = [v for v in own if scheme_facts(res.diagnosed(v)[0]).regularity == "holds"] if opposite else []
    if not drift or (opposite and not mixing):
        return None
    coherent_at = {r.seed: r for r in res.diagnosed(drift[0])}
    mixing_at = {r.seed: r for r in res.diagnosed(mixing[0])} if mixing else {}
    subjects = [v for v in own if v not in (*drift, *mixing)]
    runs = [r for r in res.runs if not (r.variant in subjects and r.dataset == res.corpus and r.diag)]
    for r in (r for v in subjects for r in res.diagnosed(v)):
        predicted = predicted_mixing(r) if opposite else None
        sources = [coherent_at.get(r.seed), mixing_at.get(r.seed) if predicted is not None else None]
        if sources[0] is None or kind(r) != "own" or (predicted is not None and sources[1] is None):
            continue
        if any(len(x.diag["layers"]) != len(r.diag["layers"]) for x in sources if x is not None):
            continue
        diag = copy.deepcopy(r.diagnostics)
        unit = 0  # (layer, head), layer-major, as the prediction is listed
        for i, layer in enumerate(diag["layers"]):
            entries = layer.get("coherence", [])
            heads = len(entries[0]["window"]) if entries else 0
            # head h takes the drift's curves unless its own angles predict it coherent
            pick = [1 if predicted is not None and unit + h < len(predicted) and not predicted[unit + h] else 0
                    for h in range(heads)]
            unit += heads
            theirs = [{c["length"]: c for c in x.diag["layers"][i].get("coherence", [])} if x is not None else {}
                      for x in sources]
            grafted = []
            for entry in entries:
                new = copy.deepcopy(theirs[0].get(entry["length"]))
                if new is None:
                    continue
                for k in HEAD_FIELDS:
                    values = [(theirs[p].get(entry["length"]) or {}).get(k) for p in pick]
                    if k in new and all(isinstance(v, list) and len(v) == heads for v in values):
                        new[k] = [copy.deepcopy(values[h][h]) for h in range(heads)]
                grafted.append(new)
            layer["coherence"] = grafted
        runs.append(replace(r, diagnostics=diag))
    return Results(runs, res.corpus)


def value_twins(variants: dict[str, dict] = VARIANTS) -> dict[str, str]:
    """``{+values variant: the same variant without value rotation}``, for each that has such a twin."""
    out = {}
    for v, over in variants.items():
        if over.get("rotate_values"):
            rest = {k: x for k, x in over.items() if k != "rotate_values"}
            twin = next((u for u, o in variants.items() if dict(o) == rest), None)
            if twin is not None:
                out[v] = twin
    return out


def _t4_null(res: Results) -> dict[str, str]:
    """Each +values variant of the study in its twin's runs; one without a twin is left out (no stand-in)."""
    twins = value_twins()
    return {v: twins.get(v, "") for v in res.variants(res.corpus) if VARIANTS.get(v, {}).get("rotate_values")}


def _t3_null(res: Results) -> dict[str, str]:
    from accrot.study.theory import role

    out = {}
    for v in res.variants(res.corpus):
        runs = res.diagnosed(v)
        if runs and (r := role(v, runs[0])) in ("bounded", "rotation-only"):
            out[v] = "NoPE" if r == "bounded" else "ALiBi"
    return out


def compare_nll(res: Results, dataset: str, what: str, a: str, b: str, mult: float, **kwargs) -> Comparison:
    """Two variants' NLL at ``mult``: the pooled two-way model where it holds, else paired over seeds; with the
    evaluation's blocks, the text's noise too (:func:`~accrot.study.stats.compare_variants`)."""
    return compare_variants(what, a, res.seeded_values(dataset, a, "nll", mult), b,
                            res.seeded_values(dataset, b, "nll", mult), pool=res.pool(dataset, mult),
                            blocks=(res.seeded_blocks(dataset, a, mult), res.seeded_blocks(dataset, b, mult)), **kwargs)


def _c1(res: Results) -> Claim:
    d = res.corpus
    c = Claim("C1", "random accumulated rotations extrapolate much better than RoPE",
              "NLL at 4×, 8× and 16× L: accum-random against RoPE",
              rule="for at every length when the paired interval of accum-random − RoPE lies below 0")
    for m in _lengths(res, d, (4, 8, 16)) or [4.0]:
        c.comparisons.append(compare_nll(res, d, f"NLL {times(m)}", "accum-random", "RoPE", m))
    return c


def _c2(res: Results) -> Claim:
    d = res.corpus
    c = Claim("C2", "learned token-dependent rotations keep near-L perplexity far beyond L",
              f"extrapolation horizon (largest m with NLL within {HORIZON_TOLERANCE:.0%} of 1× up to m, per seed; "
              f"log₂): {C2_LEARNED} against RoPE; {C2_LEARNED}'s NLL(16×) / NLL(1×) − 1" + SAME,
              rule=f"for when {C2_LEARNED}'s horizon is resolved above RoPE's and its rise to 16× lies under "
                   f"{C2_TOLERANCE:.0%}")
    c.comparisons += _c2_comparisons(res, C2_LEARNED)
    if res.by.get((d, REFERENCE_LEARNED)):  # the labelled row: read, shown, not counted
        row = _c2_comparisons(res, REFERENCE_LEARNED)
        c.note = (f"{REFERENCE_LEARNED} (Selective RoPE's ladder: its slow pairs cannot mix, outside the claim's "
                  f"premise; not counted): " + "; ".join(f"{x.what} {x.numbers} ({x.outcome})" for x in row))
    return c


def _c2_comparisons(res: Results, learned: str) -> list[Comparison]:
    d = res.corpus
    horizon_ = compare_variants("horizon (log₂ m)", learned, res.seeded(d, learned, _log2_horizon),
                                "RoPE", res.seeded(d, "RoPE", _log2_horizon), lower_is_for=False, digits=2)
    rise = res.per_seed(d, learned, lambda r: r.rise(16))
    return [horizon_, compare_threshold("NLL 16× vs 1×", rise, C2_TOLERANCE, label="rise ")]


def _c3(res: Results) -> Claim:
    d = res.corpus
    pairs = " and ".join(f"{a} against {b}" for a, b in C3_PAIRS)
    c = Claim("C3", "rotating values helps over q/k alone",
              f"NLL at 16×, 32× and 64× L: {pairs}",
              rule=f"for at every length and pair when the paired interval of +values − q/k only lies below "
                   f"−{C3_MARGIN:.0%} of the q/k-only twin's NLL at 1× (a help at least that large), against when it "
                   "lies above it (any help is smaller)")
    lengths = _lengths(res, d, (16, 32, 64)) or [16.0]
    for a, b in C3_PAIRS:
        if not (res.by.get((d, a)) or res.by.get((d, b))):
            continue  # a pair the study did not run (a --variants selection): the other decides
        margin = c3_margin(res, d, b)
        for m in lengths:
            c.comparisons.append(compare_nll(res, d, f"{a}: NLL {times(m)}", a, b, m, margin=margin))
    if not c.comparisons:
        c.comparisons.append(Comparison("+values against q/k only", "not run", "missing"))
    a, b = REFERENCE_LEARNED + "+values", REFERENCE_LEARNED
    if res.by.get((d, a)) and res.by.get((d, b)):  # the labelled row
        margin = c3_margin(res, d, b)
        row = [compare_nll(res, d, f"NLL {times(m)}", a, b, m, margin=margin) for m in lengths]
        c.note = (f"{a} against {b} (Selective RoPE's ladder: on its slow pairs R ≈ I, so rotated ≈ unrotated; "
                  "outside the premise, not counted): " + "; ".join(f"{x.what} {x.numbers} ({x.outcome})" for x in row))
    return c


def c3_margin(res: Results, dataset: str, twin: str) -> float:
    """C3's limit for +values − ``twin``: minus :data:`C3_MARGIN` of the twin's mean NLL at 1× over its seeds (0 where
    the twin has no 1× row: then only the sign is read)."""
    at_l = list(res.seeded_values(dataset, twin, "nll", 1).values())
    return -C3_MARGIN * sum(at_l) / len(at_l) if at_l else 0.0


def _c4(res: Results) -> Claim:
    d, longest = res.corpus, res.longest()
    c = Claim("C4", "rotation-only models still degrade at extreme lengths",
              f"per rotation-only variant with a far-mass-controlled sibling: extrapolated (NLL(4×) within "
              f"{HORIZON_TOLERANCE:.0%} of 1×), then NLL(16×) → NLL({times(longest)}) rises, and rises more than "
              "the sibling's" + SAME,
              rule="for a variant when its 4× rise lies under 5 %, its 16× → longest rise above 0 and above its "
                   "sibling's (paired); every pair must be for, over the variants that extrapolated (a 4× rise "
                   "resolved above 5 %: not applicable; none extrapolated: not tested)")
    notes = []
    for v, siblings in SIBLINGS.items():
        if not res.by.get((d, v)):
            continue
        extrapolated = compare_threshold(f"{v} extrapolated", res.per_seed(d, v, lambda r: r.rise(C4_EXTRAPOLATED)),
                                         HORIZON_TOLERANCE, label="rise to 4× ")
        if extrapolated.outcome == "against":  # never extrapolated: whether it degrades later is not the question
            c.comparisons.append(Comparison(f"{v}: not applicable", f"never extrapolated ({extrapolated.numbers})",
                                            NOT_APPLICABLE))
            continue
        c.comparisons.append(extrapolated)
        rise = res.seeded(d, v, lambda r: _late_rise(r, longest))
        c.comparisons.append(compare_paired(f"{v} rises 16× → {times(longest)}", list(rise.values()), label="Δ NLL "))
        ran = [s for s in siblings if res.by.get((d, s))]
        for s in ran:
            c.comparisons.append(compare_variants(f"{v} rises more than {s}", v, rise, s,
                                                  res.seeded(d, s, lambda r: _late_rise(r, longest)),
                                                  lower_is_for=False))
        if not ran:  # the comparison that makes the rise a sign of missing far-mass control: never skipped silently
            c.comparisons.append(Comparison(f"{v} rises more than its far-mass-controlled sibling",
                                            f"{' / '.join(siblings)} not run", "missing"))
        last = res.per_seed(d, v, lambda r: _late_rise(r, longest, "last_window_nll"))
        if last:
            notes.append(f"{v} last-window NLL 16× → {times(longest)}: {fmt(last)}")
    if not c.comparisons:
        c.comparisons.append(Comparison("rotation-only variants with a sibling", "not run", "missing"))
    c.note = "; ".join(notes) + ("; " if notes else "") + "local task, as distractors grow: " + _local_rise(res, longest)
    return c


def _c5(res: Results) -> Claim:
    d = res.corpus
    c = Claim("C5", "ALiBi stays length-stable",
              "ALiBi: max over lengths of NLL(m) / NLL(1×) − 1 (per seed)" + SAME,
              rule=f"for when the interval of the maximum rise lies under {C5_TOLERANCE:.0%}")
    c.comparisons.append(compare_threshold("ALiBi curve", res.per_seed(d, "ALiBi", _max_rise), C5_TOLERANCE,
                                           label="max rise "))
    return c


def _n1(res: Results) -> Claim:
    """N1 per cell: precise (non-inferior at 1× to the comparator) and flat (no more rise than ALiBi's) on the
    claims' data set, the local task and, where the study ran it, passkey retrieval (within L: precision on
    retrieval); supported when one cell is both, after Holm over the cells."""
    cells = n1_cells(res)
    datasets = [d for d in (res.corpus, *N1_DATASETS) if any(res.by.get((d, v)) for v in cells)]
    c = Claim("N1", "rotation + far-mass control is both precise and length-stable (the question the lower "
              "bound leaves open)",
              "per rotation + far-mass cell and data set (the claims' one, the local task and passkey retrieval "
              "where it ran): NLL(1×) − its own rotation-only sibling's (paired), and "
              "its maximum rise "
              "1× → any length minus ALiBi's (paired; on an answer task the accuracy drop 1× → longest minus "
              "ALiBi's)" + SAME,
              rule=f"a cell is precise when the upper end of its NLL(1×) difference lies under {N1_MARGIN:g} nats, "
                   f"flat when the upper end of its extra rise lies under {N1_MARGIN:g} nats ({N1_ACCURACY:.0%} "
                   "accuracy on an answer task); supported when one cell is both on every data set (Holm over "
                   "the cells), not supported when every cell has a resolved against")
    lines = []
    for cell in cells:
        comps = [x for d in datasets for x in _n1_cell(res, d, cell)]
        if comps:
            c.cases[cell] = comps
            c.comparisons += comps
            lines.append(f"{cell}: {n1_summary(res, cell, comps, datasets)}")
    if not c.cases:
        c.comparisons.append(Comparison("rotation + far-mass control", "not run", "missing"))
    c.note = " | ".join(lines)
    return c


def n1_cells(res: Results) -> list[str]:
    """N1's candidates: every accumulated SO(2) rotation with a far-mass design that ran (the three anchors, the
    forget gate at either init, and the field's other designs: scalable softmax, the output gate, NoPE layers)."""
    from accrot.study.state import variant_facts

    ran = {v for _, v in res.by}
    found = [v for v in res.variants(res.corpus)
             if (f := variant_facts(v)).accumulates and f.commutes and f.far_mass_design]
    return [v for v in dict.fromkeys([*ROTATION_CONTROLLED, *found]) if v in ran] or list(ROTATION_CONTROLLED)


def n1_sibling(cell: str) -> str:
    """The rotation a cell adds far-mass control to, without it (accum-random+alibi: accum-random): what the cell's
    precision is read against; :data:`N1_COMPARATOR` for a design that is no sibling of one (scalable softmax, the
    output gate)."""
    return rotation_only_of().get(cell, N1_COMPARATOR)


def _n1_cell(res: Results, dataset: str, cell: str) -> list[Comparison]:
    from accrot.study.variants import ANSWER_TASKS

    if not res.by.get((dataset, cell)):
        return [Comparison(f"{dataset}: {cell}", "not run", "missing")]
    sibling = n1_sibling(cell)
    precise = compare_nll(res, dataset, f"{dataset}: {cell} precise (vs {sibling} at 1×)", cell, sibling, 1.0,
                          margin=N1_MARGIN)
    if dataset in ANSWER_TASKS:
        drop = _accuracy_drop(res.longest(dataset))
        flat = compare_variants(f"{dataset}: {cell} flat (accuracy drop vs ALiBi's)", cell,
                                res.seeded(dataset, cell, drop), "ALiBi", res.seeded(dataset, "ALiBi", drop),
                                margin=N1_ACCURACY)
    else:
        flat = compare_variants(f"{dataset}: {cell} flat (max rise vs ALiBi's)", cell,
                                res.seeded(dataset, cell, _max_rise_nats), "ALiBi",
                                res.seeded(dataset, "ALiBi", _max_rise_nats), margin=N1_MARGIN)
    return [precise, flat]


def n1_summary(res: Results, cell: str, comps: Sequence[Comparison], datasets: Sequence[str]) -> str:
    """The cell's finding in words: ``corpus: flat, not precise (+0.240); local: precise and flat``."""
    parts = []
    for d in datasets:
        own = [x for x in comps if x.what.startswith(f"{d}: ")]
        if len(own) < 2:
            parts.append(f"{d}: not run")
            continue
        words = []
        for x, name in zip(own, ("precise", "flat")):
            words.append(name if x.outcome == "for" else f"not {name}" if x.outcome == "against"
                         else f"{name}?" if x.outcome == "inside" else f"{name}: missing")
        delta = [res.seeded_values(d, cell, "nll", 1), res.seeded_values(d, n1_sibling(cell), "nll", 1)]
        shift = ""
        if all(delta):
            common = sorted(set(delta[0]) & set(delta[1]))
            if common:
                shift = f" ({sum(delta[0][k] - delta[1][k] for k in common) / len(common):+.3f} nats at 1×)"
        parts.append(f"{d}: {', '.join(words)}{shift}")
    return "; ".join(parts)


def _c1_extended(res: Results) -> Claim | None:
    """C1 against RoPE's best evaluation-time extension at each length (only when those rows exist)."""
    d = res.corpus
    extended = [v for v in res.variants(d) if res.is_extension(v)]
    if not extended:
        return None
    c = Claim("C1-ext", "... and better than RoPE with its best eval-time length extension",
              "NLL at 4×–16× L: accum-random against the best of RoPE+PI/NTK/YaRN (YaRN in the field's code form) "
              "at that length",
              rule="for at every length when the interval of accum-random − the best extension lies below 0")
    for m in _lengths(res, d, (4, 8, 16)) or [4.0]:
        best = best_at(res, d, extended, m)  # None: no extension evaluated at m (a "not run" comparison)
        name = best.split(" (")[0] if best else "RoPE's extensions"
        c.comparisons.append(compare_variants(f"NLL {times(m)} vs {name}", "accum-random",
                                              res.seeded_values(d, "accum-random", "nll", m),
                                              name, res.seeded_values(d, best, "nll", m) if best else {}))
    return c


CLAIM_CHECKS = (_c1, _c2, _c3, _c4, _c5, *THEORY_CHECKS, _n1)
__all__ = ["check_calibration", "check_claims"]


# ---------------------------------------------------------------------------------------------------
# per-run quantities
# ---------------------------------------------------------------------------------------------------
def _lengths(res: Results, dataset: str, wanted: Sequence[float]) -> list[float]:
    have = res.multipliers(dataset)
    return [m for m in wanted if m in have]


def _log2_horizon(run: Run) -> float | None:
    import math

    h = horizon(run, HORIZON_TOLERANCE)
    return None if h is None else math.log2(h)


def _late_rise(run: Run, longest: float, field_: str | None = None) -> float | None:
    """NLL(longest) − NLL(16×) in nats: on the same targets where scored (:meth:`Run.rise`), or of ``field_``."""
    if field_ is None:
        a, b = run.rise(16, relative=False), run.rise(longest, relative=False)
    else:
        a, b = run.value(field_, 16), run.value(field_, longest)
    return None if a is None or b is None or longest <= 16 else b - a


def _max_rise(run: Run) -> float | None:
    rises = [r for m in run.lengths if (r := run.rise(m)) is not None]
    return max(rises) if rises else None


def _max_rise_nats(run: Run) -> float | None:
    rises = [r for m in run.lengths if (r := run.rise(m, relative=False)) is not None]
    return max(rises) if rises else None


def _accuracy_drop(longest: float):
    def drop(run: Run) -> float | None:
        a, b = run.value("accuracy", 1), run.value("accuracy", longest)
        return None if a is None or b is None else a - b
    return drop


def _local_rise(res: Results, longest: float) -> str:
    parts = []
    for v in ROTATION_ONLY + ("ALiBi",):
        a, b = res.values("local", v, "nll", 1), res.values("local", v, "nll", longest)
        if a and b:
            parts.append(f"{v} {fmt(a)} → {fmt(b)}")
    return "; ".join(parts) + f" (answer NLL, 1× → {times(longest)})" if parts else "not run"


# ---------------------------------------------------------------------------------------------------
# CLAIMS.md's tables, generated from the claim functions (the constants are written once, here)
# ---------------------------------------------------------------------------------------------------
DOC_BEGIN = "<!-- generated from accrot/study/claims.py: python -m accrot.study.claims --write -->"
DOC_END = "<!-- end of the generated tables -->"


def specimen_results() -> Results:
    """A study with every data set a claim reads (the corpus, the local task, parity, the S3 word problem, flip-flop),
    each data set's default variants, 3 seeds and the study's lengths, and RoPE's eval-time extension rows: what the
    claim functions need to say what each claim measures and how it is decided. Its values mean nothing."""
    from accrot.study.variants import DATASET_VARIANTS, DEFAULT_VARIANTS, EXTENSION_RECORDS, SIZES

    lengths = {float(m): {"nll": 2.0, "accuracy": 0.5} for m in SIZES["study"].multipliers}
    runs = []
    for dataset in ("corpus", "local", "parity", "s3", "flipflop"):
        for v in DATASET_VARIANTS.get(dataset, DEFAULT_VARIANTS):
            runs += [Run(dataset, v, seed, "", dict(lengths), SIZES["study"].seq_len) for seed in range(3)]
    for ext in EXTENSION_RECORDS:
        runs += [Run("corpus", ext.label, seed, "", dict(lengths), SIZES["study"].seq_len, extension=ext.kind)
                 for seed in range(3)]
    return Results(runs)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def claims_table(res: Results | None = None) -> str:
    """The claims as :func:`check_claims` states them: id, claim, what is measured, the rule (markdown)."""
    lines = ["| # | claim | measured as | rule | its null: the same rule where the effect is absent |",
             "|---|---|---|---|---|"]
    for c in check_claims(res or specimen_results()):
        null = c.null_what or "none yet: the rule is not yet shown able to read otherwise"
        lines.append(f"| {c.id} | {_cell(c.claim)} | {_cell(c.test)} | {_cell(c.rule)} | {_cell(null)} |")
    return "\n".join(lines)


def variant_sets_table() -> str:
    """The variant sets the claims read, each derived from the parts' declared facts over the study's variants."""
    from accrot.study.state import controlled, rotation_only
    from accrot.study.theory import so2_accumulated
    from accrot.study.variants import DATASET_VARIANTS

    flipflop = DATASET_VARIANTS["flipflop"]
    rows = [
        ("C4's pairs", "each rotation-only variant and the variants equal to it but for the far-mass parts' options, "
                       "which control far mass", "; ".join(f"{v} / {', '.join(s)}" for v, s in SIBLINGS.items())),
        ("C4's local-task note", "rotation-only, the regularity condition not broken by construction",
         ", ".join(ROTATION_ONLY)),
        ("T5's SO(2) accumulations", "an accumulated commuting transport, rotation-only, the condition not broken",
         ", ".join(so2_accumulated())),
        ("S3: far-mass control", "a rotation with a logit term growing with distance (flip-flop's variants)",
         ", ".join(v for v in flipflop if controlled(v))),
        ("S3: rotation-only", "an accumulated transport without one (an output gate leaves it rotation-only)",
         ", ".join(v for v in flipflop if rotation_only(v))),
        ("N1's anchors", "named: the cells the lower bound points to", ", ".join(ROTATION_CONTROLLED)),
    ]
    lines = ["| set | what decides membership | members (over every variant of the study; S3: flip-flop's) |", "|---|---|---|"]
    lines += [f"| {a} | {_cell(b)} | {_cell(c)} |" for a, b, c in rows]
    return "\n".join(lines)


def claims_doc() -> str:
    """CLAIMS.md's generated part, between its markers."""
    return f"{DOC_BEGIN}\n{claims_table()}\n\nThe variant sets they read:\n\n{variant_sets_table()}\n{DOC_END}"


def rewrite_doc(text: str) -> str:
    """``text`` (CLAIMS.md) with its generated part replaced by :func:`claims_doc`."""
    start, end = text.index(DOC_BEGIN), text.index(DOC_END) + len(DOC_END)
    return text[:start] + claims_doc() + text[end:]


if __name__ == "__main__":  # python -m accrot.study.claims [--write]: print (or rewrite) CLAIMS.md's tables
    import sys
    from pathlib import Path

    doc = Path(__file__).with_name("CLAIMS.md")
    if "--write" in sys.argv[1:]:
        doc.write_text(rewrite_doc(doc.read_text()))
    else:
        print(claims_doc())

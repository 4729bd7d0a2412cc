"""Every claim with a null is read, by its own rule, where the claim says its effect is absent; a rule that reads
*for* there is "uninformative at this size" whatever its own comparisons say. Here, per claim: a study where the
rule holds and its null reads otherwise (the verdict stands), and, where the null can read *for* at all, a study
where it does (the verdict becomes uninformative). Also the relabelling the nulls are built from, and the fix that
keeps a case verdict from resolving what the text's own noise overruled.

The synthetic studies and their conventions are those of tests/study/test_verdicts.py.
"""

from __future__ import annotations

import math

import pytest

from accrot.study.claims import NULLS, check_claims, n1_sibling
from accrot.study.results import Results, Run
from accrot.study.stats import (
    INCONCLUSIVE,
    NOT_SUPPORTED,
    NOT_TESTED,
    SUPPORTED,
    UNINFORMATIVE,
    Comparison,
    case_verdict,
    compare_variants,
)
from tests.study.test_verdicts import CELLS, PI, YARN, _state, _t3, flat_then_rising, lines, study, verdict

SMALL = (0.0, 0.001, 0.002)  # a clear study's per-seed noise
PAIRS = {"PaTH": "PaTH-FoX", "accum-learned+values": "accum-learned+values+forget"}


def _c4(rotation, sibling, alibi=(2.0, 0.0)) -> Results:
    return study({**{v: rotation for v in PAIRS}, **{s: sibling for s in PAIRS.values()}, "ALiBi": alibi},
                 jitter=SMALL)


def _n1(sibling_rise: float) -> Results:
    """The N1 cells precise and flat; their rotation-only siblings at the same NLL, rising ``sibling_rise`` nats
    per doubling; ALiBi flat."""
    nll = {"accum-learned+values": (2.0, sibling_rise), "accum-random": (2.0, sibling_rise), "ALiBi": (2.3, 0.0),
           **{c: (2.0, 0.0) for c in CELLS}}
    return study(nll, jitter=SMALL, datasets=("corpus", "local"))


# claim: (the rule holds and its null reads otherwise, the rule holds and so does its null)
INFORMATIVE_OR_NOT = {
    # C1 against RoPE's extensions: where plain RoPE is itself better than every extension, beating "the best
    # extension" is beating plain RoPE again
    "C1-ext": (lambda: study({"RoPE": (2.0, 0.3), YARN: (2.0, 0.1), PI: (2.0, 0.2), "accum-random": (2.0, 0.02)}),
               lambda: study({"RoPE": (2.0, 0.05), YARN: (2.0, 0.2), PI: (2.0, 0.3), "accum-random": (2.0, 0.01)})),
    # C2: RoPE flat to 16× (its horizon above NoPE's) makes the 16× rule blind to what accumulation adds
    "C2": (lambda: study({"RoPE": (2.0, 0.3), "accum-learned-noladder": (2.0, 0.005), "NoPE": (2.0, 0.3)}),
           lambda: study({"RoPE": flat_then_rising(2.0, 16, 0.3), "accum-learned-noladder": (2.0, 0.0),
                          "NoPE": (2.0, 0.3)}, jitter=SMALL)),
    # C4: the far-mass-controlled siblings rising after 16× more than ALiBi too (as per-length blocks can make a
    # bounded model "rise"): then the rise is no sign of missing far-mass control
    "C4": (lambda: _c4(flat_then_rising(2.0, 16, 0.2), (2.0, 0.0)),
           lambda: _c4(flat_then_rising(2.0, 16, 0.2), flat_then_rising(2.0, 16, 0.1))),
    # C5: NoPE as flat as ALiBi: the data cannot show what the bias does
    "C5": (lambda: study({"ALiBi": (2.0, 0.0), "NoPE": (2.0, 0.1)}, jitter=SMALL),
           lambda: study({"ALiBi": (2.0, 0.0), "NoPE": (2.0, 0.0)}, jitter=SMALL)),
    # N1: the rotation-only siblings as flat as ALiBi: a data set where nothing degrades cannot credit the control
    "N1": (lambda: _n1(0.05), lambda: _n1(0.0)),
    # T4: the q/k-only twins' values would turn incoherent under the same transport too: then the rule reads the
    # rotation's arithmetic, not what transporting values did
    "T4": (lambda: _t4(0.9), lambda: _t4(0.1)),
    # T5: RoPE's far maximum growing as concentration predicts too: then the growth is no sign of mixing
    "T5": (lambda: _t5(0.3), lambda: _t5(1.0)),
    # T1: the drift's curves (no finite window) censored, as they should be; the blind case: the fit places a
    # window in the drift's curves too, so placed windows are no sign of mixing
    "T1": (lambda: _graft({"censored": (True, True), "mixes": False}),
           lambda: _graft({"windows": (7.0, 7.0), "mixes": True})),
    # T2: the drift's fitted window grows with length where the transports' does not; the blind case: the fit
    # reads the same constant window in the drift's curves
    "T2": (lambda: _graft({"windows": (7.0, 30.0), "common": (7.0, 30.0)}),
           lambda: _graft({"windows": (7.0, 7.2)})),
}

GRAPE = "accum-grape"  # a learned drift: breaks the regularity condition by construction


TOKEN = "accum-token"  # a random token table: mixes by construction


def _graft(grape: dict, own_diag: dict | None = None, token: dict | None = None) -> Results:
    """The own transports (by default predicted to mix, windows placed and constant at both lengths), GRAPE's drift
    diagnosed as ``grape`` says and a token table (placed): the controls T1's and T2's null graft in."""
    own = ("accum-learned", "accum-learned+values", "PaTH")
    return study({v: (2.0, 0.0) for v in (*own, GRAPE, TOKEN)},
                 {**{v: own_diag or {"windows": (7.0, 7.1)} for v in own}, GRAPE: grape,
                  TOKEN: token or {"windows": (5.0, 5.0)}}, jitter=SMALL)


def test_t1_s_null_gives_heads_predicted_coherent_a_transport_that_mixes():
    """Heads whose angles predict coherence, censored as predicted: the rule holds; on the null they carry the token
    table's placed windows, so it reads against there; had the fit censored the token table too, the null would
    read for and T1 decide nothing."""
    coherent = {"mixes": False, "censored": (True, True)}
    c = verdict(_graft({"censored": (True, True), "mixes": False}, coherent), "T1")
    assert c.verdict == SUPPORTED and c.null_verdict == NOT_SUPPORTED, lines(c.null)
    blind = verdict(_graft({"censored": (True, True), "mixes": False}, coherent,
                           token={"censored": (True, True), "mixes": False}), "T1")
    assert blind.null_verdict == SUPPORTED and blind.verdict == UNINFORMATIVE, lines(blind.null)


def _t4(twin_position: float) -> Results:
    pairs = {"accum-random+values": "accum-random", "accum-learned-noladder+values": "accum-learned-noladder"}
    return study({v: (2.0, 0.0) for p in pairs.items() for v in p},
                 {**{v: {"value": 0.1} for v in pairs}, **{t: {"value": twin_position} for t in pairs.values()}},
                 jitter=SMALL)


def _t5(rope_growth: float) -> Results:
    so2 = ("accum-random", "accum-token", "accum-learned-noladder", "accum-learned-noladder+values")
    return study({v: (2.0, 0.0) for v in (*so2, "RoPE")},
                 {**{v: {"top_gap": 1.0, "growth": 1.0} for v in so2}, "RoPE": {"top_gap": 1.0, "growth": rope_growth}},
                 jitter=SMALL)


@pytest.mark.parametrize("claim_id", sorted(INFORMATIVE_OR_NOT))
def test_a_rule_that_reads_for_on_its_null_decides_nothing(claim_id):
    informative, blind = (make() for make in INFORMATIVE_OR_NOT[claim_id])
    c = verdict(informative, claim_id)
    assert c.own_verdict == SUPPORTED and c.verdict == SUPPORTED, lines(c)
    assert c.null is not None and c.null_verdict != SUPPORTED, lines(c.null)
    assert all(x.outcome != "missing" for x in c.null.comparisons), lines(c.null)  # the null was really read
    c = verdict(blind, claim_id)
    assert c.own_verdict == SUPPORTED, lines(c)
    assert c.null_verdict == SUPPORTED and c.verdict == UNINFORMATIVE, lines(c.null)
    assert c.why().startswith("its rule reads for on its null (") and "on its own data it reads supported" in c.why()


# nulls that exchange two variants' labels on every other seed: a paired difference cannot survive that, so these
# rules can always come out otherwise; and nulls whose control fails the rule's own threshold part
ALWAYS_INFORMATIVE = {
    # T3: ALiBi is both a subject (bounded) and the null's stand-in for the rotation-only variants, so the null
    # cannot read for while the claim holds: NoPE's growing far mass fails the bounded part
    "T3": lambda: _t3({"far": (0.3, 0.6, 0.8)}, {"far": (0.05, 0.08, 0.085)}, jitter=SMALL),
    "C1": lambda: study({"RoPE": (2.0, 0.3), "accum-random": (2.0, 0.02)}),
    "C3": lambda: study({"accum-learned-noladder": (2.0, 0.2), "accum-learned-noladder+values": (2.0, 0.1),
                         "accum-random": (2.0, 0.2), "accum-random+values": (2.0, 0.1)}),
    "S1": lambda: _state("parity", {"accum-learned": (1.0, 0.0), "accum-learned+values": (1.0, 0.0),
                                    "RoPE": lambda m: max(0.5, 1.0 - 0.2 * math.log2(m)),
                                    "NoPE": (0.5, 0.0)}),
    "S2": lambda: _state("s5", {"PaTH": (0.95, 0.02), "accum-learned": (0.01, 0.0), "accum-learned+values": (0.01, 0.0)}),
    "S3": lambda: _state("flipflop", {"PaTH-FoX": (0.99, 0.0), "accum-learned+values+forget": (0.99, 0.0),
                                      "PaTH": lambda m: 1.0 - 0.05 * math.log2(m),
                                      "accum-learned+values": lambda m: 1.0 - 0.05 * math.log2(m)}),
}


@pytest.mark.parametrize("claim_id", sorted(ALWAYS_INFORMATIVE))
def test_a_clear_effect_does_not_survive_its_null(claim_id):
    c = verdict(ALWAYS_INFORMATIVE[claim_id](), claim_id)
    assert c.verdict == SUPPORTED, lines(c)
    # (S2's control, a commuting state, cannot learn S5 at L: its null reads "not tested", which is no for either)
    assert c.null is not None and c.null_verdict in (INCONCLUSIVE, NOT_SUPPORTED, NOT_TESTED), lines(c.null)
    if NULLS[claim_id].swap:  # the exchanged seed turns the sign of its paired difference: inside the noise
        assert any(x.outcome == "inside" for x in c.null.comparisons), lines(c.null)


def test_the_graft_keeps_each_transport_s_prediction_and_takes_the_control_s_windows():
    from accrot.study.claims import graft_coherence
    from accrot.study.theory import head_windows, predicted_mixing

    res = _graft({"censored": (True, True), "mixes": False})
    grafted = graft_coherence(res, opposite=True)
    for run in grafted.diagnosed("PaTH"):
        assert predicted_mixing(run) == [True] * 8  # its own angles' prediction
        assert all(w is None for _, w, _ in head_windows(run, 64 * 128))  # the drift's censored windows
    original = res.diagnosed("PaTH")[0]
    assert all(w is not None for _, w, _ in head_windows(original, 64 * 128))  # the study's own data untouched
    # head by head: the heads predicted coherent take the token table's windows, the others the drift's
    half = _graft({"censored": (True, True), "mixes": False})
    for r in half.diagnosed("PaTH"):
        r.diag["layers"] = [dict(x) for x in r.diag["layers"]]
        r.diag["layers"][1]["regularity"] = {"kind": "pairs", "mixes": [False] * 4}
    for run in graft_coherence(half, opposite=True).diagnosed("PaTH"):
        windows = [w for _, w, _ in head_windows(run, 64 * 128)]
        assert windows[:4] == [None] * 4 and all(w is not None and abs(w - 5.0) < 0.1 for w in windows[4:]), windows
    assert graft_coherence(study({"PaTH": (2.0, 0.0)}, {"PaTH": {}})) is None  # no control diagnosed: not read
    assert graft_coherence(study({"PaTH": (2.0, 0.0), GRAPE: (2.0, 0.0)}, {"PaTH": {}, GRAPE: {}}),
                           opposite=True) is None  # no control that mixes


def test_every_claim_says_its_null_or_that_it_has_none():
    from accrot.study.claims import specimen_results

    claims = check_claims(specimen_results())
    with_null = {c.id for c in claims if c.null_what}
    assert with_null == set(NULLS) == {c.id for c in claims}  # every rule meets a null
    # each was read on the specimen's data, but the grafts T1 and T2 read, which need diagnosed runs of a control
    grafted = {"T1", "T2"}
    assert all(c.null is not None for c in claims if c.id not in grafted)
    assert {c.null_verdict for c in claims if c.id in grafted} == {"not read"}


def test_relabelling_puts_a_source_in_a_target_s_place_and_swaps_only_the_seeds_asked():
    runs = [Run("corpus", v, s, f"/{v}/{s}", {1.0: {"multiplier": 1, "nll": float(i * 10 + s)}}, 128)
            for i, v in enumerate(("a", "b", "c")) for s in (0, 1, 2)]
    assert Results(runs).alternate_seeds("a", "b") == {1}
    res = Results(runs)
    swapped = res.relabelled({"a": "b", "b": "a"}, seeds={1})
    assert swapped.seeded_values("corpus", "a", "nll", 1) == {0: 0.0, 1: 11.0, 2: 2.0}
    assert swapped.seeded_values("corpus", "b", "nll", 1) == {0: 10.0, 1: 1.0, 2: 12.0}
    put = res.relabelled({"a": "c"})  # c in a's place: a's own runs gone, c keeps its own
    assert put.seeded_values("corpus", "a", "nll", 1) == {0: 20.0, 1: 21.0, 2: 22.0}
    assert put.seeded_values("corpus", "c", "nll", 1) == {0: 20.0, 1: 21.0, 2: 22.0}
    assert put.seeded_values("corpus", "b", "nll", 1) == {0: 10.0, 1: 11.0, 2: 12.0}
    assert res.seeded_values("corpus", "a", "nll", 1) == {0: 0.0, 1: 1.0, 2: 2.0}  # the original is untouched


def test_n1_reads_each_cell_against_its_own_rotation_only_sibling():
    assert n1_sibling("accum-random+alibi") == "accum-random"
    assert n1_sibling("accum-learned+values+forget") == "accum-learned+values"
    assert n1_sibling("accum-learned+values+ssmax") == "accum-learned+values"  # no sibling: the comparator


def test_a_case_verdict_does_not_resolve_what_the_text_s_noise_overruled():
    """The seeds alone resolve a −0.1 difference (p tiny), the crossed bootstrap over the text's blocks does not;
    the comparison reads *inside*, and a one-case-among-several verdict, which reads p-values, must not call it
    supported from the seeds' p-value."""
    a, b = {0: 2.0, 1: 2.01, 2: 2.02}, {0: 2.1, 1: 2.12, 2: 2.11}
    noisy = [-2.0, 2.0, -1.9, 1.7]
    blocks_a = {s: [a[s] + x for x in noisy] for s in a}
    blocks_b = {s: [b[s] - x for x in noisy] for s in b}
    seeds_only = compare_variants("x", "a", a, "b", b)
    assert seeds_only.outcome == "for" and seeds_only.p_for < 0.01
    assert case_verdict({"cell": [seeds_only]}) == SUPPORTED
    both = compare_variants("x", "a", a, "b", b, blocks=(blocks_a, blocks_b))
    assert both.outcome == "inside" and "text's own noise" in both.numbers
    assert both.p_for == 1.0
    assert case_verdict({"cell": [both]}) != SUPPORTED
    # an outcome other than for gives its case no evidence even with a small p-value left on it
    stale = Comparison("x", "", "inside", 0.001, 0.99)
    assert case_verdict({"cell": [stale]}) != SUPPORTED
    # and a case so excluded still counts in the family Holm corrects over
    weak = [Comparison("a", "", "for", 0.02, 0.98)]
    bad = [Comparison("a", "", "against", 0.99, 0.001)]
    assert case_verdict({"x": weak, "y": bad, "z": bad}) != SUPPORTED

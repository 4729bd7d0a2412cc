"""Which pairs of a learned rotation cannot mix within the study's longest length, from the rotation's own bound
and ladder: the bound itself (any step within a of its mean keeps |E e^{iδ}| ≥ cos a), the pairs it names for
Selective RoPE's ladder at the study's head width, none for the plain form, and the report's note."""

from __future__ import annotations

import math

import torch

from accrot.position.accum import unmixable_pairs
from accrot.position.declared import config_of
from accrot.study.report import mixing_note
from accrot.study.results import Results, Run
from accrot.study.variants import VARIANTS


def test_a_bounded_step_cannot_mix_faster_than_the_cosine_bound():
    """Every distribution within ±a of its mean (here a two-point one, the extreme, and a uniform one) has
    |E e^{iδ}| ≥ cos a, so its window log ε / log|φ| is at least log ε / log cos a."""
    a, eps = 0.05, 0.05
    bound = math.log(eps) / math.log(math.cos(a))
    g = torch.Generator().manual_seed(0)
    two_point = (torch.randint(0, 2, (200_000,), generator=g).double() * 2 - 1) * a + 0.3  # a mean shift: no help
    uniform = (torch.rand(200_000, generator=g, dtype=torch.float64) * 2 - 1) * a
    for d in (two_point, uniform):
        phi = torch.complex(torch.cos(d), torch.sin(d)).mean().abs().item()
        assert math.log(eps) / math.log(phi) >= bound * 0.99  # the two-point one attains it (up to sampling)


def test_selective_ropes_ladder_leaves_its_slow_pairs_coherent_at_the_study_s_lengths():
    cfg = config_of(VARIANTS["accum-learned"])
    slow = unmixable_pairs(cfg, 24, 64 * 128)
    assert [p for p, _, _ in slow] == list(range(5, 12))
    step = math.pi * 500_000 ** (-2 * 5 / 24)  # M · ℓ_5
    assert math.isclose(slow[0][1], step, rel_tol=1e-9) and slow[0][2] > 64 * 128
    assert [p for p, _, _ in unmixable_pairs(cfg, 24, 10**8)] == [9, 10, 11]  # a longer context: more pairs mix
    assert unmixable_pairs(config_of(VARIANTS["accum-learned-plain"]), 24, 64 * 128) == []
    assert unmixable_pairs(config_of(VARIANTS["accum-random"]), 24, 64 * 128) == []


def _runs(variant: str, head_dim: int | None) -> list[Run]:
    rows = {float(m): {"multiplier": m, "nll": 2.0} for m in (1, 8, 64)}
    return [Run("corpus", variant, s, f"/r/{variant}/{s}", rows, 128, head_dim=head_dim) for s in range(3)]


def test_the_report_names_the_pairs_that_cannot_mix():
    note = mixing_note(Results(_runs("accum-learned", 24) + _runs("accum-learned-plain", 24)))
    assert "**accum-learned**: pairs 5–11 of 12 cannot mix within 64× L (8,192 tokens)" in note
    assert "accum-learned-plain" not in note
    assert mixing_note(Results(_runs("accum-learned", None))) == ""  # no head width recorded: nothing claimed


def _at_width(res: Results, head_dim: int = 24) -> Results:
    from dataclasses import replace

    return Results([replace(r, head_dim=head_dim) for r in res.runs])


def test_claims_about_mixing_rotations_show_selective_ropes_ladder_as_a_row_they_do_not_count():
    """At the study's head width Selective RoPE's ladder keeps pairs 5–11 coherent: T1, T2 and T4 read it, show it
    and leave it out of the verdict, which the ladder-free form decides; at a width where no pair is held (none
    recorded) it counts like any other."""
    from tests.study.test_verdicts import lines, study, verdict

    own = ("accum-learned", "accum-learned+values", "accum-learned-noladder", "accum-learned-noladder+values")
    diag = {"accum-learned": {"censored": (True, True), "windows": (7.0, 30.0), "value": 0.9},
            "accum-learned+values": {"censored": (True, True), "windows": (7.0, 30.0), "value": 0.9},
            **{v: {"value": 0.1} for v in own[2:]}}
    res = study({v: (2.0, 0.0) for v in own}, diag, jitter=(0.0, 0.001, 0.002))
    for claim_id in ("T1", "T4"):
        counted, uncounted = verdict(_at_width(res), claim_id), verdict(res, claim_id)
        assert counted.own_verdict == "supported", lines(counted)
        assert not any(x.what.startswith("accum-learned ") or x.what in own[:2] for x in counted.comparisons)
        row = {"T1": "accum-learned", "T4": "accum-learned+values"}[claim_id]  # T4 reads +values variants only
        assert f"{row} (pairs 5–11 cannot mix within 64× L (its ladder); not counted)" in counted.note
        assert uncounted.own_verdict == "not supported", lines(uncounted)  # no width: nothing to exclude it on
    t2 = verdict(_at_width(study({v: (2.0, 0.0) for v in own},
                                 {v: {"windows": (7.0, 30.0 if v in own[:2] else 7.2)} for v in own})), "T2")
    assert t2.own_verdict == "supported" and "accum-learned+values (pairs 5–11" in t2.note, lines(t2)


def test_c2_and_c3_are_decided_without_the_ladder_and_show_it_as_a_row():
    from tests.study.test_verdicts import lines, study, verdict

    res = study({"RoPE": (2.0, 0.3), "accum-learned-noladder": (2.0, 0.005), "accum-learned": (2.0, 0.3)})
    c2 = verdict(res, "C2")
    assert c2.own_verdict == "supported", lines(c2)
    assert c2.note.startswith("accum-learned (Selective RoPE's ladder") and "(against)" in c2.note, c2.note
    # only one of C3's pairs ran: it decides; the ladder's pair is a row
    c3 = verdict(study({"accum-learned-noladder": (2.0, 0.2), "accum-learned-noladder+values": (2.0, 0.1),
                        "accum-learned": (2.0, 0.1), "accum-learned+values": (2.0, 0.2)}), "C3")
    assert c3.own_verdict == "supported" and all(x.what.startswith("accum-learned-noladder+values")
                                                 for x in c3.comparisons), lines(c3)
    assert c3.note.startswith("accum-learned+values against accum-learned") and "(against)" in c3.note, c3.note

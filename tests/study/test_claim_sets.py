"""The variant sets the claims read, derived from the parts' declared facts: pinned on the default study's variants
(the sets CLAIMS.md names), every variant a claim names as its premise has the fact the claim needs, and the far-mass
designs that are no far-mass control (an output gate, NoPE layers) are counted as what they are."""

from __future__ import annotations

from accrot.position import facts
from accrot.study import claims, state, theory
from accrot.study.results import Results, Run
from accrot.study.variants import DATASET_VARIANTS, DEFAULT_VARIANTS, STATE_VARIANTS, VARIANTS

DEFAULT = {v: VARIANTS[v] for v in DEFAULT_VARIANTS}


def test_c4_siblings_on_the_default_variants():
    """C4: each rotation-only variant with the same rotation plus a bias (PaTH / PaTH-FoX, accum-learned+values /
    +forget, +alibi, accum-random / +alibi)."""
    assert claims.siblings(DEFAULT) == {"PaTH": ("PaTH-FoX",),
                                        "accum-learned+values": ("accum-learned+values+forget",
                                                                 "accum-learned+values+alibi"),
                                        "accum-random": ("accum-random+alibi",)}
    # the ALiBi-initialised forget gate differs from its sibling only in an option the forget gate reads
    assert claims.SIBLINGS["accum-learned+values"] == ("accum-learned+values+forget",
                                                       "accum-learned+values+forget-alibi-init",
                                                       "accum-learned+values+alibi")


def test_t5_reads_the_accumulated_so2_rotations_that_satisfy_the_condition():
    """T5 on the default variants: accum-random, accum-token, the learned ones with and without the ladder (each
    with and without values), accum-random+values; not the controls
    that break the regularity condition (the ladder spread, GRAPE's softplus drift), not PaTH, not a cell with far
    mass control."""
    assert theory.so2_accumulated(DEFAULT) == ("accum-random", "accum-token", "accum-learned", "accum-learned+values",
                                               "accum-learned-noladder", "accum-learned-noladder+values", "accum-random+values")
    assert {"accum-random-ladder", "accum-grape"} <= {v for v in DEFAULT if facts(DEFAULT[v]).breaks_condition}
    assert set(theory.so2_accumulated(DEFAULT)) <= set(theory.SO2_ACCUMULATED)


def test_rotation_only_and_controlled_on_the_default_variants():
    rotation_only = [v for v in DEFAULT if state.rotation_only(v)]
    assert rotation_only == ["accum-random", "accum-random-ladder", "accum-token", "accum-learned",
                             "accum-learned+values", "accum-learned-noladder", "accum-learned-noladder+values", "accum-random+values", "accum-grape", "PaTH"]
    assert [v for v in DEFAULT if state.controlled(v)] == ["ALiBi", "PaTH-FoX", "accum-learned+values+forget",
                                                          "accum-learned+values+alibi", "accum-random+alibi"]
    # C4's local-task note: the rotation-only variants the local task runs
    local = [v for v in claims.ROTATION_ONLY if v in DATASET_VARIANTS["local"]]
    assert local == ["accum-random", "accum-learned", "accum-learned+values", "PaTH"]
    assert [v for v in claims.ROTATION_ONLY if v in DEFAULT] == ["accum-random", "accum-token", "accum-learned",
                                                                 "accum-learned+values", "accum-learned-noladder", "accum-learned-noladder+values", "accum-random+values", "PaTH"]


def _run(variant: str, diagnosed: bool = True) -> Run:
    diag = {"schema": "accrot.diagnostics/2", "scheme": VARIANTS[variant]} if diagnosed else None
    return Run("corpus", variant, 0, f"/runs/{variant}", {}, 128, diagnostics=diag)


def test_t3_roles_on_the_default_variants():
    roles = {v: theory.role(v, _run(v)) for v in DEFAULT}
    assert {v for v, r in roles.items() if r == "bounded"} == {"ALiBi", "PaTH-FoX", "accum-learned+values+forget",
                                                                "accum-learned+values+alibi", "accum-random+alibi"}
    assert {v for v, r in roles.items() if r == "rotation-only"} == set(
        v for v in DEFAULT if state.rotation_only(v))
    assert roles["NoPE"] == "control" and roles["RoPE"] == "other"


def test_scalable_softmax_is_on_neither_side_of_t3():
    """Its logit factor grows with the keys: the bound (from L's logits) neither applies nor is the control."""
    assert theory.role("RoPE+ssmax", _run("RoPE+ssmax")) == "other"
    assert theory.role("accum-learned+values+ssmax", _run("accum-learned+values+ssmax")) == "other"
    assert theory.role("accum-learned+values+gate", _run("accum-learned+values+gate")) == "rotation-only"


def test_s3_groups_on_the_state_variants():
    controlled = [v for v in STATE_VARIANTS if state.controlled(v) and state.variant_facts(v).rotates]
    assert controlled == ["PaTH-FoX", "accum-learned+values+forget", "accum-learned+values+alibi"]
    assert [v for v in STATE_VARIANTS if state.rotation_only(v)] == ["accum-learned", "accum-learned+values", "PaTH",
                                                                    "accum-learned+values+gate"]
    so2 = [v for v in STATE_VARIANTS if (f := state.variant_facts(v)).accumulates and f.commutes]
    assert so2 == ["accum-learned", "accum-learned+values", "accum-learned+values+forget",
                   "accum-learned+values+alibi", "accum-learned+values+ssmax", "accum-learned+values+gate"]


def _flipflop(variant: str, seed: int, accuracy: float) -> Run:
    """A flip-flop run that learned the reads at L (accuracy 1) and reads ``accuracy`` at 64× L."""
    rows = {m: {"multiplier": m, "length": int(128 * m), "nll": 1.0, "accuracy": 1.0 if m == 1.0 else accuracy}
            for m in (1.0, 64.0)}
    return Run("flipflop", variant, seed, f"/runs/{variant}/{seed}", rows, 128)


def test_s3_counts_an_output_gate_as_rotation_only_and_nope_layers_as_neither():
    """An output gate leaves the attention weights (and the far mass) as they are, and RoPE with NoPE layers
    accumulates nothing: neither is far-mass control. (Counted as control, the gated cell was expected to read
    exactly and RoPE-NoPE-interleaved was judged by S3's rule.)"""
    variants = ("accum-learned+values+forget", "accum-learned+values+gate", "RoPE-NoPE-interleaved",
                "accum-learned+values+ssmax")
    res = Results([_flipflop(v, s, 0.5) for v in variants for s in range(3)])
    whats = [c.what for c in state.s3(res).comparisons]
    assert whats == ["flipflop: accum-learned+values+forget exact at 64×", "flipflop: accum-learned+values+gate fails at 64×"]


def test_every_variant_a_claim_names_has_the_fact_the_claim_needs():
    def f(v: str):
        return facts(VARIANTS[v])

    assert f("accum-random").rotation_only and f("accum-random").random  # C1
    assert f("accum-learned").rotation_only and f("accum-learned").learned  # C2
    assert f("accum-learned+values").rotates_values and not f("accum-learned").rotates_values  # C3
    assert f("ALiBi").controls_far_mass and not f("ALiBi").rotates  # C5
    for v in claims.ROTATION_CONTROLLED:  # N1's anchors: an accumulated SO(2) rotation with far-mass control
        assert f(v).accumulates and f(v).commutes and f(v).controls_far_mass
    assert f(claims.N1_COMPARATOR).rotation_only and f(claims.N1_COMPARATOR).rotates_values
    for v in ("accum-learned", "accum-learned+values"):  # S1: commuting accumulation
        assert f(v).accumulates and f(v).commutes and not f(v).far_mass_design
    assert f("PaTH").accumulates and not f("PaTH").commutes and f("PaTH").rotation_only  # S2
    assert f("NoPE").transport == "none" and not f("NoPE").far_mass_design  # T3's negative control
    for v, siblings in claims.SIBLINGS.items():
        assert f(v).rotation_only and all(f(s).controls_far_mass for s in siblings)

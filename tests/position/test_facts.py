"""The parts' declared facts, read through the registries by ``accrot.position.facts``: known truth per family, the
same answer from every form a scheme is saved in, and the options each part reads."""

from __future__ import annotations

import dataclasses

import pytest

from accrot.errors import ConfigError
from accrot.position import FAR_MASS, INCREMENTS, OUTPUT_GATES, ROTATIONS, SchemeConfig, build, facts
from accrot.position.accum import AccumulatedRotation, RandomPositionIncrements, RandomTokenIncrements
from accrot.position.declared import reads
from accrot.position.learned import LearnedIncrements, SoftplusIncrements

# scheme -> (transport, accumulates, commutes, random, learned, drifts, fresh_draws, regularity)
TRANSPORTS = {
    "none": ({}, ("none", False, True, False, False, False, False, None)),
    "rope": ({"rotation": "rope"}, ("so2", False, True, False, False, False, False, None)),
    "random": ({"rotation": "accum", "increments": "random_position"},
               ("so2", True, True, True, False, False, True, "holds")),
    "ladder": ({"rotation": "accum", "increments": "random_position", "increment_spread": "ladder"},
               ("so2", True, True, True, False, False, True, "fails")),
    "token": ({"rotation": "accum", "increments": "random_token"}, ("so2", True, True, True, False, False, False, "holds")),
    "learned": ({"rotation": "accum", "increments": "learned"},
                ("so2", True, True, False, True, False, False, "may hold")),
    "learned+floor": ({"rotation": "accum", "increments": "learned", "window": 96.0},
                      ("so2", True, True, True, True, False, False, "holds")),
    "softplus": ({"rotation": "accum", "increments": "softplus"},
                 ("so2", True, True, False, True, True, False, "fails")),
    "softplus+floor": ({"rotation": "accum", "increments": "softplus", "sigma": 0.3},
                       ("so2", True, True, True, True, True, False, "holds")),
    "path": ({"rotation": "path"}, ("path", True, False, False, True, False, False, "may hold")),
}
FIELDS = ("transport", "accumulates", "commutes", "random", "learned", "drifts", "fresh_draws", "regularity")


@pytest.mark.parametrize("name", TRANSPORTS)
def test_the_transport_facts_of_every_family(name):
    overrides, expected = TRANSPORTS[name]
    f = facts(SchemeConfig(**overrides))
    assert tuple(getattr(f, k) for k in FIELDS) == expected
    assert f.breaks_condition == (expected[-1] == "fails")


@pytest.mark.parametrize("far_mass, controls, scales", [("none", False, False), ("alibi", True, False),
                                                         ("forget", True, False), ("ssmax", False, True)])
def test_far_mass_control_is_a_term_growing_with_distance(far_mass, controls, scales):
    f = facts({"rotation": "accum", "increments": "learned", "far_mass": far_mass})
    assert (f.controls_far_mass, f.scales_logits) == (controls, scales)
    assert f.far_mass_design == (far_mass != "none")
    # the lower bound applies unless a bias grows with distance or the logits' scale with the keys
    assert f.rotation_only == (far_mass == "none")


def test_an_output_gate_and_nope_layers_are_designs_not_far_mass_control():
    gated = facts({"rotation": "accum", "increments": "learned", "output_gate": "headwise"})
    assert gated.gates_output and gated.far_mass_design and not gated.controls_far_mass and gated.rotation_only
    interleaved = facts({"rotation": "rope", "layer_pattern": ["cell", "none"]})
    assert interleaved.position_free_layers and interleaved.far_mass_design
    assert not interleaved.controls_far_mass and not interleaved.rotation_only  # RoPE accumulates nothing


def test_every_saved_form_of_a_scheme_has_the_same_facts():
    """A SchemeConfig, its asdict (run.json, a checkpoint's hparams), a variant's overrides and layer 0's
    ``describe()`` (a diagnostics bundle's ``scheme``) say the same."""
    for overrides, _ in TRANSPORTS.values():
        cfg = SchemeConfig(**overrides, far_mass="forget", output_gate="elementwise")
        described = build(cfg, d_model=32, n_heads=2).describe()
        expected = facts(cfg)
        assert facts(dataclasses.asdict(cfg)) == facts({**overrides, "far_mass": "forget",
                                                          "output_gate": "elementwise"}) == expected
        if "window" not in overrides and "sigma" not in overrides:  # describe() records the floor's σ, not its window
            assert facts(described) == expected
    assert facts(None) == facts({}) == facts(SchemeConfig())
    with pytest.raises(ConfigError, match="describes no valid scheme"):
        facts({"rotation": "spiral"})


def test_the_accumulated_rotation_builds_its_source_from_the_increment_registry():
    assert set(INCREMENTS) == {"random_position", "random_token", "learned", "softplus"}
    assert INCREMENTS["random_position"] is RandomPositionIncrements and INCREMENTS["random_token"] is RandomTokenIncrements
    assert INCREMENTS["learned"] is LearnedIncrements and INCREMENTS["softplus"] is SoftplusIncrements
    for name, cls in INCREMENTS.items():
        rotation = build(SchemeConfig(rotation="accum", increments=name), d_model=32, n_heads=2).rotation
        assert isinstance(rotation, AccumulatedRotation) and type(rotation.source) is cls
        assert (rotation.random, rotation.learned) == (cls.random, cls.learned)


def test_every_option_is_a_selector_or_read_by_some_part():
    """What a part reads is declared: every field of SchemeConfig is either what selects the parts or read by one."""
    selectors = {"rotation", "far_mass", "increments", "output_gate", "rotate_values", "layer_pattern"}
    declared = {name for registry in (ROTATIONS, FAR_MASS, OUTPUT_GATES, INCREMENTS) for cls in registry.values()
                for name in cls.reads}
    names = {f.name for f in dataclasses.fields(SchemeConfig)}
    assert declared <= names
    assert names - selectors == declared


def test_reads_follow_the_parts_in_use():
    assert "max_increment" in reads({"rotation": "accum", "increments": "learned"})
    assert "resample" not in reads({"rotation": "accum", "increments": "learned"})
    assert "resample" in reads({"rotation": "accum", "increments": "learned", "window": 64.0})  # the floor draws
    assert "block_size" in reads({"far_mass": "alibi"}) and "block_size" not in reads({"rotation": "path",
                                                                                      "far_mass": "alibi"})
    assert "learned_init_std" in reads({"rotation": "path"})  # PaTH's projections start at that std too


def test_ignored_options_come_from_the_parts():
    from accrot.position import ignored as unread

    def ignored(**kw) -> list[str]:
        return [name for name, _ in unread(SchemeConfig(**kw))]

    assert ignored(rotation="path", learned_init_std=None) == []  # PaTH-plain: its default init, read by PaTH
    assert ignored(far_mass="alibi", forget_init="alibi", ssmax_init=1.0) == ["forget_init", "ssmax_init"]
    assert ignored(rotation="rope", seed=3, vocab_size=17) == []  # filled in by every run
    assert unread(SchemeConfig(rotation="rope", window=96.0)) == [("window", "rotation='accum'")]
    assert dict(unread(SchemeConfig(rotation="rope", conv_size=2)))["conv_size"] == (
        "rotation='path' or increments='learned'")
    assert dict(unread(SchemeConfig(rotation="path", far_mass="alibi", block_size=64)))["block_size"].endswith(
        "without rotation='path'")

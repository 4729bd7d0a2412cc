"""Per-layer schemes (layer_pattern): how a pattern resolves per layer, that the backbone builds each layer through
the registry and is exactly the composition of those layers, the per-layer contract, and the rejected patterns."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from accrot.diagnostics import layer_inputs
from accrot.model import ModelConfig, Transformer
from accrot.position import ROTATIONS, ConfigError, SchemeConfig, build, explicit
from tests.helpers.tolerance import assert_close

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py

EVERY_4TH = ["cell", "cell", "cell", "none"]


def test_pattern_resolves_per_layer_and_keeps_far_mass_and_gate():
    cell = SchemeConfig(rotation="accum", increments="learned", rotate_values=True, far_mass="ssmax",
                        output_gate="elementwise", layer_pattern=EVERY_4TH)
    layers = [cell.for_layer(i) for i in range(8)]
    assert [c.rotation for c in layers] == ["accum", "accum", "accum", "none"] * 2  # entry i mod 4
    nope = layers[3]
    assert (nope.increments, nope.rotate_values, nope.far_mass, nope.output_gate) == (None, False, "ssmax",
                                                                                       "elementwise")
    assert all(c.layer_pattern is None for c in layers)  # each describes one layer
    assert layers[0] == SchemeConfig(rotation="accum", increments="learned", rotate_values=True, far_mass="ssmax",
                                     output_gate="elementwise")
    assert SchemeConfig(rotation="rope").for_layer(5) == SchemeConfig(rotation="rope")
    assert cell.label() == "accum:learned/ssmax+values+gate(cell,cell,cell,none)"


def test_backbone_builds_each_layer_through_the_registry_and_records_it():
    model = Transformer(ModelConfig(d_model=32, n_layers=4, n_heads=4,
                                    scheme=SchemeConfig(rotation="rope", layer_pattern=EVERY_4TH)))
    schemes = model.schemes()
    assert [type(s.rotation) for s in schemes] == [ROTATIONS["rope"]] * 3 + [ROTATIONS["none"]]
    info = [s.describe() for s in schemes]
    assert [i["rotation"] for i in info] == ["rope", "rope", "rope", "none"]
    assert [i["layer"] for i in info] == [0, 1, 2, 3]
    assert all(i["layer_pattern"] == EVERY_4TH and i["cell"] == "rope/none(cell,cell,cell,none)" for i in info)
    assert "layer" not in Transformer(ModelConfig(d_model=32, n_layers=2, n_heads=4)).schemes()[0].describe()


def test_interleaved_model_is_exactly_the_composition_of_its_layers():
    """Layer 0 of a [cell, none] RoPE model is a RoPE model's layer 0 and layer 1 a NoPE model's layer 1: with the
    same weights, the interleaved model's logits are those of the hand-composed stack."""
    def model(**scheme):
        torch.manual_seed(0)
        return Transformer(ModelConfig(d_model=32, n_layers=2, n_heads=4, scheme=SchemeConfig(**scheme))).double()

    mixed = model(rotation="rope", layer_pattern=["cell", "none"])
    rope, nope = model(rotation="rope"), model(rotation="none")
    for other in (rope, nope):
        other.load_state_dict(mixed.state_dict())  # no scheme parameters here: the same keys
    tokens = torch.randint(0, 256, (2, 33))
    h = mixed.embed(tokens)
    h = rope.blocks[0](h, tokens)
    h = nope.blocks[1](h, tokens)
    composed = mixed.head(mixed.norm(h))
    assert_close(composed, mixed(tokens), 1e-13)
    assert (mixed(tokens) - rope(tokens)).abs().max() > 1e-4 and (mixed(tokens) - nope(tokens)).abs().max() > 1e-4


def test_every_layer_keeps_the_public_contract():
    """Each layer's forward equals its attention recomputed from its own exposed quantities."""
    scheme = SchemeConfig(rotation="accum", increments="learned", learned_init_std=0.5, rotate_values=True,
                          far_mass="ssmax", output_gate="headwise", layer_pattern=["none", "cell"])
    model = Transformer(ModelConfig(d_model=32, n_layers=2, n_heads=4, scheme=scheme)).double().eval()
    tokens = torch.randint(0, 256, (2, 21))
    with torch.no_grad():
        for li in layer_inputs(model, tokens):
            q, k, v = li.q.double(), li.k.double(), li.v.double()
            ref = explicit.attention(li.scheme, q, k, v, li.x, li.tokens)
            assert_close(ref, li.scheme(q, k, v, li.x, li.tokens), 1e-6)  # learned angles: float32 by contract
    assert [s.cfg.rotation for s in model.schemes()] == ["none", "accum"]


@pytest.mark.parametrize("options,message", [
    (dict(rotation="rope", layer_pattern=["cell", "rope"]),
     r"^layer_pattern entry='rope' is not valid; choose one of 'cell', 'none'$"),
    (dict(rotation="rope", layer_pattern=["cell", "cell"]), r"^layer_pattern=\['cell', 'cell'\] changes no layer"),
    (dict(layer_pattern=["cell", "none"]), r"^layer_pattern=\['cell', 'none'\] needs a rotation to interleave"),
    (dict(rotation="rope", layer_pattern=[]), r"^layer_pattern=\[\] is not valid; give a list of 'cell' / 'none'"),
    (dict(rotation="rope", layer_pattern="cell,none"), r"^layer_pattern='cell,none' is not valid"),
], ids=["entry", "no-none", "no-rotation", "empty", "string"])
def test_bad_patterns_are_one_config_error(options, message):
    with pytest.raises(ConfigError, match=message):
        SchemeConfig(**options)


def test_a_pattern_the_layers_cannot_show_is_rejected_by_the_model():
    scheme = SchemeConfig(rotation="rope", layer_pattern=EVERY_4TH)
    with pytest.raises(ConfigError, match=r"^scheme.layer_pattern=.* makes every one of n_layers=2 layers the cell"):
        ModelConfig(n_layers=2, scheme=scheme)
    with pytest.raises(ConfigError, match="position-free"):
        ModelConfig(n_layers=1, scheme=SchemeConfig(rotation="rope", layer_pattern=["none", "cell"]))
    assert ModelConfig(n_layers=4, scheme=scheme).scheme.layer_pattern == EVERY_4TH


def test_build_picks_the_layer_and_a_saved_dict_round_trips():
    cfg = SchemeConfig(rotation="path", layer_pattern=["cell", "none"])
    assert build(cfg, 16, 2).rotation.kind == "path" and build(cfg, 16, 2, layer=1).rotation.kind == "none"
    assert build(cfg, 16, 2, layer=1).cell is cfg
    assert SchemeConfig.of(asdict(cfg)) == cfg  # a checkpoint's hyperparameters give the same cell back

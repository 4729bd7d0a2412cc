"""The output gate (output_gate = elementwise | headwise): what it exposes, the scheme against its explicit twin on
every rotation and far mass (outputs and gradients, float64), and the properties that follow from the math."""

from __future__ import annotations

import pytest
import torch

from accrot.position import OUTPUT_GATES, ConfigError, SchemeConfig, build, explicit
from tests.helpers.tolerance import assert_close
from tests.position.reference import GRAD_RTOL, ROTATIONS, inputs

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py


def gated(kind="elementwise", **options):
    scheme = build(SchemeConfig(output_gate=kind, **options), 16, 2)
    with torch.no_grad():  # away from the initial 1/2, so the gate differs per token, head and coordinate
        scheme.gate.proj.weight.normal_(std=0.5)
        scheme.gate.proj.bias.normal_(std=0.5)
    return scheme


@pytest.mark.parametrize("kind", ["elementwise", "headwise"])
def test_output_gate_shapes_range_and_initial_half(kind):
    fresh = build(SchemeConfig(output_gate=kind), 16, 2)
    assert OUTPUT_GATES[kind] is type(fresh.gate)
    assert fresh.gate.proj.weight.shape == ((16, 16) if kind == "elementwise" else (2, 16))
    _, _, _, x, tokens = inputs(T=7, dtype=torch.float32)
    assert torch.equal(fresh.output_gate(x, tokens), torch.full((2, 2, 7, 8), 0.5))  # W = 0, b = 0: σ(0)
    g = gated(kind).output_gate(x, tokens)
    assert g.shape == (2, 2, 7, 8) and bool(((g > 0) & (g < 1)).all())
    per_coordinate = g.std(dim=-1)  # [B, H, T]: one value per head's row (headwise) or many (elementwise)
    assert bool((per_coordinate == 0).all()) == (kind == "headwise")
    assert g.std(dim=-2).min() > 0  # depends on the token
    assert fresh.describe()["output_gate"] == kind
    ungated = build(SchemeConfig(), 16, 2)
    assert ungated.gate is None and torch.equal(ungated.output_gate(x, tokens), torch.ones(2, 2, 7, 8))


CASES = {
    **{f"{name}+gate": dict(ROTATIONS[name]) for name in ROTATIONS},
    "nope+headgate": dict(rotation="none", output_gate="headwise"),
    "path+headgate": dict(ROTATIONS["path"], output_gate="headwise"),
    "forget+gate": dict(rotation="none", far_mass="forget"),
    "path-fox+gate": dict(ROTATIONS["path"], far_mass="forget"),
    "rope-alibi+values+gate": dict(rotation="rope", far_mass="alibi", rotate_values=True, block_size=4),
    "accum-learned+values+ssmax+gate": dict(ROTATIONS["accum-learned+values"], far_mass="ssmax"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gated_scheme_matches_explicit_twin_outputs_and_gradients(name):
    """The gate after the whole attention (value transport included), on every rotation and every far mass,
    float64: outputs and the gradients of q, k, v, x and every parameter (the gate's included)."""
    torch.manual_seed(0)
    options = dict(CASES[name])
    kind = options.pop("output_gate", "elementwise")
    scheme = gated(kind, **options).double().eval()
    if scheme.far_mass is not None and scheme.far_mass.__class__.__name__ == "ForgetGate":
        with torch.no_grad():
            scheme.far_mass.proj.weight.normal_(std=0.3)
    q, k, v, x, tokens = inputs()
    leaves = [q, k, v, x]
    for t in leaves:
        t.requires_grad_()
    named = [(n, p) for n, p in scheme.named_parameters() if p.requires_grad]
    out = scheme(q, k, v, x, tokens)
    ref = explicit.attention(scheme, q, k, v, x, tokens)
    # the forget gate's log f is float32 by contract, everything else float64
    forget = options.get("far_mass") == "forget"
    assert_close(ref, out, 1e-6 if forget else 1e-10)
    g = torch.randn_like(out)
    wrt = leaves + [p for _, p in named]
    ref_g = torch.autograd.grad(ref, wrt, g, allow_unused=True)
    fast_g = torch.autograd.grad(out, wrt, g, allow_unused=True)
    rtol = 1e-5 if forget else GRAD_RTOL.get(name.removesuffix("+gate").removesuffix("+ssmax"), 1e-8)
    for a, b, what in zip(ref_g, fast_g, ["q", "k", "v", "x"] + [n for n, _ in named]):
        if a is None:
            assert b is None or b.abs().max() == 0, what
            continue
        if what.startswith("gate."):
            assert a.abs().max() > 0, what  # the gate learns
        assert_close(a, b, rtol, what)


@pytest.mark.parametrize("name", ["nope", "rope+values", "accum-learned+values", "path"])
def test_a_gate_of_one_is_the_ungated_scheme_and_of_a_half_halves_it(name):
    base = build(SchemeConfig(**ROTATIONS[name]), 16, 2).double().eval()
    scheme = build(SchemeConfig(output_gate="elementwise", **ROTATIONS[name]), 16, 2).double().eval()
    scheme.rotation.load_state_dict(base.rotation.state_dict())
    q, k, v, x, tokens = inputs(T=17)
    plain = base(q, k, v, x, tokens)
    assert_close(0.5 * plain, scheme(q, k, v, x, tokens), 1e-14)  # the initial gate: σ(0) = 1/2 everywhere
    with torch.no_grad():
        scheme.gate.proj.bias.fill_(40.0)  # σ(40) = 1 − 4e−18: 1.0 in float64
    assert torch.equal(scheme.output_gate(x, tokens), torch.ones(2, 2, 17, 8, dtype=torch.float64))
    assert_close(plain, scheme(q, k, v, x, tokens), 1e-14)


@pytest.mark.parametrize("kind", ["elementwise", "headwise"])
def test_appending_tokens_never_changes_earlier_gated_outputs(kind):
    scheme = gated(kind, **ROTATIONS["accum-learned+values"]).double().eval()
    q, k, v, x, tokens = inputs(T=40)
    full = scheme(q, k, v, x, tokens)
    short = scheme(q[:, :, :23], k[:, :, :23], v[:, :, :23], x[:, :23], tokens[:, :23])
    assert_close(full[:, :, :23], short, 1e-12)


def test_gated_output_stays_token_major_and_follows_autocast():
    """The gate keeps the fused attention's token-major layout (the backbone's reshape to [B, T, H·D] stays a view),
    and under bf16 autocast the output is bf16."""
    scheme = gated("elementwise")
    q, k, v, x, tokens = inputs(T=9, dtype=torch.float32)
    qkv = torch.stack((q, k, v)).permute(1, 3, 0, 2, 4).contiguous()  # [B, T, 3, H, D], as the backbone projects
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, T, D] views
    out = scheme(q, k, v, x, tokens)
    assert out.transpose(1, 2).is_contiguous()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert scheme(q, k, v, x, tokens).dtype == torch.bfloat16


def test_unknown_output_gate_is_one_config_error():
    with pytest.raises(ConfigError, match=r"^output_gate='sigmoid' is not valid; choose one of 'none', 'elementwise', "
                                          r"'headwise'$"):
        SchemeConfig(output_gate="sigmoid")

"""Scalable softmax (far_mass="ssmax"): the exposed factor s_h·log(t + 1), the scheme against its explicit twin on
every rotation (outputs and gradients, float64), the properties that follow from the math, and its precision."""

from __future__ import annotations

import math

import pytest
import torch

from accrot.position import FAR_MASS, ConfigError, SchemeConfig, build, explicit
from tests.helpers.tolerance import assert_close
from tests.position.reference import GRAD_RTOL, ROTATIONS, inputs

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py


def ssmax(d_model=16, n_heads=2, **options):
    return build(SchemeConfig(far_mass="ssmax", **options), d_model, n_heads)


def test_logit_scale_is_s_log_n_and_there_is_no_bias():
    scheme = ssmax()
    assert FAR_MASS["ssmax"] is type(scheme.far_mass) and not scheme.far_mass.additive
    with torch.no_grad():
        scheme.far_mass.s.copy_(torch.tensor([0.3, 1.7]))
    _, _, _, x, tokens = inputs(T=9, dtype=torch.float32)
    c = scheme.logit_scale(x, tokens)
    assert c.shape == (2, 2, 9) and c.dtype == torch.float32
    expect = torch.tensor([[s * math.log(t + 1) for t in range(9)] for s in (0.3, 1.7)])  # n = t + 1 keys
    torch.testing.assert_close(c[1], expect, rtol=1e-6, atol=0)
    assert torch.equal(scheme.log_decay(x, tokens), torch.zeros(2, 2, 9))
    assert scheme.describe()["ssmax_s"] == pytest.approx([0.3, 1.7])
    assert build(SchemeConfig(far_mass="ssmax", ssmax_init=0.25), 16, 2).far_mass.s.tolist() == [0.25, 0.25]
    assert SchemeConfig(far_mass="ssmax").ssmax_init == 0.43


@pytest.mark.parametrize("name", list(ROTATIONS))
def test_ssmax_matches_explicit_twin_outputs_and_gradients(name):
    """Every rotation × ssmax, float64: the fused path (the factor folded into q) against explicit [T, T] logits
    scaled row by row, on the output and on the gradients of q, k, v, x and every parameter (s included)."""
    torch.manual_seed(0)
    scheme = ssmax(**ROTATIONS[name]).double().eval()
    with torch.no_grad():
        scheme.far_mass.s.copy_(torch.tensor([0.6, 1.4]))  # two heads, two factors
    q, k, v, x, tokens = inputs()
    leaves = [q, k, v, x]
    for t in leaves:
        t.requires_grad_()
    params = [p for p in scheme.parameters() if p.requires_grad]
    out = scheme(q, k, v, x, tokens)
    ref = explicit.attention(scheme, q, k, v, x, tokens)
    assert_close(ref, out, 1e-10)
    g = torch.randn_like(out)
    fast_g = torch.autograd.grad(out, leaves + params, g, allow_unused=True)
    ref_g = torch.autograd.grad(ref, leaves + params, g, allow_unused=True)
    s_grad = dict(zip([id(p) for p in params], ref_g[len(leaves):]))[id(scheme.far_mass.s)]
    assert s_grad.abs().min() > 0  # s learns, from both heads
    names = ["q", "k", "v", "x"] + [n for n, p in scheme.named_parameters() if p.requires_grad]
    for a, b, what in zip(ref_g, fast_g, names):
        if a is None:
            assert b is None or b.abs().max() == 0, what
            continue
        assert_close(a, b, GRAD_RTOL.get(name, 1e-8), what)


@pytest.mark.parametrize("name", ["nope", "rope+values", "accum-learned+values", "path"])
def test_a_unit_factor_is_the_base_scheme(name):
    """s·log n ≡ 1 (log n replaced by 1 and s = 1): exactly the scheme without far mass, same rotation weights."""
    base = build(SchemeConfig(**ROTATIONS[name]), 16, 2).double().eval()
    scaled = ssmax(**ROTATIONS[name]).double().eval()
    scaled.rotation.load_state_dict(base.rotation.state_dict())
    with torch.no_grad():
        scaled.far_mass.s.fill_(1.0)
    scaled.far_mass.log_n = lambda T, device, dtype: torch.ones(T, dtype=dtype, device=device)
    q, k, v, x, tokens = inputs(T=17)
    assert torch.equal(scaled.logit_scale(x, tokens), torch.ones(2, 2, 17, dtype=torch.float64))
    assert_close(base(q, k, v, x, tokens), scaled(q, k, v, x, tokens), 1e-13)
    # and the real factor is not 1: the same weights with s·log(t + 1) give another output
    del scaled.far_mass.log_n
    assert (scaled(q, k, v, x, tokens) - base(q, k, v, x, tokens)).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["nope", "rope", "accum-learned+values", "path"])
def test_appending_tokens_never_changes_earlier_outputs(name):
    """n is the number of keys the query sees (t + 1), not the block length: a prefix is computed alike."""
    scheme = ssmax(**ROTATIONS[name]).double().eval()
    q, k, v, x, tokens = inputs(T=40)
    full = scheme(q, k, v, x, tokens)
    n = 23
    short = scheme(q[:, :, :n], k[:, :, :n], v[:, :, :n], x[:, :n], tokens[:, :n])
    assert_close(full[:, :, :n], short, 1e-12)


def test_ssmax_keeps_a_margin_winning_as_the_context_grows():
    """The design's point, on known truth: one key ahead of n − 1 equal keys by a margin z. Softmax gives it
    e^z / (e^z + n − 1) → 0; SSMax gives it n^{sz} / (n^{sz} + n − 1), which stays ≥ 1/2 for s·z ≥ 1."""
    D, z = 4, 2.0
    scheme = ssmax(d_model=D, n_heads=1).double().eval()
    with torch.no_grad():
        scheme.far_mass.s.fill_(0.5)  # s·z = 1
    for T in (16, 256, 4096):
        q = torch.zeros(1, 1, T, D, dtype=torch.float64)
        q[..., 0] = 1.0
        k = torch.zeros_like(q)
        k[:, :, 0, 0] = z * math.sqrt(D)  # key 0 scores z, every other key 0
        v = torch.zeros_like(q)
        v[:, :, 0, 1] = 1.0  # the output's coordinate 1 is key 0's weight
        x, tokens = torch.zeros(1, T, D, dtype=torch.float64), torch.zeros(1, T, dtype=torch.long)
        weight = scheme(q, k, v, x, tokens)[0, 0, -1, 1].item()
        assert weight == pytest.approx(T ** 1.0 / (T ** 1.0 + T - 1), rel=1e-9)  # n^{sz}/(n^{sz} + n − 1), n = T
        plain = build(SchemeConfig(), D, 1)(q, k, v, x, tokens)[0, 0, -1, 1].item()
        assert plain == pytest.approx(math.exp(z) / (math.exp(z) + T - 1), rel=1e-9)
    assert weight > 0.49 and plain < 0.01


def test_ssmax_factor_stays_float32_under_bf16_autocast():
    scheme = ssmax(**ROTATIONS["rope"])
    q, k, v, x, tokens = inputs(T=11, dtype=torch.float32)
    ref = scheme.logit_scale(x, tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c = scheme.logit_scale(x, tokens)
        out = scheme(q.bfloat16(), k.bfloat16(), v.bfloat16(), x, tokens)
    assert c.dtype == torch.float32 and torch.equal(c, ref)
    assert out.dtype == torch.bfloat16
    # parameters cast to bf16 (bf16-true training) still give a float32 factor, from the rounded s
    cast = scheme.to(torch.bfloat16)
    assert cast.logit_scale(x.bfloat16(), tokens).dtype == torch.float32


@pytest.mark.parametrize("value", [0, -0.5, float("inf"), "big", True])
def test_bad_ssmax_init_is_one_config_error(value):
    with pytest.raises(ConfigError, match=r"^ssmax_init=.* is not valid; it must be a positive number$"):
        SchemeConfig(far_mass="ssmax", ssmax_init=value)

"""Far-mass parts: ALiBi slopes, the FoX forget gate, and a fixed gate that is exactly ALiBi."""

from __future__ import annotations

import math

import pytest
import torch

from accrot.ops.attention import causal_attention, naive_attention, naive_decay_bias
from accrot.position import ConfigError, SchemeConfig, build
from accrot.position.alibi import alibi_slopes
from accrot.position.forget import alibi_matching_bias
from tests.helpers.tolerance import assert_close

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py


def inputs(B=2, T=23, H=4, D=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=gen, dtype=torch.float64) for _ in range(3))
    x = torch.randn(B, T, H * D, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, 256, (B, T), generator=gen)
    return q, k, v, x, tokens


def test_alibi_slopes_power_of_two():
    assert alibi_slopes(8) == [2.0**-h for h in range(1, 9)]
    assert alibi_slopes(4) == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]
    assert alibi_slopes(1) == [2.0**-8]


# Press et al.'s rule for H not a power of two: the slopes of the closest power of two n below H (2^(−8i/n),
# i = 1..n), then every other slope of 2n heads (2^(−4i/n), i odd) until there are H. Derived by hand:
ALIBI_NON_POWER_OF_TWO = {
    3: [2.0**-4, 2.0**-8] + [2.0**-2],  # n = 2: 2^-4, 2^-8; 4 heads' 2^-2, 2^-4, 2^-6, 2^-8 -> 2^-2
    6: [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8] + [2.0**-1, 2.0**-3],  # n = 4; 8 heads' odd ones: 2^-1, 2^-3
    12: [2.0**-h for h in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5],  # n = 8; 16 heads' 2^-h/2
}


@pytest.mark.parametrize("heads", sorted(ALIBI_NON_POWER_OF_TWO))
def test_alibi_slopes_follow_the_reference_interleaving(heads):
    assert alibi_slopes(heads) == pytest.approx(ALIBI_NON_POWER_OF_TWO[heads], rel=1e-15)


def test_alibi_log_decay_and_bias():
    scheme = build(SchemeConfig(far_mass="alibi"), d_model=32, n_heads=4)
    _, _, _, x, tokens = inputs(T=9)
    log_f = scheme.far_mass.log_decay(x, tokens)
    assert log_f.shape == (1, 4, 9) and log_f.dtype == torch.float32
    assert scheme.log_decay(x, tokens).shape == (2, 4, 9)
    m = torch.tensor(alibi_slopes(4), dtype=torch.float64)
    bias = naive_decay_bias(log_f)[0]  # [H, T, T]
    t, s = torch.arange(9).view(9, 1), torch.arange(9).view(1, 9)
    expect = -m.view(4, 1, 1) * (t - s).clamp_min(0)  # −m_h (t − s) on and below the diagonal
    torch.testing.assert_close(bias, expect.to(bias), rtol=0, atol=1e-6)
    assert scheme.describe()["alibi_slopes"] == alibi_slopes(4)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
def test_alibi_scheme_matches_naive(device):
    scheme = build(SchemeConfig(far_mass="alibi", block_size=8), d_model=32, n_heads=4).to(device)
    q, k, v, x, tokens = inputs()
    m = torch.tensor(alibi_slopes(4), dtype=torch.float64).view(1, 4, 1, 1)
    T = q.shape[2]
    offset = (torch.arange(T).view(T, 1) - torch.arange(T).view(1, T)).double()
    fast = scheme(*(t.to(device) for t in (q, k, v, x, tokens)))
    assert fast.device.type == device
    assert_close(naive_attention(q, k, v, -m * offset), fast, 1e-10)


def test_forget_bias_init_matches_alibi_slopes():
    bias = torch.tensor(alibi_matching_bias(12), dtype=torch.float64)
    torch.testing.assert_close(
        torch.nn.functional.logsigmoid(bias), -torch.tensor(alibi_slopes(12), dtype=torch.float64)
    )
    gate = build(SchemeConfig(far_mass="forget", forget_init="alibi"), d_model=48, n_heads=12).far_mass
    assert torch.equal(gate.proj.weight, torch.zeros_like(gate.proj.weight))
    torch.testing.assert_close(gate.proj.bias.double(), bias, rtol=1e-6, atol=0)
    for init in ("alibi", "fox"):
        custom = build(SchemeConfig(far_mass="forget", forget_init=init, forget_bias_init=3.0), d_model=8, n_heads=2)
        assert custom.far_mass.proj.bias.tolist() == [3.0, 3.0]


def test_fox_default_init_forgets_half_per_token():
    """FoX's own init (the default): weight N(0, 0.02), bias 0, so f = sigmoid(w·x) ≈ 1/2 for every head, and the
    gate depends on x from the first step (an ALiBi-initialised gate does not)."""
    torch.manual_seed(0)
    gate = build(SchemeConfig(far_mass="forget"), d_model=256, n_heads=4).far_mass
    assert gate.proj.bias.tolist() == [0.0] * 4
    assert gate.proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    x = torch.randn(2, 50, 256)
    log_f = gate.log_decay(x, torch.zeros(2, 50, dtype=torch.long))  # [B, H, T]
    assert log_f.mean().item() == pytest.approx(-math.log(2), abs=0.05)
    assert log_f.std().item() > 0.05


@pytest.mark.parametrize("rotation", ["none", "rope"])
def test_fixed_forget_gate_is_alibi(rotation):
    """w = 0, b_h = −log(e^{m_h} − 1): the forget gate reproduces ALiBi whatever x is."""
    forget = build(SchemeConfig(rotation=rotation, far_mass="forget", forget_init="alibi"), d_model=32, n_heads=4)
    alibi = build(SchemeConfig(rotation=rotation, far_mass="alibi"), d_model=32, n_heads=4)
    q, k, v, x, tokens = inputs(T=40)
    lf, la = forget.log_decay(x, tokens), alibi.log_decay(x, tokens)
    assert lf.shape == la.shape == (2, 4, 40)
    torch.testing.assert_close(lf, la, rtol=1e-6, atol=0)
    assert_close(alibi(q, k, v, x, tokens), forget(q, k, v, x, tokens), 1e-6)


def test_forget_gate_is_data_dependent_and_differentiable():
    scheme = build(SchemeConfig(far_mass="forget", block_size=8), d_model=32, n_heads=4)
    with torch.no_grad():
        scheme.far_mass.proj.weight.normal_(std=0.3)
    q, k, v, x, tokens = inputs(T=19)
    x.requires_grad_()
    log_f = scheme.far_mass.log_decay(x, tokens)
    assert log_f.shape == (2, 4, 19) and log_f.dtype == torch.float32 and bool((log_f <= 0).all())
    assert log_f.std(dim=-1).min() > 0  # varies with the token
    out = scheme(q, k, v, x, tokens)
    ref = naive_attention(q, k, v, naive_decay_bias(scheme.far_mass.log_decay(x, tokens)))
    assert_close(ref, out, 1e-10)
    g = torch.randn_like(out)
    params = [x, scheme.far_mass.proj.weight, scheme.far_mass.proj.bias]
    for a, b in zip(torch.autograd.grad(ref, params, g), torch.autograd.grad(out, params, g)):
        assert a.abs().sum() > 0
        assert_close(a, b, 1e-6)


def test_forget_gate_stays_float32_under_bf16_autocast():
    scheme = build(SchemeConfig(far_mass="forget", block_size=8), d_model=32, n_heads=4)
    with torch.no_grad():
        scheme.far_mass.proj.weight.normal_(std=0.3)
    q, k, v, x, tokens = inputs(T=17)
    x = x.float()
    ref = scheme.far_mass.log_decay(x, tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        log_f = scheme.far_mass.log_decay(x, tokens)
        out = scheme(q.bfloat16(), k.bfloat16(), v.bfloat16(), x, tokens)
    assert log_f.dtype == torch.float32 and torch.equal(log_f, ref)
    assert out.dtype == torch.bfloat16
    # parameters cast to bf16 (bf16-true training) still give a float32 gate
    assert scheme.to(torch.bfloat16).far_mass.log_decay(x.bfloat16(), tokens).dtype == torch.float32


def test_alibi_slopes_survive_a_module_cast():
    scheme = build(SchemeConfig(far_mass="alibi"), d_model=24, n_heads=3).to(torch.bfloat16)
    _, _, _, x, tokens = inputs(H=3, T=5)
    log_f = scheme.log_decay(x.bfloat16(), tokens)
    assert log_f.dtype == torch.float32
    assert log_f[0, :, 0].tolist() == pytest.approx([-m for m in ALIBI_NON_POWER_OF_TWO[3]], rel=1e-7)


def test_far_mass_prefix_invariance():
    scheme = build(SchemeConfig(far_mass="forget", block_size=16), d_model=32, n_heads=4).eval()
    with torch.no_grad():
        scheme.far_mass.proj.weight.normal_(std=0.3)
    q, k, v, x, tokens = inputs(T=70)
    full = scheme(q, k, v, x, tokens)
    short = scheme(q[:, :, :37], k[:, :, :37], v[:, :, :37], x[:, :37], tokens[:, :37])
    assert_close(full[:, :, :37], short, 1e-12)


def test_none_far_mass_is_zero_decay():
    scheme = build(SchemeConfig(), d_model=16, n_heads=2)
    q, k, v, x, tokens = inputs(H=2, T=11)
    assert torch.equal(scheme.log_decay(x, tokens), torch.zeros(2, 2, 11))
    assert_close(causal_attention(q, k, v), scheme(q, k, v, x, tokens), 1e-14)


def test_unknown_far_mass_is_a_config_error():
    with pytest.raises(ConfigError, match="far_mass"):
        SchemeConfig(far_mass="xpos")
    assert math.isfinite(alibi_matching_bias(1)[0])

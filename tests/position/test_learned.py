"""Learned increments as their references build them: Selective RoPE's learned angles (the default form), accrot's
earlier plain form, GRAPE's softplus phase, each against an independent float64 twin (outputs and gradients), and
scheme dicts saved before these defaults, which must still mean what they meant."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from accrot.ops.rotary import TWO_PI
from accrot.position import SchemeConfig, build
from accrot.position.accum import SOFTPLUS_INIT_OMEGA, causal_depthwise_conv
from accrot.position.config import saved_scheme
from accrot.position.rope import rope_frequencies
from tests.helpers.tolerance import assert_close

H, D = 2, 8
DM, P = H * D, D // 2

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py


def wrap(theta: torch.Tensor) -> torch.Tensor:
    return torch.remainder(theta + math.pi, TWO_PI) - math.pi


def layer_input(B=2, T=19, seed=0, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, DM, generator=gen, dtype=dtype), torch.zeros(B, T, dtype=torch.long)


# -- the causal convolution ----------------------------------------------------------------------------------
@pytest.mark.parametrize("K", [1, 3, 4])
def test_causal_depthwise_conv_is_conv1d_padded_on_the_left(K):
    """The shifted multiply-adds against torch's own depthwise conv1d (left padding K − 1), outputs and gradients
    in float64, at a length shorter than the filter too."""
    gen = torch.Generator().manual_seed(K)
    for T in (2, 17):
        u = torch.randn(3, T, 5, generator=gen, dtype=torch.float64, requires_grad=True)
        w = torch.randn(5, 1, K, generator=gen, dtype=torch.float64, requires_grad=True)
        ref = F.conv1d(F.pad(u.transpose(1, 2), (K - 1, 0)), w, groups=5).transpose(1, 2)  # [B, T, C]
        got = causal_depthwise_conv(u, w)
        assert got.shape == ref.shape and got.stride(-1) == 1
        assert_close(ref, got, 1e-14)
        g = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
        for name, a, b in zip("uw", torch.autograd.grad(ref, (u, w), g), torch.autograd.grad(got, (u, w), g)):
            assert_close(a, b, 1e-14, name)


# -- Selective RoPE's learned angles (the default) -----------------------------------------------------------
def selective_twin(source, x: torch.Tensor, cfg: SchemeConfig) -> torch.Tensor:
    """δ as Selective RoPE's ``SelectiveRoPE`` writes it (per-head l2 norm, low-rank projection, then its
    ShortConvolution: an ``nn.Conv1d`` padded by K − 1 on both sides cut to the first T outputs, no activation),
    times the RoPE-ladder temperature, with accrot's soft bound ℓ·M·tanh(φ/M). ``[B, H, T, P]`` float64."""
    B, T, _ = x.shape
    h = x.unflatten(-1, (H, DM // H))
    h = (h / h.norm(dim=-1, keepdim=True)).flatten(-2)  # [B, T, d_model]
    phi = source.up(source.down(h)).transpose(1, 2)  # [B, H·P, T]
    K = source.conv.weight.shape[-1]
    phi = F.conv1d(phi, source.conv.weight, padding=K - 1, groups=H * P)[..., :T]  # [B, H·P, T]
    phi = phi.unflatten(1, (H, P)).transpose(-1, -2)  # [B, H, T, P]
    temperature = 1.0 / cfg.ladder_base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)  # [P]
    M = cfg.max_increment
    return temperature * M * torch.tanh(phi / M)


def test_defaults_are_selective_ropes():
    """Rank 16, a width-4 convolution after the projection, no bias, RoPE's ladder at base 500 000, bound π, every
    weight N(0, 0.02); a config dict saved by the run holds these values, not Nones."""
    cfg = SchemeConfig(rotation="accum", increments="learned")
    assert (cfg.increment_rank, cfg.conv_size, cfg.learned_ladder, cfg.ladder_base) == (16, 4, True, 500000.0)
    assert cfg.max_increment == math.pi and cfg.learned_form == "selective" and cfg.learned_init_std == 0.02
    torch.manual_seed(0)
    source = build(cfg, 256, 4).rotation.source
    assert source.down.weight.shape == (16, 256) and source.up.weight.shape == (128, 16)
    assert source.up.bias is None and source.conv.bias is None and source.conv.weight.shape == (128, 1, 4)
    for weight in (source.down.weight, source.up.weight, source.conv.weight):
        assert weight.std().item() == pytest.approx(0.02, rel=0.15)
    assert SchemeConfig(**dataclasses.asdict(cfg)) == cfg
    # the other kinds leave the learned options unset
    assert SchemeConfig(rotation="accum").increment_rank is None and SchemeConfig(rotation="rope").conv_size is None


def test_selective_increments_match_the_reference_formula():
    """δ and θ = Σ δ against :func:`selective_twin`, and their gradients to x and to every parameter (float64)."""
    cfg = SchemeConfig(rotation="accum", increments="learned", learned_init_std=0.4, max_increment=1.5,
                       ladder_base=100.0)
    scheme = build(cfg, DM, H).double()
    source = scheme.rotation.source
    x, tokens = layer_input()
    x.requires_grad_()
    ref = selective_twin(source, x, cfg)
    assert ref.abs().amax() > 0.3  # far from linear: the bound matters at this scale
    delta = scheme.rotation.increments(x, tokens)
    theta = scheme.angles(x, tokens)
    assert_close(ref, delta, 1e-6)  # the increments are float32 by contract
    assert_close(wrap(ref.cumsum(-2)), theta, 1e-5)
    params = [x, source.down.weight, source.up.weight, source.conv.weight]
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for name, a, b in zip("x down up conv".split(), torch.autograd.grad(ref.cumsum(-2), params, g),
                          torch.autograd.grad(theta, params, g.float())):
        assert_close(a, b, 1e-5, name)


def test_the_default_bound_clips_nothing_at_init():
    """At the reference init the tanh is the identity to 1e-6 (|u| ~ 1e-4 ≪ π): δ is Selective RoPE's unbounded
    ℓ·φ, and every increment is far inside its bound."""
    torch.manual_seed(0)
    cfg = SchemeConfig(rotation="accum", increments="learned")
    scheme = build(cfg, 96, 4).double()
    x = torch.randn(4, 128, 96, dtype=torch.float64)
    u = scheme.rotation.source.pre_activation(x) * cfg.max_increment  # [B, H, T, P] = φ, before the ladder
    ladder = rope_frequencies(24, 500000.0)
    delta = scheme.rotation.increments(x, torch.zeros(4, 128, dtype=torch.long))
    assert u.abs().max() < 1e-2
    assert_close(ladder * u, delta, 1e-6)


def test_plain_form_is_the_earlier_parameterisation():
    """``plain`` with the earlier values: δ = tanh(W x + b), one full-rank projection of the raw input with a
    zero-initialised bias, bound 1, no ladder: the same parameters (and names) the earlier checkpoints hold."""
    cfg = SchemeConfig(rotation="accum", increments="learned", learned_form="plain", increment_rank=0, conv_size=0,
                       learned_ladder=False, max_increment=1.0)
    scheme = build(cfg, DM, H).double()
    assert sorted(scheme.state_dict()) == ["rotation.source.up.bias", "rotation.source.up.weight"]
    source = scheme.rotation.source
    assert torch.equal(source.up.bias, torch.zeros_like(source.up.bias))
    with torch.no_grad():
        source.up.bias.normal_()
    x, tokens = layer_input()
    ref = torch.tanh(F.linear(x, source.up.weight, source.up.bias)).unflatten(-1, (H, P)).transpose(1, 2)
    assert_close(ref, scheme.rotation.increments(x, tokens), 1e-6)


# -- GRAPE's softplus phase ----------------------------------------------------------------------------------
def softplus_scheme(**extra) -> torch.nn.Module:
    scheme = build(SchemeConfig(rotation="accum", increments="softplus", **extra), DM, H).double()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a token-dependent rate and a ladder moved away from its init
        source = scheme.rotation.source
        source.gate.weight.normal_(std=0.4, generator=gen)
        source.log_freq.add_(0.5 * torch.randn(P, generator=gen, dtype=torch.float64))
    return scheme


def test_softplus_angles_match_grapes_exclusive_phase():
    """θ_t,i = exp(λ_i) · Σ_{j<t} softplus(w·x_j + b) (GRAPE's Φ_t times its learnable frequencies) against the
    scheme's angles, every head alike, with gradients to x, w, b and λ (float64)."""
    scheme = softplus_scheme()
    source = scheme.rotation.source
    x, tokens = layer_input(T=23)
    x.requires_grad_()
    omega = F.softplus(x @ source.gate.weight[0] + source.gate.bias[0])  # [B, T]
    phase = omega.cumsum(-1) - omega  # [B, T] exclusive, as GRAPE writes it
    ref = phase[:, None, :, None] * source.log_freq.exp()  # [B, 1, T, P]
    theta = scheme.angles(x, tokens)
    assert theta.shape == (2, H, 23, P) and theta.dtype == torch.float32
    assert torch.equal(theta[:, 0], theta[:, 1])
    assert_close(wrap(ref.expand_as(theta)), theta, 1e-5)
    delta = scheme.rotation.increments(x, tokens)  # the inclusive-convention increments of the contract
    assert delta.shape == (2, H, 23, P) and bool((delta >= 0).all()) and bool((delta[:, :, 0] == 0).all())
    assert_close(wrap(delta.double().cumsum(-2)), theta, 1e-5)
    params = [x, source.gate.weight, source.gate.bias, source.log_freq]
    g = torch.randn(theta.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    for name, a, b in zip("x w b λ".split(), torch.autograd.grad(ref.expand_as(g), params, g),
                          torch.autograd.grad(theta, params, g.float())):
        assert_close(a, b, 1e-5, name)


def test_softplus_starts_as_a_slowed_rope():
    """GRAPE's init (w = 0, ω = 10⁻³): θ_t = 10⁻³ · t · ω_i, RoPE's angles a thousand times slower, for any x."""
    scheme = build(SchemeConfig(rotation="accum", increments="softplus"), DM, H).double()
    x, tokens = layer_input(T=300)
    theta = scheme.angles(x, tokens)
    expect = SOFTPLUS_INIT_OMEGA * torch.arange(300, dtype=torch.float64)[:, None] * rope_frequencies(D)
    assert_close(expect.expand_as(theta), theta, 1e-6)
    assert scheme.describe()["softplus_ladder"] == pytest.approx(rope_frequencies(D).tolist(), rel=1e-6)


def test_softplus_angles_stay_float32_under_bf16_autocast():
    scheme = softplus_scheme().float()
    x, tokens = layer_input(dtype=torch.float32)
    ref = scheme.angles(x, tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(scheme.angles(x, tokens), ref)
        assert scheme.angles(x.bfloat16(), tokens).dtype == torch.float32


# -- scheme dicts saved before the reference defaults -------------------------------------------------------
EARLIER = {  # a checkpoint's scheme hyperparameters as the earlier version saved them (every field it had)
    "rotation": "accum", "far_mass": "forget", "rotate_values": True, "rope_base": 10000.0, "increments": "learned",
    "increment_mean": "zero", "increment_spread": "constant", "increment_family": "gaussian", "window": None,
    "sigma": None, "window_eps": 0.05, "resample": True, "seed": 0, "vocab_size": 256, "max_increment": 1.0,
    "increment_rank": None, "conv_size": 0, "learned_ladder": False, "learned_init_std": 0.02,
    "forget_bias_init": None, "beta_max": 2.0, "path_rank": None, "chunk_size": 32, "path_kernel": "chunked",
    "block_size": 128,
}


def test_a_scheme_saved_before_the_reference_defaults_means_what_it_meant():
    """An earlier accum-learned checkpoint loads as the plain full-rank form with its ALiBi-initialised gate, an
    earlier PaTH as the full-rank, unconvolved w with PyTorch's init; the module has the earlier parameters."""
    learned = SchemeConfig.of(EARLIER)
    assert (learned.learned_form, learned.increment_rank, learned.conv_size, learned.learned_ladder) == (
        "plain", 0, 0, False)
    assert learned.max_increment == 1.0 and learned.forget_init == "alibi"
    names = sorted(k for k in build(learned, DM, H).state_dict() if k.startswith("rotation"))
    assert names == ["rotation.source.up.bias", "rotation.source.up.weight"]
    path = SchemeConfig.of({**EARLIER, "rotation": "path", "increments": None, "rotate_values": False})
    assert (path.path_rank, path.conv_size, path.learned_init_std) == (0, 0, None)
    # a dict of this version, and a partial dict a user writes, are read as they are
    now = dataclasses.asdict(SchemeConfig(rotation="path"))
    assert saved_scheme(now) == now and SchemeConfig.of(now).path_rank == 32
    assert SchemeConfig.of({"rotation": "accum", "increments": "learned"}).learned_form == "selective"

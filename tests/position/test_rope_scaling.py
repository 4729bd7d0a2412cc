"""Evaluation-time RoPE extensions (accrot.position.rope_scaling): each scaling against its formula written out per
frequency pair, the identity at factor 1, the dynamic factor, and the scaled scheme's attention against the naive
SO(2) twin with the scaled frequencies and YaRN's temperature."""

from __future__ import annotations

import math

import pytest
import torch

from accrot.ops.rotary import naive_so2_attention
from accrot.position import ConfigError, SchemeConfig, build
from accrot.position.rope import rope_frequencies
from accrot.position.rope_scaling import (
    SCALINGS,
    RopeScaling,
    apply_rope_scaling,
    logit_scale,
    scaled_frequencies,
)
from tests.helpers.tolerance import assert_close

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py

BASE, L = 10000.0, 128


def per_pair(kind: str, D: int, s: float, base: float = BASE, length: int = L) -> list[float]:
    """The published formulas, one pair at a time in plain floats (the code forms as the YaRN authors' and Llama
    3.1's code write them; tests/peers/ compares them with transformers' own functions)."""
    out = []
    for i in range(D // 2):
        w = base ** (-2 * i / D)
        turns = length / (2 * math.pi / w)  # r = L / λ, λ = 2π / ω
        if kind == "pi":
            out.append(w / s)
        elif kind == "ntk":
            out.append((base * s ** (D / (D - 2))) ** (-2 * i / D))
        elif kind == "yarn":  # the ramp in the pair index, between the indices where a pair turns 32 and 1 times
            def dim(r):
                return D * math.log(length / (r * 2 * math.pi)) / (2 * math.log(base))
            low, high = max(math.floor(dim(32)), 0), min(math.ceil(dim(1)), D - 1)
            high = high + 0.001 if high == low else high
            kept = 1 - min(1.0, max(0.0, (i - low) / (high - low)))
            out.append(kept * w + (1 - kept) * w / s)
        elif kind == "yarn-paper":  # the ramp in the turns: α = 1, β = 32
            gamma = min(1.0, max(0.0, (turns - 1) / (32 - 1)))
            out.append((1 - gamma) * w / s + gamma * w)
        else:  # llama3: kept above 4 turns, ÷ s below 1 turn, blended between
            if turns > 4:
                out.append(w)
            elif turns < 1:
                out.append(w / s)
            else:
                smooth = (turns - 1) / (4 - 1)
                out.append((1 - smooth) * w / s + smooth * w)
    return out


@pytest.mark.parametrize("kind", SCALINGS)
@pytest.mark.parametrize("D", [8, 32, 64])
@pytest.mark.parametrize("s", [2.0, 8.0, 37.5])
def test_each_scaling_is_its_formula_pair_by_pair(kind, D, s):
    got = scaled_frequencies(rope_frequencies(D, BASE), kind, s, L, BASE)
    assert got.dtype == torch.float64 and got.shape == (D // 2,)
    assert_close(torch.tensor(per_pair(kind, D, s), dtype=torch.float64), got, rtol=1e-12, atol=0.0, name=kind)


@pytest.mark.parametrize("kind", SCALINGS)
def test_factor_one_is_the_identity(kind):
    omega = rope_frequencies(32, BASE)
    assert_close(omega, scaled_frequencies(omega, kind, 1.0, L, BASE), rtol=1e-15, atol=0.0)
    assert logit_scale(kind, 1.0) == 1.0


def test_what_each_scaling_keeps_and_interpolates():
    D, s = 64, 8.0
    omega = rope_frequencies(D, BASE)
    ntk = scaled_frequencies(omega, "ntk", s, L, BASE)
    assert ntk[0] == 1.0 and math.isclose(ntk[-1] / omega[-1], 1 / s, rel_tol=1e-12)  # fastest kept, slowest ÷ s
    turns = L * omega / (2 * math.pi)
    for kind in ("yarn", "yarn-paper"):
        yarn = scaled_frequencies(omega, kind, s, L, BASE)
        assert torch.equal(yarn[turns >= 32], omega[turns >= 32])  # many turns within L: kept
        assert_close(omega[turns <= 1] / s, yarn[turns <= 1], rtol=1e-15, atol=0.0)  # under one turn: interpolated
    assert scaled_frequencies(omega, "yarn", s, L, BASE)[0] == 1.0  # the code form keeps pair 0 (20 turns in L)
    assert scaled_frequencies(omega, "yarn-paper", s, L, BASE)[0] < 1.0  # the paper form ramps it
    assert math.isclose(logit_scale("yarn", s), (0.1 * math.log(s) + 1) ** 2)
    assert logit_scale("yarn-paper", s) == logit_scale("yarn", s)
    assert logit_scale("pi", s) == logit_scale("ntk", s) == logit_scale("llama3", s) == 1.0
    assert logit_scale("yarn", 0.5) == 1.0


def _scheme(scaling: RopeScaling | None, D: int = 8, H: int = 2):
    torch.manual_seed(0)
    scheme = build(SchemeConfig(rotation="rope"), H * D, H).double()
    assert apply_rope_scaling(scheme, scaling) == 1
    return scheme


@pytest.mark.parametrize("kind", SCALINGS)
def test_scaled_attention_equals_the_naive_twin_with_scaled_frequencies_and_temperature(kind):
    """T = 3 L' with L' = 12 and the dynamic factor (s = 3): attention equals the path-product twin fed with
    constant increments ω' and q multiplied by the logit scale."""
    B, H, T, D, Lt = 2, 2, 36, 8, 12
    scheme = _scheme(RopeScaling(kind, Lt), D, H)
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
    x, tokens = torch.randn(B, T, H * D, dtype=torch.float64), torch.zeros(B, T, dtype=torch.long)
    out = scheme(q, k, v, x, tokens)
    omega = torch.tensor(per_pair(kind, D, 3.0, length=Lt), dtype=torch.float64)
    ref = naive_so2_attention(q * logit_scale(kind, 3.0), k, v, omega.expand(1, H, T, D // 2))
    assert_close(ref, out, rtol=1e-5, name=f"{kind} attention")
    plain = _scheme(None, D, H)(q, k, v, x, tokens)
    assert not torch.allclose(plain, out)  # the extension changed the model


def test_dynamic_factor_follows_the_length_and_never_goes_below_one():
    scheme = _scheme(RopeScaling("yarn", 16))
    x = torch.zeros(1, 64, 16, dtype=torch.float64)
    at = {T: scheme.angles(x[:, :T], torch.zeros(1, T, dtype=torch.long)) for T in (8, 16, 64)}
    plain = _scheme(None).angles(x, torch.zeros(1, 64, dtype=torch.long))
    assert torch.equal(at[8], plain[:, :, :8]) and torch.equal(at[16], plain[:, :, :16])  # s = max(1, T / L) = 1
    fixed = _scheme(RopeScaling("yarn", 16, factor=4.0)).angles(x, torch.zeros(1, 64, dtype=torch.long))
    assert torch.equal(at[64], fixed)  # T = 4 L: s = 4
    assert not torch.equal(at[64], plain)


def test_removing_the_scaling_restores_the_trained_model():
    scheme = _scheme(RopeScaling("pi", 4, factor=2.0))
    x, tokens = torch.zeros(1, 8, 16, dtype=torch.float64), torch.zeros(1, 8, dtype=torch.long)
    scaled = scheme.angles(x, tokens)
    apply_rope_scaling(scheme, None)
    assert torch.equal(scheme.angles(x, tokens), _scheme(None).angles(x, tokens))
    assert not torch.equal(scaled, scheme.angles(x, tokens))


@pytest.mark.parametrize("args, message", [
    (("yarm", 128), "rope_scaling='yarm' is not valid; choose one of pi, ntk, yarn, yarn-paper, llama3"),
    (("yarn", 128, 0.0), "rope_factor=0.0 is not valid; a positive number"),
    (("pi", 128, -2), "rope_factor=-2 is not valid"),
    (("ntk", 0), "train_length=0 is not valid"),
])
def test_bad_scalings_are_one_line_config_errors(args, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RopeScaling(*args)


def test_a_model_without_rope_refuses_an_extension():
    nope = build(SchemeConfig(), 16, 2)
    with pytest.raises(ConfigError, match="rope_scaling='yarn' needs a RoPE model"):
        apply_rope_scaling(nope, RopeScaling("yarn", 128))
    assert apply_rope_scaling(nope, None) == 0

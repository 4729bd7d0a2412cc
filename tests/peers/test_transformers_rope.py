"""accrot's RoPE extensions against Hugging Face ``transformers``' own rope-init functions (``ROPE_INIT_FUNCTIONS``),
the code most published extension numbers come from: every scaled frequency and YaRN's logit factor over a grid of
head dims, training lengths and factors.

Tolerance: transformers computes in float32 (its ``base ** (arange / dim)``, then the ramps), accrot in float64; the
bar is relative 1e-6 per frequency (float32's ε is 1.2e-7, a few roundings deep), far below what separates two
forms (YaRN's paper and code forms differ by factors of order one on the fast pairs at short L, checked below).
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from accrot.ops.rotary import rope_frequencies
from accrot.position.rope_scaling import logit_scale, scaled_frequencies, yarn_kept_share
from tests.helpers.peers import peer
from tests.helpers.tolerance import assert_close

BASE = 10000.0
HEAD_DIMS = (8, 24, 64, 128)  # 24: the study's head width; 8: fewer pairs than YaRN's correction range spans
LENGTHS = (64, 128, 512, 4096)  # 128: the study's L, where even the fastest pair turns fewer than 32 times
FACTORS = (1.0, 1.5, 2.0, 8.0, 37.5, 64.0)
RTOL = 1e-6


@pytest.fixture(scope="module")
def hf():
    """transformers' rope-init functions and its config class, its advisory logging (about keys a rope type does
    not read) kept out of the test's output."""
    rope_utils = peer("transformers.modeling_rope_utils", "transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers import PretrainedConfig

    return rope_utils.ROPE_INIT_FUNCTIONS, PretrainedConfig


def hf_frequencies(hf, rope_type: str, D: int, L: int, factor: float, seq_len: int | None = None,
                   **extra) -> tuple[torch.Tensor, float]:
    """(inverse frequencies ``[D/2]``, attention factor) from transformers for a model of head dim D trained at L."""
    functions, config_class = hf
    params = {"rope_type": rope_type, "rope_theta": BASE, "factor": factor, **extra}
    # the YaRN and Llama-3 functions read the original context; max_position_embeddings is the extended one
    config = config_class(hidden_size=D, num_attention_heads=1, rope_parameters=params,
                          max_position_embeddings=L if rope_type == "dynamic" else max(L + 1, round(factor * L)))
    inv_freq, attention_factor = functions[rope_type](config, "cpu", seq_len)
    return inv_freq.double(), float(attention_factor)


GRID = [pytest.param(D, L, s, id=f"D{D}-L{L}-s{s:g}") for D in HEAD_DIMS for L in LENGTHS for s in FACTORS]


@pytest.mark.parametrize("D, L, s", GRID)
def test_yarn_is_transformers_yarn(hf, D, L, s):
    """Frequencies and the logit factor: transformers multiplies cos and sin by its attention factor a, so each
    logit q·k carries a², which is what accrot multiplies the logits by."""
    ref, a = hf_frequencies(hf, "yarn", D, L, s, original_max_position_embeddings=L)
    got = scaled_frequencies(rope_frequencies(D, BASE), "yarn", s, L, BASE)
    assert_close(ref, got, rtol=RTOL, atol=0.0, name=f"yarn D{D} L{L} s{s}")
    assert math.isclose(logit_scale("yarn", s), a * a, rel_tol=1e-12)


@pytest.mark.parametrize("D, L, s", GRID)
def test_pi_is_transformers_linear(hf, D, L, s):
    ref, a = hf_frequencies(hf, "linear", D, L, s)
    assert_close(ref, scaled_frequencies(rope_frequencies(D, BASE), "pi", s, L, BASE), rtol=RTOL, atol=0.0)
    assert a == 1.0 and logit_scale("pi", s) == 1.0


@pytest.mark.parametrize("D, L, s", GRID)
def test_dynamic_ntk_at_length_sL_is_transformers_dynamic(hf, D, L, s):
    """accrot's NTK with the dynamic factor s = T / L at T = s·L is transformers' ``dynamic`` at factor 1 and
    seq_len T (its base b·(f·T/L − (f − 1))^(D/(D−2)) at f = 1)."""
    T = round(s * L)
    ref, a = hf_frequencies(hf, "dynamic", D, L, 1.0, seq_len=T)
    got = scaled_frequencies(rope_frequencies(D, BASE), "ntk", max(1.0, T / L), L, BASE)
    assert_close(ref, got, rtol=RTOL, atol=0.0, name=f"ntk D{D} L{L} T{T}")
    assert a == 1.0 and logit_scale("ntk", s) == 1.0


@pytest.mark.parametrize("D, L, s", GRID)
def test_llama3_is_transformers_llama3(hf, D, L, s):
    ref, a = hf_frequencies(hf, "llama3", D, L, s, original_max_position_embeddings=L, low_freq_factor=1.0,
                            high_freq_factor=4.0)
    assert_close(ref, scaled_frequencies(rope_frequencies(D, BASE), "llama3", s, L, BASE), rtol=RTOL, atol=0.0)
    assert a == 1.0 and logit_scale("llama3", s) == 1.0


def test_the_grid_reaches_every_branch_of_the_code_forms():
    """The grid is not all identities: YaRN's ramp is clamped at index 0 (L short) and not (L long), has kept,
    ramped and interpolated pairs; Llama-3's three bands all occur."""
    clamped = [L for L in LENGTHS if yarn_kept_share(32, L, BASE)[0] == 1.0 and L * 1.0 / (2 * math.pi) < 32]
    assert clamped == [64, 128]  # the fastest pair turns L/2π < 32 times, yet the code form keeps it whole
    share = yarn_kept_share(64, 4096, BASE)
    assert (share == 1).any() and ((share > 0) & (share < 1)).any() and (share == 0).any()
    omega = rope_frequencies(64, BASE)
    wavelength = 2 * math.pi / omega
    assert (wavelength < 512 / 4).any() and (wavelength > 512).any()
    assert ((wavelength >= 512 / 4) & (wavelength <= 512)).any()


def test_the_paper_form_is_not_the_code_form_at_the_study_length(hf):
    """At L = 128 and head dim 24 (the study's), the paper form interpolates the fastest pair part way while the
    code form keeps it: the two differ by large factors there, and only the code form is transformers'."""
    D, L, s = 24, 128, 16.0
    ref, _ = hf_frequencies(hf, "yarn", D, L, s, original_max_position_embeddings=L)
    omega = rope_frequencies(D, BASE)
    paper = scaled_frequencies(omega, "yarn-paper", s, L, BASE)
    assert ref[0] == pytest.approx(1.0, rel=RTOL)  # pair 0 kept whole by the code form
    assert paper[0] < 0.7  # the paper form: γ_0 = (128/2π − 1)/31 ≈ 0.62 kept, the rest ÷ 16
    assert ((paper - ref).abs() / ref).max() > 0.3

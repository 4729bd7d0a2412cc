"""The counter-based draws (accrot/ops/counter_rng.py) against their naive twins (Python ints), their statistics,
and — on a GPU — the same bits on CUDA as on the CPU."""

from __future__ import annotations

import math

import pytest
import torch

from accrot.ops.counter_rng import (
    naive_splitmix64,
    naive_standard_normal,
    naive_standard_uniform,
    splitmix64,
    standard_normal,
    standard_uniform,
)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
KEYS = [0, 1, 0x9E3779B97F4A7C15 >> 1, (1 << 63) - 1]  # mix_seed gives 63-bit keys


def unsigned(t: torch.Tensor) -> list[int]:
    return [v & ((1 << 64) - 1) for v in t.tolist()]


@pytest.mark.parametrize("key", KEYS, ids=lambda k: f"key{k:x}")
def test_bits_equal_the_naive_twin(key):
    counters = [0, 1, 2, 12345, (1 << 31) - 1, 1 << 32, (1 << 40) + 7, (1 << 62) - 1]
    got = unsigned(splitmix64(key, torch.tensor(counters)))
    assert got == [naive_splitmix64(key, c) for c in counters]


def test_known_splitmix64_outputs():
    """SplitMix64 seeded by 1234567: the published first outputs (Vigna's splitmix64.c)."""
    got = unsigned(splitmix64(1234567, torch.arange(3)))
    assert got == [6457827717110365317, 3203168211198807973, 9817491932198370423]


@pytest.mark.parametrize("family", ["normal", "uniform"])
def test_floats_equal_the_naive_twin(family):
    key, counters = 77, torch.arange(2000) * 1_000_003
    fast = (standard_normal if family == "normal" else standard_uniform)(key, counters)
    ref_fn = naive_standard_normal if family == "normal" else naive_standard_uniform
    ref = torch.tensor([ref_fn(key, int(c)) for c in counters], dtype=torch.float64).to(torch.float32)
    assert fast.dtype == torch.float32
    # identical up to a last-bit difference of float64 log/cos between libraries (rare, one float32 ulp)
    ulp = torch.finfo(torch.float32).eps * ref.abs().clamp_min(1e-30)
    assert bool(((fast - ref).abs() <= ulp).all()) and float((fast == ref).double().mean()) > 0.999


def test_any_element_is_computed_alone():
    """Element i of a stream does not depend on which other elements are drawn with it (rank-local rows)."""
    key = 5
    whole = standard_normal(key, torch.arange(1000))
    part = standard_normal(key, torch.arange(1000)[3::4])
    assert torch.equal(whole[3::4], part)
    assert torch.equal(standard_normal(key, torch.arange(6).view(2, 3)), whole[:6].view(2, 3))


def test_statistics():
    n = 200_000
    z = standard_normal(11, torch.arange(n)).double()
    u = standard_uniform(11, torch.arange(n)).double()
    se = 1 / math.sqrt(n)
    assert abs(float(z.mean())) < 5 * se and abs(float(z.std()) - 1) < 5 * se
    assert abs(float(u.mean())) < 5 * se and abs(float(u.std()) - 1) < 5 * se
    assert float(u.abs().max()) <= math.sqrt(3) and float(z.abs().max()) < 6.7
    assert abs(float((z > 1.959964).double().mean()) - 0.025) < 0.002  # a gaussian tail, not just two moments
    neighbours = float((z[1:] * z[:-1]).mean())  # consecutive counters are uncorrelated
    keys = float((z * standard_normal(12, torch.arange(n)).double()).mean())  # neighbouring keys too
    assert abs(neighbours) < 5 * se and abs(keys) < 5 * se


def test_counter_must_be_int64():
    with pytest.raises(TypeError, match="int64"):
        splitmix64(0, torch.arange(3, dtype=torch.int32))


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("family", ["normal", "uniform"])
def test_cuda_draws_equal_the_cpu_draws(family):
    """The device draws the same bits (integers exactly; floats to one float32 ulp on the rare element where the
    libraries' float64 log/cos differ in their last bit)."""
    counters = torch.arange(1 << 20)
    fn = standard_normal if family == "normal" else standard_uniform
    assert torch.equal(splitmix64(3, counters.cuda()).cpu(), splitmix64(3, counters))
    cpu, gpu = fn(3, counters), fn(3, counters.cuda()).cpu()
    ulp = torch.finfo(torch.float32).eps * cpu.abs().clamp_min(1e-30)
    assert bool(((gpu - cpu).abs() <= ulp).all()) and float((gpu == cpu).double().mean()) > 0.9999

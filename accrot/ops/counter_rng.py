"""Counter-based random numbers: element i of stream ``key`` is a pure function of (key, i), on any device.

Stream ``key`` is the SplitMix64 sequence seeded by ``key`` (Steele, Lea & Flood, "Fast splittable pseudorandom
number generators", OOPSLA 2014; the seeding generator of xoshiro): its i-th output (i = 0, 1, ...) is

    z = key + (i + 1)·γ  (mod 2⁶⁴),  γ = 0x9E3779B97F4A7C15
    z ← (z ⊕ (z ≫ 30))·0xBF58476D1CE4E5B9;  z ← (z ⊕ (z ≫ 27))·0x94D049BB133111EB;  z ← z ⊕ (z ≫ 31)

computed here with int64 tensor ops (wrapping multiplication, logical shifts by masking the arithmetic ones), so a
draw is made where its tensor lives — no generator state, no host↔device copy — and every device gets the same
bits. Any element can be computed alone, so a DDP rank draws only its own rows of a global batch, and draw n of a
stream needs nothing from draws 0..n−1 (a resumed run continues by knowing n).

Floats: :func:`standard_normal` is Box–Muller from the two 32-bit halves of one output (u₁ = (hi + 1)/2³²
∈ (0, 1], u₂ = lo/2³²; |z| ≤ 6.66), :func:`standard_uniform` the top 53 bits as u ∈ (0, 1) mapped to [−√3, √3];
both in float64, rounded once to float32. The integer bits are identical on every device; the float64 log, cos
and sqrt may differ in their last bit between CPU and CUDA libraries, which survives the float32 rounding for
about one element in 10⁸ (then by one float32 ulp). :func:`naive_splitmix64` is the test twin (Python ints).
"""

from __future__ import annotations

import math

import torch

GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    """The int64 with the same 64 bits as the unsigned ``x``."""
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic on signed integers)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def splitmix64(key: int, counter: torch.Tensor) -> torch.Tensor:
    """Output ``counter`` (int64 ≥ 0, any shape and device) of the SplitMix64 stream ``key``: int64 holding the 64
    output bits (two's complement), same shape and device."""
    if counter.dtype != torch.int64:
        raise TypeError(f"counter must be int64, got {counter.dtype}")
    z = counter * _signed(GOLDEN) + _signed(key + GOLDEN)  # key + (i + 1)·γ, wrapping
    z = (z ^ _shr(z, 30)) * _signed(MIX1)
    z = (z ^ _shr(z, 27)) * _signed(MIX2)
    return z ^ _shr(z, 31)


def naive_splitmix64(key: int, counter: int) -> int:
    """Test twin of :func:`splitmix64` for one counter, in Python's unbounded ints: the unsigned 64-bit output."""
    z = (key + (counter + 1) * GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * MIX2) & _MASK64
    return z ^ (z >> 31)


def standard_normal(key: int, counter: torch.Tensor) -> torch.Tensor:
    """N(0, 1) float32 draws, one per counter: Box–Muller (cos branch) from the two halves of each output."""
    z = splitmix64(key, counter)
    hi, lo = _shr(z, 32), z & 0xFFFFFFFF  # [...] each in [0, 2³²)
    u1 = (hi + 1).to(torch.float64) * 2.0**-32  # (0, 1]: log never sees 0
    u2 = lo.to(torch.float64) * 2.0**-32  # [0, 1)
    return (torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)).to(torch.float32)


def standard_uniform(key: int, counter: torch.Tensor) -> torch.Tensor:
    """Zero-mean, unit-variance uniform float32 draws on [−√3, √3], one per counter (53 bits each)."""
    u = (_shr(splitmix64(key, counter), 11).to(torch.float64) + 0.5) * 2.0**-53  # (0, 1)
    return ((2.0 * u - 1.0) * math.sqrt(3.0)).to(torch.float32)


def naive_standard_normal(key: int, counter: int) -> float:
    """Test twin of :func:`standard_normal` for one counter (float64 before the float32 rounding)."""
    z = naive_splitmix64(key, counter)
    u1, u2 = ((z >> 32) + 1) * 2.0**-32, (z & 0xFFFFFFFF) * 2.0**-32
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def naive_standard_uniform(key: int, counter: int) -> float:
    """Test twin of :func:`standard_uniform` for one counter (float64 before the float32 rounding)."""
    u = ((naive_splitmix64(key, counter) >> 11) + 0.5) * 2.0**-53
    return (2.0 * u - 1.0) * math.sqrt(3.0)

"""The suite's comparison helper (tests/helpers/tolerance.py): rounding noise on a zero reference passes, a real error on
a zero reference fails, the relative bound holds as before, and a failure names the tensor and both norms."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.tolerance import ULPS, assert_close, noise_floor, within


def test_zero_reference_admits_rounding_noise_only():
    ref = torch.zeros(1, 2, 1, 4, dtype=torch.float64)  # dq at T = 1: exactly zero in the twin
    noise = torch.full_like(ref, 1e-17)  # what a fused kernel returned there
    assert_close(ref, noise, 1e-10, "dq")
    for error in (1e-12, 1e-6, 1.0):  # a real error on a zero reference still fails
        assert not within(ref, torch.full_like(ref, error), 1e-10)


def test_relative_bound_is_unchanged_for_a_non_zero_reference():
    ref = torch.randn(4, 5, dtype=torch.float64)
    step = ref.norm() / math.sqrt(ref.numel())  # a uniform error of 1e-10·‖ref‖ in total
    assert within(ref, ref + 0.9e-10 * step, 1e-10)
    assert not within(ref, ref + 1.1e-10 * step, 1e-10)
    assert noise_floor(ref, ref) < 1e-3 * 1e-10 * float(ref.norm())  # the absolute term is negligible here


def test_noise_floor_scales_with_dtype_size_and_scale():
    small, big = torch.zeros(4), torch.zeros(400)
    assert noise_floor(small, small) == pytest.approx(ULPS * torch.finfo(torch.float32).eps * 2)
    assert noise_floor(big, big) == pytest.approx(10 * noise_floor(small, small))
    assert noise_floor(small.double(), small) == noise_floor(small, small)  # the least precise dtype counts
    assert noise_floor(small.double(), small.double()) < noise_floor(small, small) / 1e8
    assert noise_floor(small, small, scale=3.0) == pytest.approx(3 * noise_floor(small, small))


def test_failure_names_the_tensor_the_norms_and_the_tolerance():
    ref = torch.ones(3, dtype=torch.float64)
    with pytest.raises(AssertionError, match=r"dk: ‖ref − fast‖ = 1\.000e-01 > rtol·‖ref‖ \+ atol = 1e-05·1\.732e\+00"):
        assert_close(ref, ref + torch.tensor([0.1, 0, 0], dtype=torch.float64), 1e-5, "dk")
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_close(ref, ref[:2], 1e-5)
    with pytest.raises(AssertionError, match="nan"):  # NaN never compares close
        assert_close(ref, torch.full_like(ref, math.nan), 1e-5)

"""The fused rotation node against the elementwise formula differentiated by autograd (its twin).

Every test runs twice: through the compiled CPU kernels (``ACCROT_CPU_KERNELS=on``) and through the eager
formulas they replace (``off``), so both paths stay checked against the twins.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from accrot.ops import cpu_kernels
from accrot.ops.rotary import (
    accumulate_angles,
    accumulate_angles_reference,
    cos_sin,
    rotate_pairs_cs,
    rotate_pairs_reference,
)


def kernels_or_skip():
    """The compiled kernels; a test skips with the reason where they do not build, and fails under CI=true."""
    try:
        return cpu_kernels.ops()
    except RuntimeError as err:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"the CPU kernels do not build here: {str(err).splitlines()[0]}")


@pytest.fixture(autouse=True, params=["on", "off"], ids=["kernels", "eager"])
def kernel_mode(request, monkeypatch):
    monkeypatch.setenv("ACCROT_CPU_KERNELS", request.param)
    if request.param == "on":
        kernels_or_skip()
    return request.param


@pytest.mark.parametrize("angle_shape", ["full", "batch-broadcast", "batch-and-head-broadcast"])
@pytest.mark.parametrize("angles_learned", [True, False], ids=["learned", "fixed"])
def test_fused_rotation_matches_reference(angle_shape, angles_learned):
    B, H, T, D = 3, 2, 7, 8
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    shape = {"full": (B, H, T, D // 2), "batch-broadcast": (1, H, T, D // 2),
             "batch-and-head-broadcast": (1, 1, T, D // 2)}[angle_shape]
    theta = (3 * torch.randn(shape, generator=gen, dtype=torch.float64)).requires_grad_(angles_learned)
    g = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)

    def run(fn):
        out = fn(x, *cos_sin(theta, x.dtype))
        wrt = [x, theta] if angles_learned else [x]
        return out, torch.autograd.grad(out, wrt, g)

    (fast, fast_grads), (ref, ref_grads) = run(rotate_pairs_cs), run(rotate_pairs_reference)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-12)
    for a, b in zip(fast_grads, ref_grads):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_fused_rotation_keeps_the_input_dtype_and_rotates_in_float32():
    x = torch.randn(1, 2, 5, 4).bfloat16()
    theta = torch.linspace(0, 100, 10).view(1, 1, 5, 2)
    out = rotate_pairs_cs(x, *cos_sin(theta, x.dtype))
    assert out.dtype == torch.bfloat16
    ref = rotate_pairs_reference(x.float(), *cos_sin(theta))
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)  # bf16 rounding of the output only


@pytest.mark.parametrize("angles_learned", [True, False], ids=["learned", "fixed"])
def test_inverse_rotation_matches_negated_sine(angles_learned):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 5, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    theta = torch.randn(1, 3, 5, 3, generator=gen, dtype=torch.float64).requires_grad_(angles_learned)
    g = torch.randn(2, 3, 5, 6, generator=gen, dtype=torch.float64)
    wrt = [x, theta] if angles_learned else [x]
    fast = rotate_pairs_cs(x, *cos_sin(theta, x.dtype), inverse=True)
    cos, sin = cos_sin(theta, x.dtype)  # a graph of its own: the first grad() frees the other's
    ref = rotate_pairs_reference(x, cos, -sin)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-12)
    for a, b in zip(torch.autograd.grad(fast, wrt, g), torch.autograd.grad(ref, wrt, g)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_second_rotation_by_minus_theta_undoes_the_first_with_gradients():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 6, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    cos, sin = cos_sin(torch.randn(1, 3, 6, 2, generator=gen, dtype=torch.float64))
    back = rotate_pairs_cs(rotate_pairs_cs(x, cos, sin), cos, -sin)
    torch.testing.assert_close(back, x, rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad(back.sum(), x)
    torch.testing.assert_close(grad, torch.ones_like(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("with_offset", [False, True], ids=["no-offset", "offset"])
def test_fused_accumulation_matches_reference(with_offset):
    """Angles (float64 sum, wrap) and the gradients to the increments and the carried offset."""
    gen = torch.Generator().manual_seed(3)
    delta = (2 * torch.randn(2, 3, 50, 4, generator=gen)).requires_grad_()  # float32, big enough to wrap often
    offset = (100 * torch.randn(1, 3, 1, 4, generator=gen, dtype=torch.float64)).requires_grad_() if with_offset else None
    g = torch.randn(2, 3, 50, 4, generator=gen)
    wrt = [delta] + ([offset] if with_offset else [])
    fast, ref = accumulate_angles(delta, offset), accumulate_angles_reference(delta, offset)
    assert fast.dtype == torch.float32 and fast.shape == ref.shape
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-6)
    assert float(fast.detach().min()) >= -math.pi and float(fast.detach().max()) < math.pi
    for a, b in zip(torch.autograd.grad(fast, wrt, g), torch.autograd.grad(ref, wrt, g)):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_angle_gradient_from_the_output_matches_the_one_through_cos_and_sin(inverse):
    """The scheme's path: cos/sin of detached angles, the gradient routed to theta from the rotated output."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 7, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    theta = (3 * torch.randn(1, 3, 7, 4, generator=gen, dtype=torch.float64)).requires_grad_()
    g = torch.randn(2, 3, 7, 8, generator=gen, dtype=torch.float64)
    fast = rotate_pairs_cs(x, *cos_sin(theta.detach(), x.dtype), inverse=inverse, theta=theta)
    cos, sin = cos_sin(theta, x.dtype)
    ref = rotate_pairs_reference(x, cos, -sin if inverse else sin)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-12)
    for a, b in zip(torch.autograd.grad(fast, [x, theta], g), torch.autograd.grad(ref, [x, theta], g)):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def _layouts(B, H, T, D, gen):
    """q, k, v as the backbone makes them (views of one [B, T, 3, H, D] projection), attention's [B, T, H, D]
    output, and a plain contiguous tensor: the kernels walk each in its own memory order."""
    qkv = torch.randn(B, T, 3, H, D, generator=gen, dtype=torch.float64)
    return {
        "qkv-view": qkv.permute(2, 0, 3, 1, 4)[1],
        "bthd": torch.randn(B, T, H, D, generator=gen, dtype=torch.float64).transpose(1, 2),
        "contiguous": torch.randn(B, H, T, D, generator=gen, dtype=torch.float64),
    }


@pytest.mark.parametrize("layout", ["qkv-view", "bthd", "contiguous"])
@pytest.mark.parametrize("angle_layout", ["bhtp", "bthp", "batch-broadcast"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_rotation_of_strided_inputs_matches_reference(layout, angle_layout, dtype):
    """Outputs and gradients (x and the angles, forward and inverse) for every layout the model produces."""
    B, H, T, D = 2, 3, 9, 10
    gen = torch.Generator().manual_seed(5)
    x = _layouts(B, H, T, D, gen)[layout].to(dtype).requires_grad_()
    theta = {"bhtp": lambda: torch.randn(B, H, T, D // 2, generator=gen, dtype=torch.float64),
             "bthp": lambda: torch.randn(B, T, H, D // 2, generator=gen, dtype=torch.float64).transpose(1, 2),
             "batch-broadcast": lambda: torch.randn(1, H, T, D // 2, generator=gen, dtype=torch.float64)}[angle_layout]()
    theta = (3 * theta).to(dtype).requires_grad_()
    g = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64).to(dtype)
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    for inverse in (False, True):
        fast = rotate_pairs_cs(x, *cos_sin(theta.detach(), dtype), inverse=inverse, theta=theta)
        cos, sin = cos_sin(theta, dtype)
        ref = rotate_pairs_reference(x, cos, -sin if inverse else sin)
        torch.testing.assert_close(fast, ref, rtol=0, atol=tol)
        for a, b in zip(torch.autograd.grad(fast, [x, theta], g), torch.autograd.grad(ref, [x, theta], g)):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b, rtol=0, atol=20 * tol)


def test_accumulation_in_the_learned_increments_layout_matches_reference():
    """Learned increments arrive as a [B, T, H, P] permuted view; the sum runs along its strided time axis."""
    gen = torch.Generator().manual_seed(6)
    delta = (4 * torch.randn(2, 300, 3, 4, generator=gen)).transpose(1, 2).requires_grad_()  # [B, H, T, P] view
    g = torch.randn(2, 3, 300, 4, generator=gen)
    fast, ref = accumulate_angles(delta, None), accumulate_angles_reference(delta, None)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-6)
    (d_fast,), (d_ref,) = torch.autograd.grad(fast, [delta], g), torch.autograd.grad(ref, [delta], g)
    torch.testing.assert_close(d_fast, d_ref, rtol=1e-6, atol=1e-5)


def test_kernel_mode_decides_which_path_runs(kernel_mode):
    """With the kernels on, the compiled ops run (no silent fallback); with them off, none does."""
    x = torch.randn(2, 3, 8, 6, requires_grad=True)
    theta = torch.randn(2, 3, 8, 3, requires_grad=True)
    with torch.autograd.profiler.profile() as prof:
        angles = accumulate_angles(theta, None)
        out = rotate_pairs_cs(x, *cos_sin(angles.detach()), theta=angles)
        out.sum().backward()
    names = {e.name for e in prof.function_events}
    compiled = {"accrot_cpu::rotate", "accrot_cpu::rotate_backward", "accrot_cpu::accumulate_wrap",
                "accrot_cpu::suffix_sum"}
    assert (compiled <= names) if kernel_mode == "on" else not (compiled & names)


def test_kernel_mode_rejects_an_unknown_value(monkeypatch):
    monkeypatch.setenv("ACCROT_CPU_KERNELS", "fast")
    with pytest.raises(ValueError, match="ACCROT_CPU_KERNELS='fast' is not valid; choose one of auto, on, off"):
        cpu_kernels.ops()


def test_accumulated_angles_stay_within_a_milliradian_at_a_million_positions():
    """Increments that drift (mean 1 rad, like RoPE's fastest pair): at position 10⁶ the float32 angle, wrapped,
    is within 1e-3 rad of the exact float64 sum (issue #3's numerics), in both paths."""
    gen = torch.Generator().manual_seed(7)
    T = 1_000_000
    delta = (1.0 + 0.3 * torch.randn(1, 1, T, 2, generator=gen)).float()
    theta = accumulate_angles(delta, None)  # [1, 1, T, 2] float32 in [−π, π)
    exact = delta.double().cumsum(-2)
    err = torch.remainder(theta.double() - exact + math.pi, 2 * math.pi) - math.pi  # distance on the circle
    assert float(exact[0, 0, -1].abs().min()) > 9e5  # the sum really did travel ~10⁶ rad
    assert float(err.abs().max()) < 1e-3

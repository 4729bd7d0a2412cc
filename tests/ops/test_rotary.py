"""The fused rotation node against the elementwise formula differentiated by autograd (its twin).

Every test runs twice: through the compiled CPU kernels (``ACCROT_CPU_KERNELS=on``) and through the eager
formulas they replace (``off``), so both paths stay checked against the twins. The twin tests also take a
``cuda`` device (gpu-marked, skipped without CUDA): the fast path runs on the GPU — ``torch.compile``-fused
(``ACCROT_GPU_KERNELS=on``) or eager (``off``) — and is compared with the float64 CPU twin.
"""

from __future__ import annotations

import math

import pytest
import torch

from accrot.ops import cpu_kernels, gpu_kernels
from accrot.ops.rotary import (
    _kernels,
    accumulate_angles,
    accumulate_bounded,
    accumulate_drawn,
    cos_sin,
    naive_accumulate_angles,
    naive_accumulate_bounded,
    naive_rotate_pairs_cs,
    rotate_pairs_cs,
    rotate_pairs_many,
)
from tests.helpers.kernels import kernels_or_skip


@pytest.fixture(autouse=True, params=["on", "off"], ids=["kernels", "eager"])
def kernel_mode(request, monkeypatch):
    monkeypatch.setenv("ACCROT_CPU_KERNELS", request.param)
    monkeypatch.setenv("ACCROT_GPU_KERNELS", request.param)  # read only for CUDA tensors
    if request.param == "on" and "device" not in request.fixturenames:
        kernels_or_skip()
    return request.param


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def device(request, kernel_mode):
    """The device the fast path runs on; the twin always runs in float64 on the CPU."""
    if request.param == "cpu" and kernel_mode == "on":
        kernels_or_skip()
    return torch.device(request.param)


def on(device: torch.device, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Leaf copies of ``tensors`` on ``device`` (same dtype, same requires_grad)."""
    return [t.detach().to(device).requires_grad_(t.requires_grad) for t in tensors]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])], indirect=True)
@pytest.mark.parametrize("angle_shape", ["full", "batch-broadcast", "batch-and-head-broadcast"])
@pytest.mark.parametrize("angles_learned", [True, False], ids=["learned", "fixed"])
def test_fused_rotation_matches_the_naive_twin(angle_shape, angles_learned, device):
    B, H, T, D = 3, 2, 7, 8
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    shape = {"full": (B, H, T, D // 2), "batch-broadcast": (1, H, T, D // 2),
             "batch-and-head-broadcast": (1, 1, T, D // 2)}[angle_shape]
    theta = (3 * torch.randn(shape, generator=gen, dtype=torch.float64)).requires_grad_(angles_learned)
    g = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)

    def run(fn, x, theta, g):
        out = fn(x, *cos_sin(theta, x.dtype))
        wrt = [x, theta] if angles_learned else [x]
        return out, torch.autograd.grad(out, wrt, g)

    (fast, fast_grads) = run(rotate_pairs_cs, *on(device, x, theta, g))
    (ref, ref_grads) = run(naive_rotate_pairs_cs, x, theta, g)
    assert fast.device.type == device.type
    torch.testing.assert_close(fast.cpu(), ref, rtol=0, atol=1e-12)
    for a, b in zip(fast_grads, ref_grads):
        assert a.shape == b.shape
        torch.testing.assert_close(a.cpu(), b, rtol=0, atol=1e-12)


def test_fused_rotation_keeps_the_input_dtype_and_rotates_in_float32():
    x = torch.randn(1, 2, 5, 4).bfloat16()
    theta = torch.linspace(0, 100, 10).view(1, 1, 5, 2)
    out = rotate_pairs_cs(x, *cos_sin(theta, x.dtype))
    assert out.dtype == torch.bfloat16
    ref = naive_rotate_pairs_cs(x.float(), *cos_sin(theta))
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
    ref = naive_rotate_pairs_cs(x, cos, -sin)
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


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])], indirect=True)
@pytest.mark.parametrize("with_offset", [False, True], ids=["no-offset", "offset"])
def test_fused_accumulation_matches_the_naive_twin(with_offset, device):
    """Angles (float64 sum, wrap) and the gradients to the increments and the carried offset."""
    gen = torch.Generator().manual_seed(3)
    delta = (2 * torch.randn(2, 3, 50, 4, generator=gen)).requires_grad_()  # float32, big enough to wrap often
    offset = (100 * torch.randn(1, 3, 1, 4, generator=gen, dtype=torch.float64)).requires_grad_() if with_offset else None
    g = torch.randn(2, 3, 50, 4, generator=gen)
    wrt = [delta] + ([offset] if with_offset else [])
    fast_wrt = on(device, *wrt)
    fast = accumulate_angles(fast_wrt[0], fast_wrt[1] if with_offset else None)
    ref = naive_accumulate_angles(delta, offset)
    assert fast.dtype == torch.float32 and fast.shape == ref.shape and fast.device.type == device.type
    torch.testing.assert_close(fast.cpu(), ref, rtol=0, atol=1e-6)
    assert float(fast.detach().min()) >= -math.pi and float(fast.detach().max()) < math.pi
    fast_grads = torch.autograd.grad(fast, fast_wrt, g.to(device))
    for a, b in zip(fast_grads, torch.autograd.grad(ref, wrt, g)):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])], indirect=True)
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_angle_gradient_from_the_output_matches_the_one_through_cos_and_sin(inverse, device):
    """The scheme's path: cos/sin of detached angles, the gradient routed to theta from the rotated output."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 7, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    theta = (3 * torch.randn(1, 3, 7, 4, generator=gen, dtype=torch.float64)).requires_grad_()
    g = torch.randn(2, 3, 7, 8, generator=gen, dtype=torch.float64)
    xd, thd = on(device, x, theta)
    fast = rotate_pairs_cs(xd, *cos_sin(thd.detach(), x.dtype), inverse=inverse, theta=thd)
    cos, sin = cos_sin(theta, x.dtype)
    ref = naive_rotate_pairs_cs(x, cos, -sin if inverse else sin)
    torch.testing.assert_close(fast.cpu(), ref, rtol=0, atol=1e-12)
    fast_grads = torch.autograd.grad(fast, [xd, thd], g.to(device))
    for a, b in zip(fast_grads, torch.autograd.grad(ref, [x, theta], g)):
        assert a.shape == b.shape
        torch.testing.assert_close(a.cpu(), b, rtol=0, atol=1e-12)


def _layouts(B, H, T, D, gen):
    """q, k, v as the backbone makes them (views of one [B, T, 3, H, D] projection), attention's [B, T, H, D]
    output, and a plain contiguous tensor: the kernels walk each in its own memory order."""
    qkv = torch.randn(B, T, 3, H, D, generator=gen, dtype=torch.float64)
    return {
        "qkv-view": qkv.permute(2, 0, 3, 1, 4)[1],
        "bthd": torch.randn(B, T, H, D, generator=gen, dtype=torch.float64).transpose(1, 2),
        "contiguous": torch.randn(B, H, T, D, generator=gen, dtype=torch.float64),
    }


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])], indirect=True)
@pytest.mark.parametrize("layout", ["qkv-view", "bthd", "contiguous"])
@pytest.mark.parametrize("angle_layout", ["bhtp", "bthp", "batch-broadcast"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_rotation_of_strided_inputs_matches_the_naive_twin(layout, angle_layout, dtype, device):
    """Outputs and gradients (x and the angles, forward and inverse) for every layout the model produces."""
    B, H, T, D = 2, 3, 9, 10
    gen = torch.Generator().manual_seed(5)
    x = _layouts(B, H, T, D, gen)[layout].to(device, dtype).requires_grad_()
    theta = {"bhtp": lambda: torch.randn(B, H, T, D // 2, generator=gen, dtype=torch.float64),
             "bthp": lambda: torch.randn(B, T, H, D // 2, generator=gen, dtype=torch.float64).transpose(1, 2),
             "batch-broadcast": lambda: torch.randn(1, H, T, D // 2, generator=gen, dtype=torch.float64)}[angle_layout]()
    theta = (3 * theta).to(device, dtype).requires_grad_()  # moved layouts stay permuted where dense
    g = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64).to(device, dtype)
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    for inverse in (False, True):
        fast = rotate_pairs_cs(x, *cos_sin(theta.detach(), dtype), inverse=inverse, theta=theta)
        xc, thc = on(torch.device("cpu"), x, theta)  # the twin on the CPU, same values and dtype
        cos, sin = cos_sin(thc, dtype)
        ref = naive_rotate_pairs_cs(xc, cos, -sin if inverse else sin)
        torch.testing.assert_close(fast.cpu(), ref, rtol=0, atol=tol)
        ref_grads = torch.autograd.grad(ref, [xc, thc], g.cpu())
        for a, b in zip(torch.autograd.grad(fast, [x, theta], g), ref_grads):
            assert a.shape == b.shape
            torch.testing.assert_close(a.cpu(), b, rtol=0, atol=20 * tol)


@pytest.mark.parametrize("family", ["gaussian", "uniform"])
def test_drawn_accumulation_is_the_eager_map_then_sum(family, monkeypatch):
    """Random increments mapped and summed in one pass: the bits of δ = (mean + σ·z).to(float32) then the sum, for
    the draw as made, one DDP rank's rows of it (strided) and a token-major view; and the eager fallback agrees."""
    from accrot.position.accum import _standard_noise

    kernels_or_skip()
    gen = torch.Generator().manual_seed(4)
    z = _standard_noise((4, 3, 300, 8), family, gen)  # [B, H, T, P] float32, as the scheme draws it
    mean = torch.rand(8, generator=gen, dtype=torch.float64)
    sigma = 2 * torch.rand(8, generator=gen, dtype=torch.float64)  # large enough to wrap often
    for zz in (z, z[1::2], z.transpose(1, 2).contiguous().transpose(1, 2)):
        naive = naive_accumulate_angles((mean + sigma * zz).to(torch.float32))
        fused = accumulate_drawn(zz, mean, sigma)
        assert fused.dtype == torch.float32 and torch.equal(fused, naive)
    monkeypatch.setenv("ACCROT_CPU_KERNELS", "off")
    assert torch.equal(accumulate_drawn(z, mean, sigma), naive_accumulate_angles((mean + sigma * z).float()))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])], indirect=True)
def test_accumulation_in_the_learned_increments_layout_matches_the_naive_twin(device):
    """Learned increments arrive as a [B, T, H, P] permuted view; the sum runs along its strided time axis."""
    gen = torch.Generator().manual_seed(6)
    raw = 4 * torch.randn(2, 300, 3, 4, generator=gen)
    delta = raw.transpose(1, 2).requires_grad_()  # [B, H, T, P] view
    fast_delta = raw.to(device).transpose(1, 2).requires_grad_()  # the same view on the device
    g = torch.randn(2, 3, 300, 4, generator=gen)
    fast, ref = accumulate_angles(fast_delta, None), naive_accumulate_angles(delta, None)
    torch.testing.assert_close(fast.cpu(), ref, rtol=0, atol=1e-6)
    (d_fast,), (d_ref,) = torch.autograd.grad(fast, [fast_delta], g.to(device)), torch.autograd.grad(ref, [delta], g)
    torch.testing.assert_close(d_fast.cpu(), d_ref, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])], indirect=True)
@pytest.mark.parametrize("layout", ["qkv-view", "bthd", "contiguous"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_rotating_several_tensors_at_once_matches_rotating_each(layout, dtype, inverse, device):
    """q and k (views of one projection) rotated by one node: outputs, both input gradients and the angle gradient
    (summed over the tensors), against the twin applied to each tensor; a tensor without a gradient gets none."""
    B, H, T, D = 2, 3, 9, 10
    gen = torch.Generator().manual_seed(11)
    q, k = (_layouts(B, H, T, D, gen)[layout].to(device, dtype) for _ in range(2))
    q.requires_grad_()
    theta = (3 * torch.randn(B, T, H, D // 2, generator=gen, dtype=torch.float64)).transpose(1, 2)
    theta = theta.to(device, dtype).requires_grad_()
    gq, gk = (torch.randn(B, H, T, D, generator=gen, dtype=torch.float64).to(device, dtype) for _ in range(2))
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    for k_grad in (True, False):
        k_in = k.detach().requires_grad_(k_grad)
        yq, yk = rotate_pairs_many((q, k_in), *cos_sin(theta.detach(), dtype), inverse=inverse, theta=theta)
        qc, kc, thc = on(torch.device("cpu"), q, k_in, theta)
        cos, sin = cos_sin(thc, dtype)
        sin = -sin if inverse else sin
        rq, rk = naive_rotate_pairs_cs(qc, cos, sin), naive_rotate_pairs_cs(kc, cos, sin)
        torch.testing.assert_close(yq.cpu(), rq, rtol=0, atol=tol)
        torch.testing.assert_close(yk.cpu(), rk, rtol=0, atol=tol)
        wrt, ref_wrt = [q, theta] + ([k_in] if k_grad else []), [qc, thc] + ([kc] if k_grad else [])
        fast = torch.autograd.grad((yq, yk), wrt, (gq, gk))
        ref = torch.autograd.grad((rq, rk), ref_wrt, (gq.cpu(), gk.cpu()))
        for a, b in zip(fast, ref):
            assert a.shape == b.shape
            torch.testing.assert_close(a.cpu(), b, rtol=0, atol=20 * tol)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])], indirect=True)
@pytest.mark.parametrize("with_mean", [False, True], ids=["zero-mean", "mean"])
@pytest.mark.parametrize("extra", [None, "full", "batch-broadcast"])
@pytest.mark.parametrize("layout", ["btHP-view", "contiguous"])
def test_bounded_accumulation_matches_the_naive_twin(with_mean, extra, layout, device):
    """Learned increments' angles in one node, δ = scale·tanh(u) + mean + extra, against the twin: the angles and
    the gradient to u, in the projection's [B, T, H, P] view and contiguous, with and without a mixing floor."""
    B, H, T, P = 2, 3, 60, 4
    gen = torch.Generator().manual_seed(12)
    raw = 2 * torch.randn(B, T, H, P, generator=gen)
    u = (raw.transpose(1, 2) if layout == "btHP-view" else raw.transpose(1, 2).contiguous()).requires_grad_()
    scale = torch.tensor([1.0, 0.5, 0.25, 2.0])
    mean = torch.tensor([1.0, 0.1, 0.01, 0.001]) if with_mean else None
    floor = {None: None, "full": lambda: 0.3 * torch.randn(B, H, T, P, generator=gen),
             "batch-broadcast": lambda: 0.3 * torch.randn(1, H, T, P, generator=gen)}[extra]
    floor = floor() if floor else None
    g = torch.randn(B, H, T, P, generator=gen)
    ud = u.detach().to(device).requires_grad_()
    if layout == "btHP-view":  # the same permuted view on the device
        ud = raw.to(device).transpose(1, 2).requires_grad_()
    fast = accumulate_bounded(ud, *(None if t is None else t.to(device) for t in (scale, mean, floor)))
    ref = naive_accumulate_bounded(u, scale, mean, floor)
    assert fast.dtype == torch.float32 and fast.shape == (B, H, T, P)
    torch.testing.assert_close(fast.cpu(), ref, rtol=0, atol=1e-6)
    assert float(fast.detach().min()) >= -math.pi and float(fast.detach().max()) < math.pi
    (d_fast,), (d_ref,) = torch.autograd.grad(fast, [ud], g.to(device)), torch.autograd.grad(ref, [u], g)
    assert d_fast.shape == u.shape
    torch.testing.assert_close(d_fast.cpu(), d_ref, rtol=1e-5, atol=1e-5)


def test_bounded_accumulation_in_float64_matches_the_naive_twin():
    """A float64 pre-activation (a float64 model) takes the eager formula, exactly the twin's."""
    gen = torch.Generator().manual_seed(13)
    u = torch.randn(2, 3, 40, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    scale = torch.full((4,), 0.7, dtype=torch.float64)
    fast, ref = accumulate_bounded(u, scale), naive_accumulate_bounded(u, scale)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-6)
    g = torch.randn(2, 3, 40, 4, generator=gen)
    (a,), (b,) = torch.autograd.grad(fast, [u], g), torch.autograd.grad(ref, [u], g)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_kernel_mode_decides_which_path_runs(kernel_mode):
    """With the kernels on, the compiled ops run (no silent fallback); with them off, none does."""
    x = torch.randn(2, 3, 8, 6, requires_grad=True)
    theta = torch.randn(2, 3, 8, 3, requires_grad=True)
    u = torch.randn(2, 3, 8, 3, requires_grad=True)
    with torch.autograd.profiler.profile() as prof:
        angles = accumulate_angles(theta, None)
        out = rotate_pairs_cs(x, *cos_sin(angles.detach()), theta=angles)
        bounded = accumulate_bounded(u, torch.ones(3))
        (out.sum() + bounded.sum()).backward()
    names = {e.name for e in prof.function_events}
    compiled = {"accrot_cpu::rotate_many", "accrot_cpu::rotate_many_backward", "accrot_cpu::accumulate_wrap",
                "accrot_cpu::suffix_sum", "accrot_cpu::accumulate_bounded", "accrot_cpu::accumulate_bounded_backward"}
    assert (compiled <= names) if kernel_mode == "on" else not (compiled & names)


def test_kernel_mode_rejects_an_unknown_value(monkeypatch):
    monkeypatch.setenv("ACCROT_CPU_KERNELS", "fast")
    with pytest.raises(ValueError, match="ACCROT_CPU_KERNELS='fast' is not valid; choose one of auto, on, off"):
        cpu_kernels.ops()


def test_accumulated_angles_stay_within_a_milliradian_at_a_million_positions():
    """Increments that drift (mean 1 rad, like RoPE's fastest pair): at position 10⁶ the float32 angle, wrapped,
    is within 1e-3 rad of the exact float64 sum, in both paths."""
    gen = torch.Generator().manual_seed(7)
    T = 1_000_000
    delta = (1.0 + 0.3 * torch.randn(1, 1, T, 2, generator=gen)).float()
    theta = accumulate_angles(delta, None)  # [1, 1, T, 2] float32 in [−π, π)
    exact = delta.double().cumsum(-2)
    err = torch.remainder(theta.double() - exact + math.pi, 2 * math.pi) - math.pi  # distance on the circle
    assert float(exact[0, 0, -1].abs().min()) > 9e5  # the sum really did travel ~10⁶ rad
    assert float(err.abs().max()) < 1e-3


# -- the accelerator paths, checked where a CPU can run them ------------------------------------------------
def test_no_cpu_kernel_ever_receives_an_accelerator_tensor(monkeypatch):
    """The C++ kernels are for CPU tensors only: anything else (meta here, CUDA on a GPU) runs the compiled-GPU or
    the eager path, and the eager path is device-agnostic (it runs on meta tensors, shapes only)."""
    x, theta = torch.empty(2, 3, 5, 8, device="meta"), torch.empty(1, 3, 5, 4, device="meta")
    monkeypatch.setattr(cpu_kernels, "ops", lambda *a, **k: pytest.fail("a CPU kernel got a non-CPU tensor"))
    assert _kernels(x, *cos_sin(theta)) is None
    assert rotate_pairs_cs(x, *cos_sin(theta)).shape == (2, 3, 5, 8)
    assert accumulate_angles(theta, None).shape == (1, 3, 5, 4)
    mixed = (torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2, device="meta"))
    assert _kernels(*mixed) is None


def test_gpu_kernel_mode(monkeypatch):
    monkeypatch.setenv("ACCROT_GPU_KERNELS", "off")
    assert gpu_kernels.ops() is None and gpu_kernels.describe("cuda") == "eager"
    monkeypatch.setenv("ACCROT_GPU_KERNELS", "fast")
    with pytest.raises(ValueError, match="ACCROT_GPU_KERNELS='fast' is not valid; choose one of auto, on, off"):
        gpu_kernels.ops()


def test_a_failed_compile_falls_back_to_the_eager_formulas_once(monkeypatch):
    """Under ``auto`` a compiler that fails is one RuntimeWarning naming the error, recorded (``failure()``,
    ``describe`` says eager), and the same formulas run eagerly; ``on`` still compiles, and raises, after it."""
    monkeypatch.setenv("ACCROT_GPU_KERNELS", "auto")
    monkeypatch.setitem(gpu_kernels._state, "failed", None)
    monkeypatch.setitem(gpu_kernels._state, "triton", True)  # as on a GPU node

    def broken(name):
        raise RuntimeError("no working C compiler\nmore detail")

    monkeypatch.setattr(gpu_kernels, "_compiled_variant", broken)
    x, theta = torch.randn(2, 1, 3, 4), torch.randn(1, 1, 3, 2)
    with pytest.warns(RuntimeWarning, match="torch.compile of the rotation kernels failed") as caught:
        out = gpu_kernels.CompiledOps.rotate(x, theta.cos(), theta.sin(), 1.0)
    torch.testing.assert_close(out, naive_rotate_pairs_cs(x, theta.cos(), theta.sin()), rtol=0, atol=0)
    assert len(caught) == 1 and "\n" not in str(caught[0].message) and "no working C" in str(caught[0].message)
    assert "rotate+: RuntimeError: no working C compiler" == gpu_kernels.failure()
    assert gpu_kernels.ops() is None and gpu_kernels.describe("cuda") == "eager"  # later calls: straight to eager
    monkeypatch.setenv("ACCROT_GPU_KERNELS", "on")  # the earlier failure does not make `on` run eagerly
    assert gpu_kernels.ops() is not None and gpu_kernels.describe("cuda") == "compiled"
    with pytest.raises(RuntimeError, match="no working C compiler"):
        gpu_kernels.CompiledOps.rotate(x, theta.cos(), theta.sin(), 1.0)


@pytest.mark.parametrize("name", sorted(gpu_kernels.VARIANTS))
def test_gpu_kernel_formulas_match_the_twins(name):
    """The formulas ``torch.compile`` fuses on CUDA (and runs eagerly when it cannot), against the twins."""
    gen = torch.Generator().manual_seed(8)
    x, y, g = (torch.randn(2, 3, 6, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    theta = 3 * torch.randn(1, 3, 6, 4, generator=gen, dtype=torch.float64)
    cos, sin = theta.cos(), theta.sin()
    delta, offset = 2 * torch.randn(2, 3, 6, 4, generator=gen), torch.randn(2, 3, 1, 4, dtype=torch.float64)
    sign = -1.0 if name.endswith("-") else 1.0
    ga, gb = g.chunk(2, -1)
    ya, yb = y.chunk(2, -1)
    dtheta = sign * (ya * gb - yb * ga)
    expect = {
        "rotate": (lambda: naive_rotate_pairs_cs(x, cos, sign * sin), (x, cos, sin)),
        "dx": (lambda: naive_rotate_pairs_cs(g, cos, -sign * sin), (g, cos, sin)),
        "dtheta": (lambda: dtheta, (g, y)),
        "both": (lambda: (naive_rotate_pairs_cs(g, cos, -sign * sin), dtheta), (g, y, cos, sin)),
        "accumulate": (lambda: naive_accumulate_angles(delta), (delta,)),
        "accumulate+offset": (lambda: naive_accumulate_angles(delta, offset), (delta, offset)),
        "suffix": (lambda: g.flip(-2).cumsum(-2).flip(-2), (g,)),
    }[name.rstrip("+-")]
    want, args = expect[0](), expect[1]
    got = gpu_kernels.EAGER[name](*args)
    for a, b in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6 if b.dtype == torch.float32 else 1e-12)


@pytest.mark.slow
def test_compiled_gpu_kernels_match_the_eager_formulas_on_the_cpu(kernel_mode):
    """torch.compile of the CUDA fusion, run here by Inductor's CPU backend: the compiled ops equal their eager
    formulas, at two lengths without recompiling (dynamic shapes). (On a GPU the cuda twin tests above run it.)"""
    if kernel_mode == "off":
        pytest.skip("once is enough")
    ops = gpu_kernels.CompiledOps()
    gen = torch.Generator().manual_seed(9)
    for T in (7, 19):
        x, g = (torch.randn(2, 3, T, 8, generator=gen) for _ in range(2))
        theta = torch.randn(1, 3, T, 4, generator=gen)
        cos, sin = theta.cos(), theta.sin()
        y = ops.rotate(x, cos, sin, 1.0)
        torch.testing.assert_close(y, gpu_kernels.EAGER["rotate+"](x, cos, sin), rtol=0, atol=1e-6)
        dx, dth = ops.rotate_backward(g, y, cos, sin, -1.0, True)
        edx, edth = gpu_kernels.EAGER["both-"](g, y, cos, sin)
        torch.testing.assert_close(dx, edx, rtol=0, atol=1e-6)
        torch.testing.assert_close(dth, edth, rtol=0, atol=1e-6)
        delta = 2 * torch.randn(2, 3, T, 4, generator=gen)
        torch.testing.assert_close(ops.accumulate_wrap(delta, None), naive_accumulate_angles(delta), rtol=0,
                                   atol=1e-6)
        torch.testing.assert_close(ops.suffix_sum(g[..., :4].contiguous()), gpu_kernels.EAGER["suffix"](g[..., :4]),
                                   rtol=0, atol=1e-6)
    # and as the autograd nodes call them on CUDA: compiled ops inside _Rotate / _AccumulateWrap, forward and backward
    from accrot.ops import rotary

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rotary, "_kernels", lambda *tensors: ops)
        delta = (2 * torch.randn(2, 3, 11, 4, generator=gen)).requires_grad_()
        x = torch.randn(2, 3, 11, 8, generator=gen, requires_grad=True)
        theta = rotary.accumulate_angles(delta)
        out = rotary.rotate_pairs_cs(x, *cos_sin(theta.detach()), inverse=True, theta=theta)
        grads = torch.autograd.grad(out, [x, delta], torch.ones_like(out))
    theta_ref = naive_accumulate_angles(delta)
    cos, sin = cos_sin(theta_ref)
    ref = naive_rotate_pairs_cs(x, cos, -sin)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    for a, b in zip(grads, torch.autograd.grad(ref, [x, delta], torch.ones_like(ref))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert gpu_kernels._state["failed"] is None

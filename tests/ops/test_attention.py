"""The causal attention kernels against their naive twins: outputs and gradients (q, k, v, log f)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accrot.ops.attention import _masked_blocks, causal_attention, naive_attention, naive_decay_bias
from tests.helpers.tolerance import assert_close

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py


def make_inputs(B, T, H, D, dtype=torch.float64, decay_batch=None, max_decay=1.0, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=gen, dtype=torch.float64).to(device, dtype) for _ in range(3))
    Bd = B if decay_batch is None else decay_batch
    log_f = (-max_decay * torch.rand(Bd, H, T, generator=gen, dtype=torch.float64)).to(device, torch.float32)
    return q, k, v, log_f


CASES = [  # (B, T, H, D, block, batch of log f)
    (2, 37, 4, 16, 8, 2),  # T not a multiple of the block
    (1, 64, 2, 8, 16, 1),  # a multiple
    (2, 5, 2, 8, 16, 1),  # block > T, log f broadcast over the batch
    (1, 24, 3, 4, 24, 1),  # block == T
    (2, 9, 1, 8, 1, 2),  # one query per block
    (1, 1, 2, 4, 4, 1),  # a single token
]


def case_id(c):
    B, T, H, D, blk, Bd = c
    return f"B{B}-T{T}-H{H}-D{D}-blk{blk}-decayB{Bd}"


def grads(out, inputs, g):
    return torch.autograd.grad(out, inputs, g)


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_blockwise_matches_naive_float64(case, device, kernels_mode):
    """The biased kernel (CPU: fused flash parts, the block loop compiled and eager; CUDA: per-block SDPA with a
    float mask) against the float64 CPU twin, outputs and the gradients of q, k, v and log f."""
    B, T, H, D, blk, Bd = case
    q, k, v, log_f = make_inputs(B, T, H, D, decay_batch=Bd)
    inputs = [t.requires_grad_() for t in (q, k, v, log_f)]
    fast_inputs = [t.detach().to(device).requires_grad_() for t in inputs]
    fast = causal_attention(*fast_inputs[:3], fast_inputs[3], block_size=blk)
    ref = naive_attention(q, k, v, naive_decay_bias(log_f))
    assert fast.shape == (B, H, T, D) and fast.dtype == torch.float64 and fast.device.type == device
    assert_close(ref, fast, 1e-10, "out")
    g = torch.randn_like(ref)
    for name, a, b in zip("q k v log_f".split(), grads(ref, inputs, g), grads(fast, fast_inputs, g.to(device))):
        assert_close(a, b, 1e-10, name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", CASES[:3], ids=case_id)
def test_compiled_block_loop_is_the_eager_loop(case, dtype, monkeypatch):
    """The C++ block loop makes the eager loop's ATen calls in the same order, so the two agree to the bit: the
    output and the gradients of q, k, v (strided views of one projection, as the model passes them) and log f."""
    from tests.helpers.kernels import kernels_or_skip

    kernels_or_skip()
    B, T, H, D, blk, Bd = case
    gen = torch.Generator().manual_seed(7)
    qkv = torch.randn(B, T, 3, H, D, generator=gen, dtype=torch.float64).to(dtype)
    log_f = -3 * torch.rand(Bd, H, T, generator=gen, dtype=torch.float64).float()
    g = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64).to(dtype)
    results = []
    for mode in ("on", "off"):
        monkeypatch.setenv("ACCROT_CPU_KERNELS", mode)
        leaves = [qkv.clone().requires_grad_(), log_f.clone().requires_grad_()]
        q, k, v = leaves[0].permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, T, D] views
        out = causal_attention(q, k, v, leaves[1], block_size=blk)
        results.append([out, *torch.autograd.grad(out, leaves, g)])
    for name, a, b in zip(["out", "dqkv", "dlog_f"], *results):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_masked_fallback_matches_naive_float64(case):
    """The float-mask kernel (CUDA, or a torch without the fused CPU flash op) against the same twin."""
    B, T, H, D, blk, Bd = case
    q, k, v, log_f = make_inputs(B, T, H, D, decay_batch=Bd)
    inputs = [t.requires_grad_() for t in (q, k, v, log_f)]
    fast = _masked_blocks(q, k, v, log_f.double().cumsum(-1), max(1, min(blk, T)))
    ref = naive_attention(q, k, v, naive_decay_bias(log_f))
    assert_close(ref, fast, 1e-10, "out")
    g = torch.randn_like(ref)
    for name, a, b in zip("q k v log_f".split(), grads(ref, inputs, g), grads(fast, inputs, g)):
        assert_close(a, b, 1e-10, name)


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])], ids=lambda d: d
)
@pytest.mark.parametrize("case", [(2, 45, 4, 16, 16, 2), (1, 30, 2, 32, 64, 1)], ids=case_id)
def test_blockwise_matches_naive_float32(case, device, kernels_mode):
    B, T, H, D, blk, Bd = case
    q, k, v, log_f = make_inputs(B, T, H, D, dtype=torch.float32, decay_batch=Bd, max_decay=3.0, device=device)
    inputs = [t.requires_grad_() for t in (q, k, v, log_f)]
    fast = causal_attention(q, k, v, log_f, block_size=blk)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = naive_attention(q64, k64, v64, naive_decay_bias(log_f))  # float64 reference, grads to log f too
    assert fast.dtype == torch.float32
    assert_close(ref, fast, 1e-5, "out")
    g = torch.randn_like(ref)
    ref_grads = grads(ref, [q64, k64, v64, log_f], g)
    # log f's gradient is a suffix sum over positions of per-key terms that sum to zero, so the fused flash
    # kernel's float32 rounding (~1e-6 relative, as on the plain NoPE path) adds up in it: a looser bound
    for name, a, b in zip("q k v log_f".split(), ref_grads, grads(fast, inputs, g.float())):
        assert_close(a, b, (5e-5 if name == "log_f" else 1e-5), name)


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d)
def test_unbiased_path_matches_naive(device):
    q, k, v, _ = make_inputs(2, 19, 2, 8)
    fast = causal_attention(*(t.to(device) for t in (q, k, v)))
    assert_close(naive_attention(q, k, v), fast, 1e-12)


def test_zero_decay_is_plain_attention():
    q, k, v, _ = make_inputs(1, 21, 2, 8)
    zero = torch.zeros(1, 2, 21)
    assert_close(causal_attention(q, k, v), causal_attention(q, k, v, zero, block_size=4), 1e-12)


def test_naive_decay_bias_is_the_path_sum():
    _, _, _, log_f = make_inputs(2, 7, 3, 4, decay_batch=2)
    bias = naive_decay_bias(log_f)  # [B, H, T, T]
    c = log_f.double().cumsum(-1)
    for t in range(7):
        for s in range(t + 1):
            torch.testing.assert_close(bias[..., t, s], c[..., t] - c[..., s], rtol=0, atol=1e-12)


def test_bf16_inputs_keep_dtype_and_accuracy():
    q, k, v, log_f = make_inputs(2, 33, 2, 16, max_decay=0.5)
    out = causal_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), log_f, block_size=8)
    assert out.dtype == torch.bfloat16
    ref = naive_attention(q.bfloat16().double(), k.bfloat16().double(), v.bfloat16().double(), naive_decay_bias(log_f))
    assert_close(ref, out, 1e-2)  # bf16 output rounding only: the bias and softmax ran in float32


def test_autocast_bf16_keeps_bias_in_float32():
    q, k, v, log_f = make_inputs(1, 40, 2, 8, dtype=torch.float32, max_decay=0.3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = causal_attention(q, k, v, log_f, block_size=16)
    assert out.dtype == torch.float32  # q's dtype: the biased kernel opts out of autocast
    assert_close(causal_attention(q, k, v, log_f, block_size=16), out, 1e-6)


def test_long_sequence_decay_precision():
    """The biased kernel over a genuinely long sequence, against the closed form.

    2¹⁶ positions with log f_j ∈ [−3, −1] drive c = cumsum(log f) to about −1.3·10⁵, the magnitude it has at
    position 10⁶ with the typical log f ≈ −0.1 (a full 10⁶-position causal pass costs O(T²), ~10 minutes here).
    A float32 running sum is off by its spacing there (~0.008 nats per logit), which moves the output by 10⁻³;
    with the float64 sum what is left is the kernel's own float32 arithmetic, ~3·10⁻⁶. Zero queries and keys: the weights of query t are the bias
    alone, softmax over s of Σ_{j=s+1..t} log f_j, summed directly over the last 80 keys (e^{−80} beyond).
    """
    T, near = 1 << 16, 80
    gen = torch.Generator().manual_seed(0)
    log_f = -1.0 - 2 * torch.rand(1, 1, T, generator=gen)  # float32, [1, 1, T]
    v = torch.randn(1, 1, T, 2, generator=gen)  # [1, 1, T, 2]
    zero = torch.zeros(1, 1, T, 2)
    with torch.no_grad():
        fast = causal_attention(zero, zero, v, log_f, block_size=128)  # [1, 1, T, 2]
    lf, v64 = log_f[0, 0].double(), v[0, 0].double()
    for t in (near, T // 3, T // 2 + 77, T - 129, T - 1):
        path = lf[t - near + 1 : t + 1].flip(0).cumsum(0).flip(0)  # [near] Σ_{j=s+1..t} for s = t−near .. t−1
        bias = torch.cat((path, torch.zeros(1, dtype=torch.float64)))  # s = t: empty path
        expect = (torch.softmax(bias, 0)[:, None] * v64[t - near : t + 1]).sum(0)  # [2]
        assert_close(expect, fast[0, 0, t], 0, f"out[t={t}]", atol=2e-5)  # the kernel's float32 arithmetic: ~3e-6


_MEMORY_PROBE = """
import resource, torch
torch.set_num_threads(1)
from accrot.ops.attention import causal_attention
T, H, D = 16384, 4, 32
gen = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, H, T, D, generator=gen) for _ in range(3))
log_f = -0.05 * torch.rand(1, H, T, generator=gen)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with torch.no_grad():
    out = causal_attention(q, k, v, log_f, block_size=128)
assert out.shape == (1, H, T, D) and bool(torch.isfinite(out).all())
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_biased_kernel_memory_is_linear_in_T():
    """At T = 16384 (H = 4) the biased kernel's peak memory stays far below one [T, T] float32 bias (1 GiB).

    Run in a fresh interpreter so the peak resident size is this kernel's alone.
    """
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    grown = int(proc.stdout.split()[-1])  # bytes the peak grew by during the call
    T = 16384
    assert grown < T * T * 4 // 4, f"peak memory grew by {grown / 2**20:.0f} MiB"


def test_bad_log_decay_shape_raises():
    q, k, v, log_f = make_inputs(2, 8, 2, 4)
    with pytest.raises(ValueError, match="log_decay has shape"):
        causal_attention(q, k, v, log_f[..., :5])

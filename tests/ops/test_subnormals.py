"""The ops keep subnormals out by themselves, whatever the process's float mode (accrot/ops/csrc/subnormals.h and
accrot/ops/underflow.py): the compiled kernels flush them in every thread they compute on and restore each thread's
own mode on exit; the eager exponentials never produce one; and the far-mass and PaTH ops give the same outputs and
gradients in an IEEE process and in one that flushes everywhere.

The float mode is per thread and inherited by the threads torch's pool creates, so each probe runs in a fresh
interpreter whose mode is set (or not) before its first parallel region, with two intra-op threads."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from accrot.ops import cpu_kernels
from accrot.ops.underflow import exp2_, exp_

needs_kernels = pytest.mark.skipif(cpu_kernels.ops() is None, reason="the CPU kernels are not built here")

# Far-mass attention on values that are all subnormal (1e-39): its kernel, flushing in every thread, reads them as 0
# (DAZ), so every output row is exactly 0; the eager loop (no kernels) keeps IEEE and returns outputs of the values'
# size. 8 (batch, head) rows, so both threads of the team compute some. PaTH-FoX runs too (its walk and chunk-core
# kernels; its diagonal blocks are Python's own matmuls, which keep the values as they are). Then the float mode of
# every thread of the team, which the kernels must leave as they found it.
PROBE = """
import json, os, sys, torch
if os.environ.get("PROBE_FLUSH") == "1":
    torch.set_flush_denormal(True)  # before the pool exists: its threads inherit it
torch.set_num_threads(2)
from accrot.ops import cpu_kernels
from accrot.ops.attention import causal_attention
from accrot.ops.path import path_attention
g = torch.Generator().manual_seed(0)
B, H, T, D = 2, 4, 96, 16
q, k = torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)
v = torch.full((B, H, T, D), 1e-39)
log_f = torch.full((1, H, T), -0.05)
w = torch.nn.functional.normalize(torch.randn(B, H, T, D, generator=g), dim=-1)
beta = torch.full((B, H, T), 1.5)
far = causal_attention(q, k, v, log_f, block_size=32)
path = path_attention(q, k, v, w, beta, log_f, chunk_size=16)
kernels = cpu_kernels.ops()
print(json.dumps({"far_max": float(far.abs().max()), "far_rows_zero": int((far.abs().amax((-1, -2)) == 0).sum()),
                  "path_finite": bool(path.isfinite().all()), "modes": kernels.flush_modes() if kernels else None}))
"""


def _probe(**env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("ACCROT_DENORMALS", "PROBE_FLUSH")}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                          env={**base, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_kernels
def test_kernels_flush_in_every_thread_and_restore_ieee():
    res = _probe()
    assert res["far_max"] == 0.0 and res["far_rows_zero"] == 8  # every (batch, head) row, on either thread
    assert res["path_finite"]
    assert res["modes"] == [0, 0]  # each thread of the team back to IEEE after the calls


@needs_kernels
def test_kernels_restore_a_flushing_callers_mode():
    res = _probe(PROBE_FLUSH="1")
    assert res["far_max"] == 0.0
    assert res["modes"] == [1, 1]  # restored to what the caller had, not cleared


def test_without_kernels_the_subnormal_values_survive():
    """The control: the same probe on the eager loop keeps IEEE arithmetic inside ATen's fused attention, so the
    zeros above come from the kernels' flushing, not from the probe's inputs."""
    res = _probe(ACCROT_CPU_KERNELS="off")
    assert 1e-40 < res["far_max"] < 1.2e-38
    assert res["modes"] is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("base2", [False, True], ids=["exp", "exp2"])
def test_floored_exponentials_change_only_what_would_be_subnormal(dtype, base2):
    tiny = torch.finfo(dtype).tiny
    lowest = math.log2(tiny) if base2 else math.log(tiny)
    x = torch.linspace(1.5 * lowest, 10.0, 20001, dtype=dtype)
    x = torch.cat([x, torch.tensor([-math.inf, lowest, lowest - 1e-3], dtype=dtype)])
    plain = x.exp2() if base2 else x.exp()
    floored = (exp2_ if base2 else exp_)(x.clone())
    normal = plain >= tiny
    assert torch.equal(floored[normal], plain[normal])  # bit for bit wherever the result is a normal number
    assert bool((floored[~normal] == 0).all())  # and 0 (never a subnormal) everywhere else
    assert int((~normal).sum()) > 1000 and int(((plain > 0) & ~normal).sum()) > 100  # the range was exercised


def test_floored_exp_keeps_gradients_where_the_weight_is_normal():
    x = torch.linspace(-120.0, 5.0, 4001, requires_grad=True)
    ref = torch.linspace(-120.0, 5.0, 4001, requires_grad=True)
    exp_(x * 1.0).sum().backward()
    ref.exp().sum().backward()
    normal = ref.detach().exp() >= torch.finfo(torch.float32).tiny
    assert torch.equal(x.grad[normal], ref.grad[normal])
    assert bool((x.grad[~normal] == 0).all())


# The far-mass op (FoX-like decay) and PaTH-FoX, forward and backward, in a process that flushes everywhere and in
# one that keeps IEEE: a decay of 0.3 per step puts the weights of keys ~290–350 tokens away in the subnormal band.
AGREE = """
import os, sys, torch
from accrot import runtime
runtime.configure_process()
torch.set_num_threads(2)
from accrot.ops.attention import causal_attention
from accrot.ops.path import path_attention
g = torch.Generator().manual_seed(1)
B, H, T, D = 1, 2, 512, 16
q, k, v = (torch.randn(B, H, T, D, generator=g).requires_grad_() for _ in range(3))
log_f = torch.full((1, H, T), -0.3, requires_grad=True)
w = torch.nn.functional.normalize(torch.randn(B, H, T, D, generator=g), dim=-1)
beta = torch.full((B, H, T), 1.2)
out = {}
for name, f in (("far", lambda: causal_attention(q, k, v, log_f, block_size=64)),
                ("path", lambda: path_attention(q, k, v, w, beta, log_f, chunk_size=32))):
    y = f()
    y.backward(torch.randn(y.shape, generator=g))
    out[name] = [y.detach()] + [t.grad.clone() for t in (q, k, v, log_f)]
    for t in (q, k, v, log_f):
        t.grad = None
out["denormals"] = runtime.denormals()
torch.save(out, sys.argv[1])
"""


def test_far_mass_and_path_agree_with_and_without_a_flushing_process(tmp_path):
    results = {}
    for mode in ("keep", "flush"):
        env = {**os.environ, "ACCROT_DENORMALS": mode}
        path = tmp_path / f"{mode}.pt"
        done = subprocess.run([sys.executable, "-c", AGREE, str(path)], capture_output=True, text=True, timeout=300,
                              env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        results[mode] = torch.load(path)
    assert results["keep"]["denormals"] == "IEEE" and results["flush"]["denormals"] == "flushed"
    for name in ("far", "path"):
        for i, (a, b) in enumerate(zip(results["keep"][name], results["flush"][name])):
            # outputs and gradients: the same bits (every subnormal is flushed or floored in both processes)
            assert torch.equal(a, b), (name, ["out", "dq", "dk", "dv", "dlog_f"][i])

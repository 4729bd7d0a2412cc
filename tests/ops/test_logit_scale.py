"""A per-row logit factor c_t (scalable softmax's s_h·log(t + 1), YaRN's temperature) folded into the query before
the fast kernels, against the naive twins that scale the explicit [T, T] logits row by row: plain fused attention,
the biased (far-mass) kernel and PaTH's chunked kernel, outputs and gradients (q, k, v, c, log f) in float64."""

from __future__ import annotations

import pytest
import torch

from accrot.ops.attention import causal_attention, naive_attention, naive_decay_bias
from accrot.ops.path import naive_path_attention_products, path_attention
from tests.helpers.tolerance import assert_close

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py


def make(B, T, H, D, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=gen, dtype=torch.float64) for _ in range(3))
    s = torch.rand(1, H, 1, generator=gen, dtype=torch.float64)  # [1, H, 1]
    c = s * torch.arange(1, T + 1, dtype=torch.float64).log()  # [1, H, T]
    log_f = -torch.rand(B, H, T, generator=gen, dtype=torch.float64)
    w = torch.nn.functional.normalize(torch.randn(B, H, T, D, generator=gen, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(B, H, T, generator=gen, dtype=torch.float64)
    for t in (q, k, v, c, log_f):  # the inputs whose gradients are compared
        t.requires_grad_()
    return q, k, v, c, log_f, w, beta  # c: [1, H, T] s_h·log(t + 1) with s_h in (0, 1)


def check(ref, fast, inputs, rtol=1e-8):
    """Outputs, and the gradients of ``inputs`` (q, k, v, c and, where it enters, log f)."""
    assert_close(ref, fast, 1e-10)
    g = torch.randn_like(ref)
    names = ["q", "k", "v", "c", "log f"]
    for a, b, name in zip(torch.autograd.grad(ref, inputs, g), torch.autograd.grad(fast, inputs, g), names):
        assert a.abs().max() > 0, name
        assert_close(a, b, rtol, name)


@pytest.mark.parametrize("bias", [False, True], ids=["fused", "biased-blk8"])
def test_folded_factor_matches_scaled_logits(bias):
    """c_t·(q_t·k_s) = (c_t q_t)·k_s: scaling q is scaling row t's scores; a bias is added after the factor."""
    q, k, v, c, log_f, _, _ = make(2, 37, 3, 8)
    fast = causal_attention(q * c[..., None], k, v, log_f if bias else None, block_size=8)
    ref = naive_attention(q, k, v, naive_decay_bias(log_f) if bias else None, logit_scale=c)
    check(ref, fast, [q, k, v, c] + ([log_f] if bias else []))


@pytest.mark.parametrize("log_decay", [False, True], ids=["path", "path-fox"])
def test_folded_factor_matches_scaled_path_logits(log_decay):
    """PaTH: the factor multiplies the transported score q_tᵀ H_t ⋯ H_{s+1} k_s (linear in q_t), not the bias."""
    q, k, v, c, log_f, w, beta = make(2, 11, 2, 4)
    lf = log_f if log_decay else None
    fast = path_attention(q * c[..., None], k, v, w, beta, lf, chunk_size=4)
    ref = naive_path_attention_products(q, k, v, w, beta, lf, logit_scale=c)
    check(ref, fast, [q, k, v, c] + ([log_f] if log_decay else []))


def test_naive_twins_scale_rows_not_columns():
    """The twins' own convention, on known truth: with c_t = 0 row t is uniform over its t + 1 keys, whatever q·k."""
    q, k, v, c, _, w, beta = make(1, 6, 1, 4)
    c = torch.zeros_like(c)  # a fresh leaf, no gradient needed
    uniform = v.cumsum(2) / torch.arange(1, 7, dtype=torch.float64)[:, None]  # [B, H, T, D] running mean
    assert_close(uniform, naive_attention(q, k, v, logit_scale=c), 1e-14)
    assert_close(uniform, naive_path_attention_products(q, k, v, w, beta, logit_scale=c), 1e-14)
    g = torch.rand(1, 1, 6, 4, dtype=torch.float64)
    assert_close(uniform * g, naive_attention(q, k, v, logit_scale=c, gate=g), 1e-14)

"""The compiled rotations (accrot/ops/gpu_kernels.py) across the shapes and modes one run gives them, compiled by
Inductor's CPU backend (the same dynamo front end as on CUDA): every call compiles or reuses a graph, never past
the limit, and a new length reuses the graph of its kind (dynamic shapes)."""

from __future__ import annotations

import pytest
import torch

from accrot.ops import gpu_kernels

# what a run hands the rotation: (batch, cos/sin shared over batch and heads, dtype, autocast, inference mode)
RUN_SHAPES = [(B, shared, dtype, autocast, inference)
              for dtype in (torch.float32, torch.float64)
              for B in (2, 1)  # training batches; batch 1 at evaluation
              for shared in (True, False)  # RoPE tables [1, 1, T, P]; accumulated angles [B, H, T, P]
              for autocast, inference in ((False, False), (True, False), (True, True))]  # fp32, bf16-mixed, eval


@pytest.fixture
def fresh_dynamo(monkeypatch):
    from torch._dynamo.utils import counters

    monkeypatch.setattr(gpu_kernels, "_compiled", {})
    torch._dynamo.reset()
    yield counters
    torch._dynamo.reset()


def _rotate_call(B: int, shared: bool, dtype: torch.dtype, autocast: bool, inference: bool, T: int):
    H, D = 2, 8
    x = torch.randn(B, H, T, D, dtype=dtype)
    theta = torch.randn(1 if shared else B, 1 if shared else H, T, D // 2, dtype=dtype)
    with torch.autocast("cpu", enabled=autocast), torch.inference_mode(inference):
        return gpu_kernels._compiled_variant("rotate+")(x, theta.cos(), theta.sin()), x, theta


@pytest.mark.slow
def test_the_shapes_of_a_run_compile_within_the_limit_and_lengths_never_recompile(fresh_dynamo):
    """Every combination a run (and this suite's float64 tests) produces compiles once, more graphs than dynamo's
    default limit of 8 (which with fullgraph=True raised), all under :data:`RECOMPILE_LIMIT`; a second length
    compiles nothing new; the compiled rotation equals the eager formula."""
    counters = fresh_dynamo
    for case in RUN_SHAPES:
        out, x, theta = _rotate_call(*case, T=16)
        torch.testing.assert_close(out, gpu_kernels.EAGER["rotate+"](x, theta.cos(), theta.sin()))
    graphs = counters["stats"]["unique_graphs"]
    assert 8 < graphs <= gpu_kernels.RECOMPILE_LIMIT, graphs
    for case in RUN_SHAPES:
        _rotate_call(*case, T=37)
    assert counters["stats"]["unique_graphs"] == graphs  # lengths are dynamic

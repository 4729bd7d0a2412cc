"""Exponentials that never produce a subnormal: the eager CPU paths' softmax weights and log-sum-exp merges.

A far-mass bias (ALiBi, a forget gate) drives the logits of far keys tens of nats below the row's maximum, and a
softmax weight exp(ℓ − m) below float32's smallest normal number (2^−126 ≈ 1.2e-38, ℓ − m < −87.3) is subnormal.
x86 computes on a subnormal operand or result some hundred times slower unless the thread flushes them to zero, a
mode the caller may never have set; the weight itself is 10^−31 of the row's largest, far below float32's
resolution of the sum it joins. So every exponent that can only give a subnormal (or zero) is sent to −inf first
and the weight is exactly 0: the same value a flushing process computes, whatever the process's float mode. A
value at or above the dtype's smallest normal number is unchanged, bit for bit, and so are the gradients there
(exp's backward reads its output, 0 for a floored entry, where the true gradient was below 2^−126 too).

The compiled kernels (``csrc/subnormals.h``) flush inside their own threads instead; these are for the eager
twins and the Python steps around the kernels. The floors are the dtype's own (float64: 2^−1022), so the float64
twins the tests compare against keep their full range. Off the CPU nothing needs them: GPUs compute on subnormals
at full speed (the block walk, the portable masked kernel).
"""

from __future__ import annotations

import functools
import math

import torch


@functools.cache
def _floor(dtype: torch.dtype, base2: bool) -> float:
    """The smallest exponent of ``dtype`` whose exp (exp2 with ``base2``) torch computes as a normal number: from
    log(tiny) up by ulps while torch's result (accurate to an ulp or so) is still below tiny."""
    tiny = torch.finfo(dtype).tiny  # 2^−126 (float32), 2^−1022 (float64)
    x = torch.tensor(math.log2(tiny) if base2 else math.log(tiny), dtype=dtype)
    up = torch.tensor(math.inf, dtype=dtype)
    while float(x.exp2() if base2 else x.exp()) < tiny:
        x = torch.nextafter(x, up)
    return float(x)


def exp_(x: torch.Tensor) -> torch.Tensor:
    """``x.exp_()`` with every exponent below the smallest normal's sent to −inf first (weight 0), in place."""
    return x.masked_fill_(x < _floor(x.dtype, base2=False), -math.inf).exp_()


def exp2_(x: torch.Tensor) -> torch.Tensor:
    """``x.exp2_()`` with every exponent below −126 (float32; the dtype's own) sent to −inf first, in place."""
    return x.masked_fill_(x < _floor(x.dtype, base2=True), -math.inf).exp2_()

"""Causal softmax attention, plain or with a far-mass bias.

The bias of key s seen from query t ≤ s is b_ts = Σ_{j=s+1..t} log f_j = c_t − c_s with c = cumsum(log f),
per batch and head (ALiBi: log f_j = −m_h, Press et al. 2022; FoX forget gate: log f_j = logsigmoid(·),
Lin et al. 2025). The biased kernel never materialises a ``[T, T]`` bias. It walks query blocks of
``block_size`` rows; within block [t0, t1) it splits b_ts = (c_t − c_t0) + (c_t0 − c_s) and drops the first
term, which is constant along the row and so leaves the softmax unchanged. What is left depends on the key
only (c_t0 − c_s), so it is a broadcast ``[B|1, H, 1, S]`` mask, or a dot product with one extra coordinate:
q' = [q, √D], k' = [k, c_t0 − c_s], so D^−1/2 q'·k' = D^−1/2 q·k + (c_t0 − c_s). Then:

* on CPU (:class:`_KeyBiasAttention`): each block is two fused flash-attention
  calls (keys before t0: no causal mask; the diagonal tile: ``is_causal``, which skips its upper triangle),
  merged by their log-sum-exps, the way ring attention merges key shards. The forward passes the key bias as the
  broadcast mask (read once per key tile); the backward calls the fused backward of each part with the merged
  output and log-sum-exp on the augmented operands, whose extra key coordinate's gradient is the bias's.
  ``accrot bench schemes`` measures it against plain causal attention;
* elsewhere (CUDA) or without the CPU flash op: one SDPA call per block with a ``[block, t1]`` float mask.

Memory stays O(T·(D + block)) under ``torch.no_grad``. Gradients flow to q, k, v and log f (through the
cumsum, in float64). Splitting around each block's own t0 keeps the float32 bias terms small wherever the
bias is (near keys carry the mass), so the bias keeps its precision at T = 10⁶.

:func:`naive_attention` and :func:`naive_decay_bias` are the test twins: a full ``[T, T]`` softmax and
the bias as an explicit sum over the path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from accrot.ops import cpu_kernels
from accrot.ops.underflow import exp_

# ATen's fused CPU flash attention returning (out, logsumexp), and its backward (private ops, present since
# torch 2.3; the masked path below is the fallback when they are missing)
_CPU_FWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_CPU_BWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor | None = None, block_size: int = 128
) -> torch.Tensor:
    """Causal attention with scale D^−1/2 and an optional far-mass bias b_ts = Σ_{j=s+1..t} log f_j.

    Args:
        q, k, v: ``[B, H, T, D]``, any float dtype (the output has q's dtype).
        log_decay: ``[B|1, H, T]`` per-step log f_j ≤ 0 (float32 or wider), or None for plain causal attention
            (fused SDPA, flash where available).
        block_size: query rows per step of the biased kernel; memory O(B·H·T·block_size).
    Returns:
        ``[B, H, T, D]``.

    The biased path runs in float32 or wider whatever q's dtype or the autocast state (low-precision inputs are
    upcast; the bias never passes through bf16). c = cumsum(log f) accumulates in float64, so the bias keeps its
    precision at T = 10⁶; each block splits it as (c_t − c_t0) + (c_t0 − c_s) around the block start t0, so
    both float32 terms are small wherever the bias itself is small (near keys, which carry the mass).
    """
    if log_decay is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    B, H, T, D = q.shape
    if log_decay.dim() != 3 or log_decay.shape[-2:] != (H, T) or log_decay.shape[0] not in (1, B):
        raise ValueError(f"log_decay has shape {tuple(log_decay.shape)}; expected [{B} or 1, {H}, {T}]")
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be a positive integer")
    work = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(device_type=q.device.type, enabled=False):
        qw, kw, vw = q.to(work), k.to(work), v.to(work)  # [B, H, T, D]
        c = log_decay.to(torch.float64).cumsum(-1)  # [B|1, H, T] c_t = Σ_{j≤t} log f_j
        blk = max(1, min(block_size, T))
        if q.device.type == "cpu" and _CPU_FWD is not None and _CPU_BWD is not None and T > 0:
            out = _KeyBiasAttention.apply(qw, kw, vw, c, blk)  # strided views are fine: every call slices along T
        else:
            out = _masked_blocks(qw, kw, vw, c, blk)
    return out.to(q.dtype)


def _masked_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor, blk: int) -> torch.Tensor:
    """The portable biased kernel: per query block one SDPA call with a ``[B|1, H, blk, t1]`` float bias."""
    B, H, T, D = q.shape
    future = torch.ones(blk, blk, dtype=torch.bool, device=q.device).triu_(1)  # [blk, blk] s > t
    outs = []
    for t0 in range(0, T, blk):
        t1 = min(t0 + blk, T)
        ref = c[..., t0 : t0 + 1]  # [B|1, H, 1]
        row = (c[..., t0:t1] - ref).to(q.dtype)  # [B|1, H, blk]  c_t − c_t0
        col = (ref - c[..., :t1]).to(q.dtype)  # [B|1, H, t1]   c_t0 − c_s
        bias = row.unsqueeze(-1) + col.unsqueeze(-2)  # [B|1, H, blk, t1]
        # only the diagonal tile holds future keys (s > t); keys before t0 are all visible
        bias[..., t0:t1].masked_fill_(future[: t1 - t0, : t1 - t0], float("-inf"))
        outs.append(F.scaled_dot_product_attention(q[:, :, t0:t1], k[:, :, :t1], v[:, :, :t1], attn_mask=bias))
    return torch.cat(outs, dim=2) if outs else q.new_empty(B, H, 0, v.shape[-1])  # [B, H, T, D]


def widened(x: torch.Tensor, width: int, fill: float = 0.0) -> torch.Tensor:
    """x padded on its last dimension to ``width`` with ``fill``, contiguous (x itself when it is already both).
    One pass: a copy into an empty buffer and a fill of its strided new columns cost about 1.6× as much at
    training shapes."""
    if width == x.shape[-1]:  # F.pad would keep x's strides
        return x.contiguous()
    return F.pad(x, (0, width - x.shape[-1]), value=fill)


def _augmented(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, grad: torch.Tensor):
    """The backward's operands at head size D + 1: ``q' = [q, √D]``, ``k' = [k, ·]`` (the bias slot, filled per
    block), ``v' = [v, 0]``, ``out' = [out, 0]``, ``grad' = [grad, 0]`` (the fused kernel wants one head size),
    ``[B, H, T, D + 1]`` each."""
    D = q.shape[-1]
    return (widened(q, D + 1, math.sqrt(D)), widened(k, D + 1), widened(v, D + 1), widened(out, D + 1),
            widened(grad.to(q.dtype), D + 1))


def _blocks(T: int, blk: int):
    """``(t0, t1, parts)`` per query block; a part is ``(s0, s1, is_causal)``: the diagonal tile, then the keys
    before it (none for the first block)."""
    for t0 in range(0, T, blk):
        t1 = min(t0 + blk, T)
        yield t0, t1, [(t0, t1, True)] + ([(0, t0, False)] if t0 else [])


class _KeyBiasAttention(torch.autograd.Function):
    """Biased causal attention from fused CPU flash-attention calls (module docstring).

    forward(q, k, v ``[B, H, T, D]`` float32/64 with unit last stride (views of a fused projection are fine),
    c ``[B|1, H, T]`` float64 cumulative log f, blk) → ``[B, H, T, D]``. The forward passes the key part of each block's bias as a broadcast ``[B|1, H, 1, S]``
    mask, read once per key tile: at head size D it costs 3–8 % over plain flash calls where the extra
    coordinate costs 15–20 %. Saves the merged output and log-sum-exp (O(T·D)). The backward needs the bias's
    gradient, Σ_t dℓ_ts per key, which the fused backward returns for no mask: it runs on q', k', v' augmented
    to D + 1 (the bias slot's key gradient is that sum, as q'_t's slot is √D and the scale D^−1/2).
    """

    @staticmethod
    def forward(ctx, q, k, v, c, blk):
        D = q.shape[-1]
        kernels = cpu_kernels.ops()
        if kernels is not None:  # the same loop in C++ (csrc/attention_cpu.cpp)
            out, lse = kernels.key_bias_forward(q, k, v, c, blk, D**-0.5)
        else:
            out, lse = eager_key_bias_forward(q, k, v, c, blk)
        ctx.save_for_backward(q, k, v, c, out, lse)
        ctx.blk = blk
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, c, out, lse = ctx.saved_tensors
        B, H, T, D = q.shape
        qa, ka, va, oa, ga = _augmented(q, k, v, out, grad)
        kernels = cpu_kernels.ops()
        if kernels is not None:  # the same loop in C++ (csrc/attention_cpu.cpp)
            dqa, dka, dva = kernels.key_bias_backward(ga, qa, ka, va, oa, lse, c, ctx.blk, D**-0.5)
        else:
            dqa, dka, dva = eager_key_bias_backward(ga, qa, ka, va, oa, lse, c, ctx.blk)
        # bias slot c_t0 − c_s: dka[..., D] holds Σ_t dℓ_ts over every block, so −that to each c_s. The share of
        # c_t0 (+Σ_s dℓ_ts per row) is exactly 0, since c_t0 shifts every logit of a row alike; leaving it out
        # keeps float32 cancellation noise out of it
        dc = -dka[..., D].to(torch.float64)  # [B, H, T]
        if c.shape[0] != B:
            dc = dc.sum(0, keepdim=True)
        return dqa[..., :D], dka[..., :D], dva[..., :D], dc, None


def eager_key_bias_forward(q, k, v, c, blk):
    """The eager twin of ``key_bias_forward`` (``csrc/attention_cpu.cpp``): per query block its diagonal tile
    (causal) and the keys before it, each one fused flash call with the key part of the bias as a mask, merged by
    log-sum-exp. Returns the output ``[B, H, T, D]`` and the natural-unit log-sum-exp ``[B, H, T]``."""
    B, H, T, D = q.shape
    out = torch.empty_like(q)
    lse = q.new_empty(B, H, T)
    for t0, t1, parts in _blocks(T, blk):
        col = (c[..., t0 : t0 + 1] - c[..., :t1]).to(q.dtype)[..., None, :]  # [B|1, H, 1, t1]  c_t0 − c_s
        merged_o = merged_l = None
        for s0, s1, causal in parts:
            o, l = _CPU_FWD(q[:, :, t0:t1], k[:, :, s0:s1], v[:, :, s0:s1], 0.0, causal,
                            attn_mask=col[..., s0:s1], scale=D**-0.5)
            if merged_o is None:
                merged_o, merged_l = o, l
            else:  # softmax over the union of two key sets, from each set's normalised output and LSE
                both = torch.logaddexp(merged_l, l)  # [B, H, blk]
                merged_o = merged_o.mul_(exp_(merged_l - both).unsqueeze(-1))
                merged_o.add_(o.mul_(exp_(l - both).unsqueeze(-1)))
                merged_l = both
        out[:, :, t0:t1], lse[:, :, t0:t1] = merged_o, merged_l
    return out, lse


def eager_key_bias_backward(ga, qa, ka, va, oa, lse, c, blk):
    """The eager twin of ``key_bias_backward`` (``csrc/attention_cpu.cpp``): the fused backward of each part of
    every query block on the operands augmented to D + 1 (:func:`_augmented`; ``ka``'s last coordinate is filled
    per block). Returns dq', dk', dv' ``[B, H, T, D + 1]``."""
    B, H, T, W = qa.shape
    D = W - 1
    # every row of these is written before it is added to: query block t0's diagonal tile comes first and
    # assigns its rows (and its keys' rows); the keys before t0 were assigned by their own block earlier.
    # Token-major ([B, T, H, D + 1] in memory), the order of the fused backward's own results, so the copies
    # and sums below run along memory, not across it (and so does the stacking into the projection's gradient)
    dqa, dka, dva = (x.new_empty(B, T, H, W).transpose(1, 2) for x in (qa, ka, va))
    for t0, t1, parts in _blocks(T, blk):
        ka[..., :t1, D] = (c[..., t0 : t0 + 1] - c[..., :t1]).to(ka.dtype)  # c_t0 − c_s, keys of this block
        for s0, s1, causal in parts:
            # each part's share of the gradient, from the *merged* output and LSE (its softmax weights are
            # exp(score − merged LSE), exactly its entries of the full softmax)
            dq_, dk_, dv_ = _CPU_BWD(ga[:, :, t0:t1], qa[:, :, t0:t1], ka[:, :, s0:s1], va[:, :, s0:s1],
                                     oa[:, :, t0:t1], lse[:, :, t0:t1], 0.0, causal, scale=D**-0.5)
            if causal:
                dqa[:, :, t0:t1], dka[:, :, s0:s1], dva[:, :, s0:s1] = dq_, dk_, dv_
            else:
                dqa[:, :, t0:t1] += dq_
                dka[:, :, s0:s1] += dk_
                dva[:, :, s0:s1] += dv_
    return dqa, dka, dva


def naive_decay_bias(log_decay: torch.Tensor) -> torch.Tensor:
    """Test twin of the far-mass bias: b_ts = Σ_{j=s+1..t} log f_j as an explicit masked sum (no cumsum).

    Args:
        log_decay: ``[B|1, H, T]``.
    Returns:
        ``[B|1, H, T, T]`` float64; entries with s > t are 0 (the causal mask removes them).
    """
    T = log_decay.shape[-1]
    idx = torch.arange(T, device=log_decay.device)
    t, s, j = idx.view(T, 1, 1), idx.view(1, T, 1), idx.view(1, 1, T)
    on_path = ((j > s) & (j <= t)).to(torch.float64)  # [T, T, T]  j ∈ (s, t]
    return torch.einsum("tsj,bhj->bhts", on_path, log_decay.to(torch.float64))  # [B|1, H, T, T]


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    logit_scale: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Test twin of :func:`causal_attention` (and of the scheme's logit scale and output gate): explicit ``[T, T]``
    logits ℓ_ts = c_t·D^−1/2 q_t·k_s + b_ts, causal mask, softmax, out_t = g_t ⊙ Σ_s a_ts v_s.

    Args:
        q, k, v: ``[B, H, T, D]``.
        bias: ``[B|1, H, T, T]`` additive logit bias b_ts (e.g. :func:`naive_decay_bias`), or None.
        logit_scale: ``[B|1, H, T]`` factor c_t on every score of row t (scalable softmax: s_h·log(t + 1)), or None.
        gate: ``[B|1, H, T, D]`` output gate g_t, or None.
    Returns:
        ``[B, H, T, D]`` in q's dtype (computed in float32 or wider).
    """
    T, D = q.shape[-2], q.shape[-1]
    work = torch.promote_types(q.dtype, torch.float32)
    scores = q.to(work) @ k.to(work).transpose(-1, -2) * D**-0.5  # [B, H, T, T]
    if logit_scale is not None:
        scores = scores * logit_scale.to(work)[..., :, None]  # row t times c_t
    if bias is not None:
        scores = scores + bias.to(work)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # s > t
    scores = scores.masked_fill(future, float("-inf"))
    out = scores.softmax(dim=-1) @ v.to(work)  # [B, H, T, D]
    if gate is not None:
        out = out * gate.to(work)
    return out.to(q.dtype)

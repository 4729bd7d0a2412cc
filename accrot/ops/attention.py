"""Causal softmax attention, plain or with a far-mass bias (DESIGN §3).

The bias of key s seen from query t ≤ s is b_ts = Σ_{j=s+1..t} log f_j = c_t − c_s with c = cumsum(log f),
per batch and head (ALiBi: log f_j = −m_h, Press et al. 2022; FoX forget gate: log f_j = logsigmoid(·),
Lin et al. 2025). The biased kernel never materialises a ``[T, T]`` bias: each query block of ``block_size``
rows attends to keys ``[0, end of block)`` through one fused SDPA call with a ``[block, end]`` float mask, so
memory stays O(T·block) under ``torch.no_grad``. Gradients flow to q, k, v and log f (through the cumsum).

:func:`naive_attention` and :func:`naive_decay_bias` are the test twins: a full ``[T, T]`` softmax and
the bias as an explicit sum over the path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
        future = torch.ones(blk, blk, dtype=torch.bool, device=q.device).triu_(1)  # [blk, blk] s > t
        outs = []
        for t0 in range(0, T, blk):
            t1 = min(t0 + blk, T)
            ref = c[..., t0 : t0 + 1]  # [B|1, H, 1]
            row = (c[..., t0:t1] - ref).to(work)  # [B|1, H, blk]  c_t − c_t0
            col = (ref - c[..., :t1]).to(work)  # [B|1, H, t1]   c_t0 − c_s
            bias = row.unsqueeze(-1) + col.unsqueeze(-2)  # [B|1, H, blk, t1]
            # only the diagonal tile holds future keys (s > t); keys before t0 are all visible
            bias[..., t0:t1].masked_fill_(future[: t1 - t0, : t1 - t0], float("-inf"))
            outs.append(F.scaled_dot_product_attention(qw[:, :, t0:t1], kw[:, :, :t1], vw[:, :, :t1], attn_mask=bias))
        out = torch.cat(outs, dim=2) if outs else qw.new_empty(B, H, 0, v.shape[-1])  # [B, H, T, D]
    return out.to(q.dtype)


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
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Test twin of :func:`causal_attention`: explicit ``[T, T]`` scores, additive bias, causal mask, softmax.

    Args:
        q, k, v: ``[B, H, T, D]``.
        bias: ``[B|1, H, T, T]`` additive logit bias (e.g. :func:`naive_decay_bias`), or None.
    Returns:
        ``[B, H, T, D]`` in q's dtype (computed in float32 or wider).
    """
    T, D = q.shape[-2], q.shape[-1]
    work = torch.promote_types(q.dtype, torch.float32)
    scores = q.to(work) @ k.to(work).transpose(-1, -2) * D**-0.5  # [B, H, T, T]
    if bias is not None:
        scores = scores + bias.to(work)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # s > t
    scores = scores.masked_fill(future, float("-inf"))
    return (scores.softmax(dim=-1) @ v.to(work)).to(q.dtype)  # [B, H, T, D]

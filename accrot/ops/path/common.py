"""What every PaTH implementation shares: input checks, the work dtype, the cumulative log-decay, and the
chunk-major blocking both chunked walks start from (:func:`_chunked_inputs`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)


def _check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    log_decay: torch.Tensor | None,
) -> None:
    if q.dim() != 4:
        raise ValueError(f"q must be [B, H, T, D], got shape {tuple(q.shape)}")
    B, H, T, D = q.shape
    for name, x in (("k", k), ("w", w)):
        if x.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)}, got {tuple(x.shape)}")
    if v.dim() != 4 or v.shape[:3] != (B, H, T):
        raise ValueError(f"v must be [B, H, T, Dv] = [{B}, {H}, {T}, Dv], got {tuple(v.shape)}")
    if beta.shape != (B, H, T):
        raise ValueError(f"beta must be [B, H, T] = [{B}, {H}, {T}], got {tuple(beta.shape)}")
    if log_decay is not None and (
        log_decay.dim() != 3 or log_decay.shape[0] not in (1, B) or log_decay.shape[1:] != (H, T)
    ):
        raise ValueError(f"log_decay must be [B|1, H, T] = [{B}|1, {H}, {T}], got {tuple(log_decay.shape)}")


def _work_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float32, or wider when any input is wider (float64 tests run entirely in float64)."""
    dtype = torch.float32
    for x in tensors:
        dtype = torch.promote_types(dtype, x.dtype)
    return dtype


def _cumulative_log_decay(log_decay: torch.Tensor, B: int, T_pad: int) -> torch.Tensor:
    """G_t = Σ_{j≤t} log f_j in float64, ``[B, H, T_pad]`` (zero steps past T), so b_ts = G_t − G_s."""
    G = log_decay.to(torch.float64).expand(B, -1, -1)  # [B, H, T]
    return F.pad(G, (0, T_pad - G.shape[-1])).cumsum(-1)  # [B, H, T_pad]


def _chunked_inputs(q, k, v, w, beta, log_decay, chunk_size: int, scale: float, multiple: int = 1,
                    grouped: bool = False):
    """What both chunked walks start from: the work dtype, chunk length c, chunk count N, the chunk-major blocks
    ``(qb, kb, vb, wb, bb)`` and the far-mass split ``(G, R, a)`` (all None without a bias). With ``grouped``
    the blocks and ``a`` come in :func:`_blocks`' group-major order for groups of ``multiple`` chunks (G and R
    stay in token order).

    N = ⌈T/c⌉ rounded up to a ``multiple``; a ragged tail is padded with H = I and zero keys, which causality hides. Logits are kept in log2
    units (scale·log2 e folded into q and the bias) so the softmax runs on exp2, several times cheaper than exp on
    CPU. The bias b_ts = G_t − G_s is split as (a_t − a_s) + (R_n − R_m): G ``[B·H, N·c]`` the cumulative log2-decay
    and R_n ``[N, B·H]`` G just before chunk n (float64, may be huge), a = G − R within the chunk ``[N, B·H, c]``
    (small, work dtype), so nothing large cancels in the work dtype.
    """
    B, H, T, D = q.shape
    dt = _work_dtype(q, k, v, w, beta)
    c = min(chunk_size, T)
    N = -(-T // c)
    N = -(-N // multiple) * multiple
    g = multiple if grouped else 1
    qb = _blocks(q, N, c, dt, g) * (scale * LOG2E)  # [N, BH, c, D]
    kb, vb, wb, bb = (_blocks(x, N, c, dt, g) for x in (k, v, w, beta))  # [N, BH, c, D|Dv|-]
    G = R = a = None
    if log_decay is not None:
        G = _cumulative_log_decay(log_decay, B, N * c).flatten(0, 1) * LOG2E  # [B·H, N·c] float64
        R = F.pad(G[:, c - 1 :: c][:, :-1], (1, 0)).T  # [N, BH] float64
        a = (G.unflatten(1, (N, c)).transpose(0, 1) - R[..., None]).to(dt)  # [N, BH, c]
        if grouped:
            a = _by_group(a, multiple)  # [g, Ng·BH, c]
    return dt, c, N, (qb, kb, vb, wb, bb), (G, R, a)


def _by_group(x: torch.Tensor, g: int) -> torch.Tensor:
    """``[N, BH, *]`` chunk-major -> ``[g, Ng·BH, *]`` group-major: chunk j of every group of g chunks, as one batch
    (the layout :func:`_blocks` gives directly with ``groups=g``)."""
    return x.unflatten(0, (x.shape[0] // g, g)).transpose(0, 1).reshape(g, -1, *x.shape[2:])


def _blocks(x: torch.Tensor, N: int, c: int, dt: torch.dtype, groups: int = 1) -> torch.Tensor:
    """``[B, H, T, *]`` -> chunk-major ``[N, B·H, c, *]`` in the work dtype, zero-padded to N·c tokens; with
    ``groups`` g > 1, group-major ``[g, (N/g)·B·H, c, *]`` (:func:`_by_group`'s layout).

    Chunk-major because the walk slices leading chunks: every batched matmul then sees a contiguous batch. One
    copy, by one permutation from x's own dimensions: q, k, v arrive as views of the fused projection, which a
    ``flatten(0, 1)`` first would copy once more (as would its backward)."""
    x = x.to(dt)
    pad = N * c - x.shape[2]
    if pad:
        x = F.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad))
    rest = x.shape[3:]
    if groups == 1:
        y = x.unflatten(2, (N, c))  # [B, H, N, c, *]
        order = (2, 0, 1, 3)
    else:
        y = x.unflatten(2, (N // groups, groups, c))  # [B, H, Ng, g, c, *]
        order = (3, 2, 0, 1, 4)
    y = y.permute(*order, *range(len(order), y.dim()))
    return y.reshape(y.shape[0], -1, c, *rest).contiguous()


def _unblock(x: torch.Tensor, B: int, H: int, T: int) -> torch.Tensor:
    """``[N, B·H, c, Dv]`` -> ``[B, H, T, Dv]`` (drops the padded tail), stored token-major (``[B, T, H, Dv]`` in
    memory, as ATen's fused attention returns NoPE's): the attention module's ``transpose(1, 2).reshape`` to
    ``[B, T, H·Dv]`` is then a view, not a second copy (nor is its backward)."""
    N, _, c, Dv = x.shape
    y = x.view(N, B, H, c, Dv).permute(1, 0, 3, 2, 4).reshape(B, N * c, H, Dv)  # [B, N·c, H, Dv], one copy
    return y[:, :T].transpose(1, 2)

"""The block walk (PATH.md §3–4), the chunked kernel off the CPU: queries walk earlier key blocks right to left with
an online softmax, under autograd, in O(T·c) extra memory."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from accrot.ops.path.chunk import _chunk_core
from accrot.ops.path.common import _chunked_inputs, _unblock


def _path_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    log_decay: torch.Tensor | None,
    chunk_size: int,
    scale: float,
) -> torch.Tensor:
    B, H, T, D = q.shape
    dt, c, N, (qb, kb, vb, wb, bb), (G, R, a) = _chunked_inputs(q, k, v, w, beta, log_decay, chunk_size, scale)
    vb = torch.cat((vb, torch.ones_like(vb[..., :1])), -1)  # [N, BH, c, Dv + 1]: the value matmul also sums p
    state, r, K_walk, X, U_walk = _chunk_prologue(qb, kb, vb, wb, bb, a)
    del qb, kb, wb, bb
    explicit = U_walk is None

    # Off-diagonal walk: at block distance d, query block n (n = d..N−1) meets key block m = n − d. Running queries
    # r_n = q_start_n P_{n−1} ⋯ P_{n−d+1} score against k_end_m, then cross chunk m. Block d is done after step d,
    # so the active set shrinks from the front and every step is one batched op over N − d blocks.
    outs = [_normalise(state[1][:1])]  # block 0 only sees itself
    state = tuple(x[1:] for x in state)
    r = r[1:]  # [N−1, BH, c, D(+1)] blocks 1..N−1: nothing lies between chunk n−1's end and chunk n's start
    for d in range(1, N):
        n_act = N - d  # active query blocks d..N−1, key blocks 0..N−1−d
        scores = r @ K_walk[:n_act]  # [N−d, BH, c, c]
        shift = None  # [N−d, BH, c] a_t + R_n − R_m, constant along each row
        if a is not None:
            shift = a[d:] + (R[d:] - R[:n_act]).to(dt)[..., None]
        state = _online_update(state, scores, vb[:n_act], shift)
        outs.append(_normalise(state[1][:1]))  # block d has met key block 0
        if d < N - 1:
            # blocks d+1..N−1 cross chunks 1..N−1−d (block d is done: its queries are not carried further)
            state = tuple(x[1:] for x in state)
            r = r[1:]
            x = r @ X[1:n_act]  # [N−d−1, BH, c, D(+1)|c]
            r = x if explicit else r - x @ U_walk[1:n_act]
    return _unblock(torch.cat(outs, 0), B, H, T).to(q.dtype)


def _online_update(
    state: tuple[torch.Tensor, torch.Tensor],
    s: torch.Tensor,
    vk: torch.Tensor,
    shift: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One online-softmax step over a block of keys, in log2 units.

    ``state = (m, acc)``: running row max ``[..., c]`` (kept out of autograd: the result does not depend on it) and
    unnormalised ``[Σ p v, Σ p]`` ``[..., c, Dv + 1]``; the new logits are ``s + shift`` (``s`` ``[..., c, c']``,
    ``shift`` ``[..., c]`` per row or None) for keys with values ``vk = [v, 1]`` ``[..., c', Dv + 1]``.
    """
    m, acc = state
    row_max = s.amax(-1) if shift is None else s.amax(-1) + shift  # [..., c]
    m_new = torch.maximum(m, row_max).detach()  # [..., c]
    alpha = (m - m_new).exp2()[..., None]  # [..., c, 1]
    sub = (m_new if shift is None else m_new - shift)[..., None]  # [..., c, 1]
    # in place when nothing needs the logits for backward: s is a fresh matmul output (saves two tile passes)
    p = (s - sub).exp2() if s.requires_grad else s.sub_(sub).exp2_()  # [..., c, c']
    acc = acc * alpha if acc.requires_grad else acc.mul_(alpha)  # [..., c, Dv + 1]
    acc = torch.baddbmm(acc.flatten(0, -3), p.flatten(0, -3), vk.flatten(0, -3)).view(acc.shape)
    return m_new, acc


def _chunk_prologue(
    qb: torch.Tensor,
    kb: torch.Tensor,
    vb: torch.Tensor,
    wb: torch.Tensor,
    bb: torch.Tensor,
    a: torch.Tensor | None,
) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Everything that stays inside a chunk, for all chunks at once (PATH.md §1–2), and the block walk's operands.

    Args:
        qb, kb, wb: ``[N, BH, c, D]`` (qb scaled); vb: ``[N, BH, c, Dv + 1]``; bb: ``[N, BH, c]``;
        a: ``[N, BH, c]`` within-chunk cumulative log2-decay or None.
    Returns:
        ``state`` (row max ``[N, BH, c]``, unnormalised ``[N, BH, c, Dv + 1]``) after the diagonal blocks;
        ``r`` the queries carried to their chunk start ``[N, BH, c, D(+1)]``; the walk's right operands, the keys
        carried to their chunk end ``k̃ᵀ`` ``[N, BH, D(+1), c]`` and the transport ``X`` ``[N, BH, D(+1), D(+1)|c]``;
        ``U_walk`` for the rank-c transport, None when X = P is explicit.
    """
    N, BH, c, D = qb.shape
    dt, dev = qb.dtype, qb.device
    s_diag, q_start, k_end, U = _chunk_core(qb, kb, wb, bb, a)
    m = s_diag.amax(-1).detach()  # [N, BH, c]
    state = (m, (s_diag - m[..., None]).exp2() @ vb)  # [N, BH, c], [N, BH, c, Dv + 1]
    # Per walk step, r @ k̃ᵀ scores a key block and r @ X carries the still-active queries across its chunk, with
    # X = P (D×D, when D ≤ 2c) or Wᵀ (rank-c form r − (r Wᵀ) U). Two matmuls rather than one on [k̃ᵀ | X]: the
    # finished block is not carried, and the backward pass does not split one product's gradient in two. With a bias, queries carry a constant 1 and keys
    # −a_s; the per-row part a_t + R_n − R_m only shifts the row maximum (never touches the tiles).
    explicit = D <= 2 * c
    X = torch.eye(D, dtype=dt, device=dev) - wb.mT @ U if explicit else wb.mT  # [N, BH, D, D|c]
    r, K_walk, U_walk = q_start, k_end.mT, U  # [N, BH, c, D], [N, BH, D, c], [N, BH, c, D]
    if a is not None:
        r = torch.cat((r, torch.ones_like(a)[..., None]), -1)  # [N, BH, c, D + 1]
        K_walk = torch.cat((K_walk, -a[..., None, :]), -2)  # [N, BH, D + 1, c]
        X = F.pad(X, (0, int(explicit), 0, 1))  # [N, BH, D + 1, D + 1|c]
        if explicit:  # blockdiag(P, 1) keeps the constant column (a fill on the device, no host tensor)
            X[..., D, D] = 1.0
        U_walk = F.pad(U, (0, 1))  # [N, BH, c, D + 1]
    return state, r, K_walk, X, None if explicit else U_walk


def _normalise(acc: torch.Tensor) -> torch.Tensor:
    """``[..., Dv + 1]`` unnormalised ``[Σ p v, Σ p]`` -> ``[..., Dv]`` softmax output."""
    return acc[..., :-1] / acc[..., -1:]

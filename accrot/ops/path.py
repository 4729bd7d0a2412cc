"""PaTH attention: accumulated Householder-like transforms along the path s → t.

    ℓ_ts  = D^−1/2 · q_tᵀ H_t H_{t−1} ⋯ H_{s+1} k_s + b_ts       (s ≤ t; the product is I when s = t)
    H_j   = I − β_j w_j w_jᵀ,  ‖w_j‖ = 1,  β_j ∈ [0, 2]
    b_ts  = Σ_{j=s+1..t} log f_j                                 (far-mass bias, added unscaled; PaTH-FoX)
    out_t = Σ_{s≤t} softmax_s(ℓ_ts) v_s

Implementations (compared on outputs and gradients in ``tests/ops/test_path.py``):

* :func:`path_attention` with ``kernel="chunked"``: the UT/WY chunked algorithm. Per chunk of c tokens the UT
  transform turns the chunk's product into a rank-c update. On the CPU the keys walk forward (each query chunk is
  one fused flash-attention call over all earlier keys carried to its start) with a hand-written backward that
  keeps O(√N) key buffers; elsewhere queries walk earlier key blocks right to left with an online softmax under
  autograd (O(T·c) extra memory). No ``[T, T]`` tensor either way. Derivation: ``accrot/ops/PATH.md``.
* :func:`naive_path_attention_recurrence`: each query walks back one token per step, u ← H_j u, vector ops only
  (``kernel="recurrent"``, for debugging).
* :func:`naive_path_attention_products`: explicit D×D path products and a plain softmax (tiny T only).
* ``kernel="fla"``: the Triton kernel of ``fla`` (flash-linear-attention), CUDA only, pinned by the ``gpu`` extra
  (``pip install -e '.[gpu]'``); w in q's dtype, β and the gate in float32; a missing CUDA device, Triton or fla
  is one :class:`~accrot.errors.ConfigError` line (:func:`fla_problem`).

The Householder math (w, β, transports, UT transform) and the softmax run in float32 or wider whatever the input
dtype (autocast is disabled inside); the output has q's dtype. Cumulative log-decays are summed in float64.

Reference: Yang, Shen, Wen, Tan, Mishra, Ren, Panda, Kim, "PaTH Attention: Position Encoding via Accumulating
Householder Transformations" (2025, arXiv:2505.16381); fla-org/flash-linear-attention ``fla/ops/path_attn``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

from accrot.errors import ConfigError
from accrot.ops import cpu_kernels
from accrot.ops.attention import (  # ATen's fused CPU flash attention (out, logsumexp), backward
    _CPU_BWD,
    _CPU_FWD,
    widened,
)

Kernel = Literal["chunked", "recurrent", "fla"]
KERNELS: tuple[str, ...] = ("chunked", "recurrent", "fla")
LOG2E = 1.0 / math.log(2.0)


# -- shared helpers ---------------------------------------------------------------------------------
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


# -- the chunked UT/WY kernel -----------------------------------------------------------------------
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


def _chunk_core(
    qb: torch.Tensor,
    kb: torch.Tensor,
    wb: torch.Tensor,
    bb: torch.Tensor,
    a: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The UT transform and the diagonal blocks of all chunks at once (PATH.md §1–2).

    Args: as :func:`_chunk_prologue`. Returns the diagonal blocks' logits in log2 units (``[N, BH, c, c]``, −inf
    above the diagonal), the queries carried to their chunk start and the keys to their chunk end
    (``[N, BH, c, D]`` each), and U (``[N, BH, c, D]``, the chunk product P = I − Wᵀ U).
    """
    N, BH, c, D = qb.shape
    dt, dev = qb.dtype, qb.device
    lower = torch.ones(c, c, dtype=torch.bool, device=dev).tril()  # [c, c] i ≤ t
    strict = lower.logical_xor(torch.eye(c, dtype=torch.bool, device=dev))  # [c, c] j > s

    # UT transform: L = I + strict_lower(diag(β) W Wᵀ); chunk product P = H_last ⋯ H_first = I − Wᵀ U, U = L⁻¹ diag(β) W.
    wbeta = wb * bb[..., None]  # [N, BH, c, D] rows β_j w_j
    L = torch.eye(c, dtype=dt, device=dev) + (wbeta @ wb.mT) * strict  # [N, BH, c, c]
    WK = (wbeta @ kb.mT) * strict  # [N, BH, c, c] β_j w_j·k_s, kept for j > s
    U, TWK = torch.linalg.solve_triangular(
        L, torch.cat((wbeta, WK), -1), upper=False, unitriangular=True
    ).split((D, c), -1)  # [N, BH, c, D], [N, BH, c, c]
    QW = (qb @ wb.mT) * lower  # [N, BH, c, c] q_t·w_i, kept for i ≤ t
    q_start = qb - QW @ U  # [N, BH, c, D] q_tᵀ H_t ⋯ H_first: queries carried to their chunk start
    k_end = kb - TWK.mT @ wb  # [N, BH, c, D] H_last ⋯ H_{s+1} k_s: keys carried to their chunk end

    # diagonal blocks: exact intra-chunk products q_tᵀ H_t ⋯ H_{s+1} k_s = q_t·k_s − (QW T WK)_ts
    s = torch.baddbmm((qb @ kb.mT).flatten(0, 1), QW.flatten(0, 1), TWK.flatten(0, 1), alpha=-1)
    s = s.view(N, BH, c, c)  # [N, BH, c, c]
    if a is not None:
        s = s + (a[..., :, None] - a[..., None, :])
    s = s.masked_fill(~lower, float("-inf"))  # [N, BH, c, c] log2-unit logits, −inf above the diagonal
    return s, q_start, k_end, U


def _addmm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """acc + alpha · a @ b over ``[N, BH, ·, ·]`` batches: one fused BLAS call, no separate add pass."""
    out = torch.baddbmm(acc.flatten(0, 1), a.flatten(0, 1), b.flatten(0, 1), alpha=alpha)
    return out.view(*a.shape[:2], *out.shape[-2:])


def _addmm_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """:func:`_addmm` into ``acc`` itself (a contiguous temporary of ours): no copy of acc first."""
    acc.view(-1, *acc.shape[-2:]).baddbmm_(a.flatten(0, 1), b.flatten(0, 1), alpha=alpha)
    return acc


def _core_kernels():
    """The compiled chunk core (``path_core_forward``/``_backward`` in ``csrc/path_cpu.cpp``) or None: eager."""
    return cpu_kernels.ops()


def _walk_kernels():
    """The compiled key-walk loop (``path_walk_forward``/``_backward``) or None: the eager loop. Two names for one
    switch, so a test can run the compiled and eager walk loops over the same chunk core."""
    return cpu_kernels.ops()


class _ChunkCore(torch.autograd.Function):
    """:func:`_chunk_core` with a hand-written backward, for the CPU key walk (PATH.md §2, §7).

    forward(qb, kb, wb ``[N, BH, c, D]`` (qb scaled), bb ``[N, BH, c]``) -> the diagonal logits ``[N, BH, c, c]``
    (log2 units, −inf above the diagonal, no bias), q̂ and k̂ ``[N, BH, c, D]``, and Pᵀ per chunk ``[N, BH, D, D]``.
    The UT transform keeps T = L⁻¹ explicitly (one triangular solve on the identity), so the backward's L⁻ᵀ is a
    matmul. Saves O(T·(c + D)): the inputs, T, U, Y = T·WK and the masked q·w block (none without a gradient).

    With the CPU kernels built, both directions run in C++ (``path_core_forward``/``_backward``): one chunk at a
    time in cache, products that share an operand stacked into one GEMM (4 forward, 10 backward), one BLAS thread
    per chunk range. The batched ATen calls below are its eager twin: a pass over all chunks per product, each
    writing a fresh ``[N, BH, c, c]`` tensor (on 2 cores the C++ core measured 1.9× faster forward + backward, PATH.md §7).
    """

    @staticmethod
    def forward(ctx, qb, kb, wb, bb):
        kernels = _core_kernels() if qb.device.type == "cpu" else None
        if kernels is not None:  # the same products, one chunk at a time in cache (csrc/path_cpu.cpp)
            save = any(ctx.needs_input_grad)
            s, q_start, k_end, Pt, *saved = kernels.path_core_forward(qb, kb, wb, bb, save)
            if save:
                ctx.save_for_backward(qb, kb, wb, bb, *saved)
            ctx.compiled = True
            return s, q_start, k_end, Pt
        ctx.compiled = False
        c, D = qb.shape[-2:]
        dt, dev = qb.dtype, qb.device
        lower = torch.ones(c, c, dtype=torch.bool, device=dev).tril()  # [c, c] i ≤ t
        strict = lower.tril(-1)  # [c, c] j > s
        X = wb * bb[..., None]  # [N, BH, c, D] rows β_j w_j
        eye = torch.eye(c, dtype=dt, device=dev)
        L = torch.baddbmm(eye, X.flatten(0, 1), wb.flatten(0, 1).mT).view(*X.shape[:2], c, c)  # I + βW Wᵀ
        Tinv = torch.linalg.solve_triangular(L, eye.expand_as(L), upper=False, unitriangular=True)  # T = L⁻¹
        U = Tinv @ X  # [N, BH, c, D]: P = I − Wᵀ U
        Y = Tinv @ ((X @ kb.mT) * strict)  # [N, BH, c, c] T·WK, WK_js = β_j w_j·k_s for j > s
        QW = (qb @ wb.mT) * lower  # [N, BH, c, c] q_t·w_i, kept for i ≤ t
        q_start = _addmm(qb, QW, U, -1)  # [N, BH, c, D] q̂ = Q − QW U
        k_end = _addmm(kb, Y.mT, wb, -1)  # [N, BH, c, D] k̂ = K − Yᵀ W
        s = _addmm_(qb @ kb.mT, QW, Y, -1).masked_fill_(~lower, float("-inf"))  # [N, BH, c, c] QKᵀ − QW Y
        Pt = _addmm(torch.eye(D, dtype=dt, device=dev).expand(*U.shape[:2], D, D), U.mT, wb, -1)  # I − Uᵀ W
        ctx.save_for_backward(qb, kb, wb, bb, Tinv, U, Y, QW)
        return s, q_start, k_end, Pt

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, ds, dq_start, dk_end, dPt):
        qb, kb, wb, bb, Tinv, U, Y, QW = ctx.saved_tensors
        if ctx.compiled:
            return tuple(_core_kernels().path_core_backward(ds, dq_start, dk_end, dPt, qb, kb, wb, bb, Tinv, U, Y,
                                                              QW))
        c = qb.shape[-2]
        lower = torch.ones(c, c, dtype=torch.bool, device=qb.device).tril()
        strict = lower.tril(-1)
        ds = ds.masked_fill(~lower, 0.0)  # the −inf entries carry no gradient
        X = wb * bb[..., None]
        # q̂ = Q − QW U, k̂ = K − Yᵀ W, S = QKᵀ − QW Y, Pᵀ = I − Uᵀ W
        dQW = _addmm_(dq_start @ U.mT, ds, Y.mT).mul_(lower).neg_()  # [N, BH, c, c] (q·w kept for i ≤ t)
        dU = _addmm_(QW.mT @ dq_start, wb, dPt.mT).neg_()  # [N, BH, c, D]
        dY = _addmm_(QW.mT @ ds, wb, dk_end.mT).neg_()  # [N, BH, c, c]
        dw = _addmm_(U @ dPt, Y, dk_end).neg_()  # [N, BH, c, D]
        # U = T X, Y = T WK with L T = I: dX += Tᵀ dU, dWK = Tᵀ dY, dL = −Tᵀ (dU Uᵀ + dY Yᵀ) on j > s
        dX = Tinv.mT @ dU  # [N, BH, c, D]
        dR = Tinv.mT @ dY  # [N, BH, c, c]
        dA = _addmm_(dX @ U.mT, dR, Y.mT).mul_(strict).neg_()  # [N, BH, c, c] = dL below the diagonal
        dWK = dR.mul_(strict)  # [N, BH, c, c]
        # L = I + βW Wᵀ, WK = βW Kᵀ, QW = Q Wᵀ, S ∋ Q Kᵀ
        dX = _addmm_(_addmm_(dX, dA, wb), dWK, kb)
        dq = _addmm_(_addmm(dq_start, dQW, wb), ds, kb)
        dk = _addmm_(_addmm(dk_end, dWK.mT, X), ds.mT, qb)
        dw = _addmm_(_addmm_(dw, dA.mT, X), dQW.mT, qb).add_(dX * bb[..., None])
        db = (dX * wb).sum(-1)
        return dq, dk, dw, db


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


LN2 = math.log(2.0)


def _flash_walk_applies(*tensors: torch.Tensor | None) -> bool:
    """The key walk (forward and backward by ATen's fused CPU flash ops) serves CPU tensors where both ops exist."""
    return (_CPU_FWD is not None and _CPU_BWD is not None
            and all(t.device.type == "cpu" for t in tensors if t is not None))


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _diag_softmax(s_diag: torch.Tensor, vb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax of every chunk's diagonal block alone: ``s_diag [N, BH, c, c]`` log2-unit logits (−inf above the
    diagonal), ``vb [N, BH, c, Dv]`` -> normalised output ``[N, BH, c, Dv]`` and natural-unit log-sum-exp
    ``[N, BH, c]``."""
    m = s_diag.amax(-1)  # [N, BH, c] finite: the diagonal entry is always there
    p = s_diag.sub(m[..., None]).exp2_()  # [N, BH, c, c] (in place on fresh tensors: each new one costs a pass)
    l = p.sum(-1)  # [N, BH, c]
    return (p @ vb).div_(l[..., None]), m * LN2 + l.log()


class _KeyWalk:
    """The keys of all earlier chunks carried to the start of query chunk n (PATH.md §6).

    ``keys [BH, ≥ n·c, width]``: after :meth:`advance` to n, rows ``:n·c`` hold K_n(s) = P_{n−1} ⋯ P_{m+1} k̂_s for
    s in chunk m < n; with a bias, coordinate D holds R_n − G_s (float64 difference, then cast: near keys keep
    small values) against a constant 1 on the queries. ``queries [N, BH, c, width]`` are the chunk-start queries q̂
    (and the 1), ``values [BH, N·c, width]`` v zero-padded (the fused op wants one head size for q, k and v).
    Each step's transport writes into another buffer (BLAS straight into the rows, no temporary): one of two
    of N·c rows used in turn, or with ``fresh`` a new one of n·c rows that later steps never touch (kept for the
    backward). ``operands``: the (queries, values) of an earlier walk over the same chunks (the backward reuses the
    forward's), else built here: q̂ itself and one copy of v when no column is added, else one copy each.
    """

    def __init__(self, q_start, k_end, Pt, vb, G, R, operands=None):
        N, BH, c, D = q_start.shape
        Dv = vb.shape[-1]
        self.N, self.c, self.D, self.Dv = N, c, D, Dv
        self.k_end, self.Pt = k_end, Pt
        self.G, self.R = G, R  # the far-mass split of :func:`_chunked_inputs`, or None
        self.bias = G is not None
        W = self.width = max(D + self.bias, Dv)
        self.keys: torch.Tensor | None = None
        self.pool: list[torch.Tensor] = []  # two buffers of N·c rows, used in turn by steps that are not fresh
        self.n = 0
        if operands is not None:
            self.queries, self.values = operands
            return
        self.values = widened(vb.transpose(0, 1), W).view(BH, N * c, W)  # [BH, N·c, W]
        queries = widened(q_start, D + 1, 1.0) if self.bias else q_start  # [N, BH, c, D (+1)]
        self.queries = queries if W == queries.shape[-1] else widened(queries, W)

    def restore(self, n: int, keys: torch.Tensor | None) -> None:
        """Set the walk to K_n (``[BH, n·c, width]``, not copied: advance ``fresh`` from here, so it stays as it
        is); n = 1 with None rebuilds K_1 = k̂_0 itself."""
        if keys is None:
            self.n, self.keys = 0, None
            self.advance(fresh=True)
        else:
            self.n, self.keys = n, keys

    def _buffer(self, rows: int) -> torch.Tensor:
        buf = self.values.new_empty(self.values.shape[0], rows, self.width)
        if self.width > self.D + self.bias:
            buf[..., self.D + self.bias :] = 0.0  # zero columns pad q·k to the common width
        return buf

    def advance(self, fresh: bool = False) -> torch.Tensor:
        """Move from K_n to K_{n+1} = [K_n P_nᵀ ; k̂_n] and return its rows ``:(n+1)·c``."""
        n, c, D = self.n + 1, self.c, self.D
        done = (n - 1) * c  # rows already held (chunks 0..n−2, carried to chunk n−1's start)
        if fresh:
            dst = self._buffer(n * c)
        else:
            if not self.pool:
                self.pool = [self._buffer(self.N * c), self._buffer(self.N * c)]
            dst = self.pool[self.keys is self.pool[0]]  # the one not being read
        if done:  # ... and carried across chunk n−1
            torch.bmm(self.keys[:, :done, :D], self.Pt[n - 1], out=dst[:, :done, :D])
        dst[:, done : n * c, :D] = self.k_end[n - 1]
        if self.bias:  # b_ts = a_t + (R_n − G_s): the key part here, a_t is added to the log-sum-exp
            dst[:, : n * c, D] = (self.R[n][:, None] - self.G[:, : n * c]).to(dst.dtype)
        self.keys, self.n = dst, n
        return dst[:, : n * c]


KEEP_ALL = 16  # up to this many chunks the forward keeps every K_n (≤ N/2·T keys), so the backward walks no more


def _segment(N: int) -> int:
    """Chunks per backward segment. Up to :data:`KEEP_ALL` chunks, 1: every K_n is kept (at most 8·T keys).
    Beyond, ⌈√(N − 1)⌉: the kept buffers (one per segment boundary, and those of the segment being worked on)
    hold O(√N) copies of at most T keys, not N."""
    return 1 if N <= KEEP_ALL else math.isqrt(N - 2) + 1


def _walk_chunks(q_start, k_end, Pt, vb, G, R, keep: int = 0):
    """The key walk alone (N ≥ 2): one fused flash call per query chunk n ≥ 1 over the keys of chunks 0..n−1
    carried to its start (:class:`_KeyWalk`; the loop in C++ when the CPU kernels are built). Returns the output
    ``[N−1, BH, c, Dv]`` and the log-sum-exp ``[N−1, BH, c]`` (natural units, without the bias's row part a_t),
    the K_n buffers at n = 1 + keep, 1 + 2·keep, … when ``keep`` > 0 (``{n: [BH, n·c, width]}``) and the walk."""
    N, D, Dv = q_start.shape[0], q_start.shape[-1], vb.shape[-1]
    walk = _KeyWalk(q_start, k_end, Pt, vb, G, R)
    kept: dict[int, torch.Tensor] = {}
    kernels = _walk_kernels()
    if kernels is not None:  # the same loop in C++ (csrc/path_cpu.cpp)
        o, l, buffers = kernels.path_walk_forward(walk.queries, walk.values, k_end, Pt, G, R, keep, Dv)
        kept = dict(zip(range(1 + keep, N, keep), buffers)) if keep else {}
    else:
        # with a bias (and Dv ≤ D) the flash calls run at head size D with the bias's key part as a broadcast
        # mask (added after the scale, so times ln 2): cheaper than the extra coordinate, which the kept buffers
        # still carry for the backward
        masked = walk.bias and Dv <= D
        width = D if masked else walk.width
        outs, lses = [], []  # per query chunk n ≥ 1: the walk's output [BH, c, width] and log-sum-exp [BH, c]
        for n in range(1, N):
            keep_n = keep and n > 1 and (n - 1) % keep == 0
            keys = walk.advance(fresh=keep_n)  # [BH, n·c, walk.width]
            if keep_n:
                kept[n] = keys
            rows = keys.shape[1]
            mask = None
            if masked:
                mask = ((walk.R[n][:, None] - walk.G[:, :rows]) * LN2).to(keys.dtype)[None, :, None, :]
            o, l = _CPU_FWD(walk.queries[n][None, ..., :width], keys[None, ..., :width],
                            walk.values[None, :, :rows, :width], 0.0, False, attn_mask=mask,
                            scale=LN2)  # [1, BH, c, width], [1, BH, c]: log2-unit logits · ln 2
            outs.append(o[0])
            lses.append(l[0])
        o, l = torch.stack(outs), torch.stack(lses)  # [N−1, BH, c, width], [N−1, BH, c]
    return o[..., :Dv], l, kept, walk


def _merge(out, lse, o, l, a) -> None:
    """Fold the walk's (o, l) for chunks 1..N−1 into ``out [N, BH, c, Dv]`` and ``lse [N, BH, c]`` in place, by
    the two log-sum-exps (``a [N, BH, c]``: the bias's row part, added to the walk's, or None)."""
    if a is not None:
        l = l + a[1:] * LN2
    both = torch.logaddexp(lse[1:], l)  # [N−1, BH, c]
    out[1:].mul_((lse[1:] - both).exp_()[..., None]).add_(o.mul_((l - both).exp_()[..., None]))  # o: the walk's own
    lse[1:] = both


def _walk_forward(q_start, k_end, Pt, s_diag, vb, G, R, a, keep: int = 0):
    """PaTH attention from the chunked operands: the diagonal blocks, then one fused flash call per query chunk
    over its earlier keys (:func:`_walk_chunks`), merged by log-sum-exp. ``G, R, a``: the far-mass split of
    :func:`_chunked_inputs` (a_t, the bias's row part, is added to the walk's log-sum-exp) or None. Returns the
    output ``[N, BH, c, Dv]``, the natural-unit log-sum-exp ``[N, BH, c]`` and, when ``keep`` > 0, the buffers of
    K_n at n = 1 + keep, 1 + 2·keep, … (the backward's checkpoints, ``{n: [BH, n·c, width]}``), and the walk's
    (queries, values) (None at N = 1)."""
    out, lse = _diag_softmax(s_diag, vb)
    if s_diag.shape[0] == 1:
        return out, lse, {}, None
    o, l, kept, walk = _walk_chunks(q_start, k_end, Pt, vb, G, R, keep)
    _merge(out, lse, o, l, a)
    return out, lse, kept, (walk.queries, walk.values)


class _PathWalk(torch.autograd.Function):
    """The chunked PaTH walk with a hand-written backward (CPU), from the operands of :class:`_ChunkCore`.

    forward(q_start, k_end ``[N, BH, c, D]``, Pt ``[N, BH, D, D]`` (Pᵀ per chunk), s_diag ``[N, BH, c, c]``,
    vb ``[N, BH, c, Dv]``, G ``[BH, N·c]`` float64, R ``[N, BH]``, a ``[N, BH, c]`` or all three None) ->
    ``[N, BH, c, Dv]``. Saves the operands, the output, its log-sum-exp and the K_n buffers of
    :func:`_segment` (every one up to 16 chunks, else O(√N) of them; no tile). The backward (PATH.md §7) rebuilds
    the walk between those buffers, calls ATen's fused flash backward per query chunk with the merged output and
    log-sum-exp, and carries the key gradients back through K_{n+1} = [K_n P_nᵀ ; k̂_n], which also gives each
    chunk transport's gradient. The bias's gradient reaches G alone (R and a are functions of G, taken as
    constants here).
    """

    @staticmethod
    def forward(ctx, q_start, k_end, Pt, s_diag, vb, G, R, a):
        seg = _segment(s_diag.shape[0])
        out, lse, kept, operands = _walk_forward(q_start, k_end, Pt, s_diag, vb, G, R, a, keep=seg)
        ctx.seg, ctx.kept_at = seg, sorted(kept)
        queries, values = (q_start, None) if operands is None else operands  # q̂ is queries[..., :D]
        ctx.save_for_backward(queries, values, k_end, Pt, s_diag, vb, G, R, a, out, lse, *kept.values())
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        queries, values, k_end, Pt, s_diag, vb, G, R, a, out, lse, *kept = ctx.saved_tensors
        kept = dict(zip(ctx.kept_at, kept))
        N, BH, c, D = k_end.shape
        q_start = queries[..., :D]
        Dv = vb.shape[-1]
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)  # [N, BH, c] rowsum(dO ∘ O)
        # diagonal blocks: P = exp(ℓ − lse), dℓ = P ∘ (dO vᵀ − Δ); the logits are in log2 units, so ds = ln 2 · dℓ
        p = s_diag.sub((lse * LOG2E)[..., None]).exp2_()  # [N, BH, c, c]
        ds_diag = (dout @ vb.mT).sub_(delta[..., None]).mul_(p).mul_(LN2)  # [N, BH, c, c]
        dvb = p.mT @ dout  # [N, BH, c, Dv]
        del p
        dG = None
        if N == 1:  # one chunk: the diagonal block is all there is
            dq, dk, dPt = torch.zeros_like(q_start), torch.zeros_like(k_end), torch.zeros_like(Pt)
        else:
            walk = _KeyWalk(q_start, k_end, Pt, vb, G, R, operands=(queries, values))
            width = walk.width
            g_w = _tokens_major(dout, width)  # [N, BH, c, width]
            o_w = widened(out, width) if width > Dv else out
            lse_walk = lse - a * LN2 if a is not None else lse  # the flash op's own logits lack a_t
            kernels = _walk_kernels()
            if kernels is not None:  # the same loop in C++ (csrc/path_cpu.cpp)
                dq, dk, dPt, dvals, dcol = kernels.path_walk_backward(
                    walk.queries, walk.values, k_end, Pt, G, R, g_w, o_w, lse_walk, list(kept.values()),
                    list(kept), ctx.seg, Dv)
                dcol = dcol if walk.bias else None
            else:
                dq, dk, dPt, dvals, dcol = _walk_backward_loop(walk, kept, ctx.seg, g_w, o_w, lse_walk)
            dvb += dvals.view(BH, N, c, Dv).transpose(0, 1)
            if dcol is not None:
                # b_ts = G_t − G_s off the diagonal blocks: −Σ_t dℓ_ts to G_s, and to G_t its row's off-diagonal
                # sum, which is minus the diagonal block's (every row of dℓ sums to 0: softmax ignores a row shift)
                row = -ds_diag.sum(-1)  # [N, BH, c]
                row[0] = 0.0  # chunk 0 has no earlier keys
                dG = (row.transpose(0, 1).reshape(BH, N * c) - dcol).to(torch.float64)
        return dq, dk, dPt, ds_diag, dvb, dG, None, None


def _tokens_major(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x [N, BH, c, Dv]`` zero-padded to ``width``, stored token-major (``[N, c, BH, width]`` in memory) and
    returned as the ``[N, BH, c, width]`` view. ATen's fused CPU backward reads its output gradient in
    ``[B, T, H, D]`` order and copies any other layout on every call: one copy here instead of one per chunk."""
    return widened(x.transpose(1, 2), width).transpose(1, 2)


class _RowColumnBias(torch.autograd.Function):
    """``s + a_t − a_s`` for ``s [..., c, c]`` and ``a [..., c]`` in one pass (the bias inside each chunk); the
    backward: ds itself, and to a its row sums minus its column sums."""

    @staticmethod
    def forward(ctx, s, a):
        return s.add(a[..., :, None]).sub_(a[..., None, :])

    @staticmethod
    def backward(ctx, ds):
        return ds, ds.sum(-1) - ds.sum(-2)


def _walk_backward_loop(walk: _KeyWalk, kept: dict[int, torch.Tensor], seg: int, g_w, o_w, lse_walk):
    """The eager twin of ``path_walk_backward`` (``csrc/path_cpu.cpp``): from the last query chunk to the first,
    ATen's fused flash backward per chunk, then the key gradients carried back through K_{n+1} = [K_n P_nᵀ ; k̂_n]
    (which also gives each chunk transport's gradient). Segments between the forward's ``kept`` buffers are
    rebuilt by walking forward again (N ≥ 2). Returns dq, dk ``[N, BH, c, D]``, dPt ``[N, BH, D, D]``, the value
    gradient ``[BH, N·c, Dv]`` and, with a bias, the column sums of the logit gradient ``[BH, N·c]`` (else None)."""
    N, BH, c, D = walk.N, walk.values.shape[0], walk.c, walk.D
    Dv, Pt = walk.Dv, walk.Pt
    dq, dk, dPt = torch.empty_like(walk.k_end), torch.empty_like(walk.k_end), torch.empty_like(Pt)
    dq[0], dk[-1], dPt[0], dPt[-1] = 0.0, 0.0, 0.0, 0.0  # chunk 0 has no earlier keys, the last passes none on
    dvals = walk.values.new_zeros(BH, N * c, Dv)
    dcol = walk.values.new_zeros(BH, N * c) if walk.bias else None
    snapshots: dict[int, torch.Tensor] = {}  # K_n of the segment being worked on
    A = None  # adjoint of K_{n+1}'s first D coordinates, [BH, (n+1)·c, D]
    for n in range(N - 1, 0, -1):
        if n not in snapshots:  # rebuild segment [first, n]: K_first from its checkpoint, then walk on
            first = 1 + (n - 1) // seg * seg
            walk.restore(first, kept.pop(first, None))
            snapshots = {first: walk.keys}
            snapshots.update((m, walk.advance(fresh=True)) for m in range(first + 1, n + 1))
        K = snapshots.pop(n)  # [BH, n·c, width]
        rows = n * c
        dq_, dK, dV = _CPU_BWD(g_w[n][None], walk.queries[n][None], K[None], walk.values[None, :, :rows],
                               o_w[n][None], lse_walk[n][None], 0.0, False, scale=LN2)
        dq[n] = dq_[0, ..., :D]
        dvals[:, :rows].add_(dV[0, ..., :Dv])
        dK = dK[0]  # [BH, n·c, width]
        if dcol is not None:
            dcol[:, :rows].add_(dK[..., D])  # Σ_t dℓ_ts: the key part R_n − G_s of the bias
        if A is None:
            A = dK[..., :D]
        else:  # K_{n+1} = [K_n Pt_n ; k̂_n]
            dk[n] = A[:, rows : rows + c]
            torch.bmm(K[..., :D].mT, A[:, :rows], out=dPt[n])  # [BH, D, D]
            A = dK[..., :D].baddbmm_(A[:, :rows], Pt[n].mT)  # into the flash op's own fresh dK
    dk[0] = A[:, :c]  # K_1 = k̂_0
    return dq, dk, dPt, dvals, dcol


def _core_operands(q, k, v, w, beta, log_decay, chunk_size: int, scale: float, multiple: int = 1,
                   grouped: bool = False):
    """:func:`_chunked_inputs`, then the chunk core (:class:`_ChunkCore`) with the bias inside each chunk: the work
    dtype, c, N, ``(s_diag [N, BH, c, c], q̂, k̂ [N, BH, c, D], Pᵀ [N, BH, D, D], vb [N, BH, c, Dv])`` and the
    far-mass split ``(G, R, a)``, what both CPU walks start from."""
    dt, c, N, (qb, kb, vb, wb, bb), (G, R, a) = _chunked_inputs(q, k, v, w, beta, log_decay, chunk_size, scale,
                                                                multiple, grouped)
    s_diag, q_start, k_end, Pt = _ChunkCore.apply(qb, kb, wb, bb)
    if a is not None:
        s_diag = _RowColumnBias.apply(s_diag, a)  # the bias inside the chunk
    return dt, c, N, (s_diag, q_start, k_end, Pt, vb), (G, R, a)


def _path_walk(q, k, v, w, beta, log_decay, chunk_size: int, scale: float) -> torch.Tensor:
    """The chunked kernel on the CPU: the UT transform and diagonal blocks (:class:`_ChunkCore`), every block pair
    by the key walk (:func:`_walk_forward`, with :class:`_PathWalk`'s backward when a gradient is needed), both
    with hand-written backwards; the in-chunk bias and the blocking stay with autograd. Without a gradient, at the
    lengths of :func:`_eval_levels`, the walk on several levels of :func:`_grouped_walk`."""
    B, H, T, D = q.shape
    grad = _needs_grad(q, k, v, w, beta, log_decay)
    levels = () if grad else _eval_levels(T, min(chunk_size, T))
    if levels:
        return _grouped_walk(q, k, v, w, beta, log_decay, chunk_size, scale, levels)
    _, _, _, (s_diag, q_start, k_end, Pt, vb), (G, R, a) = _core_operands(q, k, v, w, beta, log_decay, chunk_size,
                                                                          scale)
    split = (G, None, None) if a is None else (G, R.detach(), a.detach())  # G alone carries the bias's gradient
    if grad:
        out = _PathWalk.apply(q_start, k_end, Pt, s_diag, vb, *split)
    else:
        out = _walk_forward(q_start, k_end, Pt, s_diag, vb, *split)[0]
    return _unblock(out, B, H, T).to(q.dtype)


EVAL_GROUP = 256  # tokens per innermost group of the evaluation walk (PATH.md §6)


def _eval_levels(T: int, c: int) -> tuple[int, ...]:
    """Chunks per group at each level of :func:`_grouped_walk` at length T, innermost first; empty: the one-level
    walk. Measured (PATH.md §6): groups pay from T = 4096 (at 2048 they tie), groups of 256 tokens there, and of
    1024 from T = 8192, where the fused kernel's long-query calls take its 256-query blocks (on a Xeon 1024 beat
    768 by 7 % at 8192 and 16384). A third level measured no faster at 8192 or 16384: the walk supports it, the
    lengths here do not choose it."""
    g = EVAL_GROUP // c
    if g < 2 or T < 16 * EVAL_GROUP:
        return ()
    return (4 * g,) if T >= 32 * EVAL_GROUP else (g,)


def _grouped_walk(q, k, v, w, beta, log_decay, chunk_size: int, scale: float, levels: tuple[int, ...]):
    """The CPU key walk without a gradient, on several levels (PATH.md §6): chunks of c tokens inside groups of
    ``levels[0]`` chunks, those inside groups of ``levels[1]`` chunks, and so on (each a multiple of the one
    before). :func:`_walk_levels` does the work from the chunk core's operands."""
    B, H, T, D = q.shape
    # the chunk core runs on the outer level's group-major layout, so the walk needs no regrouping copies
    _, c, N, (s_diag, q_hat, k_hat, Pt, vb), (G, R, a) = _core_operands(q, k, v, w, beta, log_decay,
                                                                        min(chunk_size, T), scale,
                                                                        multiple=levels[-1], grouped=True)
    out = _walk_groups(s_diag, q_hat, k_hat, Pt, vb, G, R, a, levels, B * H)[0]  # [BH, N·c, Dv]
    return out.view(B, H, N * c, -1)[:, :, :T].to(q.dtype)


def _walk_levels(s_diag, q_hat, k_hat, Pt, vb, G, R, a, levels: tuple[int, ...]):
    """PaTH attention without a gradient from the chunk core's operands (``[N, BH, ...]`` chunk-major, the
    far-mass split ``G [BH, N·c], R [N, BH], a [N, BH, c]`` or None), walking groups of g = ``levels[-1]`` chunks
    (N a multiple of g). Returns the output ``[BH, N·c, Dv]`` and the natural-unit log-sum-exp ``[BH, N·c]``,
    token-major. No levels: :func:`_walk_forward`; else the operands regrouped (:func:`_by_group`) for
    :func:`_walk_groups`."""
    N, BH, c, _ = q_hat.shape
    Dv = vb.shape[-1]
    if not levels:
        out, lse = _walk_forward(q_hat, k_hat, Pt, s_diag, vb, G, R, a)[:2]  # [N, BH, c, Dv], [N, BH, c]
        return out.transpose(0, 1).reshape(BH, N * c, Dv), lse.transpose(0, 1).reshape(BH, N * c)
    g = levels[-1]
    s_g, q_g, k_g, Pt_g, v_g = (_by_group(x, g) for x in (s_diag, q_hat, k_hat, Pt, vb))
    return _walk_groups(s_g, q_g, k_g, Pt_g, v_g, G, R, None if a is None else _by_group(a, g), levels, BH)


def _by_group(x: torch.Tensor, g: int) -> torch.Tensor:
    """``[N, BH, *]`` chunk-major -> ``[g, Ng·BH, *]`` group-major: chunk j of every group of g chunks, as one batch
    (the layout :func:`_blocks` gives directly with ``groups=g``)."""
    return x.unflatten(0, (x.shape[0] // g, g)).transpose(0, 1).reshape(g, -1, *x.shape[2:])


def _walk_groups(s_g, q_g, k_g, Pt_g, v_g, G, R, a_g, levels: tuple[int, ...], BH: int):
    """:func:`_walk_levels` from operands already in the group-major layout of g = ``levels[-1]`` chunks per group
    (``[g, Ng·BH, ...]``, :func:`_by_group`; ``a_g`` too, G and R in token order). Inside the groups: every group
    at once as a batch of Ng·BH sequences of g chunks, by the levels below. Across groups: each group's queries
    carried to the group's start (q̂ P_{j−1} ⋯ P_0), its keys to its end (P_{g−1} ⋯ P_{j+1} k̂) and its transport
    (the product of its g chunk transports, D × D), so the walk of :func:`_walk_chunks` steps a group at a time:
    its flash calls see g·c queries, not c, and its key transports cost g times less. Same sums, another order."""
    g, NgBH, c, D = q_g.shape
    Ng, N, C, Dv = NgBH // BH, g * (NgBH // BH), g * c, v_g.shape[-1]
    # inside the groups: Ng·BH sequences of g chunks (G and R keep their global values: only differences within a
    # group are used); token-major [Ng·BH, C] is [Ng, BH, C], this level's group-major layout, as it is
    G_in = R_in = None
    if G is not None:
        G_in = G.view(BH, Ng, C).transpose(0, 1).reshape(Ng * BH, C)  # [Ng·BH, C]
        R_in = _by_group(R, g)  # [g, Ng·BH]
    out, lse = _walk_levels(s_g, q_g, k_g, Pt_g, v_g, G_in, R_in, a_g, levels[:-1])
    out, lse = out.view(Ng, BH, C, Dv), lse.view(Ng, BH, C)
    if Ng > 1:
        # across the groups: M_j = P_{j−1} ⋯ P_0 carries chunk j's queries to the group start, S_j = P_{j+1}ᵀ ⋯
        # P_{g−1}ᵀ its keys (as rows) to the group end; the group's own transport is P_0ᵀ S_0. In the group-major
        # layout chunk j of every group is one contiguous batch, so each product writes straight into its slot
        M, S = Pt_g.new_empty(g, Ng * BH, D, D), Pt_g.new_empty(g, Ng * BH, D, D)  # [g, Ng·BH, D, D]
        M[0] = S[-1] = torch.eye(D, dtype=Pt_g.dtype, device=Pt_g.device)
        for j in range(1, g):
            torch.bmm(Pt_g[j - 1].mT, M[j - 1], out=M[j])
            torch.bmm(Pt_g[g - j], S[g - j], out=S[g - 1 - j])

        def by_chunk(x: torch.Tensor) -> torch.Tensor:  # [g, Ng·BH, c, D] -> [Ng, BH, g·c, D]
            return x.view(g, Ng, BH, c, -1).permute(1, 2, 0, 3, 4).reshape(Ng, BH, C, x.shape[-1])

        q_start, k_end, v_group = by_chunk(q_g @ M), by_chunk(k_g @ S), by_chunk(v_g)
        P_group = (Pt_g[0] @ S[0]).view(Ng, BH, D, D)  # (rows)
        R_group = a_group = None
        if G is not None:
            R_group = R[::g]  # [Ng, BH] G just before each group
            a_group = (G.view(BH, Ng, C).transpose(0, 1) - R_group[..., None]).to(out.dtype)  # [Ng, BH, C]
        o, l = _walk_chunks(q_start, k_end, P_group, v_group, G, R_group)[:2]
        _merge(out, lse, o, l, a_group)
    return out.transpose(0, 1).reshape(BH, N * c, Dv), lse.transpose(0, 1).reshape(BH, N * c)


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


def _normalise(acc: torch.Tensor) -> torch.Tensor:
    """``[..., Dv + 1]`` unnormalised ``[Σ p v, Σ p]`` -> ``[..., Dv]`` softmax output."""
    return acc[..., :-1] / acc[..., -1:]


def _unblock(x: torch.Tensor, B: int, H: int, T: int) -> torch.Tensor:
    """``[N, B·H, c, Dv]`` -> ``[B, H, T, Dv]`` (drops the padded tail), stored token-major (``[B, T, H, Dv]`` in
    memory, as ATen's fused attention returns NoPE's): the attention module's ``transpose(1, 2).reshape`` to
    ``[B, T, H·Dv]`` is then a view, not a second copy (nor is its backward)."""
    N, _, c, Dv = x.shape
    y = x.view(N, B, H, c, Dv).permute(1, 0, 3, 2, 4).reshape(B, N * c, H, Dv)  # [B, N·c, H, Dv], one copy
    return y[:, :T].transpose(1, 2)


# -- naive twins ------------------------------------------------------------------------------------
def naive_path_attention_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """PaTH attention by the per-query backward recurrence u ← H_j u (vector ops only, O(T²·D), T steps).

    Every query t starts at u = q_t; at step d it scores key t − d (ℓ = u·k_{t−d} + G_t − G_{t−d}), folds it into
    its own streaming softmax, then applies H_{t−d} to walk one token further back. All queries step together,
    so the state is ``[B, H, T, D]`` and nothing ``[T, T]`` is ever formed.

    Args:
        q, k, w: ``[B, H, T, D]`` (w unit rows); v: ``[B, H, T, Dv]``; beta: ``[B, H, T]``;
        log_decay: ``[B|1, H, T]`` per-step log f_j or None; scale: default D^−1/2.
    Returns:
        ``[B, H, T, Dv]`` in q's dtype.
    """
    _check_inputs(q, k, v, w, beta, log_decay)
    B, H, T, D = q.shape
    scale = D**-0.5 if scale is None else scale
    if T == 0:
        return v.new_zeros(B, H, 0, v.shape[-1]).to(q.dtype)
    out_dtype, dt = q.dtype, _work_dtype(q, k, v, w, beta)
    q, k, v, w, beta = q.to(dt) * scale, k.to(dt), v.to(dt), w.to(dt), beta.to(dt)
    G = None if log_decay is None else _cumulative_log_decay(log_decay, B, T)  # [B, H, T] float64
    u = q  # [B, H, T − d, D]: row i is query t = i + d, already carried across H_t ⋯ H_{t−d+1}
    s = (u * k).sum(-1)  # [B, H, T] ℓ(t, t)
    m = s.detach()  # [B, H, T] running max
    l = (s - m).exp()  # [B, H, T] running sum (ones, but carrying the logit's gradient)
    acc = l[..., None] * v  # [B, H, T, Dv] unnormalised output
    outs = [acc[:, :, :1] / l[:, :, :1, None]]  # query 0 has only itself
    for d in range(1, T):
        wj, bj = w[:, :, 1 : T - d + 1], beta[:, :, 1 : T - d + 1]  # H_{t−d+1} for t = d..T−1
        u = u[:, :, 1:]
        u = u - (bj * (u * wj).sum(-1))[..., None] * wj  # [B, H, T−d, D]
        s = (u * k[:, :, : T - d]).sum(-1)  # [B, H, T−d] ℓ(t, t − d)
        if G is not None:
            s = s + (G[..., d:] - G[..., : T - d]).to(dt)
        m, l, acc = m[:, :, 1:], l[:, :, 1:], acc[:, :, 1:]  # query d − 1 is done
        m_new = torch.maximum(m, s).detach()  # streaming softmax, one key per query
        alpha, p = (m - m_new).exp(), (s - m_new).exp()  # [B, H, T−d]
        m, l, acc = m_new, l * alpha + p, acc * alpha[..., None] + p[..., None] * v[:, :, : T - d]
        outs.append(acc[:, :, :1] / l[:, :, :1, None])  # query t = d has reached key 0
    return torch.cat(outs, 2).to(out_dtype)  # [B, H, T, Dv]


def naive_path_attention_products(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    scale: float | None = None,
    logit_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """PaTH attention from explicit D×D path products and a full softmax: the dumbest correct version.

    M_ts = H_t H_{t−1} ⋯ H_{s+1} is multiplied out for every pair and b_ts summed term by term: O(T³·D³), tiny T only.
    Arguments and result as :func:`naive_path_attention_recurrence`; ``logit_scale`` ``[B|1, H, T]`` multiplies
    every transported score of row t before the bias is added (scalable softmax's s_h·log(t + 1)).
    """
    _check_inputs(q, k, v, w, beta, log_decay)
    B, H, T, D = q.shape
    scale = D**-0.5 if scale is None else scale
    out_dtype, dt = q.dtype, _work_dtype(q, k, v, w, beta)
    q, k, v, w, beta = q.to(dt), k.to(dt), v.to(dt), w.to(dt), beta.to(dt)
    eye = torch.eye(D, dtype=dt, device=q.device)
    Hj = eye - beta[..., None, None] * w[..., :, None] * w[..., None, :]  # [B, H, T, D, D]
    ld = None if log_decay is None else log_decay.to(torch.float64).expand(B, -1, -1)  # [B, H, T]
    rows = []
    for t in range(T):
        row = []
        for s in range(T):
            if s > t:
                row.append(q.new_full((B, H), float("-inf")))
                continue
            M = eye.expand(B, H, D, D)
            for j in range(t, s, -1):
                M = M @ Hj[:, :, j]  # [B, H, D, D] H_t ⋯ H_j
            logit = scale * torch.einsum("bhd,bhde,bhe->bh", q[:, :, t], M, k[:, :, s])  # [B, H]
            if logit_scale is not None:
                logit = logit * logit_scale[:, :, t].to(dt)
            if ld is not None:
                logit = logit + ld[..., s + 1 : t + 1].sum(-1).to(dt)
            row.append(logit)
        rows.append(torch.stack(row, -1))  # [B, H, T]
    if not rows:
        return v.new_zeros(B, H, 0, v.shape[-1]).to(out_dtype)
    logits = torch.stack(rows, -2)  # [B, H, T, T]
    return (logits.softmax(-1) @ v).to(out_dtype)  # [B, H, T, Dv]


def householder_product(w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """The explicit product H_T ⋯ H_2 H_1 over the sequence axis by one UT transform (rank-T update of I).

    Args:
        w: ``[..., T, D]`` unit rows; beta: ``[..., T]``.
    Returns:
        ``[..., D, D]`` in float32 or wider: I − Wᵀ (I + strict_lower(diag(β) W Wᵀ))⁻¹ diag(β) W.
    """
    dt = _work_dtype(w, beta)
    w, beta = w.to(dt), beta.to(dt)
    T, D = w.shape[-2:]
    wbeta = w * beta[..., None]  # [..., T, D]
    L = torch.eye(T, dtype=dt, device=w.device) + (wbeta @ w.mT).tril(-1)  # [..., T, T]
    U = torch.linalg.solve_triangular(L, wbeta, upper=False, unitriangular=True)  # [..., T, D]
    return torch.eye(D, dtype=dt, device=w.device) - w.mT @ U  # [..., D, D]


# -- optional CUDA kernel ---------------------------------------------------------------------------------
FLA_HEAD_DIMS = (16, 32, 64)  # what fla's PaTH kernels support
FLA_INSTALL = "pip install -e '.[gpu]'"


def fla_problem(device: torch.device | str | None = None) -> str | None:
    """Why ``kernel='fla'`` cannot run (on ``device``, when given), as one line; None when it can.

    Checked in order: a CUDA device, Triton, then fla's PaTH kernel itself (``find_spec`` first, so a missing
    package never costs an import)."""
    import importlib.util

    if device is not None and torch.device(device).type != "cuda":
        return (f"kernel='fla' needs CUDA tensors (got device {torch.device(device).type!r}); use "
                "kernel='chunked' on the CPU")
    if importlib.util.find_spec("triton") is None:
        return (f"kernel='fla' needs Triton, which is not installed (it comes with torch's CUDA wheels and with "
                f"{FLA_INSTALL}); use kernel='chunked'")
    if importlib.util.find_spec("fla") is None:
        return (f"kernel='fla' needs the optional flash-linear-attention package, which is not installed "
                f"({FLA_INSTALL}); use kernel='chunked'")
    try:
        from fla.ops.path_attn.parallel import parallel_path_attention  # noqa: F401
    except Exception as err:  # noqa: BLE001 - an fla that does not import (Triton too old or too new) is the reason
        text = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        return (f"kernel='fla' could not import fla's PaTH kernel ({type(err).__name__}: {text}); install the "
                f"pinned version ({FLA_INSTALL}) or use kernel='chunked'")
    return None


def _path_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    log_decay: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """fla's Triton PaTH (``parallel_path_attention``, ``[B, T, H, D]`` layout): q, k, v and w in q's dtype (its
    matmuls want one dtype), β and the gate in float32 (β near 0 and near 2 must not round: H_j is a reflection
    at exactly 2)."""
    problem = fla_problem(q.device)
    if problem is not None:
        raise ConfigError(problem)
    D, Dv = q.shape[-1], v.shape[-1]
    if D not in FLA_HEAD_DIMS or Dv not in FLA_HEAD_DIMS:
        got = f"{D}" if D == Dv else f"{D} for q, k and {Dv} for v"
        raise ConfigError(f"kernel='fla' supports head dims {', '.join(map(str, FLA_HEAD_DIMS))} (got {got}); change "
                          "d_model / n_heads or use kernel='chunked'")
    from fla.ops.path_attn.parallel import parallel_path_attention

    B = q.shape[0]
    g = None
    if log_decay is not None:
        # fla adds its gate before multiplying by the softmax scale; ours is added after, so pre-divide.
        g = (log_decay.float().expand(B, -1, -1) / scale).transpose(1, 2).contiguous()  # [B, T, H] float32
    o, _ = parallel_path_attention(
        q=q.transpose(1, 2),  # fla is [B, T, H, D]
        k=k.to(q.dtype).transpose(1, 2),
        v=v.to(q.dtype).transpose(1, 2),
        w=w.to(q.dtype).transpose(1, 2),
        beta=beta.float().transpose(1, 2),  # [B, T, H] float32
        g=g,
        scale=scale,
    )
    return o.transpose(1, 2).to(q.dtype)  # [B, H, T, Dv]


# -- public entry point -----------------------------------------------------------------------------
def path_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    chunk_size: int = 32,
    kernel: Kernel = "chunked",
    scale: float | None = None,
) -> torch.Tensor:
    """Causal PaTH attention (optionally PaTH-FoX), ``[B, H, T, Dv]`` in q's dtype.

    Args:
        q, k: ``[B, H, T, D]``; v: ``[B, H, T, Dv]``.
        w: ``[B, H, T, D]`` unit rows; beta: ``[B, H, T]`` in [0, 2] (H_j = I − β_j w_j w_jᵀ).
        log_decay: ``[B|1, H, T]`` per-step log f_j ≤ 0 or None; b_ts = Σ_{j=s+1..t} log f_j is added to the
            logit after the D^−1/2 scaling.
        chunk_size: chunk length c of the chunked kernel (any positive int; c ≥ T means one chunk).
        kernel: ``"chunked"`` (default), ``"recurrent"`` (the naive recurrence, for debugging) or ``"fla"``
            (fla's Triton kernel: CUDA tensors, Triton and the pinned ``fla`` of the ``gpu`` extra needed; what is
            missing is one :class:`~accrot.errors.ConfigError` line, :func:`fla_problem`).
        scale: logit scale, default D^−1/2.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} is not valid; choose one of {', '.join(map(repr, KERNELS))}")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} is not valid; it must be a positive integer")
    _check_inputs(q, k, v, w, beta, log_decay)
    B, H, T, D = q.shape
    scale = D**-0.5 if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale={scale!r} is not valid; it must be finite")
    if T == 0:
        return q.new_zeros(B, H, 0, v.shape[-1])
    with torch.autocast(device_type=q.device.type, enabled=False):  # Householder math stays ≥ float32
        if kernel == "fla":
            return _path_fla(q, k, v, w, beta, log_decay, scale)
        if kernel == "recurrent":
            return naive_path_attention_recurrence(q, k, v, w, beta, log_decay, scale=scale)
        if _flash_walk_applies(q, k, v, w, beta, log_decay):
            return _path_walk(q, k, v, w, beta, log_decay, chunk_size, scale)
        return _path_chunked(q, k, v, w, beta, log_decay, chunk_size, scale)

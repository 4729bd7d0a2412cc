"""The chunk core: everything that stays inside a chunk, for all chunks at once (PATH.md §1–2): the UT transform,
the diagonal blocks' logits, the queries carried to their chunk start, the keys to their chunk end and the chunk
transports. :func:`_chunk_core` under autograd serves the block walk; :class:`_ChunkCore`, with a hand-written
backward (C++ when the CPU kernels are built), serves the CPU key walk."""

from __future__ import annotations

import torch

from accrot.ops import cpu_kernels
from accrot.ops.path.common import _chunked_inputs


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


class _RowColumnBias(torch.autograd.Function):
    """``s + a_t − a_s`` for ``s [..., c, c]`` and ``a [..., c]`` in one pass (the bias inside each chunk); the
    backward: ds itself, and to a its row sums minus its column sums."""

    @staticmethod
    def forward(ctx, s, a):
        return s.add(a[..., :, None]).sub_(a[..., None, :])

    @staticmethod
    def backward(ctx, ds):
        return ds, ds.sum(-1) - ds.sum(-2)


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

"""The CPU key walk (PATH.md §6–7): keys carried forward chunk by chunk, one fused flash-attention call per query
chunk over all earlier keys, and its hand-written backward (:class:`_PathWalk`) that keeps O(√N) key buffers. It
serves training and the evaluations below the grouped walk's lengths, and is the step of every level of the
grouped walk; the chunk loop runs in C++ when the CPU kernels are built."""

from __future__ import annotations

import math

import torch

from accrot.ops import cpu_kernels
from accrot.ops.attention import (  # ATen's fused CPU flash attention (out, logsumexp), backward
    _CPU_BWD,
    _CPU_FWD,
    widened,
)
from accrot.ops.path.common import LN2, LOG2E
from accrot.ops.underflow import exp2_, exp_


def _walk_kernels():
    """The compiled key-walk loop (``path_walk_forward``/``_backward``) or None: the eager loop
    (:func:`eager_path_walk_forward`, :func:`eager_path_walk_backward`). Two names for one switch, so a test can run
    the compiled and eager walk loops over the same chunk core."""
    return cpu_kernels.ops()


def _diag_softmax(s_diag: torch.Tensor, vb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax of every chunk's diagonal block alone: ``s_diag [N, BH, c, c]`` log2-unit logits (−inf above the
    diagonal), ``vb [N, BH, c, Dv]`` -> normalised output ``[N, BH, c, Dv]`` and natural-unit log-sum-exp
    ``[N, BH, c]``."""
    m = s_diag.amax(-1)  # [N, BH, c] finite: the diagonal entry is always there
    p = exp2_(s_diag.sub(m[..., None]))  # [N, BH, c, c] (in place on a fresh tensor: each new one costs a pass)
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
    N, Dv = q_start.shape[0], vb.shape[-1]
    walk = _KeyWalk(q_start, k_end, Pt, vb, G, R)
    kernels = _walk_kernels()
    if kernels is not None:  # the same loop in C++ (csrc/path_cpu.cpp)
        o, l, buffers = kernels.path_walk_forward(walk.queries, walk.values, k_end, Pt, G, R, keep, Dv)
        kept = dict(zip(range(1 + keep, N, keep), buffers)) if keep else {}
    else:
        o, l, kept = eager_path_walk_forward(walk, keep)
    return o[..., :Dv], l, kept, walk


def eager_path_walk_forward(walk: _KeyWalk, keep: int = 0):
    """The eager twin of ``path_walk_forward`` (``csrc/path_cpu.cpp``): for each query chunk n ≥ 1, the walk advanced
    to K_n, then one fused flash call over those keys. Returns the output ``[N−1, BH, c, width]``, the log-sum-exp
    ``[N−1, BH, c]`` and the kept K_n buffers, as :func:`_walk_chunks` describes (N ≥ 2)."""
    N, D, Dv = walk.N, walk.D, walk.Dv
    kept: dict[int, torch.Tensor] = {}
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
    return torch.stack(outs), torch.stack(lses), kept  # [N−1, BH, c, width], [N−1, BH, c], {n: K_n}


def _merge(out, lse, o, l, a) -> None:
    """Fold the walk's (o, l) for chunks 1..N−1 into ``out [N, BH, c, Dv]`` and ``lse [N, BH, c]`` in place, by
    the two log-sum-exps (``a [N, BH, c]``: the bias's row part, added to the walk's, or None)."""
    if a is not None:
        l = l + a[1:] * LN2
    both = torch.logaddexp(lse[1:], l)  # [N−1, BH, c]
    out[1:].mul_(exp_(lse[1:] - both)[..., None]).add_(o.mul_(exp_(l - both)[..., None]))  # o: the walk's own
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
        p = exp2_(s_diag.sub((lse * LOG2E)[..., None]))  # [N, BH, c, c]
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
                dq, dk, dPt, dvals, dcol = eager_path_walk_backward(walk, kept, ctx.seg, g_w, o_w, lse_walk)
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


def eager_path_walk_backward(walk: _KeyWalk, kept: dict[int, torch.Tensor], seg: int, g_w, o_w, lse_walk):
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

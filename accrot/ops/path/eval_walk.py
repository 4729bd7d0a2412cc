"""The grouped evaluation walk (PATH.md §6): without a gradient and at long lengths, the key walk on several levels,
chunks inside groups of chunks, so the cross-group flash calls see a whole group's queries and the key
transports cost a group's length less."""

from __future__ import annotations

import torch

from accrot.ops.path.chunk import _core_operands
from accrot.ops.path.common import _by_group
from accrot.ops.path.key_walk import _merge, _walk_chunks, _walk_forward

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

"""PaTH's transport written out: the per-query backward recurrence u ← H_j u (vector ops only, no kernel).

For a query t, u_0 = q_t and u_d = H_{t−d+1} u_{d−1}, so u_dᵀ k_{t−d} = q_tᵀ H_t ⋯ H_{t−d+1} k_{t−d}, the PaTH
pairing of t with the key d steps back. It serves the explicit twin of a scheme (PaTH's transported scores,
:meth:`accrot.position.path.PathRotation.transported_scores`) and the diagnostics that walk a pairing by
distance; the training kernels are :mod:`accrot.ops.path`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

import torch

WALK_BUDGET = 1 << 22  # elements of one stretch's gathered w / k rows


def path_walk(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor, rows: torch.Tensor, max_steps: int,
    wanted: set[int] | None = None, budget: int = WALK_BUDGET,
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """For ascending queries ``rows [R]`` walk back d = 0..max_steps keys: yield ``(d, start, ℓᴹ [B, H, R − start])``
    for the queries ``rows[start:]`` that still have a key t − d ≥ 0, with ℓᴹ = q_tᵀ H_t ⋯ H_{t−d+1} k_{t−d}
    (unscaled), computed as u·k_{t−d} with u ← H_{t−d+1} u, u_0 = q_t.

    Args: q, k, w ``[B, H, T, D]`` (w unit rows), beta ``[B, H, T]``, all of one dtype (the walk's precision).
    The w, β and k rows of a stretch of steps are gathered at once (the walk is thousands of small steps, so
    per-step op count is what costs; ``budget`` bounds a stretch's elements); queries that have reached key 0
    drop out at the next stretch. ``wanted``: the distances to yield (the walk still takes every step; None: all of
    them). Differentiable (plain tensor ops)."""
    B, H, _, D = q.shape
    row_list = rows.tolist()
    # row-major layouts ([T, B, H, D]): one gather of a stretch's rows is already step-major and contiguous
    q_t, k_t, w_t = (x.permute(2, 0, 1, 3).contiguous() for x in (q, k, w))  # one copy each, then fast gathers
    beta_t = beta.permute(2, 0, 1).contiguous()  # [T, B, H]
    u = q_t[rows]  # [R, B, H, D]
    start = 0
    stretch = max(1, budget // max(1, B * H * rows.numel() * D))
    for d0 in range(0, max_steps + 1, stretch):
        first = bisect_left(row_list, d0)  # rows[first:] >= d0 still have keys
        if first >= len(row_list):
            return
        u, start = u[first - start :], first  # [R', B, H, D]
        live = rows[start:]  # [R']
        steps = torch.arange(d0, min(d0 + stretch, max_steps + 1), device=rows.device)  # [c]
        key = (live[None, :] - steps[:, None]).clamp(min=0)  # [c, R'] k_{t−d} (clamped where finished)
        hh = (key + 1).clamp(max=w.shape[2] - 1)  # [c, R'] H_{t−d+1}
        wj_all, kj_all, bj_all = w_t[hh], k_t[key], beta_t[hh]  # [c, R', B, H, D] (β: [c, R', B, H])
        for j, d in enumerate(steps.tolist()):
            if d > 0:
                wj = wj_all[j]  # [R', B, H, D]
                # (a·b).sum(-1), not linalg.vecdot or addcmul: on these small rows both are many times slower
                coef = bj_all[j] * (u * wj).sum(-1)  # [R', B, H]
                u = u - coef[..., None] * wj  # [R', B, H, D]  u ← H_{t−d+1} u
            if wanted is not None and d not in wanted:
                continue
            lo = bisect_left(row_list, d) - start  # rows with t < d have no key at distance d
            yield d, start + lo, (u[lo:] * kj_all[j, lo:]).sum(-1).permute(1, 2, 0)  # [B, H, R' − lo]

"""PaTH's naive twins (PATH.md §5): the dumbest correct versions the chunked kernel is tested against, and the
explicit Householder product."""

from __future__ import annotations

import torch

from accrot.ops.path.common import _check_inputs, _cumulative_log_decay, _work_dtype


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

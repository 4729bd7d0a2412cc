"""Attention rows, far-attention mass (T3), the score gap (T5) and the value far norm (T4), computed row chunk by
row chunk from q, k, the rotation and the far-mass bias (never a [T, T] tensor)."""

from __future__ import annotations

import math

import torch
from torch import nn

from accrot.diagnostics.inputs import GAP_SUMS, ROW_BUDGET, path_walk
from accrot.ops.rotary import cos_sin, rotate_pairs, rotate_pairs_cs


# -- attention rows, far mass and value transport ------------------------------------------------------------------
def attention_rows(
    scheme: nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    x: torch.Tensor,
    tokens: torch.Tensor,
    rows: torch.Tensor,
) -> torch.Tensor:
    """Attention probabilities of query ``rows [R]`` (ascending positions) over every key: ``[B, H, R, T]``
    float32 (0 for s > t).

    ℓ_ts = c_t·D^−1/2 q_tᵀ M_{t,s} k_s + b_ts from q, k and the scheme's angles / householder, logit_scale (c_t:
    scalable softmax's s_h·log(t + 1)) and log_decay; the caller chunks the rows (memory B·H·R·T). The output gate
    multiplies what the rows average, not the rows."""
    if rows.numel() > 1 and bool((rows.diff() <= 0).any()):
        raise ValueError("rows must be strictly ascending query positions")
    return _probabilities(scheme, _scores(scheme, q, k, x, tokens, rows), x, tokens, rows)


def _probabilities(scheme: nn.Module, scores: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
                   rows: torch.Tensor) -> torch.Tensor:
    """Softmax over keys of the transported scores ``[B, H, R, T]`` (float64) times the row's logit factor, plus
    the far-mass bias, causal."""
    T = scores.shape[-1]
    factor = scheme.logit_scale(x, tokens).double()  # [B, H, T]: ones but for ssmax (and YaRN's temperature)
    logits = scores * factor[:, :, rows, None]
    if scheme.far_mass is not None and scheme.far_mass.additive:
        c = scheme.log_decay(x, tokens).double().cumsum(-1)  # [B|1, H, T] c_t = Σ_{j≤t} log f_j
        logits = logits + (c[:, :, rows, None] - c[:, :, None, :])  # b_ts = c_t − c_s
    future = torch.arange(T, device=scores.device)[None, :] > rows[:, None]  # [R, T]
    return logits.masked_fill(future, -math.inf).softmax(-1).float()


def _scores(scheme: nn.Module, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
            rows: torch.Tensor) -> torch.Tensor:
    """Transported scores D^−1/2 q_tᵀ M_{t,s} k_s of query ``rows`` over every key, ``[B, H, R, T]`` float64,
    without the far-mass bias or the row's logit factor (entries s > t are meaningless; callers mask them)."""
    B, H, T, D = q.shape
    q, k = q.float().contiguous(), k.float().contiguous()
    kind = scheme.rotation.kind
    if kind == "path":
        w, beta = scheme.householder(x, tokens)  # [B, H, T, D], [B, H, T]
        w, beta = w.float().contiguous(), beta.float().contiguous()
        by_dist = q.new_zeros(B, H, rows.numel(), T)  # [B, H, R, T] ℓᴹ(t, t − Δ) at [.., t, Δ]
        for d, start, lm in path_walk(q, k, w, beta, rows, T - 1):
            by_dist[:, :, start:, d] = lm
        keys = torch.arange(T, device=q.device)
        back = (rows[:, None] - keys[None, :]).clamp(min=0)  # [R, T] Δ = t − s
        logits = by_dist.gather(-1, back.expand(B, H, -1, -1))  # [B, H, R, T]
    else:
        if kind == "so2":
            theta = scheme.angles(x, tokens)  # [B, H, T, P]
            q, k = rotate_pairs(q, theta), rotate_pairs(k, theta)
        logits = q[:, :, rows] @ k.transpose(-1, -2)  # [B, H, R, T]
    return logits.double() * D**-0.5


def scheme_far_sums(
    scheme: nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    x: torch.Tensor,
    tokens: torch.Tensor,
    window: int,
    n_queries: int = 32,
) -> dict[str, torch.Tensor]:
    """Per-head sums over blocks and the last ``n_queries`` queries, each ``[H]`` float64, plus ``far_rows`` (the
    query rows summed):
    ``far_mass`` Σ_{t−s>W} a_ts, and for SO(2) rotations the far output norms ``rotated``, ``unrotated`` and
    ``incoherent`` (see module doc)."""
    B, H, T, D = q.shape
    if window < 0:
        raise ValueError(f"window={window} must be >= 0")
    rows_all = torch.arange(max(0, T - n_queries), T, device=q.device)
    chunk = max(1, ROW_BUDGET // max(1, B * H * T))
    so2 = scheme.rotation.kind == "so2"
    out = {name: torch.zeros(H, dtype=torch.float64) for name in ("far_mass", "rotated", "unrotated", "incoherent",
                                                                     *GAP_SUMS)}
    q_norm, k_norm = q.float().norm(dim=-1), k.float().norm(dim=-1)  # [B, H, T]
    if so2:
        cos, sin = cos_sin(scheme.angles(x, tokens))  # [B, H, T, P]
        v = v.float()
        v_back = rotate_pairs_cs(v, cos, -sin)  # R(−θ_s) v_s: Σ a R(θ_t − θ_s) v_s = R(θ_t) Σ a R(−θ_s) v_s
        v_sq = v.pow(2).sum(-1)  # [B, H, T]
    keys = torch.arange(T, device=q.device)
    for i in range(0, rows_all.numel(), chunk):
        rows = rows_all[i : i + chunk]
        scores = _scores(scheme, q, k, x, tokens, rows)  # [B, H, R, T] transported, no bias
        a = _probabilities(scheme, scores, x, tokens, rows)  # [B, H, R, T]
        dist = rows[:, None] - keys[None, :]  # [R, T] Δ = t − s
        far_keys = dist > window
        far = a * far_keys  # [B, H, R, T] weights of keys t − s > W
        # score gap (T5): near keys 0 ≤ Δ ≤ W against the far keys' mean and spread
        near_keys = (dist >= 0) & ~far_keys
        out["near_sum"] += (scores * near_keys).sum((0, 2, 3)).cpu()
        out["near_count"] += float(B) * float(near_keys.sum())
        out["far_sum"] += (scores * far_keys).sum((0, 2, 3)).cpu()
        out["far_sq"] += (scores.pow(2) * far_keys).sum((0, 2, 3)).cpu()
        out["far_count"] += float(B) * float(far_keys.sum())
        norms = q_norm[:, :, rows, None].double() * k_norm[:, :, None, :].double() / D  # [B, H, R, T] ‖q‖‖k‖/D
        out["far_concentration"] += (norms * far_keys).sum((0, 2, 3)).cpu()
        out["far_mass"] += far.double().sum((0, 2, 3)).cpu()
        if so2:
            # ‖R(θ_t) y‖ = ‖y‖: the rotated far part needs no output rotation for its norm
            out["rotated"] += (far @ v_back).double().norm(dim=-1).sum((0, 2)).cpu()
            out["unrotated"] += (far @ v).double().norm(dim=-1).sum((0, 2)).cpu()
            out["incoherent"] += (far.pow(2) @ v_sq[..., None]).double().sqrt().sum((0, 2, 3)).cpu()
    # not "count": the coherence sums have their own [B, H, n] count, and layer_sums merges both into one dict
    out["far_rows"] = torch.tensor(float(B * rows_all.numel()), dtype=torch.float64)
    if not so2:
        for name in ("rotated", "unrotated", "incoherent"):
            del out[name]
    return out



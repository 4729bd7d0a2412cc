"""Attention rows, far-attention mass (T3), the score gap (T5) and the value far norm (T4), computed row chunk by
row chunk (never a [T, T] tensor) from the scheme's explicit attention (:mod:`accrot.position.explicit`: the
transported scores, the row's logit factor and the far-mass bias, each asked of the part that defines it)."""

from __future__ import annotations

import math

import torch
from torch import nn

from accrot.diagnostics.inputs import FAR_SUMS, ROW_BUDGET
from accrot.ops.rotary import cos_sin, rotate_pairs_cs
from accrot.position import explicit, facts


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

    ℓ_ts = c_t·D^−1/2 q_tᵀ M_{t,s} k_s + b_ts as the scheme's explicit attention gives them
    (:func:`accrot.position.explicit.probabilities`: M from the rotation, c_t the row's logit factor, scalable
    softmax's s_h·log(t + 1), b_ts the far-mass bias); the caller chunks the rows (memory B·H·R·T). The output gate
    multiplies what the rows average, not the rows."""
    if rows.numel() > 1 and bool((rows.diff() <= 0).any()):
        raise ValueError("rows must be strictly ascending query positions")
    return explicit.probabilities(scheme, q, k, x, tokens, rows).float()


def scheme_far_sums(
    scheme: nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    x: torch.Tensor,
    tokens: torch.Tensor,
    window: int | torch.Tensor,
    n_queries: int = 32,
) -> dict[str, torch.Tensor]:
    """Sums over the last ``n_queries`` queries of each block, split at a per-head window W_h (near: 0 ≤ Δ ≤ W_h,
    far: Δ > W_h). Each ``[H]`` float64 (summed over blocks and rows) unless marked:

    * ``far_mass`` Σ_t Σ_far a_ts; ``far_mass_blocks`` ``[B, H]`` (per block: blocks are the replicates);
    * the score gap (T5), on the transported scores s_ts = D^−1/2 q_tᵀ M_ts k_s without the bias: ``near_as``,
      ``near_a`` (Σ_near a·s and Σ_near a: the attention-weighted near score), ``far_sum``, ``far_sq``,
      ``far_count`` (the far scores' mean and spread) and ``far_norm_sq`` Σ_far (‖q_t‖‖k_s‖/D)² (the spread
      concentration predicts for incoherent pairs); over the queries with far keys (``top_rows`` of them),
      ``near_top`` Σ_t max_near s_ts and ``far_top`` Σ_t max_far s_ts (the top near score and the far maximum),
      and ``far_root_log_n`` Σ_t √(2 ln n_t), n_t the query's far keys (the growth of the maximum of n i.i.d.
      scores that concentration predicts: μ + σ√(2 ln n));
    * the lower bound's inputs (T3): ``far_exp`` Σ_far e^{c_t s} (the far keys' mean weight before the bias; c_t
      the row's logit factor, 1 but for scalable softmax, where the prediction holds it at L's value),
      ``z_near`` ``[B·R, H]`` Σ_near e^{s + b} per query (its near partition), ``e_far_q`` ``[B·R, H]`` the mean
      far weight e^{c_t s} per query (NaN without far keys), and for a far-mass scheme
      ``decay_sum``, ``decay_count`` (Σ f_j over the block's tokens: the mean gate);
    * for SO(2) rotations the far output norms ``rotated``, ``unrotated`` and ``incoherent`` (see module doc);
    * ``far_rows``: the query rows summed (B·R).

    ``window``: an int (every head) or ``[H]`` integers."""
    B, H, T, D = q.shape
    wins = torch.as_tensor(window, dtype=torch.long, device=q.device).expand(H).clone()  # [H]
    if bool((wins < 0).any()):
        raise ValueError(f"window={window} must be >= 0")
    rows_all = torch.arange(max(0, T - n_queries), T, device=q.device)
    chunk = max(1, ROW_BUDGET // max(1, B * H * T))
    declared = facts(scheme.cfg)
    so2 = declared.rotates and declared.commutes  # a rotation by angles: its far output norms are defined
    out = {name: torch.zeros(H, dtype=torch.float64) for name in FAR_SUMS}
    out["far_mass_blocks"] = torch.zeros(B, H, dtype=torch.float64)
    z_near, e_far_q = [], []
    q_norm, k_norm = q.float().norm(dim=-1), k.float().norm(dim=-1)  # [B, H, T]
    if so2:
        cos, sin = cos_sin(scheme.angles(x, tokens))  # [B, H, T, P]
        v = v.float()
        v_back = rotate_pairs_cs(v, cos, -sin)  # R(−θ_s) v_s: Σ a R(θ_t − θ_s) v_s = R(θ_t) Σ a R(−θ_s) v_s
        v_sq = v.pow(2).sum(-1)  # [B, H, T]
    factor = explicit.logit_factor(scheme, x, tokens)  # [B|1, H, T] ones but for scalable softmax (and YaRN)
    if scheme.far_mass is not None and scheme.far_mass.additive:
        f = scheme.log_decay(x, tokens).double().exp()  # [B|1, H, T] the gates f_j
        out["decay_sum"] = f.sum((0, 2)).cpu()
        out["decay_count"] = torch.full((H,), float(f.shape[0] * T), dtype=torch.float64)
    keys = torch.arange(T, device=q.device)
    for i in range(0, rows_all.numel(), chunk):
        rows = rows_all[i : i + chunk]
        terms = explicit.explicit_rows(scheme, q, k, x, tokens, rows)  # each [B, H, R, T] float64
        scores = terms.scores  # transported, no factor or bias
        logits = terms.logits  # with the factor and the bias, −inf for s > t
        a = terms.probabilities
        dist = rows[:, None] - keys[None, :]  # [R, T] Δ = t − s
        far_keys = dist[None] > wins[:, None, None]  # [H, R, T]
        near_keys = (dist >= 0)[None] & ~far_keys  # [H, R, T]
        far = a * far_keys  # [B, H, R, T] weights of keys t − s > W_h
        out["far_mass"] += far.sum((0, 2, 3)).cpu()
        out["far_mass_blocks"] += far.sum((2, 3)).cpu()
        out["near_as"] += (a * scores * near_keys).sum((0, 2, 3)).cpu()
        out["near_a"] += (a * near_keys).sum((0, 2, 3)).cpu()
        far_scores = torch.where(far_keys, scores, 0.0)  # [B, H, R, T]
        out["far_sum"] += far_scores.sum((0, 2, 3)).cpu()
        out["far_sq"] += far_scores.pow(2).sum((0, 2, 3)).cpu()
        out["far_count"] += float(B) * far_keys.sum((1, 2)).double().cpu()
        # e^s in float64 (scores of a trained model stay far below the 709 where it overflows)
        weights = (far_scores * factor[:, :, rows, None]).clamp(max=700).exp()  # e^{c_t s}: before the bias
        out["far_exp"] += (weights * far_keys).sum((0, 2, 3)).cpu()
        z_near.append((logits.clamp(max=700).exp() * near_keys).sum(-1).transpose(1, 2).cpu())  # [B, R, H]
        # each query's far weight from its far logits' mean and spread, E[e^ℓ] = e^{μ + σ²/2} for Gaussian far
        # logits (concentration's prediction): their sample mean of e^ℓ, ruled by a few of the largest logits,
        # typically falls short of it
        n_far = far_keys.sum(-1).double().clamp(min=1)  # [H, R] far keys of each query
        scaled = far_scores * factor[:, :, rows, None] * far_keys  # [B, H, R, T]
        mu = scaled.sum(-1) / n_far  # [B, H, R]
        var = (scaled.pow(2).sum(-1) / n_far - mu.pow(2)).clamp(min=0)
        e_q = torch.exp((mu + var / 2).clamp(max=700))
        e_far_q.append(torch.where(far_keys.any(-1), e_q, math.nan).transpose(1, 2).cpu())  # [B, R, H]
        # the top near score and the far maximum, over the queries that have far keys
        has_far = far_keys.any(-1)  # [H, R]
        far_top = torch.where(far_keys, scores, -math.inf).amax(-1)  # [B, H, R]
        near_top = torch.where(near_keys, scores, -math.inf).amax(-1)  # near always holds Δ = 0
        out["far_top"] += torch.where(has_far, far_top, 0.0).sum((0, 2)).cpu()
        out["near_top"] += torch.where(has_far, near_top, 0.0).sum((0, 2)).cpu()
        out["top_rows"] += float(B) * has_far.sum(-1).double().cpu()
        out["far_root_log_n"] += float(B) * torch.where(has_far, (2 * n_far.log()).clamp(min=0).sqrt(),
                                                        0.0).sum(-1).cpu()
        norms = q_norm[:, :, rows, None].double() * k_norm[:, :, None, :].double() / D  # [B, H, R, T] ‖q‖‖k‖/D
        out["far_norm_sq"] += (norms.pow(2) * far_keys).sum((0, 2, 3)).cpu()
        if so2:
            far = far.float()
            # ‖R(θ_t) y‖ = ‖y‖: the rotated far part needs no output rotation for its norm
            out["rotated"] += (far @ v_back).double().norm(dim=-1).sum((0, 2)).cpu()
            out["unrotated"] += (far @ v).double().norm(dim=-1).sum((0, 2)).cpu()
            out["incoherent"] += (far.pow(2) @ v_sq[..., None]).double().sqrt().sum((0, 2, 3)).cpu()
    # per query [B·R, H], blocks in order (rows of a block together)
    empty = torch.zeros(0, H, dtype=torch.float64)
    out["z_near"] = torch.cat(z_near, 1).reshape(-1, H) if z_near else empty
    out["e_far_q"] = torch.cat(e_far_q, 1).reshape(-1, H) if e_far_q else empty
    # not "count": the coherence sums have their own [B, H, n] count, and layer_sums merges both into one dict
    out["far_rows"] = torch.tensor(float(B * rows_all.numel()), dtype=torch.float64)
    if not so2:
        for name in ("rotated", "unrotated", "incoherent"):
            del out[name]
    return out


# -- the lower bound's prediction (T3) --------------------------------------------------------------------------
def predicted_far_mass(
    z_near: torch.Tensor,
    e_far: torch.Tensor,
    decay: torch.Tensor,
    window: torch.Tensor,
    length: int,
    n_queries: int = 32,
) -> torch.Tensor:
    """The far attention mass the lower bound predicts at ``length`` from statistics measured at L, ``[H]``.

    For a query at t, the far keys Δ ∈ (W, t] each weigh e^{s + b}: their unbiased scores s, beyond the window,
    do not depend on Δ (the theory's incoherence), so each contributes E[e^s] (``e_far``, the mean over the query's
    far keys at L) times the bias's mean factor E[e^{b(Δ)}] = f̄^Δ (``decay`` = log f̄, the log of the mean gate: exact
    for ALiBi's constant f, and for i.i.d. gates; 0 without a far-mass bias). The near keys keep their measured
    partition Z (``z_near``, per query at L: the same near set at any length). So

        mass(t) = F(t) / (Z + F(t)),    F(t) = E[e^s] · Σ_{Δ=W+1}^{t} f̄^Δ,

    averaged over the last ``n_queries`` queries of a block of ``length`` tokens and over the measured Z (the
    same queries the measured far mass averages). Without a bias F grows linearly in t and the mass tends to 1;
    with one F converges, and the mass stays bounded.

    Args:
        z_near: ``[Nq, H]`` near partitions Σ_{Δ≤W} e^{s+b} of the queries measured at L.
        e_far: ``[Nq, H]`` each measured query's mean far weight at L (its own ‖q‖ scales both its near and far
            scores, so the pairs are kept; NaN where it had no far key), or ``[H]`` one mean for all.
        decay: ``[H]`` log f̄ ≤ 0.
        window: ``[H]`` W per head (tokens).
    """
    t = torch.arange(max(0, length - n_queries), length, dtype=torch.float64)  # [R]
    w = window.double()[:, None]  # [H, 1]
    n_far = (t[None, :] - w).clamp(min=0)  # [H, R] far keys of query t
    g = decay.double()[:, None].clamp(max=0.0)  # [H, 1]
    geometric = torch.exp(g * (w + 1)) * torch.expm1(g * n_far) / torch.expm1(g).clamp(max=-1e-300)
    count = torch.where(g < -1e-12, geometric, n_far)  # [H, R] Σ f̄^Δ over the far keys of query t
    e = e_far.double()
    e = e[None].expand_as(z_near) if e.dim() == 1 else e  # [Nq, H]
    far = e[:, :, None] * count[None]  # [Nq, H, R] F(t), each measured query with its own far weight
    z = z_near.double()[:, :, None]  # [Nq, H, 1]
    mass = far / (z + far)  # NaN where a query had no far key at L to weigh
    return mass.nanmean((0, 2))  # [H]

"""The regularity condition read off a trained model's own transport (T1's prediction, per head).

The theorem's windows exist only where every pair mixes. For an SO(2) accumulation pair i of head h mixes over Δ
steps when the phase differences θ_t − θ_{t−Δ} spread: their mean resultant length R_{h,i}(Δ) = |E_t e^{i(θ_t −
θ_{t−Δ})}| falls under ε (random increments: R = |φ|^Δ; RoPE: R = 1 at every Δ, its phase difference is ωΔ for
every t). The condition is about the subspace that carries q and k, so a head's pairs count by the share of its
score each carries: w_{h,i} = E|q_i|²·E|k_i|² / Σ_j E|q_j|²·E|k_j|² (pair i's part of E[(q·k)²] when pairs are
uncorrelated), and the head mixes when its weighted resultant Σ_i w_{h,i} R_{h,i}(Δ), an upper bound on its
coherence, falls under ε within the measured distances. A pair that stays coherent keeps that head coherent only
if it carries at least ε of the head's score (read alike, every pair would let a slow pair that q and k barely use
decide the head). For PaTH the transport is a product of Householder factors H_t = I − β_t w_t w_tᵀ: its mean
contracts when the largest |eigenvalue| ρ_h of E[H_t] lies below 1, with window log ε / log ρ_h (β = 2 with w
spread over every direction contracts, β → 0 does not).

What it reads are the model's own angles and factors on real blocks, and of q and k only each pair's mean energy
(never how q and k are transported): it predicts which heads should show a finite coherence window, and T1
compares that with the windows the coherence instrument fits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from accrot.diagnostics.coherence import mixing_window_measured
from accrot.position import facts


def pair_resultants(angles: torch.Tensor, distances: Sequence[int]) -> torch.Tensor:
    """R_{h,i}(Δ) = |mean over blocks and t ≥ Δ of e^{i(θ_t − θ_{t−Δ})}| for ``angles [B, H, T, P]``: ``[H, P, n]``
    float64 (1 at Δ = 0; NaN where Δ ≥ T)."""
    theta = angles.double()
    B, H, T, P = theta.shape
    out = torch.full((H, P, len(distances)), math.nan, dtype=torch.float64)
    for j, d in enumerate(distances):
        if d >= T:
            continue
        diff = theta[:, :, d:] - theta[:, :, : T - d] if d > 0 else torch.zeros_like(theta)
        out[:, :, j] = torch.complex(diff.cos(), diff.sin()).mean((0, 2)).abs()
    return out


def pair_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """w_{h,i}: pair i's share of head h's score energy, E|q_i|²·E|k_i|² normalised over the head's pairs, for
    ``q, k [B, H, T, D]`` in the half-split layout (pair i is coordinates i and i + D/2): ``[H, D/2]`` float64
    (uniform for a head whose q or k is 0)."""
    P = q.shape[-1] // 2

    def energy(t: torch.Tensor) -> torch.Tensor:
        t = t.double()
        return (t[..., :P] ** 2 + t[..., P:2 * P] ** 2).mean((0, 2))  # [H, P]

    e = energy(q) * energy(k)
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / total.clamp_min(torch.finfo(torch.float64).tiny), torch.full_like(e, 1.0 / P))


def householder_contraction(w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """ρ_h, the largest |eigenvalue| of E[I − β_t w_t w_tᵀ] over blocks and positions, for ``w [B, H, T, D]`` (unit
    rows) and ``beta [B, H, T]``: ``[H]`` float64."""
    w, beta = w.double(), beta.double()
    D = w.shape[-1]
    mean = torch.eye(D, dtype=torch.float64) - torch.einsum("bht,bhti,bhtj->hij", beta, w, w) / (w.shape[0] * w.shape[2])
    return torch.linalg.eigvalsh(mean).abs().amax(-1)


def regularity(scheme: nn.Module, x: torch.Tensor, tokens: torch.Tensor, distances: Sequence[int],
               eps: float = 0.05, q: torch.Tensor | None = None, k: torch.Tensor | None = None) -> dict | None:
    """Per head, whether the scheme's own transport satisfies the regularity condition on these blocks, within the
    largest of ``distances``: ``{"kind": "pairs", "distances", "pair_window" [H][P] (the first Δ with R < ε; None:
    not within the distances), "weights" [H][P], "head_window" [H] (the first Δ with Σ_i w_i R_i < ε; None: not
    within the distances), "criterion", "mixes" [H]}`` for an SO(2) accumulation, ``{"kind": "householder",
    "contraction" [H], "window" [H] (None: ρ = 1 or beyond the distances), "mixes" [H]}`` for PaTH, None for a
    scheme that accumulates nothing. ``q, k [B, H, T, D]`` (the layer's own, on the same blocks) weight the pairs
    (:func:`pair_weights`); without them every pair counts alike (a head mixes when each of its pairs does)."""
    declared = facts(scheme.cfg)
    if not declared.accumulates:
        return None
    top = max(distances)
    if declared.commutes:
        R = pair_resultants(scheme.angles(x, tokens), distances)  # [H, P, n]
        windows = mixing_window_measured(R, distances, eps)  # [H, P] inf where it never falls under ε
        pairs = [[None if not math.isfinite(v) else int(v) for v in row] for row in windows.tolist()]
        out = {"kind": "pairs", "distances": list(distances), "pair_window": pairs}
        if q is None or k is None:
            return {**out, "criterion": "every pair", "mixes": [bool(torch.isfinite(row).all()) for row in windows]}
        w = pair_weights(q, k)  # [H, P]
        head = (w[:, :, None] * R).sum(1, keepdim=True)  # [H, 1, n]
        head_window = mixing_window_measured(head, distances, eps)[:, 0]  # [H]
        return {**out, "weights": w.tolist(), "criterion": "score-weighted",
                "head_window": [None if not math.isfinite(v) else int(v) for v in head_window.tolist()],
                "mixes": [bool(math.isfinite(v)) for v in head_window.tolist()]}
    w, beta = scheme.householder(x, tokens)
    rho = householder_contraction(w, beta)
    window = [math.log(eps) / math.log(r) if 0 < r < 1 else math.inf for r in rho.tolist()]
    return {"kind": "householder", "contraction": rho.tolist(),
            "window": [None if not w_ <= top else w_ for w_ in window], "mixes": [w_ <= top for w_ in window]}

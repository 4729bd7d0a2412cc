"""Coherence decay c(Δ) (T1), its error bars over replicate blocks or fresh increment draws, the fitted mixing
window (T2) and the i.i.d. prediction it is compared with (see the package docstring for the estimator)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from accrot.diagnostics.inputs import ROW_BUDGET, check_distances, spread_indices
from accrot.position.accum import mix_seed
from accrot.position.explicit import pairings_at

# -- coherence ---------------------------------------------------------------------------------------------------
PATH_ROW_TOKENS = 2048  # PaTH's per-query walk: rows × length held at most max_queries × this


def scheme_coherence_sums(
    scheme: nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    x: torch.Tensor,
    tokens: torch.Tensor,
    distances: Sequence[int],
    max_queries: int | None = 512,
    theta: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Sums over each block's queries, each ``[B, H, len(distances)]`` float64: ``num`` Σ ℓᴹ ℓᴵ, ``den``
    Σ (ℓᴵ)², ``msq`` Σ (ℓᴹ)² and ``count`` (pairs summed); c = Σ_b num / Σ_b den (see module doc). Blocks stay
    apart so the error bar can treat them as the independent replicates they are (:func:`sums_stderr`).

    Args:
        scheme: a :class:`~accrot.position.PositionScheme` (eval mode).
        q, k: ``[B, H, T, D]``; x: ``[B, T, d_model]``; tokens: ``[B, T]``.
        distances: Δ values in [0, T).
        max_queries: query positions (evenly spaced over [0, T), one set for every Δ: each Δ uses those with
            t ≥ Δ); None for all of them.
        theta: SO(2) angles ``[B|1, H, T, D/2]`` to transport with instead of ``scheme.angles`` (a fresh draw
            of random increments, :meth:`~accrot.position.accum.AccumulatedRotation.independent_angles`).
    """
    B, H, T, D = q.shape
    dist = check_distances(distances, T)
    q, k = q.float().contiguous(), k.float().contiguous()
    out = {name: torch.zeros(B, H, dist.numel(), dtype=torch.float64) for name in ("num", "den", "msq", "count")}

    def add(cols: slice | int, lm: torch.Tensor, li: torch.Tensor, dims: tuple[int, ...]) -> None:
        out["num"][..., cols] = (lm * li).sum(dims).cpu()
        out["den"][..., cols] = (li * li).sum(dims).cpu()
        out["msq"][..., cols] = (lm * lm).sum(dims).cpu()

    rotation = scheme.rotation
    factored = rotation.factored_pairs(q, k, x, tokens, theta)  # (q', k') with q'·k' = q_tᵀ M_ts k_s, or None
    if factored is None:  # a transport that does not factor per position (PaTH): its per-query walk
        # one query set (each Δ uses those with t ≥ Δ); the walk is a step per distance over every row, so past
        # 2048 tokens fewer rows keep its cost that of 2048 (the blocks, not the rows, are the replicates)
        n_rows = None if max_queries is None else max(64, max_queries * min(T, PATH_ROW_TOKENS) // T)
        rows = spread_indices(0, T, n_rows, q.device)
        column = {int(d): i for i, d in enumerate(dist.tolist())}
        for d, start, lm in rotation.walked_pairs(q, k, x, tokens, rows, int(dist.max()), wanted=set(column)):
            if d in column:
                r = rows[start:]
                li = (q[:, :, r] * k[:, :, r - d]).sum(-1).double()  # [B, H, R']
                add(column[d], lm.double(), li, (2,))
                out["count"][..., column[d]] = r.numel()
        return out
    qm, km = factored
    transported = qm is not q  # without a rotation the pairing is the raw one
    draws = qm.shape[0] // B  # fresh draws of the angles, draw-major: replicate r = d·B + b
    if draws > 1:
        out = {name: torch.zeros(draws * B, H, dist.numel(), dtype=torch.float64) for name in out}
    dist = dist.to(q.device)
    rows = spread_indices(0, T, max_queries, q.device)  # [R] one query set; each Δ uses the queries with t ≥ Δ
    keys = rows[:, None] - dist[None, :]  # [R, n] key s = t − Δ of each (query, distance)
    valid = keys >= 0
    keys = keys.clamp(min=0)
    # the n diagonals Δ of each query row, raw and transported (explicit.pairings_at: one GEMM per chunk of rows)
    chunk = max(1, ROW_BUDGET // max(1, draws * B * H * T))
    for r0 in range(0, rows.numel(), chunk):
        r = rows[r0 : r0 + chunk]
        idx, ok = keys[r0 : r0 + chunk], valid[r0 : r0 + chunk].double()  # [R', n]
        li = pairings_at(q, k, r, idx).double() * ok  # [B, H, R', n]
        lm = li if not transported else pairings_at(qm, km, r, idx).double() * ok
        li = li.repeat(draws, 1, 1, 1)  # the same for every draw
        out["num"] += (lm * li).sum(2).cpu()
        out["den"] += (li * li).sum(2).cpu()
        out["msq"] += (lm * lm).sum(2).cpu()
    out["count"][...] = valid.sum(0).double().cpu()  # [n] broadcast over B, H
    return out


def ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, math.nan))


def sums_curve(acc: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """c = Σ_b num_b / Σ_b den_b over the replicates (dim 0): ``[H, n]``."""
    return ratio(acc["num"].sum(0), acc["den"].sum(0))


def sums_stderr(acc: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Standard error of c = Σ num_b / Σ den_b across its N replicates (dim 0), ``[H, n]``: the ratio estimator's
    linearisation √(N/(N−1) · Σ_b (num_b − c·den_b)²) / Σ_b den_b. Honest when the replicates are independent:
    blocks for a deterministic scheme, (block, fresh draw) pairs for random increments (:func:`layer_sums`); NaN
    with fewer than two replicates."""
    num, den = acc["num"], acc["den"]  # [N, H, n]
    n = num.shape[0]
    if n < 2:
        return torch.full(num.shape[1:], math.nan, dtype=torch.float64)
    c = ratio(num.sum(0), den.sum(0))  # [H, n]
    resid = ((num - c * den) ** 2).sum(0)  # [H, n]
    return ratio((n / (n - 1) * resid).sqrt(), den.sum(0))


def curve_and_stderr(sums: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """c(Δ) and its standard error across replicates, ``[H, n]`` each, from per-replicate coherence sums."""
    return sums_curve(sums), sums_stderr(sums)


def scheme_coherence(scheme, q, k, x, tokens, distances, max_queries: int | None = 512) -> torch.Tensor:
    """c(Δ) of one scheme on given inputs, ``[H, len(distances)]`` float64 (see :func:`scheme_coherence_sums`)."""
    with torch.no_grad(), torch.autocast(device_type=q.device.type, enabled=False):
        return sums_curve(scheme_coherence_sums(scheme, q, k, x, tokens, distances, max_queries))


COHERENCE_SUMS = ("num", "den", "msq", "count")
FRESH_DRAWS = 32  # independent increment draws per block for the coherence of random increments
DRAW_BUDGET = 1 << 23  # elements of the rotated q (and k) of the fresh draws handled together
_DIAG_STREAM = 1 << 43  # generator indices of the diagnostics' fresh draws (disjoint from the scheme's own)


def fresh_generator(scheme: nn.Module, layer: int, batch: int, draw: int) -> torch.Generator:
    """The generator of one fresh draw: a pure function of (the scheme's seed, layer, batch, draw)."""
    seed = mix_seed(mix_seed(int(scheme.cfg.seed or 0), _DIAG_STREAM + layer), (batch << 20) + draw)
    return torch.Generator().manual_seed(seed)


def scheme_coherence_fresh(
    scheme: nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    x: torch.Tensor,
    tokens: torch.Tensor,
    distances: Sequence[int],
    max_queries: int | None = 512,
    draws: int = FRESH_DRAWS,
    layer: int = 0,
    batch: int = 0,
) -> dict[str, torch.Tensor]:
    """Coherence sums of a random-increment scheme under ``draws`` fresh, independent draws of its increment
    distribution: ``[draws · B, H, n]`` each (one replicate per draw and block). The draws come from generators
    that are a pure function of (the scheme's seed, ``layer``, ``batch``, draw)."""
    B, H, T, D = q.shape
    chunk = max(1, DRAW_BUDGET // (B * H * T * D))  # draws rotated at once: one pass over q, k per chunk
    reps = []
    for first in range(0, draws, chunk):
        theta = torch.cat([scheme.rotation.independent_angles(tokens, fresh_generator(scheme, layer, batch, d))
                           for d in range(first, min(draws, first + chunk))])  # [chunk · B, H, T, P]
        reps.append(scheme_coherence_sums(scheme, q, k, x, tokens, distances, max_queries, theta=theta))
    return {n: torch.cat([r[n] for r in reps]) for n in COHERENCE_SUMS}


def mixing_window_measured(
    curve: torch.Tensor,
    distances: Sequence[int],
    eps: float = 0.05,
    sustained: bool = False,
) -> torch.Tensor:
    """The first measured Δ where ``curve [..., n]`` falls below ε (inf if it never does), float64 ``[...]``.

    With ``sustained`` it is the first Δ after which |curve| stays below ε over the measured distances: an
    oscillating curve (RoPE-like drift) then counts as coherent until its envelope has decayed. Only meaningful
    where the curve's Monte-Carlo error is well below ε (noise in a sparsely sampled tail reads as coherence).
    """
    curve = torch.as_tensor(curve, dtype=torch.float64)
    dist = torch.as_tensor(list(distances), dtype=torch.float64)
    if curve.shape[-1] != dist.numel():
        raise ValueError(f"curve has {curve.shape[-1]} points but there are {dist.numel()} distances")
    n = dist.numel()
    idx = torch.arange(n).expand_as(curve)
    if sustained:
        above = ~(curve.abs() < eps)  # NaN counts as not below
        first = torch.where(above, idx, torch.full_like(idx, -1)).amax(-1) + 1  # [...] after the last exceedance
    else:
        below = curve < eps
        first = torch.where(below, idx, torch.full_like(idx, n)).amin(-1)  # [...]
    padded = torch.cat((dist, torch.tensor([math.inf], dtype=torch.float64)))
    return padded[first]


def fitted_window(
    curve: torch.Tensor,
    stderr: torch.Tensor,
    distances: Sequence[int],
    eps: float = 0.05,
    max_distance: int | None = None,
) -> dict[str, torch.Tensor]:
    """The mixing window from a log-linear fit of the coherence, per head: ``{"window", "window_se",
    "censored", "resolved"}``, each ``[...]`` (the curve's leading dims).

    log c(Δ) = a + b·Δ is fitted by weighted least squares over the *resolved range*: 1 ≤ Δ ≤ ``max_distance``
    up to the first Δ where c is no longer resolved above zero (c ≤ 2·stderr), each point weighted by
    (c / stderr)² (the variance of log c); W solves a + b·W = log ε, its standard error comes from the slope's.
    The intercept is free because a learned transport can raise the coherence above 1 at the first steps
    (c(0) = 1 only at Δ = 0). Unlike a first crossing it uses the whole decay, so noise near ε moves it little.
    With fewer than two resolved points the curve may be gone within a step or two: W is the first unresolved Δ
    when the curve is known to lie under ε there (c + 2·stderr ≤ ε).
    ``censored`` marks a window the data cannot place: no decay resolved, or W beyond ``max_distance`` (the
    window is then only known to exceed it; ``window`` is NaN). Pass the same ``max_distance`` at every length
    (T2 compares like with like). ``resolved`` is the number of points fitted.
    """
    c = torch.as_tensor(curve, dtype=torch.float64)
    se = torch.as_tensor(stderr, dtype=torch.float64)
    dist = torch.as_tensor(list(distances), dtype=torch.float64)
    top = float(dist.max()) if max_distance is None else float(max_distance)
    inside = (dist >= 1) & (dist <= top)  # [n]
    ok = inside & (c > 2 * se) & torch.isfinite(c) & torch.isfinite(se) & (se > 0)  # [..., n]
    # the resolved range is contiguous from the first distance: stop at the first unresolved point inside
    run = torch.cumprod((ok | ~inside).to(torch.int64), dim=-1).bool() & ok
    y = torch.where(run, c.clamp_min(1e-300).log(), torch.zeros_like(c))
    w = torch.where(run, (c / se.clamp_min(1e-300)) ** 2, torch.zeros_like(c))
    sw = w.sum(-1)  # [...]
    mx = (w * dist).sum(-1) / sw.clamp_min(1e-300)
    my = (w * y).sum(-1) / sw.clamp_min(1e-300)
    sxx = (w * (dist - mx[..., None]) ** 2).sum(-1)
    slope = torch.where(sxx > 0, (w * (dist - mx[..., None]) * (y - my[..., None])).sum(-1) / sxx.clamp_min(1e-300),
                        torch.zeros_like(sxx))
    slope_se = torch.where(sxx > 0, sxx.clamp_min(1e-300).rsqrt(), torch.full_like(sxx, math.inf))
    intercept = my - slope * mx
    log_eps = math.log(eps)
    window = torch.where(slope < 0, (log_eps - intercept) / slope.clamp_max(-1e-300), torch.full_like(slope, math.inf))
    window = window.clamp(min=1.0)  # a fit already under ε at Δ = 1 (its intercept below log ε): gone in a step
    window_se = (window - mx).abs() * slope_se / slope.abs().clamp_min(1e-300)  # δW ≈ |W − Δ̄|·δb/|b|
    resolved = run.sum(-1)
    # gone within a step or two: the first unresolved distance bounds the window when the curve is known to be
    # under ε there (c + 2·stderr ≤ ε); a curve that is merely noisy there stays censored
    gone = inside & ~run & (c + 2 * se <= eps)  # [..., n]
    first_gone = torch.where(gone, dist.expand_as(c), torch.full_like(c, math.inf)).amin(-1)
    first_unresolved = torch.where(inside & ~run, dist.expand_as(c), torch.full_like(c, math.inf)).amin(-1)
    short = (resolved < 2) & torch.isfinite(first_gone) & (first_gone == first_unresolved)
    window = torch.where(short, first_gone, window)
    window_se = torch.where(short, torch.full_like(window, math.nan), window_se)
    censored = (window > top) | ~torch.isfinite(window)
    return {"window": torch.where(censored, torch.full_like(window, math.nan), window),
            "window_se": torch.where(censored, torch.full_like(window, math.nan), window_se),
            "censored": censored, "resolved": resolved}


ENVELOPE_Z = 3.0  # |c| counts as above ε where |c| − ENVELOPE_Z·stderr ≥ ε (3: a few hundred Δ are read)


def window_estimate(curve: torch.Tensor, stderr: torch.Tensor, distances: Sequence[int], eps: float = 0.05,
                    max_distance: int | None = None) -> dict[str, torch.Tensor]:
    """The mixing window per head: :func:`fitted_window`, except where the coherence *oscillates* (a learned
    transport whose phases drift: c resolved below zero, c < −2·stderr, at a distance before the fitted window or
    anywhere when the fit is censored). There the log-linear fit stops at the first zero crossing, so the window is
    read off the envelope instead: one past the last Δ whose |c| is still resolved above ε (|c| − 3·stderr ≥ ε),
    censored when that is in the last tenth of the range. ``method`` per head: 0 fit, 1 envelope."""
    c = torch.as_tensor(curve, dtype=torch.float64)
    se = torch.as_tensor(stderr, dtype=torch.float64)
    dist = torch.as_tensor(list(distances), dtype=torch.float64)
    top = float(dist.max()) if max_distance is None else float(max_distance)
    fit = fitted_window(c, se, distances, eps, max_distance)
    inside = (dist >= 1) & (dist <= top)
    limit = torch.where(fit["censored"], torch.full_like(fit["window"], math.inf), fit["window"])  # [...]
    negative = inside & (c < -2 * se) & (dist < limit[..., None])
    oscillates = negative.any(-1)
    above = inside & ((c.abs() - ENVELOPE_Z * se) >= eps)
    last = torch.where(above, dist.expand_as(c), torch.full_like(c, 0.0)).amax(-1)  # [...] 0 when none
    envelope = last + 1
    env_censored = envelope > 0.9 * top
    fit["window"] = torch.where(oscillates, torch.where(env_censored, torch.full_like(envelope, math.nan), envelope),
                                fit["window"])
    fit["window_se"] = torch.where(oscillates, torch.full_like(envelope, math.nan), fit["window_se"])
    fit["censored"] = torch.where(oscillates, env_censored, fit["censored"])
    fit["method"] = oscillates.long()
    return fit


def replicate_window(sums: Mapping[str, torch.Tensor], distances: Sequence[int], eps: float = 0.05,
                     max_distance: int | None = None) -> dict[str, torch.Tensor]:
    """:func:`window_estimate` of the pooled curve, with ``window_se`` from a delete-one-replicate jackknife.

    The weighted fit's own slope error treats the Δ points as independent, but they share every draw and block,
    so it is several times too small; refitting with each replicate left out (the same weights) gives an error
    bar that covers the true window (tested on known truth)."""
    curve, stderr = sums_curve(sums), sums_stderr(sums)
    fit = window_estimate(curve, stderr, distances, eps, max_distance)
    num, den = sums["num"], sums["den"]  # [N, H, n]
    n = num.shape[0]
    if n < 3:
        fit["window_se"] = torch.full_like(fit["window"], math.nan)
        return fit
    loo = ratio(num.sum(0) - num, den.sum(0) - den)  # [N, H, n] the curve without replicate i
    windows = window_estimate(loo, stderr.expand_as(loo), distances, eps, max_distance)["window"]  # [N, H]
    spread = ((windows - windows.mean(0)) ** 2).sum(0) * (n - 1) / n  # NaN if any refit is censored
    fit["window_se"] = torch.where(fit["censored"], torch.full_like(fit["window"], math.nan), spread.sqrt())
    return fit


def predicted_coherence(scheme: nn.Module, distances: Sequence[int]) -> torch.Tensor | None:
    """The i.i.d. prediction of c(Δ) from the scheme's increment distribution, ``[H, len(distances)]`` float64,
    or None where the theory gives none (learned increments without a mixing floor, PaTH): the rotation part's own
    (:meth:`~accrot.position.base.RotationPart.predicted_coherence`).

    none: 1. rope: mean_i cos(Δ ω_i). accum with random increments: mean_i |φ_i|^Δ cos(Δ μ_i) (exact for zero-mean,
    one-spread ``random_position``; the others assume isotropic q, k, and ``random_token`` assumes the tokens on a
    path are distinct). Learned increments with a mixing floor: the floor's envelope mean_i |φ_i|^Δ, an upper bound.
    See :func:`prediction_basis`.
    """
    d = torch.as_tensor(list(distances), dtype=torch.float64)[:, None]  # [n, 1]
    curve = scheme.rotation.predicted_coherence(d)  # [n] or None
    return None if curve is None else curve.expand(scheme.rotation.n_heads, -1).clone()


def prediction_basis(scheme: nn.Module) -> str:
    """How :func:`predicted_coherence` relates to the measurement: ``exact`` (in expectation, any q, k),
    ``isotropic`` (assumes isotropic q, k), ``approximate`` (random_token: i.i.d. only over distinct tokens),
    ``upper bound`` (learned increments' mixing floor) or ``none`` (the rotation part's own)."""
    return scheme.rotation.prediction_basis()

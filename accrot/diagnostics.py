"""Theory diagnostics (PAPER.md T1–T5): coherence decay, mixing window, far-attention mass, score gap, value incoherence.

Everything is computed from a model's own per-layer q, k, v and the quantities its schemes expose
(``angles``, ``householder``, ``log_decay``; DESIGN §2), never from a fast kernel's internals:

* **coherence** (T1, T2). For query t and key s = t − Δ let ℓᴹ = q_tᵀ M_{t,s} k_s (the transported pairing the
  model uses, without scale or bias) and ℓᴵ = q_tᵀ k_s (the same pair, untransported). The curve is the
  least-squares slope of ℓᴹ on ℓᴵ, per head, over blocks and query positions:

      c(Δ) = E[ℓᴹ ℓᴵ] / E[(ℓᴵ)²]            (per head; expectations over blocks and query positions t ≥ Δ)

  "how much of the untransported signal survives transport over Δ steps". Why this normalisation: the plain
  ratio E[ℓᴹ] / E[ℓᴵ] has a denominator ≈ 0 whenever q·k has no systematic sign (random initialisation, most
  heads), while E[(ℓᴵ)²] > 0 always. It makes the i.i.d. prediction exact: for SO(2) pair i write
  z_i = conj(q_t,i) k_s,i (complex, half-split layout), so ℓᴹ = Σ_i Re(z_i e^{iφ_i}) with φ_i = θ_s,i − θ_t,i;
  when the increments are independent of q, k then E[ℓᴹ ℓᴵ] = Σ_i Re(E[e^{iφ_i}] E[z_i ℓᴵ]), and for zero-mean
  increments E[e^{iφ_i}] = |E[e^{iδ_i}]|^Δ, so with one spread for every pair c(Δ) = |E[e^{iδ}]|^Δ for *any*
  distribution of q, k. NoPE gives c ≡ 1 exactly (ℓᴹ = ℓᴵ). With pair-dependent spreads (ladder) or RoPE-mean
  drift μ_i the prediction assumes isotropic q, k (E[z_i ℓᴵ] real and equal across pairs):
  c(Δ) = mean_i |E[e^{iδ_i}]|^Δ cos(Δ μ_i). PaTH: ℓᴹ = (H_{s+1} ⋯ H_t q_t)·k_s by the per-query backward
  recurrence u ← H_j u (vector ops only).
* **error bars and fresh draws**: blocks are kept apart as replicates and the standard error is the ratio
  estimator's across them (:func:`_stderr`). For random increments one fixed evaluation draw would be shared
  by every block (so blocks are not independent at all where the draw matters), and one draw spreads far more
  than its pairs suggest; instead each block's q, k are transported by ``draws`` independent fresh draws of the
  scheme's own increment distribution (:data:`FRESH_DRAWS`), which are independent of q, k: the prediction
  |φ|^Δ is then exact in expectation and the error bar covers it at its nominal rate (tested on known truth).
  Learned increments are a deterministic function of x: their blocks are the replicates.
* **mixing window** (:func:`fitted_window`): a weighted log-linear fit of c(Δ) over the resolved range
  1 ≤ Δ ≤ 7L/8 — the same range at every length, so T2 compares like with like — W where the fit meets ε; a window
  the range cannot place is *censored* ("> Δmax"), never dropped. The first crossing (``window_first_crossing``)
  and the sustained one are kept for reference: a crossing moves by ~20 tokens for an error of 0.03 in c.
* **far mass** (T3): attention probability on keys farther than ``window`` tokens (t − s > W), averaged over
  the last ``n_queries`` queries of each block, from q, k, the rotation and the far-mass bias, row chunk by row
  chunk (never a ``[T, T]`` tensor). The lower bound predicts growth with length for rotation-only schemes
  (NoPE with flat logits: (t − W)/(t + 1)) and a bounded value with far-mass control (ALiBi).
* **score gap** (T5): over the same last queries, the transported scores D^−1/2 q_tᵀ M_{t,s} k_s (no far-mass
  bias) of the near keys (0 ≤ Δ ≤ W) against the far keys' (Δ > W) mean and spread: gap = (mean near − mean
  far) / std far. Concentration predicts the far spread ≈ ‖q‖‖k‖/D (``concentration``, the mean over far pairs)
  and a near signal above it; the claim is that the gap measured at L holds at the longest length.
* **value far norm** (T4, SO(2) rotations): ‖Σ_{t−s>W} a_ts R(θ_t − θ_s) v_s‖ ("rotated") against
  ‖Σ_{t−s>W} a_ts v_s‖ ("unrotated") with the same weights a_ts, and the random-walk reference
  √(Σ a_ts² ‖v_s‖²) ("incoherent"). For a scheme without ``rotate_values`` "rotated" is the counterfactual.

Functions take a :class:`~accrot.model.Transformer` (or a LightningModule holding one as ``.model``) and token
blocks ``[N, T]``; they run in ``eval()`` mode (restoring the previous mode) so the exposed quantities are the
ones forward uses, under ``torch.no_grad`` with autocast off. The ``scheme_*`` functions do the same on one
scheme module and its inputs (tests use them with random q, k).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from accrot.ops.rotary import cos_sin, rotate_pairs, rotate_pairs_cs
from accrot.position.accum import char_fn_abs, increment_distribution, mix_seed
from accrot.position.rope import rope_frequencies

SCHEMA = "accrot.diagnostics/1"
DENSE_DISTANCES = 256  # every Δ below this is measured; beyond, a log-spaced grid
LOG_DISTANCES = 32
_ROW_BUDGET = 1 << 22  # elements of one [B, H, rows, T] probability chunk
GAP_SUMS = ("near_sum", "near_count", "far_sum", "far_sq", "far_count", "far_concentration")


# -- per-layer inputs -------------------------------------------------------------------------------------------
@dataclass
class LayerInputs:
    """What one attention layer sees: its scheme, q, k, v ``[B, H, T, D]`` (float32), the normalised layer
    input x ``[B, T, d_model]`` and the tokens ``[B, T]``."""

    scheme: nn.Module
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    x: torch.Tensor
    tokens: torch.Tensor


def _backbone(model: nn.Module) -> nn.Module:
    if hasattr(model, "blocks") and hasattr(model, "embed"):
        return model
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "blocks"):
        return inner
    raise TypeError(f"expected an accrot Transformer (or a module with .model), got {type(model).__name__}")


class _eval_mode:
    """Eval mode, no grad, autocast off; the module's previous mode is restored on exit."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.was_training = model, model.training
        self.grad = torch.no_grad()

    def __enter__(self) -> None:
        self.model.eval()
        self.grad.__enter__()
        device = next(self.model.parameters()).device.type
        self.autocast = torch.autocast(device_type=device, enabled=False)
        self.autocast.__enter__()

    def __exit__(self, *exc) -> None:
        self.autocast.__exit__(*exc)
        self.grad.__exit__(*exc)
        self.model.train(self.was_training)


def layer_inputs(model: nn.Module, tokens: torch.Tensor) -> Iterator[LayerInputs]:
    """Walk the backbone block by block on ``tokens [B, T]``, yielding each layer's :class:`LayerInputs`.

    Call inside ``torch.no_grad`` with the model in ``eval()`` (the public functions do)."""
    net = _backbone(model)
    device = next(net.parameters()).device
    tokens = tokens.to(device=device, dtype=torch.long)
    h = net.embed(tokens)  # [B, T, d_model]
    for block in net.blocks:
        x = block.attn_norm(h)  # [B, T, d_model] the scheme sees the normalised input
        q, k, v = block.attn.project(x)  # [B, H, T, D] each
        # contiguous: the diagnostics gather query / key rows, which is slow on project()'s strided views
        q, k, v = (t.float().contiguous() for t in (q, k, v))
        yield LayerInputs(block.attn.scheme, q, k, v, x, tokens)
        h = block(h, tokens)


def _batches(tokens: torch.Tensor, max_batch_tokens: int) -> Iterator[torch.Tensor]:
    if tokens.dim() != 2 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be [N, T] with T >= 1, got shape {tuple(tokens.shape)}")
    per = max(1, max_batch_tokens // tokens.shape[1])
    for i in range(0, tokens.shape[0], per):
        yield tokens[i : i + per]


def default_distances(length: int, dense: int = DENSE_DISTANCES, n_log: int = LOG_DISTANCES) -> list[int]:
    """Every Δ in [0, dense), then ``n_log`` log-spaced Δ, up to ⌊7·length/8⌋: the longest distances keep at
    least an eighth of the block's queries (beyond, a handful of pairs makes the curve pure noise)."""
    top = max(1, 7 * length // 8)
    dist = set(range(min(dense, top + 1)))
    if top > dense:
        dist.update(int(round(d)) for d in torch.logspace(math.log10(dense), math.log10(top), n_log).tolist())
    return sorted(dist)


def _check_distances(distances: Sequence[int], T: int) -> torch.Tensor:
    d = torch.as_tensor(list(distances), dtype=torch.long)
    if d.numel() == 0 or d.min() < 0 or d.max() >= T:
        raise ValueError(f"distances must be non-empty integers in [0, {T - 1}] for blocks of {T} tokens")
    return d


def _spread(lo: int, hi: int, n: int | None, device: torch.device) -> torch.Tensor:
    """At most ``n`` evenly spaced integers of [lo, hi), ascending (all of them when n is None or the range is
    small)."""
    t, valid = _spread_many(torch.tensor([lo], device=device), hi, n)
    return t[0, valid[0]]


def _spread_many(lo: torch.Tensor, hi: int, n: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row i: at most ``n`` evenly spaced integers of [lo_i, hi), ascending and distinct, padded to a common width
    R: ``(t [len(lo), R], valid [len(lo), R])`` (padding repeats lo_i and is marked invalid)."""
    span = hi - lo  # [n_rows]
    R = int(span.max()) if n is None else min(n, int(span.max()))
    count = span.clamp(max=R)[:, None]  # [n_rows, 1] queries in row i
    j = torch.arange(R, device=lo.device)[None, :]  # [1, R]
    valid = j < count  # [n_rows, R]
    t = lo[:, None] + torch.div(j * span[:, None], count.clamp(min=1), rounding_mode="floor")  # step ≥ 1: distinct
    return torch.where(valid, t, lo[:, None]), valid


# -- PaTH transport by the per-query recurrence -------------------------------------------------------------------
def _path_walk(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor, rows: torch.Tensor, max_steps: int
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """For ascending queries ``rows [R]`` walk back d = 0..max_steps keys: yield ``(d, start, ℓᴹ [B, H, R − start])``
    for the queries ``rows[start:]`` that still have a key t − d ≥ 0, with ℓᴹ = q_tᵀ H_t ⋯ H_{t−d+1} k_{t−d}
    (unscaled), computed as u·k_{t−d} with u ← H_{t−d+1} u, u_0 = q_t.

    The w, β and k rows of a stretch of steps are gathered at once (the walk is thousands of small steps, so
    per-step op count is what costs); queries that have reached key 0 drop out at the next stretch."""
    from bisect import bisect_left

    B, H, _, D = q.shape
    row_list = rows.tolist()
    u = q[:, :, rows]  # [B, H, R, D]
    start = 0
    stretch = max(1, _ROW_BUDGET // max(1, B * H * rows.numel() * D))
    for d0 in range(0, max_steps + 1, stretch):
        first = bisect_left(row_list, d0)  # rows[first:] >= d0 still have keys
        if first >= len(row_list):
            return
        u, start = u[:, :, first - start :], first  # [B, H, R', D]
        live = rows[start:]  # [R']
        steps = torch.arange(d0, min(d0 + stretch, max_steps + 1), device=rows.device)  # [c]
        key = (live[:, None] - steps[None, :]).clamp(min=0)  # [R', c] k_{t−d} (clamped where finished)
        hh = (key + 1).clamp(max=w.shape[2] - 1)  # [R', c] H_{t−d+1}
        # step-major copies, so every step reads contiguous [B, H, R', D] slices
        wj_all = w[:, :, hh].permute(3, 0, 1, 2, 4).contiguous()  # [c, B, H, R', D]
        kj_all = k[:, :, key].permute(3, 0, 1, 2, 4).contiguous()  # [c, B, H, R', D]
        bj_all = beta[:, :, hh].permute(3, 0, 1, 2).contiguous()  # [c, B, H, R']
        for j, d in enumerate(steps.tolist()):
            if d > 0:
                wj = wj_all[j]  # [B, H, R', D]
                coef = bj_all[j] * torch.linalg.vecdot(u, wj)  # [B, H, R']
                u = torch.addcmul(u, coef[..., None], wj, value=-1.0)  # [B, H, R', D]  u ← H_{t−d+1} u
            lo = bisect_left(row_list, d) - start  # rows with t < d have no key at distance d
            yield d, start + lo, torch.linalg.vecdot(u[:, :, lo:], kj_all[j, :, :, lo:])  # [B, H, R' − lo]


# -- coherence ---------------------------------------------------------------------------------------------------
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
    apart so the error bar can treat them as the independent replicates they are (:func:`_stderr`).

    Args:
        scheme: a :class:`~accrot.position.PositionScheme` (eval mode).
        q, k: ``[B, H, T, D]``; x: ``[B, T, d_model]``; tokens: ``[B, T]``.
        distances: Δ values in [0, T).
        max_queries: query positions per Δ (evenly spaced over t ∈ [Δ, T)); None for all of them.
        theta: SO(2) angles ``[B|1, H, T, D/2]`` to transport with instead of ``scheme.angles`` (a fresh draw
            of random increments, :meth:`~accrot.position.accum.AccumulatedRotation.independent_angles`).
    """
    B, H, T, D = q.shape
    dist = _check_distances(distances, T)
    q, k = q.float().contiguous(), k.float().contiguous()
    kind = scheme.rotation.kind
    out = {name: torch.zeros(B, H, dist.numel(), dtype=torch.float64) for name in ("num", "den", "msq", "count")}

    def add(cols: slice | int, lm: torch.Tensor, li: torch.Tensor, dims: tuple[int, ...]) -> None:
        out["num"][..., cols] = (lm * li).sum(dims).cpu()
        out["den"][..., cols] = (li * li).sum(dims).cpu()
        out["msq"][..., cols] = (lm * lm).sum(dims).cpu()

    if kind == "path":
        w, beta = scheme.householder(x, tokens)  # [B, H, T, D], [B, H, T]
        w, beta = w.float().contiguous(), beta.float().contiguous()
        rows = _spread(0, T, max_queries, q.device)  # one query set; each Δ uses the queries with t ≥ Δ
        column = {int(d): i for i, d in enumerate(dist.tolist())}
        for d, start, lm in _path_walk(q, k, w, beta, rows, int(dist.max())):
            if d in column:
                r = rows[start:]
                li = (q[:, :, r] * k[:, :, r - d]).sum(-1).double()  # [B, H, R']
                add(column[d], lm.double(), li, (2,))
                out["count"][..., column[d]] = r.numel()
        return out
    draws = 1
    if kind == "so2":
        theta = scheme.angles(x, tokens) if theta is None else theta  # [B|1 or draws·B, H, T, P]
        if theta.shape[0] > B:  # several draws at once, draw-major: replicate r = d·B + b pairs θ_d with block b
            if theta.shape[0] % B:
                raise ValueError(f"theta has {theta.shape[0]} rows, not a multiple of the batch {B}")
            draws = theta.shape[0] // B
            out = {name: torch.zeros(draws * B, H, dist.numel(), dtype=torch.float64) for name in out}
        qr, kr = (q, k) if draws == 1 else (q.repeat(draws, 1, 1, 1), k.repeat(draws, 1, 1, 1))
        qm, km = rotate_pairs(qr, theta), rotate_pairs(kr, theta)  # (R(θ_t) q_t)·(R(θ_s) k_s) = q_tᵀ M_ts k_s
    else:
        qm, km = q, k
    dist = dist.to(q.device)
    t_all, valid_all = _spread_many(dist, T, max_queries)  # [n, R] queries t ∈ [Δ, T) per distance
    # a group of distances per step: few large ops rather than many tiny ones (CPU threads idle on tiny ops)
    group = max(1, _ROW_BUDGET // max(1, draws * B * H * t_all.shape[1] * D))
    for g in range(0, dist.numel(), group):
        t, valid = t_all[g : g + group], valid_all[g : g + group]  # [n', R]
        s = t - dist[g : g + group, None]  # [n', R] keys s = t − Δ
        li = (q[:, :, t] * k[:, :, s]).sum(-1).double() * valid  # [B, H, n', R], the same for every draw
        lm = li if kind == "none" else (qm[:, :, t] * km[:, :, s]).sum(-1).double() * valid
        add(slice(g, g + group), lm, li.repeat(draws, 1, 1, 1), (3,))
        out["count"][..., g : g + group] = valid.sum(-1).double().cpu()  # [n'] broadcast over B, H
    return out


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, math.nan))


def _curve(acc: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """c = Σ_b num_b / Σ_b den_b over the replicates (dim 0): ``[H, n]``."""
    return _ratio(acc["num"].sum(0), acc["den"].sum(0))


def _stderr(acc: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Standard error of c = Σ num_b / Σ den_b across its N replicates (dim 0), ``[H, n]``: the ratio estimator's
    linearisation √(N/(N−1) · Σ_b (num_b − c·den_b)²) / Σ_b den_b. Honest when the replicates are independent:
    blocks for a deterministic scheme, (block, fresh draw) pairs for random increments (:func:`_layer_sums`); NaN
    with fewer than two replicates."""
    num, den = acc["num"], acc["den"]  # [N, H, n]
    n = num.shape[0]
    if n < 2:
        return torch.full(num.shape[1:], math.nan, dtype=torch.float64)
    c = _ratio(num.sum(0), den.sum(0))  # [H, n]
    resid = ((num - c * den) ** 2).sum(0)  # [H, n]
    return _ratio((n / (n - 1) * resid).sqrt(), den.sum(0))


def curve_and_stderr(sums: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """c(Δ) and its standard error across replicates, ``[H, n]`` each, from per-replicate coherence sums."""
    return _curve(sums), _stderr(sums)


def scheme_coherence(scheme, q, k, x, tokens, distances, max_queries: int | None = 512) -> torch.Tensor:
    """c(Δ) of one scheme on given inputs, ``[H, len(distances)]`` float64 (see :func:`scheme_coherence_sums`)."""
    with torch.no_grad(), torch.autocast(device_type=q.device.type, enabled=False):
        return _curve(scheme_coherence_sums(scheme, q, k, x, tokens, distances, max_queries))


COHERENCE_SUMS = ("num", "den", "msq", "count")
FRESH_DRAWS = 32  # independent increment draws per block for the coherence of random increments
_DRAW_BUDGET = 1 << 23  # elements of the rotated q (and k) of the fresh draws handled together
_DIAG_STREAM = 1 << 43  # generator indices of the diagnostics' fresh draws (disjoint from the scheme's own)


def _fresh_generator(scheme: nn.Module, layer: int, batch: int, draw: int) -> torch.Generator:
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
    chunk = max(1, _DRAW_BUDGET // (B * H * T * D))  # draws rotated at once: one pass over q, k per chunk
    reps = []
    for first in range(0, draws, chunk):
        theta = torch.cat([scheme.rotation.independent_angles(tokens, _fresh_generator(scheme, layer, batch, d))
                           for d in range(first, min(draws, first + chunk))])  # [chunk · B, H, T, P]
        reps.append(scheme_coherence_sums(scheme, q, k, x, tokens, distances, max_queries, theta=theta))
    return {n: torch.cat([r[n] for r in reps]) for n in COHERENCE_SUMS}


def _layer_sums(
    model: nn.Module,
    tokens: torch.Tensor,
    distances: Sequence[int] | None = None,
    window: int | None = None,
    n_queries: int = 32,
    max_queries: int | None = 512,
    max_batch_tokens: int = 16384,
    draws: int = FRESH_DRAWS,
) -> dict[int, dict[str, torch.Tensor]]:
    """One walk over the layers, micro-batch by micro-batch: per layer the coherence sums of
    :func:`scheme_coherence_sums` per replicate (``[N, H, n]``, when ``distances`` is given) and the far sums of
    :func:`scheme_far_sums` with their ``count`` summed over blocks (when ``window`` is given).

    For random increments the replicates are (block, fresh draw) pairs: ``draws`` independent draws of the
    scheme's own increment distribution transport each block's q, k (N = blocks × draws), so the curve is the
    distribution's coherence on the model's q, k, and its error bar covers the draw-to-draw spread that a single
    fixed evaluation draw hides. Otherwise a replicate is a block.
    """
    sums: dict[int, dict[str, torch.Tensor]] = {}
    with _eval_mode(model):
        for b, batch in enumerate(_batches(tokens, max_batch_tokens)):
            for i, li in enumerate(layer_inputs(model, batch)):
                part: dict[str, torch.Tensor] = {}
                if distances is not None:
                    rotation = li.scheme.rotation
                    if getattr(rotation, "random", False) and draws > 0:
                        part.update(scheme_coherence_fresh(li.scheme, li.q, li.k, li.x, li.tokens, distances,
                                                           max_queries, draws, layer=i, batch=b))
                    else:
                        part.update(scheme_coherence_sums(li.scheme, li.q, li.k, li.x, li.tokens, distances,
                                                          max_queries))
                if window is not None:
                    part.update(scheme_far_sums(li.scheme, li.q, li.k, li.v, li.x, li.tokens, window, n_queries))
                acc = sums.setdefault(i, {})
                for name, t in part.items():
                    if name in COHERENCE_SUMS:  # replicates side by side
                        acc[name] = t if name not in acc else torch.cat((acc[name], t))
                    else:
                        acc[name] = t if name not in acc else acc[name] + t
    return sums


def _far_means(acc: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    names = ("far_mass", "rotated", "unrotated", "incoherent")
    out = {name: acc[name] / acc["count"] for name in names if name in acc}
    if "near_sum" in acc:  # the score gap (T5), per head
        near = _ratio(acc["near_sum"], acc["near_count"])
        far = _ratio(acc["far_sum"], acc["far_count"])
        spread = (_ratio(acc["far_sq"], acc["far_count"]) - far**2).clamp_min(0).sqrt()
        out.update(near_score=near, far_score=far, far_spread=spread, gap=_ratio(near - far, spread),
                   concentration=_ratio(acc["far_concentration"], acc["far_count"]))
    return out


def coherence_curve(
    model: nn.Module,
    tokens: torch.Tensor,
    distances: Sequence[int],
    max_queries: int | None = 512,
    max_batch_tokens: int = 16384,
) -> dict[int, torch.Tensor]:
    """Measured coherence c(Δ) = E[ℓᴹ ℓᴵ] / E[(ℓᴵ)²] per layer: ``{layer: [H, len(distances)]}`` float64.

    Args:
        model: a Transformer (or a module holding one as ``.model``).
        tokens: ``[N, T]`` blocks; distances: Δ values in [0, T).
        max_queries: query positions per Δ and block, evenly spaced (None: all).
        max_batch_tokens: tokens per forward pass.
    """
    sums = _layer_sums(model, tokens, distances=distances, max_queries=max_queries, max_batch_tokens=max_batch_tokens,
                       draws=0)
    return {i: _curve(acc) for i, acc in sums.items()}


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


def replicate_window(sums: Mapping[str, torch.Tensor], distances: Sequence[int], eps: float = 0.05,
                     max_distance: int | None = None) -> dict[str, torch.Tensor]:
    """:func:`fitted_window` of the pooled curve, with ``window_se`` from a delete-one-replicate jackknife.

    The weighted fit's own slope error treats the Δ points as independent, but they share every draw and block,
    so it is several times too small; refitting with each replicate left out (the same weights) gives an error
    bar that covers the true window (tested on known truth)."""
    curve, stderr = _curve(sums), _stderr(sums)
    fit = fitted_window(curve, stderr, distances, eps, max_distance)
    num, den = sums["num"], sums["den"]  # [N, H, n]
    n = num.shape[0]
    if n < 3:
        fit["window_se"] = torch.full_like(fit["window"], math.nan)
        return fit
    loo = _ratio(num.sum(0) - num, den.sum(0) - den)  # [N, H, n] the curve without replicate i
    windows = fitted_window(loo, stderr.expand_as(loo), distances, eps, max_distance)["window"]  # [N, H]
    spread = ((windows - windows.mean(0)) ** 2).sum(0) * (n - 1) / n  # NaN if any refit is censored
    fit["window_se"] = torch.where(fit["censored"], torch.full_like(fit["window"], math.nan), spread.sqrt())
    return fit


def predicted_coherence(scheme: nn.Module, distances: Sequence[int]) -> torch.Tensor | None:
    """The i.i.d. prediction of c(Δ) from the scheme's increment distribution, ``[H, len(distances)]`` float64,
    or None where the theory gives none (learned increments without a mixing floor, PaTH).

    none: 1. rope: mean_i cos(Δ ω_i). accum with random increments: mean_i |φ_i|^Δ cos(Δ μ_i) with |φ_i| from
    ``describe()``'s ``increment_char_fn`` (exact for zero-mean, one-spread ``random_position``; the others assume
    isotropic q, k, and ``random_token`` assumes the tokens on a path are distinct). Learned increments with a
    mixing floor: the floor's envelope mean_i |φ_i|^Δ, an upper bound. See :func:`prediction_basis`.
    """
    cfg = scheme.cfg
    H, D = scheme.rotation.n_heads, scheme.rotation.head_dim
    d = torch.as_tensor(list(distances), dtype=torch.float64)[:, None]  # [n, 1]
    if cfg.rotation == "none":
        curve = torch.ones(d.shape[0], dtype=torch.float64)
    elif cfg.rotation == "rope":
        curve = torch.cos(d * rope_frequencies(D, cfg.rope_base)).mean(-1)  # [n]
    elif cfg.rotation == "accum":
        info = scheme.describe()
        if cfg.increments in ("random_position", "random_token"):
            rho = torch.tensor(info["increment_char_fn"], dtype=torch.float64)  # [P]
            mean, _ = increment_distribution(cfg, D)  # [P]
        elif "mixing_floor_sigma" in info:
            rho = char_fn_abs(torch.tensor(info["mixing_floor_sigma"], dtype=torch.float64), cfg.increment_family)
            mean = torch.zeros_like(rho)  # the envelope: the learned part can only lower it
        else:
            return None
        curve = (rho.pow(d) * torch.cos(d * mean)).mean(-1)  # [n]
    else:
        return None
    return curve.expand(H, -1).clone()


def prediction_basis(scheme: nn.Module) -> str:
    """How :func:`predicted_coherence` relates to the measurement: ``exact`` (in expectation, any q, k),
    ``isotropic`` (assumes isotropic q, k), ``approximate`` (random_token: i.i.d. only over distinct tokens),
    ``upper bound`` (learned increments' mixing floor) or ``none``."""
    cfg = scheme.cfg
    if cfg.rotation == "none":
        return "exact"
    if cfg.rotation == "rope":
        return "isotropic"
    if cfg.rotation == "accum":
        if cfg.increments == "random_position":
            exact = cfg.increment_mean == "zero" and cfg.increment_spread == "constant"
            return "exact" if exact else "isotropic"
        if cfg.increments == "random_token":
            return "approximate"
        if "mixing_floor_sigma" in scheme.describe():
            return "upper bound"
    return "none"


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

    ℓ_ts = D^−1/2 q_tᵀ M_{t,s} k_s + b_ts from q, k and the scheme's angles / householder / log_decay; the
    caller chunks the rows (memory B·H·R·T)."""
    if rows.numel() > 1 and bool((rows.diff() <= 0).any()):
        raise ValueError("rows must be strictly ascending query positions")
    return _probabilities(scheme, _scores(scheme, q, k, x, tokens, rows), x, tokens, rows)


def _probabilities(scheme: nn.Module, scores: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
                   rows: torch.Tensor) -> torch.Tensor:
    """Softmax over keys of the transported scores ``[B, H, R, T]`` (float64) plus the far-mass bias, causal."""
    T = scores.shape[-1]
    logits = scores
    if scheme.far_mass is not None:
        c = scheme.log_decay(x, tokens).double().cumsum(-1)  # [B|1, H, T] c_t = Σ_{j≤t} log f_j
        logits = logits + (c[:, :, rows, None] - c[:, :, None, :])  # b_ts = c_t − c_s
    future = torch.arange(T, device=scores.device)[None, :] > rows[:, None]  # [R, T]
    return logits.masked_fill(future, -math.inf).softmax(-1).float()


def _scores(scheme: nn.Module, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
            rows: torch.Tensor) -> torch.Tensor:
    """Transported scores D^−1/2 q_tᵀ M_{t,s} k_s of query ``rows`` over every key, ``[B, H, R, T]`` float64,
    without the far-mass bias (entries s > t are meaningless; callers mask them)."""
    B, H, T, D = q.shape
    q, k = q.float().contiguous(), k.float().contiguous()
    kind = scheme.rotation.kind
    if kind == "path":
        w, beta = scheme.householder(x, tokens)  # [B, H, T, D], [B, H, T]
        w, beta = w.float().contiguous(), beta.float().contiguous()
        by_dist = q.new_zeros(B, H, rows.numel(), T)  # [B, H, R, T] ℓᴹ(t, t − Δ) at [.., t, Δ]
        for d, start, lm in _path_walk(q, k, w, beta, rows, T - 1):
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
    """Per-head sums over blocks and the last ``n_queries`` queries, each ``[H]`` float64, plus ``count``:
    ``far_mass`` Σ_{t−s>W} a_ts, and for SO(2) rotations the far output norms ``rotated``, ``unrotated`` and
    ``incoherent`` (see module doc)."""
    B, H, T, D = q.shape
    if window < 0:
        raise ValueError(f"window={window} must be >= 0")
    rows_all = torch.arange(max(0, T - n_queries), T, device=q.device)
    chunk = max(1, _ROW_BUDGET // max(1, B * H * T))
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
    out["count"] = torch.tensor(float(B * rows_all.numel()), dtype=torch.float64)
    if not so2:
        for name in ("rotated", "unrotated", "incoherent"):
            del out[name]
    return out


def far_mass(
    model: nn.Module,
    tokens_by_length: Mapping[int, torch.Tensor],
    window: int,
    n_queries: int = 32,
    max_batch_tokens: int = 16384,
) -> dict[int, dict[int, torch.Tensor]]:
    """Attention mass on keys farther than ``window`` tokens, mean over blocks and the last ``n_queries``
    queries: ``{layer: {length: [H]}}`` float64. ``tokens_by_length`` maps a length to blocks ``[N, ≥length]``."""
    result: dict[int, dict[int, torch.Tensor]] = {}
    for length, blocks in sorted(tokens_by_length.items()):
        sums = _layer_sums(model, blocks[:, :length], window=window, n_queries=n_queries,
                           max_batch_tokens=max_batch_tokens)
        for i, acc in sums.items():
            result.setdefault(i, {})[int(length)] = _far_means(acc)["far_mass"]
    return result


def value_far_norm(
    model: nn.Module, tokens: torch.Tensor, window: int, n_queries: int = 32, max_batch_tokens: int = 16384
) -> dict[int, dict[str, torch.Tensor]]:
    """Norm of the far part of the attention output with and without value rotation (same weights), mean over
    blocks and the last ``n_queries`` queries: ``{layer: {"rotated", "unrotated", "incoherent": [H]}}`` for layers
    with an SO(2) rotation (rope, accum); other layers are absent."""
    sums = _layer_sums(model, tokens, window=window, n_queries=n_queries, max_batch_tokens=max_batch_tokens)
    stats = {i: _far_means(acc) for i, acc in sums.items()}
    return {i: {k: s[k] for k in ("rotated", "unrotated", "incoherent")} for i, s in stats.items() if "rotated" in s}


# -- the bundle -----------------------------------------------------------------------------------------------------
def _finite_or_none(x):
    """JSON without NaN/Infinity: non-finite floats become null (a window that never fell below ε, or an
    undefined ratio)."""
    if isinstance(x, torch.Tensor):
        x = x.tolist()
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_none(v) for v in x]
    return x


def diagnose(
    model: nn.Module,
    blocks_by_length: Mapping[int, torch.Tensor],
    train_length: int,
    eps: float = 0.05,
    far_window: int | None = None,
    n_queries: int = 32,
    max_queries: int | None = 512,
    max_batch_tokens: int = 16384,
    draws: int = FRESH_DRAWS,
) -> dict:
    """All diagnostics of one model, JSON-serialisable (lists; null for inf / undefined).

    Coherence and windows at the training length (or the shortest length given) and at the longest; far mass
    and value far norms at every length. ``far_window`` defaults to ``train_length // 4``.

    Layout: ``{"schema", "train_length", "lengths", "eps", "window_fit_range", "far_window", "n_queries",
    "scheme" (describe() of layer 0), "prediction" (:func:`prediction_basis`), "layers": [{"layer",
    "coherence": [{"length", "distances", "curve" [H][n], "stderr" [H][n] (across replicates), "replicates",
    "fresh_draws", "window" [H] (fitted; null when censored), "window_se" [H], "window_censored" [H],
    "window_first_crossing" [H], "window_sustained" [H], "predicted" [H][n] | null}], "predicted": {"distances",
    "curve",
    "window", "window_sustained"} | null, "far_mass": [{"length", "mass" [H]}], "score_gap": [{"length", "near_score",
    "far_score", "far_spread", "gap", "concentration" [H] each}], "value_far_norm": [{"length",
    "rotated", "unrotated", "incoherent"}]}]}``.
    """
    if not blocks_by_length:
        raise ValueError("blocks_by_length is empty; give at least one length")
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps={eps!r} must lie in (0, 1)")
    lengths = sorted(int(n) for n in blocks_by_length)
    window = max(1, train_length // 4) if far_window is None else int(far_window)
    coherence_lengths = sorted({train_length if train_length in lengths else lengths[0], lengths[-1]})
    fit_range = max(1, 7 * min(coherence_lengths) // 8)  # the windows' Δ range, the same at every length
    schemes = _backbone(model).schemes()
    layers = [{"layer": i, "coherence": [], "far_mass": [], "value_far_norm": []} for i in range(len(schemes))]
    grid = list(range(lengths[-1]))  # the prediction on every Δ the longest block holds
    predictions = [predicted_coherence(scheme, grid) for scheme in schemes]  # [H, len(grid)] or None each

    for length in lengths:
        tokens = blocks_by_length[length][:, :length]
        dist = default_distances(length) if length in coherence_lengths else None
        sums = _layer_sums(model, tokens, dist, window, n_queries, max_queries, max_batch_tokens, draws)
        for i, acc in sums.items():
            if dist is not None:
                curve, stderr = _curve(acc), _stderr(acc)  # [H, n] each
                fit = replicate_window(acc, dist, eps, fit_range)
                layers[i]["coherence"].append({
                    "length": length,
                    "distances": dist,
                    "curve": curve,
                    "stderr": stderr,
                    "replicates": int(acc["num"].shape[0]),
                    "fresh_draws": draws if getattr(schemes[i].rotation, "random", False) else 0,
                    "window": fit["window"],
                    "window_se": fit["window_se"],
                    "window_censored": fit["censored"].tolist(),
                    "window_first_crossing": mixing_window_measured(curve, dist, eps),
                    "window_sustained": mixing_window_measured(curve, dist, eps, sustained=True),
                    # the prediction at the measured distances (T1 compares them point by point)
                    "predicted": None if predictions[i] is None else predictions[i][:, dist],
                })
            stats = _far_means(acc)
            layers[i]["far_mass"].append({"length": length, "mass": stats["far_mass"]})
            layers[i].setdefault("score_gap", []).append({"length": length, **{k: stats[k] for k in (
                "near_score", "far_score", "far_spread", "gap", "concentration")}})
            if "rotated" in stats:
                layers[i]["value_far_norm"].append({"length": length, **{k: stats[k] for k in
                                                                          ("rotated", "unrotated", "incoherent")}})

    for i, pred in enumerate(predictions):
        if pred is None:
            layers[i]["predicted"] = None
            continue
        shown = default_distances(lengths[-1])
        layers[i]["predicted"] = {
            "distances": shown,
            "curve": pred[:, shown],
            "window": mixing_window_measured(pred, grid, eps),
            "window_sustained": mixing_window_measured(pred, grid, eps, sustained=True),
        }
    return _finite_or_none({
        "schema": SCHEMA,
        "train_length": int(train_length),
        "lengths": lengths,
        "eps": eps,
        "window_fit_range": [1, fit_range],
        "far_window": window,
        "n_queries": n_queries,
        "scheme": schemes[0].describe(),
        "prediction": prediction_basis(schemes[0]),
        "layers": layers,
    })


def _nan(x) -> float:
    return math.nan if x is None else float(x)


def summary(result: Mapping) -> list[dict]:
    """Per layer (means over heads, inf for a window that never fell below ε): ``window@{length}``,
    ``predicted_window``, ``far_mass@{length}``; used for the table and for logged scalars."""
    rows = []
    for layer in result["layers"]:
        row: dict = {"layer": layer["layer"]}
        for c in layer["coherence"]:
            row[f"window@{c['length']}"] = _mean_window(c["window"])
        pred = layer.get("predicted")
        row["predicted_window"] = _mean_window(pred["window"]) if pred else math.nan
        for f in layer["far_mass"]:
            row[f"far_mass@{f['length']}"] = sum(map(_nan, f["mass"])) / max(1, len(f["mass"]))
        rows.append(row)
    return rows


def _mean_window(windows: Sequence) -> float:
    values = [math.inf if w is None else float(w) for w in windows]
    return sum(values) / len(values) if values else math.nan


# -- figures -----------------------------------------------------------------------------------------------------------
def plot_diagnostics(result: Mapping, out_dir: str | Path) -> list[Path]:
    """PNGs (written atomically): ``coherence.png`` (c vs Δ per layer: measured solid at L, dotted at the longest
    length, predicted dashed, ε line), ``far_mass.png`` (vs length, log x) and, for SO(2) rotations,
    ``value_far_norm.png``. Returns the paths written."""
    from accrot.report import _pyplot, atomic_savefig

    plt = _pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    layers, eps, L = result["layers"], result["eps"], result["train_length"]
    written = []

    fig, axes = plt.subplots(1, len(layers), figsize=(4.5 * len(layers), 3.8), squeeze=False)
    for ax, layer in zip(axes[0], layers):
        for j, c in enumerate(layer["coherence"]):
            style = "-" if j == 0 else ":"
            dist = c["distances"]
            for h, curve in enumerate(c["curve"]):
                pts = [(d, _nan(y)) for d, y in zip(dist, curve) if d > 0]
                ax.plot(*zip(*pts), style, color=f"C{h}", linewidth=1.2,
                        label=f"head {h} @{c['length']}" if j == 0 or h == 0 else None)
        pred = layer.get("predicted")
        if pred:
            pts = [(d, _nan(y)) for d, y in zip(pred["distances"], pred["curve"][0]) if d > 0]
            ax.plot(*zip(*pts), "--", color="black", linewidth=1.6, zorder=5,
                    label=f"predicted ({result['prediction']})")
        ax.axhline(eps, color="grey", linewidth=0.8)
        ax.axvline(L, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_ylim(-0.25, 1.1)
        ax.set_xlabel("distance Δ (tokens)")
        ax.set_title(f"layer {layer['layer']}")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("coherence E[ℓᴹℓᴵ]/E[(ℓᴵ)²]")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"coherence (solid: length {L}, dotted: longest; grey: ε = {eps:g}, training length)")
    atomic_savefig(fig, out_dir / "coherence.png")
    plt.close(fig)
    written.append(out_dir / "coherence.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for layer in layers:
        xs = [f["length"] for f in layer["far_mass"]]
        per_head = list(zip(*[[_nan(m) for m in f["mass"]] for f in layer["far_mass"]]))
        mean = [sum(col) / len(col) for col in zip(*per_head)]
        line = ax.plot(xs, mean, marker="o", label=f"layer {layer['layer']} (mean over heads)")[0]
        for ys in per_head:
            ax.plot(xs, ys, color=line.get_color(), alpha=0.3, linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.axvline(L, color="grey", linestyle="--", linewidth=1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel(f"attention mass on keys > {result['far_window']} back")
    ax.set_title("far mass (last queries of each block)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    atomic_savefig(fig, out_dir / "far_mass.png")
    plt.close(fig)
    written.append(out_dir / "far_mass.png")

    if any(layer["value_far_norm"] for layer in layers):
        fig, ax = plt.subplots(figsize=(6, 4))
        for layer in layers:
            rows = layer["value_far_norm"]
            if not rows:
                continue
            xs = [r["length"] for r in rows]

            def mean(key, rows=rows):
                return [sum(map(_nan, r[key])) / len(r[key]) for r in rows]

            line = ax.plot(xs, mean("unrotated"), "--", marker="o", label=f"layer {layer['layer']} unrotated")[0]
            ax.plot(xs, mean("rotated"), "-", marker="o", color=line.get_color(), label=f"layer {layer['layer']} rotated")
            ax.plot(xs, mean("incoherent"), ":", color=line.get_color(), label=f"layer {layer['layer']} √Σa²‖v‖²")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel("‖far part of the output‖ (mean over heads)")
        ax.set_title("value transport: far contributions")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        atomic_savefig(fig, out_dir / "value_far_norm.png")
        plt.close(fig)
        written.append(out_dir / "value_far_norm.png")
    return written


# -- the command ------------------------------------------------------------------------------------------------------
def _fmt_window(x: float) -> str:
    return "∞" if math.isinf(x) else "-" if math.isnan(x) else f"{x:.0f}"


def diagnostics_table(result: Mapping):
    """A rich table: per layer, measured windows (mean over heads) at each coherence length, the predicted
    window, and far mass at the shortest and the longest length."""
    from rich.table import Table

    L, lengths = result["train_length"], result["lengths"]
    coh_lengths = [c["length"] for c in result["layers"][0]["coherence"]] if result["layers"] else []
    mass_lengths = sorted({lengths[0], lengths[-1]})
    table = Table(title=f"diagnostics (ε = {result['eps']:g}, far = keys > {result['far_window']} back)")
    table.add_column("layer", justify="right")
    for n in coh_lengths:
        table.add_column(f"window @{n / L:g}×", justify="right")
    table.add_column("predicted", justify="right")
    for n in mass_lengths:
        table.add_column(f"far mass @{n / L:g}×", justify="right")
    for row in summary(result):
        table.add_row(
            str(row["layer"]),
            *(_fmt_window(row[f"window@{n}"]) for n in coh_lengths),
            _fmt_window(row["predicted_window"]),
            *(f"{row[f'far_mass@{n}']:.3f}" for n in mass_lengths),
        )
    return table


def _floats(values: Sequence[str]) -> list[float]:
    """``1 8 32``, ``[1,8,32]`` or ``1,8,32`` as floats."""
    out = []
    for v in values:
        for part in str(v).strip("[]").split(","):
            if part.strip():
                out.append(float(part))
    return out


def diagnose_main(argv: list[str]) -> int:
    """``accrot diagnose --ckpt PATH``: coherence, mixing windows, far mass and value far norms of a checkpoint;
    writes diagnostics.json + PNGs into <run>/diagnostics/."""
    import json
    import time

    from jsonargparse import ArgumentParser
    from rich.console import Console

    from accrot.cli import UsageError, _load_data_module, resolve_run
    from accrot.lit import LitLM
    from accrot.report import atomic_write_text

    parser = ArgumentParser(prog="accrot diagnose", exit_on_error=False, description=diagnose_main.__doc__)
    parser.add_argument("--ckpt", type=str, required=True, help="checkpoint (.ckpt) of an accrot run")
    parser.add_argument("--config", type=str | None, default=None,
                        help="the run's config.yaml (default: found next to the checkpoint's run directory)")
    parser.add_argument("--multipliers", type=str, nargs="+", default=["1", "8", "32"],
                        help="lengths as multiples of the training length: 1 8 32 or [1,8,32]")
    parser.add_argument("--blocks", type=int, default=4, help="evaluation blocks per length")
    parser.add_argument("--eps", type=float, default=0.05, help="ε of the mixing window")
    parser.add_argument("--far_window", type=int | None, default=None, help="far = keys more than this many tokens back "
                        "(default: training length / 4)")
    parser.add_argument("--queries", type=int, default=32, help="last queries per block for far mass")
    parser.add_argument("--out", type=str | None, default=None, help="output folder (default: <run>/diagnostics)")
    parser.add_argument("--device", type=str, default="cpu", help="cpu, cuda, cuda:1, ...")
    args = parser.parse_args(argv)

    ckpt, run_dir, config = resolve_run(args.ckpt, args.config)
    try:
        multipliers = _floats(args.multipliers)
    except ValueError as err:
        raise UsageError(f"--multipliers={' '.join(args.multipliers)!r} is not valid; give numbers, e.g. 1 8 32") from err
    if not multipliers or any(not m > 0 for m in multipliers):
        raise UsageError(f"--multipliers={multipliers!r} is not valid; give positive multiples of the training length")
    if args.blocks < 1:
        raise UsageError(f"--blocks={args.blocks} is not valid; it must be a positive integer")
    if not 0.0 < args.eps < 1.0:
        raise UsageError(f"--eps={args.eps} is not valid; it must lie in (0, 1)")
    if args.far_window is not None and args.far_window < 0:
        raise UsageError(f"--far_window={args.far_window} is not valid; it must be >= 0")
    if args.queries < 1:
        raise UsageError(f"--queries={args.queries} is not valid; it must be a positive integer")
    try:
        lit = LitLM.load_from_checkpoint(ckpt, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - any failure to load is the same bad input
        raise UsageError(f"checkpoint {str(ckpt)!r} is not a readable accrot checkpoint ({type(err).__name__})") from err
    dm = _load_data_module(config)
    train_length = int(dm.seq_len)
    lengths = sorted({max(2, round(m * train_length)) for m in multipliers})
    blocks = {n: dm.eval_blocks(n, args.blocks * n, record=False)[:, :n] for n in lengths}  # DataError before any work
    lit.eval().to(args.device)
    t0 = time.perf_counter()
    with Console(stderr=True).status("diagnosing"):
        result = diagnose(lit.model, blocks, train_length, eps=args.eps, far_window=args.far_window,
                          n_queries=args.queries)
    result.update(checkpoint=str(ckpt), seconds=round(time.perf_counter() - t0, 3),
                  blocks={str(n): int(b.shape[0]) for n, b in blocks.items()},
                  data=_finite_or_none(dm.describe()))
    out = Path(args.out) if args.out else run_dir / "diagnostics"
    out.mkdir(parents=True, exist_ok=True)
    plot_diagnostics(result, out)
    atomic_write_text(out / "diagnostics.json", json.dumps(result, indent=1))
    Console().print(diagnostics_table(result))
    print(out / "diagnostics.json")
    return 0

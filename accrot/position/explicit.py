"""A scheme's attention written out: the explicit twin of :meth:`PositionScheme.forward`.

The fast path folds every term into a fused kernel (the row factor into q, the bias into the kernel's blocks, the
rotation into q, k and v); here each term is an explicit ``[B, H, R, T]`` tensor, in float64, for any query rows R:

    ℓ_ts = c_t · s_ts + b_ts,   s_ts = D^−1/2 q_tᵀ M_{t,s} k_s,   out_t = g_t ⊙ Σ_s softmax_s(ℓ_ts) M^v_{t,s} v_s

and every term is asked of the part it belongs to, never of a family name (``accrot.position.base``):

* the transported scores s_ts and the value transport M^v from the rotation part (``transported_scores``,
  ``transported_values``: q·k without a rotation, R(θ_s − θ_t) for SO(2), H_t ⋯ H_{s+1} for PaTH);
* the row factor c_t from the far-mass part's ``logit_scale`` (scalable softmax's s_h·log(t + 1)) times the rotation
  part's ``logit_scale(T)`` (an evaluation-time RoPE extension's temperature), and the bias b_ts from the far-mass
  part's ``logit_bias`` (Σ_{j=s+1..t} log f_j);
* the output factor g_t from the output gate's ``gate``.

A new mechanism that changes the fast path changes its part's term here too, and a test compares the two on every
cell (``tests/position/test_explicit.py``), so what the diagnostics measure with these functions
(:mod:`accrot.diagnostics`) is the attention the model computes. The scores run in q's precision (float32 or wider:
float32 for the diagnostics' float32 q, float64 for a float64 check); factor, bias, softmax and values in float64.
Memory is B·H·R·T per tensor: callers chunk the rows. Defined in ``eval()`` (in training, random increments that are
redrawn per call would give each call its own draw). Everything is differentiable: gradients reach q, k, v, x and
every parameter of the parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ExplicitRows:
    """The attention of query rows R over every key, each ``[B, H, R, T]`` float64: ``scores`` s_ts (transported,
    no factor or bias; meaningless for s > t), ``logits`` ℓ_ts = c_t·s_ts + b_ts (−inf for s > t) and
    ``probabilities`` softmax_s(ℓ_ts) (0 for s > t)."""

    scores: torch.Tensor
    logits: torch.Tensor
    probabilities: torch.Tensor


def scores(scheme: nn.Module, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
           rows: torch.Tensor) -> torch.Tensor:
    """Transported scores s_ts = D^−1/2 q_tᵀ M_{t,s} k_s of query ``rows [R]`` (ascending positions) over every key,
    ``[B, H, R, T]`` float64, without the row factor or the bias (entries s > t are meaningless; callers mask them).

    Args:
        scheme: a :class:`~accrot.position.scheme.PositionScheme`.
        q, k: ``[B, H, T, D]``; x: ``[B, T, d_model]`` the layer input; tokens: ``[B, T]``; rows: ``[R]`` long.
    """
    return scheme.rotation.transported_scores(q, k, x, tokens, rows)


def pairings_at(q: torch.Tensor, k: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The unscaled pairings q_t·k_s of query ``rows [R]`` with the keys ``keys [R, n]`` each (pairs a rotation
    part's :meth:`~accrot.position.base.RotationPart.factored_pairs` hands out pair to its transported scores),
    ``[B, H, R, n]`` in q's dtype: every query against every key up to the last row by one GEMM, then each row's keys
    picked out of it (the pairs needed are a sliver of the product, but a GEMM reads q and k once where gathering
    pairs moves D floats each)."""
    upto = int(rows.max()) + 1  # keys past the last query are never read
    product = q[:, :, rows] @ k[:, :, :upto].transpose(-1, -2)  # [B, H, R, upto]
    return product.gather(-1, keys.expand(q.shape[0], q.shape[1], -1, -1))  # [B, H, R, n]


def logit_factor(scheme: nn.Module, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The factor c_t on every logit of row t, ``[B|1, H, T]`` float64: the far-mass part's row factor (ones where
    it has none) times the rotation part's factor at this length. Equals ``scheme.logit_scale`` (in float64)."""
    T = tokens.shape[1]
    row = None if scheme.far_mass is None else scheme.far_mass.logit_scale(x, tokens)  # [B|1, H, T] or None
    if row is None:
        row = torch.ones(1, scheme.rotation.n_heads, T, dtype=torch.float64, device=x.device)
    return row.double() * scheme.rotation.logit_scale(T)  # [B|1, H, T]


def logits(scheme: nn.Module, scores: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
           rows: torch.Tensor) -> torch.Tensor:
    """The logits ℓ_ts = c_t·s_ts + b_ts of query ``rows [R]`` from their transported ``scores [B, H, R, T]``
    (:func:`scores`): ``[B, H, R, T]`` float64, −inf for keys s > t (c_t: :func:`logit_factor`; b_ts: the far-mass
    part's ``logit_bias``)."""
    T = scores.shape[-1]
    out = scores.double() * logit_factor(scheme, x, tokens)[:, :, rows, None]  # [B, H, R, T]
    bias = None if scheme.far_mass is None else scheme.far_mass.logit_bias(x, tokens, rows)  # [B|1, H, R, T]
    if bias is not None:
        out = out + bias
    future = torch.arange(T, device=scores.device)[None, :] > rows[:, None]  # [R, T]
    return out.masked_fill(future, -math.inf)


def explicit_rows(scheme: nn.Module, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
                  rows: torch.Tensor) -> ExplicitRows:
    """Scores, logits and probabilities of query ``rows [R]`` (ascending) over every key, from one evaluation of
    each term (shapes as :func:`scores`)."""
    s = scores(scheme, q, k, x, tokens, rows)  # [B, H, R, T]
    ell = logits(scheme, s, x, tokens, rows)  # [B, H, R, T]
    return ExplicitRows(s, ell, ell.softmax(-1))


def probabilities(scheme: nn.Module, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
                  rows: torch.Tensor) -> torch.Tensor:
    """Attention weights a_ts = softmax_s(ℓ_ts) of query ``rows [R]`` (ascending) over every key, ``[B, H, R, T]``
    float64 (0 for s > t)."""
    return explicit_rows(scheme, q, k, x, tokens, rows).probabilities


def attention(scheme: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor,
              tokens: torch.Tensor) -> torch.Tensor:
    """The scheme's attention output written out: out_t = g_t ⊙ Σ_s a_ts M^v_{t,s} v_s for every query,
    ``[B, H, T, D]`` float64 (what ``scheme(q, k, v, x, tokens)`` computes; explicit ``[B, H, T, T]`` weights).

    Args: q, k, v ``[B, H, T, D]``; x ``[B, T, d_model]``; tokens ``[B, T]``."""
    rows = torch.arange(q.shape[-2], device=q.device)  # [T]
    a = probabilities(scheme, q, k, x, tokens, rows)  # [B, H, T, T]
    out = scheme.rotation.transported_values(a, v, x, tokens, rows)  # [B, H, T, D]
    if scheme.gate is not None:
        out = out * scheme.gate.gate(x, tokens).to(out.dtype)  # the output gate, after the value transport
    return out

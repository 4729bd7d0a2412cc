"""Per-layer sums of a model over blocks (coherence, far mass, score gap, value norms in one pass per layer) and
the model-level curves read from them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from accrot.diagnostics.coherence import (
    COHERENCE_SUMS,
    FRESH_DRAWS,
    ratio,
    scheme_coherence_fresh,
    scheme_coherence_sums,
    sums_curve,
)
from accrot.diagnostics.far_mass import scheme_far_sums
from accrot.diagnostics.inputs import batches, eval_mode, layer_inputs
from accrot.position import facts


def layer_sums(
    model: nn.Module,
    tokens: torch.Tensor,
    distances: Sequence[int] | None = None,
    window: int | Mapping[int, torch.Tensor] | None = None,
    n_queries: int = 32,
    max_queries: int | None = 512,
    max_batch_tokens: int = 16384,
    draws: int = FRESH_DRAWS,
) -> dict[int, dict[str, torch.Tensor]]:
    """One walk over the layers, micro-batch by micro-batch: per layer the coherence sums of
    :func:`scheme_coherence_sums` per replicate (``[N, H, n]``, when ``distances`` is given) and the far sums of
    :func:`scheme_far_sums` summed over blocks (when ``window`` is given: one int, or ``{layer: [H]}`` windows).

    For random position increments (an instrument check: their coherence is known) the replicates are (block,
    fresh draw) pairs: ``draws`` independent draws of the scheme's own increment distribution transport each
    block's q, k (N = blocks × draws), so the curve is the distribution's coherence on the model's q, k, and its
    error bar covers the draw-to-draw spread that a single fixed evaluation draw hides. Every other transport
    (learned or token increments, PaTH) is the model's own, deterministic one, and a replicate is a block.
    """
    sums: dict[int, dict[str, torch.Tensor]] = {}
    with eval_mode(model):
        for b, batch in enumerate(batches(tokens, max_batch_tokens)):
            for i, li in enumerate(layer_inputs(model, batch)):
                part: dict[str, torch.Tensor] = {}
                if distances is not None:
                    if fresh_draws_apply(li.scheme) and draws > 0:
                        part.update(scheme_coherence_fresh(li.scheme, li.q, li.k, li.x, li.tokens, distances,
                                                           max_queries, draws, layer=i, batch=b))
                    else:
                        part.update(scheme_coherence_sums(li.scheme, li.q, li.k, li.x, li.tokens, distances,
                                                          max_queries))
                if window is not None:
                    w = window[i] if isinstance(window, Mapping) else window
                    part.update(scheme_far_sums(li.scheme, li.q, li.k, li.v, li.x, li.tokens, w, n_queries))
                acc = sums.setdefault(i, {})
                for name, t in part.items():
                    if name in REPLICATED:  # replicates side by side
                        acc[name] = t if name not in acc else torch.cat((acc[name], t))
                    else:
                        acc[name] = t if name not in acc else acc[name] + t
    return sums


# sums kept per replicate (block, or block × draw), stacked along dim 0 across micro-batches
REPLICATED = (*COHERENCE_SUMS, "far_mass_blocks", "z_near", "e_far_q")


def fresh_draws_apply(scheme: nn.Module) -> bool:
    """Random *position* increments: a new draw per training batch, so no single draw is "the model's" transport;
    their coherence is measured under fresh draws of the distribution (a calibration of the instrument). Token
    increments are a fixed table, learned ones a function of x: the model's own transport, measured as it is."""
    return facts(scheme.cfg).fresh_draws


def far_means(acc: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-head means of the far pass's sums (:func:`scheme_far_sums`), ``[H]`` each (``far_mass_blocks``:
    ``[N, H]``): far mass, value far norms, and the score gap's pieces — ``near_score`` (attention-weighted),
    ``far_score`` and ``far_spread`` (mean and standard deviation of the far scores), ``gap`` = (near − far) /
    spread, ``concentration`` √E[(‖q‖‖k‖/D)²] over far pairs and ``concentration_ratio`` = spread /
    concentration (1 for incoherent pairs in high dimension); over the queries with far keys, ``near_top`` and
    ``far_max`` (the top near score and the far maximum, each a mean over queries), ``top_gap`` = (near_top −
    far_max) / spread, and ``far_max_predicted`` = far_score + spread·E[√(2 ln n)] (the maximum of n i.i.d.
    scores, as concentration predicts it)."""
    names = ("far_mass", "rotated", "unrotated", "incoherent")
    out = {name: acc[name] / acc["far_rows"] for name in names if name in acc}
    if "far_mass_blocks" in acc:
        rows_per_block = acc["far_rows"] / acc["far_mass_blocks"].shape[0]
        out["far_mass_blocks"] = acc["far_mass_blocks"] / rows_per_block
    if "near_as" in acc:  # the score gap (T5), per head
        near = ratio(acc["near_as"], acc["near_a"])
        far = ratio(acc["far_sum"], acc["far_count"])
        spread = (ratio(acc["far_sq"], acc["far_count"]) - far**2).clamp_min(0).sqrt()
        conc = ratio(acc["far_norm_sq"], acc["far_count"]).sqrt()
        out.update(near_score=near, far_score=far, far_spread=spread, gap=ratio(near - far, spread),
                   concentration=conc, concentration_ratio=ratio(spread, conc))
        if "far_top" in acc:
            near_top, far_max = ratio(acc["near_top"], acc["top_rows"]), ratio(acc["far_top"], acc["top_rows"])
            out.update(near_top=near_top, far_max=far_max, top_gap=ratio(near_top - far_max, spread),
                       far_max_predicted=far + spread * ratio(acc["far_root_log_n"], acc["top_rows"]))
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
    sums = layer_sums(model, tokens, distances=distances, max_queries=max_queries, max_batch_tokens=max_batch_tokens,
                       draws=0)
    return {i: sums_curve(acc) for i, acc in sums.items()}


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
        sums = layer_sums(model, blocks[:, :length], window=window, n_queries=n_queries,
                           max_batch_tokens=max_batch_tokens)
        for i, acc in sums.items():
            result.setdefault(i, {})[int(length)] = far_means(acc)["far_mass"]
    return result


def value_far_norm(
    model: nn.Module, tokens: torch.Tensor, window: int, n_queries: int = 32, max_batch_tokens: int = 16384
) -> dict[int, dict[str, torch.Tensor]]:
    """Norm of the far part of the attention output with and without value rotation (same weights), mean over
    blocks and the last ``n_queries`` queries: ``{layer: {"rotated", "unrotated", "incoherent": [H]}}`` for layers
    with an SO(2) rotation (rope, accum); other layers are absent."""
    sums = layer_sums(model, tokens, window=window, n_queries=n_queries, max_batch_tokens=max_batch_tokens)
    stats = {i: far_means(acc) for i, acc in sums.items()}
    return {i: {k: s[k] for k in ("rotated", "unrotated", "incoherent")} for i, s in stats.items() if "rotated" in s}

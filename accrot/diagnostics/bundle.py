"""Every diagnostic of a model at several lengths in one JSON-ready bundle (``diagnostics.json``) and its summary
rows per layer."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from accrot.diagnostics.coherence import (
    FRESH_DRAWS,
    mixing_window_measured,
    predicted_coherence,
    prediction_basis,
    ratio,
    replicate_window,
    sums_curve,
    sums_stderr,
)
from accrot.diagnostics.far_mass import predicted_far_mass
from accrot.diagnostics.inputs import SCHEMA, backbone, default_distances, layer_inputs
from accrot.diagnostics.layers import far_means, fresh_draws_apply, layer_sums
from accrot.diagnostics.regularity import regularity
from accrot.position import facts


# -- the bundle -----------------------------------------------------------------------------------------------------
def finite_or_none(x):
    """JSON without NaN/Infinity: non-finite floats become null (a window that never fell below ε, or an
    undefined ratio)."""
    if isinstance(x, torch.Tensor):
        x = x.tolist()
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_none(v) for v in x]
    return x


def diagnose(
    model: nn.Module,
    blocks_by_length: Mapping[int, torch.Tensor],
    train_length: int,
    eps: float = 0.05,
    far_window: int | None = None,
    n_queries: int = 32,
    max_queries: int | None = 512,
    max_batch_tokens: int = 65536,
    draws: int = FRESH_DRAWS,
    fresh_blocks: int = 2,
    fresh_max_multiple: float = 8.0,
    window_multiple: float = 8.0,
) -> dict:
    """All diagnostics of one model, JSON-serialisable (lists; null for inf / undefined). Two passes per length:

    1. **coherence** at every length, each head's mixing window fitted over 1 ≤ Δ ≤ 7/8 of that length with a
       jackknife error bar over the blocks (:func:`~accrot.diagnostics.coherence.replicate_window`), and, from
       the ``window_multiple`` × L length on, also over 1 ≤ Δ ≤ 7/8 of that length at each (one range for all). The model's
       own transport (learned or token increments, PaTH; every block a replicate) — what T1 and T2 judge; or,
       for random position increments, fresh draws of their distribution on the first ``fresh_blocks`` blocks at
       lengths up to ``fresh_max_multiple`` × L: a calibration of the instrument, whose answer |φ|^Δ is known.
    2. **far keys** per head beyond W_h = max(``far_window`` (default L/4), the head's own window): the window
       fitted at ``window_multiple`` × L (the nearest length diagnosed), the predicted one for random position
       increments, none for NoPE, RoPE and ALiBi. At every length: far attention mass (per block too), the score
       gap's pieces and the value far norms; from L's statistics alone, the far mass the lower bound predicts at
       every power-of-two multiple up to the longest length (:func:`~accrot.diagnostics.far_mass.predicted_far_mass`).

    Layout: ``{"schema", "train_length", "lengths", "blocks" {length: N}, "eps", "far_window" (the base),
    "n_queries", "scheme" (describe() of layer 0), "prediction" (:func:`prediction_basis`), "layers": [{"layer",
    "coherence": [{"length", "instrument" ("own transport" | "fresh draws"), "distances", "curve" [H][n],
    "stderr" [H][n], "replicates", "fresh_draws", "fit_range", "window" [H] (null when censored),
    "window_se" [H] (jackknife), "window_censored" [H], "window_method" [H] ("fit" | "envelope"),
    "window_first_crossing" [H], "window_sustained" [H], "predicted" [H][n] | null; from the reference length on,
    also "common_range" [1, 7/8 of the reference], "window_common", "window_common_se", "window_common_censored" [H]:
    the window fitted over that one range at every such length}], "predicted": {"distances", "curve", "window",
    "window_sustained"} | null,
    "far_window" [H], "far_window_source" [H], "far": [{"length", "mass" [H], "mass_blocks" [N][H], "near_score",
    "far_score", "far_spread", "gap", "concentration", "concentration_ratio", "near_top", "far_max", "top_gap",
    "far_max_predicted" [H] each}], "far_prediction":
    {"from_length", "e_far" [H], "log_gate" [H], "multiples", "lengths", "mass" [[H] per length]} | null,
    "value_far_norm": [{"length", "rotated", "unrotated", "incoherent"}], "regularity": the transport's own
    regularity per head on the longest length's blocks (:func:`~accrot.diagnostics.regularity.regularity`), for an
    accumulated transport only}]}``.
    """
    if not blocks_by_length:
        raise ValueError("blocks_by_length is empty; give at least one length")
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps={eps!r} must lie in (0, 1)")
    lengths = sorted(int(n) for n in blocks_by_length)
    base = max(1, train_length // 4) if far_window is None else int(far_window)
    schemes = backbone(model).schemes()
    layers = [{"layer": i, "coherence": [], "far": [], "value_far_norm": []} for i in range(len(schemes))]
    grid = list(range(lengths[-1]))  # the prediction on every Δ the longest block holds
    predictions = [predicted_coherence(scheme, grid) for scheme in schemes]  # [H, len(grid)] or None each
    fresh = any(fresh_draws_apply(s) for s in schemes)
    reference = _reference_length(lengths, window_multiple * train_length)
    own = not fresh and any(facts(s.cfg).accumulates for s in schemes)  # windows read off pass 1
    windows = None if own else _far_windows(schemes, layers, predictions, grid, eps, base, reference, train_length)
    at_l, near_l = None, min(lengths, key=lambda n: abs(n - train_length))
    # the reference length first: the far keys of a model's own transport begin at the windows fitted there
    for length in sorted(lengths, key=lambda n: n != reference):
        tokens = blocks_by_length[length][:, :length]
        dist, top = default_distances(length), max(1, 7 * length // 8)
        # T2 compares the windows at two lengths: at every length from the reference on, also fitted over the one
        # range they all share (1 ≤ Δ ≤ 7/8 of the reference), so a longer range cannot lengthen the window
        common = max(1, 7 * reference // 8) if length >= reference else None
        coherent = length <= fresh_max_multiple * train_length if fresh else True
        if fresh or windows is None:  # the coherence on its own: a calibration's few blocks, or the windows first
            if coherent:
                sums = layer_sums(model, tokens[:fresh_blocks] if fresh else tokens, dist, None, n_queries,
                                  max_queries, max_batch_tokens, draws)
                _add_coherence(layers, sums, dist, eps, top, length, schemes, draws, predictions, common)
            if windows is None:
                windows = _far_windows(schemes, layers, predictions, grid, eps, base, reference, train_length)
            sums = layer_sums(model, tokens, None, windows, n_queries, max_queries, max_batch_tokens, draws)
        else:  # one walk over the layers for both
            sums = layer_sums(model, tokens, dist, windows, n_queries, max_queries, max_batch_tokens, draws)
            _add_coherence(layers, sums, dist, eps, top, length, schemes, draws, predictions, common)
        _add_far(layers, sums, length)
        if length == near_l:
            at_l = (length, sums)
    _add_regularity(model, layers, schemes, blocks_by_length, lengths[-1], eps)
    for layer in layers:
        layer["coherence"].sort(key=lambda c: c["length"])
        layer["far"].sort(key=lambda f: f["length"])
        layer["value_far_norm"].sort(key=lambda f: f["length"])
    multiples = sorted({2.0**e for e in range(0, int(math.log2(lengths[-1] / train_length)) + 1)}
                       | {n / train_length for n in lengths})
    for i in range(len(schemes)):
        layers[i]["far_prediction"] = None if at_l is None else _far_prediction(
            at_l[1][i], windows[i], at_l[0], train_length, multiples, n_queries)
        pred = predictions[i]
        shown = default_distances(lengths[-1])
        layers[i]["predicted"] = None if pred is None else {
            "distances": shown,
            "curve": pred[:, shown],
            "window": mixing_window_measured(pred, grid, eps),
            "window_sustained": mixing_window_measured(pred, grid, eps, sustained=True),
        }
    return finite_or_none({
        "schema": SCHEMA,
        "train_length": int(train_length),
        "lengths": lengths,
        "blocks": {str(n): int(blocks_by_length[n].shape[0]) for n in lengths},
        "eps": eps,
        "far_window": base,
        "n_queries": n_queries,
        "scheme": schemes[0].describe(),
        "prediction": prediction_basis(schemes[0]),
        "layers": layers,
    })


def _add_regularity(model, layers, schemes, blocks_by_length, longest: int, eps: float) -> None:
    """T1's prediction: each accumulated transport's own regularity per head, on the longest length's blocks."""
    if not any(facts(s.cfg).accumulates for s in schemes):
        return
    with torch.no_grad():
        for i, li in enumerate(layer_inputs(model, blocks_by_length[longest][:REGULARITY_BLOCKS, :longest])):
            layers[i]["regularity"] = regularity(li.scheme, li.x, li.tokens, default_distances(longest), eps,
                                                    li.q, li.k)


REGULARITY_BLOCKS = 8  # blocks of the longest length the regularity is read on: its resultants' sampling error


def _add_coherence(layers, sums, dist, eps, top, length, schemes, draws, predictions, common=None) -> None:
    for i, acc in sums.items():
        if "num" in acc:
            entry = _coherence_entry(acc, dist, eps, top, length, schemes[i], draws, predictions[i])
            if common is not None:
                fit = replicate_window(acc, dist, eps, common)
                entry.update(common_range=[1, common], window_common=fit["window"], window_common_se=fit["window_se"],
                             window_common_censored=fit["censored"].tolist())
            layers[i]["coherence"].append(entry)


def _add_far(layers, sums, length) -> None:
    for i, acc in sums.items():
        stats = far_means(acc)
        layers[i]["far"].append({"length": length, "mass": stats["far_mass"], "mass_blocks": stats["far_mass_blocks"],
                                 **{k: stats[k] for k in GAP_STATS}})
        if "rotated" in stats:
            layers[i]["value_far_norm"].append({"length": length, **{k: stats[k] for k in
                                                                      ("rotated", "unrotated", "incoherent")}})


def _far_windows(schemes, layers, predictions, grid, eps, base, reference, train_length) -> dict[int, torch.Tensor]:
    """Every layer's far windows (:func:`far_windows`), recorded in its entry; ``{layer: [H]}``."""
    out = {}
    for i, scheme in enumerate(schemes):
        window, source = far_windows(scheme, layers[i], predictions[i], grid, eps, base, reference, train_length)
        layers[i].update(far_window=window, far_window_source=source)
        out[i] = torch.tensor(window)
    return out


GAP_STATS = ("near_score", "far_score", "far_spread", "gap", "concentration", "concentration_ratio", "near_top",
             "far_max", "top_gap", "far_max_predicted")


def _coherence_entry(acc, dist, eps, top, length, scheme, draws, prediction) -> dict:
    curve, stderr = sums_curve(acc), sums_stderr(acc)  # [H, n] each
    fit = replicate_window(acc, dist, eps, top)
    drawn = fresh_draws_apply(scheme) and draws > 0
    return {
        "length": length,
        "instrument": "fresh draws" if drawn else "own transport",
        "distances": dist,
        "curve": curve,
        "stderr": stderr,
        "replicates": int(acc["num"].shape[0]),
        "fresh_draws": draws if drawn else 0,
        "fit_range": [1, top],
        "window": fit["window"],
        "window_se": fit["window_se"],
        "window_censored": fit["censored"].tolist(),
        "window_method": ["envelope" if m else "fit" for m in fit["method"].tolist()],
        "window_first_crossing": mixing_window_measured(curve, dist, eps),
        "window_sustained": mixing_window_measured(curve, dist, eps, sustained=True),
        # the prediction at the measured distances (the calibration compares them point by point)
        "predicted": None if prediction is None else prediction[:, dist],
    }


def _reference_length(lengths: Sequence[int], target: float) -> int:
    """The diagnosed length nearest ``target`` (on a log scale): where the far windows are read."""
    return min(lengths, key=lambda n: (abs(math.log(n / target)), -n))


def far_windows(scheme: nn.Module, layer: Mapping, prediction, grid: Sequence[int], eps: float, base: int,
                reference: int, train_length: int) -> tuple[list[int], list[str]]:
    """Per head, where the far keys begin: W_h = max(``base``, the head's own window), at most 7/8 of L, and why.

    Random position increments: the window their distribution predicts (every head alike). The model's own
    transport (learned or token increments, PaTH): the window fitted at the ``reference`` length, rounded up;
    a censored one (the curve never placed under ε) leaves ``base``. NoPE, RoPE and a bias alone: ``base``."""
    H = scheme.rotation.n_heads
    if fresh_draws_apply(scheme) and prediction is not None:
        w = float(mixing_window_measured(prediction[0], grid, eps, sustained=True))
        own = [w] * H
        why = f"predicted {w:.0f}" if math.isfinite(w) else "predicted: none"
        sources = [why] * H
    elif facts(scheme.cfg).accumulates:
        entry = next((c for c in layer["coherence"] if c["length"] == reference), None)
        own, sources = [], []
        for h in range(H):
            w = math.nan if entry is None else float(entry["window"][h])
            own.append(w)
            sources.append(f"fitted at {reference}" if math.isfinite(w) else f"censored at {reference}")
    else:
        own, sources = [math.nan] * H, ["none"] * H
    windows = [max(base, math.ceil(w)) if math.isfinite(w) else base for w in own]
    # at most 7/8 of L: the lower bound is predicted from L's far keys, so every head keeps some there (a head
    # whose window runs past that then has far keys inside it: its far logits are not yet incoherent)
    cap = max(base, 7 * train_length // 8)
    sources = [f"{s}; W = {min(w, cap)}" + (" (capped at 7L/8)" if w > cap else "") for s, w in zip(sources, windows)]
    return [min(w, cap) for w in windows], sources


def _far_prediction(acc: Mapping[str, torch.Tensor], window: torch.Tensor, length: int, train_length: int,
                    multiples: Sequence[float], n_queries: int) -> dict:
    """The lower bound's far mass at every multiple, from the far sums at L (:func:`predicted_far_mass`)."""
    e_far = ratio(acc["far_exp"], acc["far_count"])  # [H] NaN where L had no far pairs
    if "decay_sum" in acc:
        log_gate = ratio(acc["decay_sum"], acc["decay_count"]).clamp_min(1e-300).log()
    else:
        log_gate = torch.zeros_like(e_far)
    lengths = [int(round(m * train_length)) for m in multiples]
    mass = [predicted_far_mass(acc["z_near"], acc["e_far_q"], log_gate, window, n, n_queries) for n in lengths]
    return {"from_length": length, "e_far": e_far, "log_gate": log_gate, "multiples": list(multiples),
            "lengths": lengths, "mass": mass}


def or_nan(x) -> float:
    return math.nan if x is None else float(x)


def summary(result: Mapping) -> list[dict]:
    """Per layer (means over heads, inf for a window that never fell below ε): ``window@{length}``,
    ``predicted_window``, ``far_mass@{length}``, ``predicted_far_mass@{length}``; the table and logged scalars."""
    rows = []
    for layer in result["layers"]:
        row: dict = {"layer": layer["layer"]}
        for c in layer["coherence"]:
            row[f"window@{c['length']}"] = _mean_window(c["window"])
        pred = layer.get("predicted")
        row["predicted_window"] = _mean_window(pred["window"]) if pred else math.nan
        for f in layer["far"]:
            row[f"far_mass@{f['length']}"] = sum(map(or_nan, f["mass"])) / max(1, len(f["mass"]))
        prediction = layer.get("far_prediction") or {}
        for n, mass in zip(prediction.get("lengths", []), prediction.get("mass", [])):
            row[f"predicted_far_mass@{n}"] = sum(map(or_nan, mass)) / max(1, len(mass))
        rows.append(row)
    return rows


def _mean_window(windows: Sequence) -> float:
    values = [math.inf if w is None else float(w) for w in windows]
    return sum(values) / len(values) if values else math.nan

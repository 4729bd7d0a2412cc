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
    replicate_window,
    sums_curve,
    sums_stderr,
)
from accrot.diagnostics.inputs import SCHEMA, backbone, default_distances
from accrot.diagnostics.layers import far_means, layer_sums


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
    schemes = backbone(model).schemes()
    layers = [{"layer": i, "coherence": [], "far_mass": [], "value_far_norm": []} for i in range(len(schemes))]
    grid = list(range(lengths[-1]))  # the prediction on every Δ the longest block holds
    predictions = [predicted_coherence(scheme, grid) for scheme in schemes]  # [H, len(grid)] or None each

    for length in lengths:
        tokens = blocks_by_length[length][:, :length]
        dist = default_distances(length) if length in coherence_lengths else None
        sums = layer_sums(model, tokens, dist, window, n_queries, max_queries, max_batch_tokens, draws)
        for i, acc in sums.items():
            if dist is not None:
                curve, stderr = sums_curve(acc), sums_stderr(acc)  # [H, n] each
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
            stats = far_means(acc)
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
    return finite_or_none({
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


def or_nan(x) -> float:
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
            row[f"far_mass@{f['length']}"] = sum(map(or_nan, f["mass"])) / max(1, len(f["mass"]))
        rows.append(row)
    return rows


def _mean_window(windows: Sequence) -> float:
    values = [math.inf if w is None else float(w) for w in windows]
    return sum(values) / len(values) if values else math.nan

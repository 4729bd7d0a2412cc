"""``accrot ablation --tune_lr``: each variant's learning rate from a 3-point grid, before its seeds train.

One learning rate for every variant lets a verdict be a learning rate's: a scheme with more parameters, or one whose
own parameters want smaller steps, is compared at another's optimum. With ``--tune_lr`` the ablation first runs a
grid of its own, the sweep ``<study>-lr`` (spec ``<study>-lr.yaml`` beside the ablation's, one Optuna study per data
set, ``<study>-lr/corpus``, ..., in the ablation's storage): every variant × data set at lr/3, lr and 3·lr of the
size (:func:`lr_grid`), one seed (:data:`TUNE_SEED`), the ablation's recipe and budget, evaluated at 1× L only and
without the theory diagnostics. Each (data set, variant) then trains its seeds at the grid point with the lowest
NLL at 1× L on the validation stream (``nll@1x`` of the run's final evaluation, :func:`choose`); a run that
diverged never wins; with no complete point the size's lr stays. The chosen rates are the ablation spec's
per-variant ``model.lr`` (so every run's config and run record hold its own), and REPORT.md's "Learning rates"
section shows the grid (:func:`lr_table`).

Why a sweep of its own rather than a first phase of the ablation's studies: the seeds' learning rates are known
only once the grid is done, while an ablation study queues its whole grid of variants × seeds when it is created
(that queue is what it resumes from), and the grid's runs at the losing rates would sit among the runs the report
and the dashboard compare. Why a seed of its own: reusing the winning grid run as seed 0 would keep the one run
that was selected for being low, pulling that variant's mean down by the noise it won by (a winner's curse of a
different size for every variant). The grid is one seed: two rates closer than the seeds' spread are picked
between by noise, which the report says.

Resumable like the ablation: complete grid runs stay (the storage knows them), and a grid that is complete is
not started again (:func:`pending`).
"""

from __future__ import annotations

import copy
import math
from typing import Any

from accrot.metrics import metric_key

GRID_FACTORS = (1 / 3, 1.0, 3.0)  # half a decade either side: the usual spacing of a coarse lr sweep
TUNE_SEED = 1000  # no ablation's seed list reaches it: the grid's runs are independent of every reported run
CRITERION = metric_key("nll", 1)  # nll@1x: the final evaluation at the training length, validation stream


def lr_grid(lr: float) -> list[float]:
    """``[lr/3, lr, 3·lr]`` to 3 significant digits (3e-3 → 0.001, 0.003, 0.009)."""
    return [float(f"{lr * f:.3g}") for f in GRID_FACTORS]


def tuning_name(study: str) -> str:
    return f"{study}-lr"


def tuning_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """The grid's sweep spec from the ablation's (:func:`accrot.study.ablation.build_spec`, one learning rate): the
    same strata and recipe, ``model.lr`` searched over :func:`lr_grid` of the ablation's rate, seed
    :data:`TUNE_SEED`, evaluated at 1× L only, and no diagnostics callback (a run of the grid is read for its NLL
    at 1× and nothing else)."""
    (lr,) = doc["space"]["model.lr"]
    out = copy.deepcopy(doc)
    out["name"] = tuning_name(doc["name"])
    out["description"] = ("accrot ablation --tune_lr: a learning-rate grid per variant and data set (one seed), "
                          f"before the seeds of {doc['name']}")
    out["overrides"]["extrapolation.multipliers"] = [1]
    out["space"] = {"model.lr": lr_grid(lr)}
    out["seeds"] = [TUNE_SEED]
    out["objectives"] = [{"metric": CRITERION, "direction": "minimize"}]
    for over in out["variants"].values():
        callbacks = over.get("trainer.callbacks")
        if callbacks:
            over["trainer.callbacks"] = [c for c in callbacks if not c["class_path"].endswith("DiagnosticsCallback")]
    return out


def with_lrs(doc: dict[str, Any], lrs: dict[str, float]) -> dict[str, Any]:
    """The ablation's spec with each stratum (``<data>.<variant>``) at its own ``model.lr``; nothing searched."""
    out = copy.deepcopy(doc)
    out["space"] = {}
    for label, over in out["variants"].items():
        over["model.lr"] = lrs[label]
    return out


def without_lrs(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its learning rates left out (the space and every stratum's ``model.lr``): what an ablation's
    options fix before its grid has chosen them."""
    out = copy.deepcopy(doc)
    out.pop("space", None)
    for over in out.get("variants", {}).values():
        over.pop("model.lr", None)
    return out


def tuned(doc: dict[str, Any]) -> bool:
    """Whether an ablation spec trains each variant at its own (tuned) learning rate."""
    return not doc.get("space") and any("model.lr" in o for o in doc.get("variants", {}).values())


# ---------------------------------------------------------------------------------------------------
# reading the grid
# ---------------------------------------------------------------------------------------------------
def grid_results(spec, ref) -> dict[str, dict[float, float | None]]:
    """``{"<data>.<variant>": {lr: nll@1x, or None for a run that failed}}`` over the finished runs of the grid."""
    import optuna
    from optuna.trial import TrialState

    from accrot.sweep.storage import open_storage

    storage = open_storage(ref)
    out: dict[str, dict[float, float | None]] = {s.variant: {} for s in spec.strata()}
    for name in spec.studies():
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            continue
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            label, lr = t.user_attrs.get("variant"), t.params.get("model.lr")
            if label not in out or lr is None:
                continue
            value = (t.user_attrs.get("metrics") or {}).get(CRITERION) if t.state == TrialState.COMPLETE else None
            if value is not None and math.isfinite(value):
                out[label][float(lr)] = float(value)
            else:
                out[label].setdefault(float(lr), None)  # a failed attempt; a complete retry replaces it
    return out


def pending(spec, ref) -> bool:
    """Whether the grid has runs left to do (a study not created yet, a run queued or running, a point missing)."""
    import optuna

    from accrot.errors import UsageError
    from accrot.sweep.recovery import budget_state
    from accrot.sweep.storage import open_storage

    if ref.path is not None and not ref.path.is_file():
        return True  # a file storage not made yet: the sweep creates it
    try:
        storage = open_storage(ref)
    except UsageError:
        return True  # the sweep says why, in its own words
    for name in spec.studies():
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            return True
        counted, waiting, running = budget_state(study)
        if waiting or running or counted < spec.budget_of(name):
            return True
    return False


def choose(results: dict[float, float | None], center: float) -> tuple[float, str]:
    """The grid point of lowest NLL and what to say about it: ``"edge"`` when it is the grid's smallest or largest
    point (the optimum may lie beyond it), ``"none complete"`` when no run of the grid completed (``center`` stays)."""
    done = {lr: v for lr, v in results.items() if v is not None}
    if not done:
        return center, "none complete"
    best = min(done, key=lambda lr: (done[lr], abs(math.log(lr / center))))  # a tie goes to the nearer the centre
    edge = len(results) > 1 and best in (min(results), max(results))
    return best, "edge" if edge else ""


def chosen(spec, ref) -> dict[str, float]:
    """Each stratum's learning rate (``<data>.<variant>`` → lr) from the finished grid."""
    center = _center(spec)
    return {label: choose(results, center)[0] for label, results in grid_results(spec, ref).items()}


def lr_table(spec, ref) -> dict[str, Any]:
    """What REPORT.md's learning-rate section shows: the grid, its seed and criterion, and per stratum the NLL at
    every point, the chosen rate and its note (JSON-able: the report's ``meta["lr"]``)."""
    center, cells = _center(spec), {}
    for label, results in grid_results(spec, ref).items():
        lr, note = choose(results, center)
        cells[label] = {"lr": lr, "note": note, "nll": {f"{k:g}": v for k, v in sorted(results.items())}}
    return {"grid": list(spec.space["model.lr"].choices), "seed": spec.seeds[0], "criterion": CRITERION,
            "cells": cells}


def _center(spec) -> float:
    grid = list(spec.space["model.lr"].choices)
    return float(grid[len(grid) // 2])


def headline(doc: dict[str, Any]) -> str:
    """``18 runs = 3 variants × 2 data sets × 3 learning rates (0.001, 0.003, 0.009), seed 1000, evaluated at 1× L:
    the learning-rate grid, before the seeds``."""
    strata = doc["variants"]
    variants = len(dict.fromkeys(k.split(".", 1)[1] for k in strata))
    datasets = len(dict.fromkeys(k.split(".", 1)[0] for k in strata))
    grid = doc["space"]["model.lr"]
    return (f"{len(strata) * len(grid)} runs = {variants} variant{'s' * (variants != 1)} × {datasets} data "
            f"set{'s' * (datasets != 1)} × {len(grid)} learning rates ({', '.join(f'{g:g}' for g in grid)}), seed "
            f"{doc['seeds'][0]}, evaluated at 1× L: the learning-rate grid, before the seeds")


def summary(table: dict[str, Any]) -> list[str]:
    """One line per data set: each variant's chosen rate (``PaTH 0.001 (edge)``)."""
    by_data: dict[str, list[str]] = {}
    for label, cell in table["cells"].items():
        data, _, variant = label.partition(".")
        note = f" ({cell['note']})" if cell["note"] else ""
        by_data.setdefault(data, []).append(f"{variant} {cell['lr']:g}{note}")
    return [f"learning rates on {data} (lowest {table['criterion']} of the grid): {', '.join(parts)}"
            for data, parts in by_data.items()]

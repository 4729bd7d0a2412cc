"""``accrot bench schemes``: every built scheme cell's training step and evaluation, as ratios to NoPE measured in
one process, interleaved round by round, against the targets of each cell."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from accrot.bench.grid import (
    FAR_MASS_MEMORY_LIMIT,
    FAR_MASS_TIME_LIMIT,
    LEARNED_LIMIT,
    LEARNED_VALUES_LIMIT,
    OP_FAR_MASS_LIMIT,
    PATH_EVAL_LIMIT,
    PATH_FORGET_LIMIT,
    PATH_FOX,
    PATH_TRAIN_LIMIT,
    ROTATION_LIMIT,
    ROTATION_VALUES_LIMIT,
    SCHEMA,
    SIZES,
    TARGET_EVAL_LENGTH,
    Cell,
    build_model,
    grid,
    interleaved_rounds,
    parse_device,
    size_shape,
    sync,
)
from accrot.bench.memory import eval_plan, measure_eval
from accrot.bench.ops import OP_EVAL_LENGTH, OP_SHAPE, op_cells, time_op_training
from accrot.bench.subnormals import run_subnormals
from accrot.ops import cpu_kernels

# -- the grid -----------------------------------------------------------------------------------------------


# -- timing -------------------------------------------------------------------------------------------------


def _train_step(model, tokens: torch.Tensor) -> float:
    """Seconds of forward + next-token loss + backward on ``tokens [B, T+1]``."""
    model.zero_grad(set_to_none=True)
    sync(tokens.device)
    t0 = time.perf_counter()
    logits = model(tokens[:, :-1])  # [B, T, vocab]
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    sync(tokens.device)
    seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)  # every model stays alive for the rounds; its gradients need not
    return seconds


PROJECTION = "floor: learned projection"  # a pseudo-variant of the training rounds (see :func:`_projection_step`)


def _projection_step(model, x: torch.Tensor) -> float:
    """Seconds of every layer's learned-increment projection u = proj(x) alone, forward and backward (to x and to
    the weights), at the model's own shapes: the one piece of work learned increments add to RoPE's that no
    kernel can remove (the projection d_model → H·D/2 per token, through its bottleneck and short convolution),
    timed like a variant between two NoPE steps."""
    from accrot.position.accum import LearnedIncrements

    sources = [m for m in model.modules() if isinstance(m, LearnedIncrements)]
    sync(x.device)
    t0 = time.perf_counter()
    for source in sources:
        u = source.pre_activation(x)  # [B, H, T, D/2]
        u.backward(torch.ones_like(u))
    sync(x.device)
    seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    x.grad = None
    return seconds


def time_training(cells: Sequence[Cell], size: str, T: int, batch: int, repeats: int, device: torch.device,
                  seed: int, log) -> dict[str, dict[str, Any]]:
    """Training-step ms per variant (see :func:`interleaved_rounds`), after one untimed step of each; with a
    learned-increment cell, also :data:`PROJECTION`, its projection's share of the step."""
    shape = size_shape(size)
    models = {c.name: build_model(c, shape, seed, device).train() for c in cells}
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, shape["vocab_size"], (batch, T + 1), generator=g).to(device)  # [B, T+1]
    learned = next((models[c.name] for c in cells if c.facts.learned and c.facts.commutes), None)
    x = torch.randn(batch, T, shape["d_model"], generator=g).to(device).requires_grad_()  # [B, T, d_model]
    names = list(models) + ([PROJECTION] if learned is not None else [])

    def measure(name: str) -> dict[str, float]:
        seconds = _projection_step(learned, x) if name == PROJECTION else _train_step(models[name], tokens)
        return {"ms": seconds * 1e3}

    log(f"train {size}: d_model {shape['d_model']}, {shape['n_layers']} layers, {shape['n_heads']} heads, "
        f"B {batch}, T {T}: warm-up + {repeats} round(s) × {len(names)} variants, NoPE between each")
    for name in names:  # warm-up: allocator, thread pools, lazy caches
        measure(name)
    res = interleaved_rounds(names, cells[0].name, repeats, seed, measure)
    return {name: r["ms"] for name, r in res.items()}


def learned_floor(cell: Cell, train: dict[str, dict[str, Any]]) -> dict[str, float] | None:
    """A learned-increment cell's measured floor in one size's rounds: RoPE's ratio (the same rotation of q, k and,
    with values, v and the output, from fixed tables) plus the projection's share of NoPE's step. Any kernel for
    learned increments does at least both; None when either was not measured."""
    rope = train.get(Cell("rope", rotate_values=cell.rotate_values).name)
    projection = train.get(PROJECTION)
    if not (cell.facts.learned and cell.facts.commutes) or rope is None or projection is None:
        return None
    return {"ratio": rope["ratio"] + projection["ratio"], "ratio_of_min": rope["ratio_of_min"] +
            projection["ratio_of_min"], "rope": rope["ratio"], "projection": projection["ratio"]}


# -- targets ------------------------------------------------------------------------------------------------
def _check(what: str, value: float, value_of_min: float, limit: float,
           floor: dict[str, float] | None = None) -> dict[str, Any]:
    check = {"what": what, "value": value, "value_of_min": value_of_min, "limit": limit}
    if floor is not None:  # the measured floor (learned increments), and whether the limit lies below it
        check["floor"] = floor
        check["limit_below_floor"] = bool(floor["ratio"] > limit)
    return check


def targets(cell: Cell, row: dict[str, Any], rows: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The issue's targets that apply to ``cell``, each ``{what, value, limit, ok}`` (``rows``: every row by
    variant, for PaTH-FoX's ratio to PaTH)."""
    checks = _step_targets(cell, row) + _op_targets(cell, row, rows)
    for check in checks:  # judged on the median ratio; ok_of_min says whether the minima agree
        check["ok"] = bool(check["value"] <= check["limit"])
        check["ok_of_min"] = bool(check["value_of_min"] <= check["limit"])
    return checks


def _step_targets(cell: Cell, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The whole model's: training step per size, the far-mass anchors' evaluation time and memory (the targets
    were set for cells without a gate or a layer pattern; those are reported beside them)."""
    checks = []
    if not cell.plain:
        return checks
    f = cell.facts
    if cell.far_mass_free and f.rotates and f.commutes:  # an SO(2) rotation alone
        if f.learned:
            limit = LEARNED_VALUES_LIMIT if cell.rotate_values else LEARNED_LIMIT
        else:
            limit = ROTATION_VALUES_LIMIT if cell.rotate_values else ROTATION_LIMIT
        for size, res in row["train"].items():
            checks.append(_check(f"train {size}", res["ratio"], res["ratio_of_min"], limit, res.get("floor")))
    if not f.commutes and cell.far_mass_free:  # PaTH alone
        for size, res in row["train"].items():
            checks.append(_check(f"train {size}", res["ratio"], res["ratio_of_min"], PATH_TRAIN_LIMIT[size]))
    if not f.rotates and not cell.far_mass_free and row["eval"]:  # a far-mass part alone
        lengths = [int(k) for k in row["eval"]]  # the anchors are measured at every length
        T = TARGET_EVAL_LENGTH if TARGET_EVAL_LENGTH in lengths else max(lengths)
        res = row["eval"][str(T)]
        checks.append(_check(f"eval {T} time", res["ratio"], res["ratio_of_min"], FAR_MASS_TIME_LIMIT))
        checks.append(_check(f"eval {T} memory", res["mem_ratio"], res["mem_ratio"], FAR_MASS_MEMORY_LIMIT))
    return checks


def _op_targets(cell: Cell, row: dict[str, Any], rows: dict[str, dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The attention op's: the far-mass op, PaTH-FoX's op against PaTH's, PaTH's op evaluation."""
    checks = []
    op = row.get("op") or {}
    if not cell.plain:
        return checks
    if not cell.facts.rotates and not cell.far_mass_free and op.get("train"):
        checks.append(_check("op", op["train"]["ratio"], op["train"]["ratio_of_min"], OP_FAR_MASS_LIMIT))
    path = (rows or {}).get(Cell("path").name, {}).get("op", {}).get("train")
    if cell == PATH_FOX and op.get("train") and path:  # the target set for PaTH-FoX
        checks.append(_check("op / PaTH's", op["train"]["ratio"] / path["ratio"],
                             op["train"]["ratio_of_min"] / path["ratio_of_min"], PATH_FORGET_LIMIT))
    if cell in (Cell("path"), PATH_FOX) and op.get("eval"):
        checks.append(_check(f"op eval {op['eval']['T']}", op["eval"]["ratio"], op["eval"]["ratio_of_min"],
                             PATH_EVAL_LIMIT))
    return checks


# -- the schemes benchmark --------------------------------------------------------------------------------
def run_schemes(sizes: Sequence[str], T: int, eval_lengths: Sequence[int], repeats: int, eval_repeats: int,
                batch: dict[str, int], eval_all: bool = False, device: str = "cpu", seed: int = 0,
                log=print, op_T: int = OP_SHAPE["T"], op_eval_length: int = OP_EVAL_LENGTH) -> dict[str, Any]:
    """Measure every built cell; returns the JSON-ready report (``rows`` in grid order, NoPE first)."""
    from accrot.errors import UsageError

    for name, value in {"T": T, "repeats": repeats, "eval_repeats": eval_repeats, "op_T": op_T,
                        "op_eval_length": op_eval_length}.items():
        if value < 1:
            raise UsageError(f"{name}={value} is not valid; it must be a positive integer")
    if any(ln < 1 for ln in eval_lengths):
        raise UsageError(f"eval_lengths={list(eval_lengths)} is not valid; lengths must be positive")
    bad = [k for k, v in batch.items() if k not in SIZES or not isinstance(v, int) or v < 1]
    if bad:
        raise UsageError(f"batch has a bad entry {bad[0]!r}; give sizes {', '.join(SIZES)} positive integers")
    dev = parse_device(device)
    started = time.perf_counter()
    cells = grid()
    train = {size: time_training(cells, size, T, batch[size], repeats, dev, seed, log) for size in sizes}
    plan = eval_plan(cells, list(eval_lengths), eval_all)
    evals = measure_eval(plan, eval_repeats, dev, seed, log)
    op_shape = {**OP_SHAPE, "T": op_T}
    # the op is ~20x cheaper than a small step and its ratios are read to 0.05: twice the rounds, for ~15 s more
    op_repeats = 2 * repeats
    op_train = time_op_training(cells, op_shape, op_repeats, dev, seed, log)
    # the far-mass ops with IEEE subnormals beside a flushing process: fresh interpreters, CPU only (GPUs compute on
    # subnormals at full speed); half the op's rounds, as each side measures only its ~7 cells
    subnormals = run_subnormals(cells, op_shape, max(1, repeats), seed, log) if dev.type == "cpu" else None
    op_eval_cells = op_cells(cells)
    op_eval = measure_eval({op_eval_length: op_eval_cells}, eval_repeats, dev, seed, log, target="op",
                           shape=op_shape)[op_eval_length]
    rows = []
    for cell in cells:
        row: dict[str, Any] = {
            "variant": cell.name, "rotation": cell.rotation, "far_mass": cell.far_mass,
            "rotate_values": cell.rotate_values, "increments": cell.increments,
            "train": {size: {"batch": batch[size], "T": T, "ms": res[cell.name]["median"],
                             "ratio": res[cell.name]["ratio"], "ratio_of_min": res[cell.name]["ratio_of_min"],
                             "ms_samples": res[cell.name]["samples"],
                             "ratio_samples": res[cell.name]["ratio_samples"]} for size, res in train.items()},
            "eval": {str(ln): res[cell.name] for ln, res in evals.items() if cell.name in res},
            "op": {"train": {"ms": op_train[cell.name]["median"], "ratio": op_train[cell.name]["ratio"],
                             "ratio_of_min": op_train[cell.name]["ratio_of_min"],
                             "ms_samples": op_train[cell.name]["samples"],
                             "ratio_samples": op_train[cell.name]["ratio_samples"]},
                   "eval": {"T": op_eval_length, **op_eval[cell.name]} if cell.name in op_eval else None},
        }
        for size, res in row["train"].items():
            floor = learned_floor(cell, train[size])
            if floor is not None:
                res["floor"] = floor
        rows.append(row)
    by_name = {row["variant"]: row for row in rows}
    for cell, row in zip(cells, rows):
        row["targets"] = targets(cell, row, by_name)
        row["ok"] = all(c["ok"] for c in row["targets"]) if row["targets"] else None
    return {
        "schema": SCHEMA, "bench": "schemes", "device": str(dev), "torch": torch.__version__,
        "python": platform.python_version(), "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "rotation_kernels": cpu_kernels.describe(dev),  # compiled CPU kernels or eager torch ops
        "settings": {"sizes": {s: {**size_shape(s), "batch": batch[s]} for s in sizes}, "T": T,
                     "eval_lengths": list(eval_lengths), "eval_model": "tiny", "eval_batch": 1, "repeats": repeats,
                     "eval_repeats": eval_repeats, "eval_all": eval_all, "seed": seed,
                     "op": {**op_shape, "eval_length": op_eval_length, "eval_batch": 1, "repeats": op_repeats,
                            "eval_cells": [c.name for c in op_eval_cells]},
                     "eval_skipped": {str(ln): [c.name for c in cells if c not in plan[ln]] for ln in plan},
                     "memory_method": "cuda max_memory_allocated" if dev.type == "cuda"
                     else "forked child: ru_maxrss after − /proc/self/statm RSS before"},
        "rows": rows, "subnormals": subnormals, "wall_s": time.perf_counter() - started,
    }


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}×"


def _mark(row: dict[str, Any]) -> str:
    """✓/✗ on the median ratios; where the ratio of minima disagrees, what it says in brackets."""
    if not row["targets"]:
        return "–"
    failed = [f"{c['what']} {c['value']:.3f}>{c['limit']:.2f}" + _floor_note(c) for c in row["targets"]
              if not c["ok"]]
    mark = "✓" if not failed else "✗ " + "; ".join(failed)
    differ = [c for c in row["targets"] if c["ok"] != c["ok_of_min"]]
    if differ:
        mark += " [×min: " + "; ".join(f"{c['what']} {c['value_of_min']:.3f} {'✓' if c['ok_of_min'] else '✗'}"
                                       for c in differ) + "]"
    return mark


def _floor_note(check: dict[str, Any]) -> str:
    """A failed check's measured floor, where it has one: ``(floor 1.058 = RoPE 1.038 + proj 0.020)``."""
    floor = check.get("floor")
    if floor is None:
        return ""
    return f" (floor {floor['ratio']:.3f} = RoPE {floor['rope']:.3f} + proj {floor['projection']:.3f})"


def schemes_table(doc: dict[str, Any]):
    from rich.table import Table

    sizes = list(doc["settings"]["sizes"])
    lengths = doc["settings"]["eval_lengths"]
    nope = doc["rows"][0]
    absolute = [f"{s} train {nope['train'][s]['ms']:.0f} ms" for s in sizes]
    absolute += [f"eval {ln} {nope['eval'][str(ln)]['ms']:.0f} ms / {nope['eval'][str(ln)]['peak_mib']:.0f} MiB"
                 for ln in lengths]
    kernels = f", rotation kernels: {doc['rotation_kernels']}" if "rotation_kernels" in doc else ""
    table = Table(title=f"position schemes vs NoPE ({doc['device']}, {doc['threads']} threads, T = "
                        f"{doc['settings']['T']}; eval: tiny, batch 1{kernels})",
                  caption="NoPE: " + ", ".join(absolute) + ". ×: median of ratios to the two NoPE neighbours; ×min: "
                          "ratio of the minima; ms: median; n/m: not measured (see --eval_all). Floor (learned "
                          "increments): RoPE's × with the same values setting plus the learned projection's "
                          "forward + backward alone, as a share of NoPE's step, measured in the same rounds.")
    table.add_column("variant")
    for s in sizes:
        table.add_column(f"{s} ms", justify="right")
        table.add_column(f"{s} ×", justify="right")
        table.add_column(f"{s} ×min", justify="right")
    for ln in lengths:
        table.add_column(f"eval {ln} ×t", justify="right")
        table.add_column(f"{ln} ×mem", justify="right")
    table.add_column("target")
    for row in doc["rows"]:
        cells = [row["variant"]]
        for s in sizes:
            res = row["train"][s]
            cells += [f"{res['ms']:.0f}", _fmt_ratio(res["ratio"]), _fmt_ratio(res["ratio_of_min"])]
        for ln in lengths:
            res = row["eval"].get(str(ln))
            cells += ["n/m", "n/m"] if res is None else [_fmt_ratio(res["ratio"]), _fmt_ratio(res["mem_ratio"])]
        cells.append(_mark(row))
        table.add_row(*cells)
    return table


def ops_table(doc: dict[str, Any]):
    """The attention-op table: each cell's op forward + backward and its evaluation forward, as ratios to NoPE's."""
    from rich.table import Table

    op = doc["settings"]["op"]
    nope = doc["rows"][0]["op"]
    ev = nope["eval"]
    table = Table(title=f"attention op vs NoPE's (one layer's scheme; train: B {op['B']} × H {op['H']} × T {op['T']} "
                        f"× D {op['D']}, forward + backward; eval: batch 1, T {op['eval_length']}, no grad)",
                  caption=f"NoPE's op: train {nope['train']['ms']:.1f} ms, eval {ev['ms']:.0f} ms / "
                          f"{ev['peak_mib']:.0f} MiB. Evaluated: one cell per kernel and increment kind; the "
                          "targets are judged in the schemes table above.")
    table.add_column("variant")
    for col in ("train ms", "train ×", "train ×min", "eval ms", "eval ×t", "eval ×min", "eval MiB", "eval ×mem"):
        table.add_column(col, justify="right")
    for row in doc["rows"]:
        train, evals = row["op"]["train"], row["op"]["eval"]
        cells = [row["variant"], f"{train['ms']:.1f}", _fmt_ratio(train["ratio"]), _fmt_ratio(train["ratio_of_min"])]
        if evals is None:
            cells += ["n/m"] * 5
        else:
            cells += [f"{evals['ms']:.0f}", _fmt_ratio(evals["ratio"]), _fmt_ratio(evals["ratio_of_min"]),
                      f"{evals['peak_mib']:.0f}", _fmt_ratio(evals["mem_ratio"])]
        table.add_row(*cells)
    return table

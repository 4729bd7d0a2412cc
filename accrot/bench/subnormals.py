"""``accrot bench schemes``' subnormal table: the far-mass and PaTH cells' attention op with IEEE subnormals, which
is what a Python caller of the library gets (no process setting; the ``accrot`` command's default too), beside
the same op in a process that flushes them to zero in every thread (``ACCROT_DENORMALS=flush``).

Far keys' softmax weights under a far-mass bias, and PaTH's far keys after many contracting transports, fall
below float32's normal range; on x86 an operation on a subnormal can cost a hundred times a normal one. The ops
keep that cost out themselves (the compiled kernels flush inside their own threads, ``csrc/subnormals.h``; the
eager steps never exponentiate to a subnormal, :mod:`accrot.ops.underflow`), so each cell's ratio to NoPE should
be the same in both processes: the last column, IEEE ÷ flushed, within noise of 1. A new op that lets subnormals
through shows there as a ratio above 1, on a machine whose CPU pays for them (some do not: AMD's Zen cores
multiply subnormals at full speed, and there both columns agree whether or not the ops flush).

Each side runs in a fresh interpreter that sets its float mode before torch's first parallel region (threads
inherit the mode they are created with), with the allocator the command uses, so the float mode is the only
difference; each measures its cells against NoPE interleaved (:func:`~accrot.bench.ops.time_op_training`) and
reports the mode that held.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from accrot.bench.grid import Cell
from accrot.bench.ops import op_cells

MODES = ("keep", "flush")  # ACCROT_DENORMALS of each side: IEEE (the library's case), flushed process-wide


def subnormal_cells(cells: Sequence[Cell]) -> list[Cell]:
    """NoPE, and the cells whose weights can underflow: one per far-mass kernel (a bias on NoPE, each PaTH walk)
    and the accumulated rotation with values and a forget gate (its own rotations around the biased kernel)."""
    picked = [c for c in op_cells(cells) if c == Cell("none")]
    picked += [c for c in op_cells(cells) if c.facts.controls_far_mass or not c.facts.commutes]
    picked += [c for c in cells if c == Cell("accum", "forget", True, "learned")]
    return [c for i, c in enumerate(picked) if c not in picked[:i]]


def run_subnormals(cells: Sequence[Cell], shape: dict[str, int], repeats: int, seed: int, log=print,
                   timeout: float = 1800.0) -> dict[str, Any]:
    """Both sides, one child interpreter each; returns ``{"cells": [...], "sides": {mode: {"denormals": what held,
    "ratios": {cell: ratio to NoPE}, "ms": {cell: median ms}}}, "rows": [{variant, keep, flush, keep_over_flush}]}``.
    A side that fails raises RuntimeError with its last line (a bench cell never hides an error)."""
    chosen = subnormal_cells(cells)
    request = json.dumps({"cells": [asdict(c) for c in chosen], "shape": shape, "repeats": repeats, "seed": seed})
    sides: dict[str, Any] = {}
    for mode in MODES:
        log(f"subnormals: ACCROT_DENORMALS={mode}, {len(chosen)} cells in a fresh interpreter")
        env = {**os.environ, "ACCROT_DENORMALS": mode}
        done = subprocess.run([sys.executable, "-m", "accrot.bench.subnormals"], input=request, env=env,
                              capture_output=True, text=True, timeout=timeout)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the subnormal bench's {mode} side failed (exit {done.returncode}): {last}")
        sides[mode] = json.loads(lines[-1])
    rows = []
    for c in chosen:
        keep, flush = sides["keep"]["ratios"][c.name], sides["flush"]["ratios"][c.name]
        rows.append({"variant": c.name, "keep": keep, "flush": flush, "keep_over_flush": keep / flush})
    return {"cells": [c.name for c in chosen], "shape": shape, "repeats": repeats, "sides": sides, "rows": rows}


def _side(request: dict[str, Any]) -> dict[str, Any]:
    """One side, in this interpreter: the process settings first (before any tensor), then the op timings."""
    from accrot import runtime

    settings = runtime.configure_process()
    import torch

    from accrot.bench.ops import time_op_training

    cells = [Cell(**c) for c in request["cells"]]
    res = time_op_training(cells, request["shape"], request["repeats"], torch.device("cpu"), request["seed"],
                           log=lambda message: print(message, file=sys.stderr))
    return {**settings, "ratios": {n: r["ratio"] for n, r in res.items()},
            "ms": {n: r["median"] for n, r in res.items()}}


def subnormals_table(doc: dict[str, Any]):
    """Each cell's op ratio to NoPE with IEEE subnormals and with them flushed, and IEEE ÷ flushed."""
    from rich.table import Table

    shape, sides = doc["shape"], doc["sides"]
    table = Table(title=f"subnormals: op vs NoPE's with IEEE subnormals (the library's case) and flushed "
                        f"process-wide (B {shape['B']} × H {shape['H']} × T {shape['T']} × D {shape['D']}, "
                        "forward + backward)",
                  caption=f"held: {sides['keep']['denormals']} | {sides['flush']['denormals']}; NoPE's op "
                          f"{sides['keep']['ms'][doc['cells'][0]]:.1f} | {sides['flush']['ms'][doc['cells'][0]]:.1f}"
                          " ms. IEEE ÷ flushed near 1: the ops do not depend on the process's float mode.")
    table.add_column("variant")
    for col in ("IEEE ×", "flushed ×", "IEEE ÷ flushed"):
        table.add_column(col, justify="right")
    for row in doc["rows"]:
        table.add_row(row["variant"], f"{row['keep']:.2f}", f"{row['flush']:.2f}", f"{row['keep_over_flush']:.2f}")
    return table


if __name__ == "__main__":  # a side: one JSON request on stdin, one JSON result on the last stdout line
    print(json.dumps(_side(json.loads(sys.stdin.read()))))

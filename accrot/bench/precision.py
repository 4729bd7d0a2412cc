"""``accrot bench precision``: one training step of a preset's model in float32 (``32-true``) against bf16 autocast
(``bf16-mixed``, what Lightning's precision of that name runs), side by side in one process.

Why it exists: on the CPU, bf16 is a speed-up only where the CPU multiplies bf16 in hardware (AVX-512 BF16, AMX;
``accrot fit`` refuses it elsewhere, :func:`accrot.runtime.cpu_bf16`), and how much it gains depends on the shape
(the small preset gains more than the study's d 96). Each row is one cell at the preset's shape (RoPE, and PaTH,
whose walk runs in float32 whatever the autocast); each round measures both precisions back to back, in an order
that alternates between rounds, and the ratio is the median over rounds of float32 / bf16 (above 1: bf16 is faster).
Where the CPU has no hardware bf16 the bf16 column is left out with the reason (measuring it would cost minutes to
show what the refusal already says).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from accrot.bench.grid import BENCH_BATCH, Cell, build_model, size_shape, sync

CELLS = (Cell("rope"), Cell("path"))
PRECISIONS = ("32-true", "bf16-mixed")


def _step(model, tokens: torch.Tensor, precision: str) -> float:
    """Seconds of forward + next-token loss + backward on ``tokens [B, T+1]``, under bf16 autocast for
    ``bf16-mixed`` (the weights and gradients stay float32, as in Lightning's mixed precision)."""
    model.zero_grad(set_to_none=True)
    sync(tokens.device)
    t0 = time.perf_counter()
    with torch.autocast(tokens.device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        logits = model(tokens[:, :-1])  # [B, T, vocab]
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    sync(tokens.device)
    return time.perf_counter() - t0


def bf16_problem(device: torch.device) -> str | None:
    """Why bf16 is not measured on ``device`` (a CPU without hardware bf16), or None."""
    from accrot.runtime import cpu_bf16

    if device.type != "cpu" or cpu_bf16() is not None:
        return None
    return "not measured: this CPU has no hardware bf16 (no avx512_bf16 or amx_bf16), where accrot fit refuses it"


def run_precision(size: str = "small", T: int = 512, batch: int | None = None, repeats: int = 5,
                  device: torch.device | str = "cpu", seed: int = 0, log=print,
                  cells: Sequence[Cell] = CELLS) -> dict[str, Any]:
    """Per cell: the median ms of a float32 and of a bf16-mixed training step at ``size``'s shape, and the median
    over rounds of their ratio (float32 / bf16). ``batch`` defaults to :data:`BENCH_BATCH`'s for the size."""
    device = torch.device(device)
    shape, batch = size_shape(size), batch or BENCH_BATCH[size]
    problem = bf16_problem(device)
    precisions = PRECISIONS if problem is None else PRECISIONS[:1]
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, shape["vocab_size"], (batch, T + 1), generator=g).to(device)  # [B, T+1]
    log(f"precision {size}: d_model {shape['d_model']}, {shape['n_layers']} layers, B {batch}, T {T}: "
        f"{' vs '.join(precisions)}, warm-up + {repeats} round(s) per cell")
    rows = []
    for cell in cells:
        model = build_model(cell, shape, seed, device).train()
        for precision in precisions:  # warm-up: allocator, thread pools, oneDNN's bf16 kernels
            _step(model, tokens, precision)
        ms: dict[str, list[float]] = {p: [] for p in precisions}
        for r in range(repeats):
            for precision in precisions if r % 2 == 0 else precisions[::-1]:
                ms[precision].append(1e3 * _step(model, tokens, precision))
        row: dict[str, Any] = {"variant": cell.name, "float32 ms": statistics.median(ms["32-true"])}
        if problem is None:
            row["bf16-mixed ms"] = statistics.median(ms["bf16-mixed"])
            row["float32 / bf16"] = statistics.median(a / b for a, b in zip(ms["32-true"], ms["bf16-mixed"]))
        else:
            row["bf16-mixed ms"], row["float32 / bf16"], row["note"] = None, None, problem
        row["samples"] = ms
        rows.append(row)
        del model
    return {"bench": "precision", "size": size, "T": T, "batch": batch, "repeats": repeats, "device": str(device),
            "bf16": problem or "measured", "rows": rows}


def precision_lines(doc: dict[str, Any]) -> list[str]:
    """One line per cell: float32 vs bf16-mixed ms and their ratio (or why bf16 was not measured)."""
    lines = []
    for row in doc["rows"]:
        head = (f"precision {doc['size']} (B {doc['batch']}, T {doc['T']}) {row['variant']}: float32 "
                f"{row['float32 ms']:.0f} ms")
        if row["float32 / bf16"] is None:
            lines.append(f"{head}; bf16-mixed {row['note']}")
        else:
            lines.append(f"{head} vs bf16-mixed {row['bf16-mixed ms']:.0f} ms: float32 / bf16 = "
                         f"{row['float32 / bf16']:.2f}x")
    return lines

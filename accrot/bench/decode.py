"""``accrot bench decode``: generation speed per cell, cached decoding against recomputing the prefix.

For every cell of the grid and every prompt length (1× and 16× the training length L by default), both ways of
generating the same ``new_tokens`` greedy tokens after a random prompt are timed side by side, interleaved: each
round visits the cells in a fresh order and, per cell and length, times the cached steps (``Transformer.step``
after one ``prefill``, the prefill timed apart) and then the same number of full forwards over the growing
sequence, so a burst of load on a shared machine hits both alike. Reported per cell and length: the medians of
tokens per second of each, the prefill's seconds and the speed-up (median over rounds of recompute / cached time).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from rich.table import Table

from accrot.bench.grid import SCHEMA, Cell, build_model, grid, size_shape, sync


def _cached(model, prompt: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """(prefill seconds, seconds of ``new_tokens`` greedy steps)."""
    sync(prompt.device)
    t0 = time.perf_counter()
    logits, cache = model.prefill(prompt)
    token = logits[:, -1].argmax(-1)
    sync(prompt.device)
    t1 = time.perf_counter()
    for _ in range(new_tokens):
        token = model.step(token, cache).argmax(-1)
    sync(prompt.device)
    return t1 - t0, time.perf_counter() - t1


def _recomputed(model, prompt: torch.Tensor, new_tokens: int) -> float:
    """Seconds of ``new_tokens`` greedy tokens, each by the forward over the whole sequence so far."""
    seq = prompt
    sync(prompt.device)
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        token = model(seq)[:, -1].argmax(-1)
        seq = torch.cat((seq, token[:, None]), 1)
    sync(prompt.device)
    return time.perf_counter() - t0


@torch.no_grad()
def run_decode(cells: Sequence[Cell] | None = None, size: str = "tiny", train_length: int = 128,
               multipliers: Sequence[int] = (1, 16), new_tokens: int = 16, repeats: int = 3,
               device: torch.device | str = "cpu", seed: int = 0, log=print,
               shape: dict[str, int] | None = None) -> dict[str, Any]:
    """The decode report: ``rows`` of (cell, prompt length, tokens/s cached and recomputed, prefill s, speed-up)."""
    device = torch.device(device)
    cells = list(grid() if cells is None else cells)
    shape = shape or size_shape(size)
    models = {c.name: build_model(c, shape, seed, device).eval() for c in cells}
    g = torch.Generator().manual_seed(seed)
    lengths = [max(1, int(m * train_length)) for m in multipliers]
    prompts = {ln: torch.randint(0, shape["vocab_size"], (1, ln), generator=g).to(device) for ln in lengths}
    samples: dict[tuple[str, int], dict[str, list[float]]] = {
        (c.name, ln): {"prefill": [], "cached": [], "recomputed": []} for c in cells for ln in lengths}
    log(f"decode {size}: {len(cells)} cells, prompts of {', '.join(map(str, lengths))} tokens, {new_tokens} new "
        f"tokens, warm-up + {repeats} round(s), cached and recomputed side by side")
    for name in models:  # warm-up: allocator, lazy tables, kernels
        _cached(models[name], prompts[lengths[0]], 2)
        _recomputed(models[name], prompts[lengths[0]], 1)
    for r in range(repeats):
        order = list(models)
        random.Random(seed + r).shuffle(order)
        for name in order:
            for ln in lengths:
                s = samples[(name, ln)]
                prefill, cached = _cached(models[name], prompts[ln], new_tokens)
                s["prefill"].append(prefill)
                s["cached"].append(cached)
                s["recomputed"].append(_recomputed(models[name], prompts[ln], new_tokens))
    rows = []
    for (name, ln), s in samples.items():
        rows.append({"cell": name, "prompt": ln, "multiplier": ln / train_length, "new_tokens": new_tokens,
                     "cached_tokens_per_s": new_tokens / statistics.median(s["cached"]),
                     "recomputed_tokens_per_s": new_tokens / statistics.median(s["recomputed"]),
                     "prefill_s": statistics.median(s["prefill"]),
                     "speedup": statistics.median(b / a for a, b in zip(s["cached"], s["recomputed"])),
                     "samples": s})
    return {"schema": SCHEMA, "bench": "decode", "size": size, "train_length": train_length, "shape": shape,
            "repeats": repeats, "device": str(device), "rows": rows}


def decode_table(report: dict[str, Any]) -> Table:
    """One row per cell: per prompt length, tokens/s cached and recomputed and the speed-up."""
    lengths = sorted({r["prompt"] for r in report["rows"]})
    L = report["train_length"]
    table = Table(title=f"decoding {report['rows'][0]['new_tokens'] if report['rows'] else 0} tokens: tokens/s "
                        "cached / recomputing the prefix (speed-up)")
    table.add_column("cell")
    for ln in lengths:
        table.add_column(f"prompt {ln / L:g}×L", justify="right")
    by = {(r["cell"], r["prompt"]): r for r in report["rows"]}
    for cell in dict.fromkeys(r["cell"] for r in report["rows"]):
        table.add_row(cell, *(f"{by[(cell, ln)]['cached_tokens_per_s']:.0f} / "
                              f"{by[(cell, ln)]['recomputed_tokens_per_s']:.0f} ({by[(cell, ln)]['speedup']:.1f}×)"
                              for ln in lengths))
    return table

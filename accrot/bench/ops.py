"""The attention op alone (``accrot bench schemes``' op table): one layer's position scheme, forward + backward
at ``B 4 × H 4 × T 1024 × D 32`` and the evaluation forward (batch 1) at 16384 tokens with its peak memory.

At the tiny model's training step the MLP, the projections and the loss hide most of attention, so a scheme that
doubles attention's cost moves the whole step by a third of that; here nothing else runs. The op is the
:class:`~accrot.position.scheme.PositionScheme` of one layer called as the backbone calls it: q, k, v are views of
one ``[B, T, 3, H, D]`` projection (leaf, with a gradient), x is the layer input the scheme's own projections
read (learned increments, forget gates, PaTH's w and β), and the backward pass takes a fixed output gradient.
Times are ratios to NoPE's op (:func:`~accrot.bench.grid.interleaved_rounds`); evaluation forwards run in
forked children like the model's (:mod:`accrot.bench.memory`), so the peak is that one forward's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from accrot.bench.grid import Cell, interleaved_rounds, sync

OP_SHAPE = {"B": 4, "H": 4, "T": 1024, "D": 32}  # the training-op shape of the table
OP_EVAL_LENGTH = 16384
QUICK_OP = {"T": 256, "eval_T": 1024}


def op_cells(cells: Sequence[Cell]) -> list[Cell]:
    """The cells whose op is measured at the evaluation length: one per attention kernel and increment kind
    (NoPE, ALiBi, FoX, ssmax, the gates on NoPE, rope, accum random and learned, PaTH with each far mass); the
    others add O(T·D) rotations (or a gate) to one of these. A layer pattern's op is its first layer's."""
    return [c for c in cells if not c.facts.rotates or (c.plain and (not c.facts.commutes or (
        not c.facts.rotates_values and c.far_mass_free)))]


def build_op(cell: Cell, H: int, D: int, seed: int, device: torch.device):
    from accrot.position import build

    torch.manual_seed(seed)  # the same scheme weights for every measurement of a cell
    return build(cell.scheme(), H * D, H).to(device)


def op_inputs(B: int, H: int, T: int, D: int, seed: int, device: torch.device,
              grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``qkv [B, T, 3, H, D]``, the layer input ``x [B, T, H·D]`` and ``tokens [B, T]``, the same for every cell."""
    g = torch.Generator().manual_seed(seed + T)
    qkv = torch.randn(B, T, 3, H, D, generator=g).to(device).requires_grad_(grad)
    x = torch.randn(B, T, H * D, generator=g).to(device).requires_grad_(grad)
    tokens = torch.randint(0, 256, (B, T), generator=g).to(device)
    return qkv, x, tokens


def op_forward(scheme, qkv: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor, n: int | None = None):
    """The scheme on the first ``n`` positions (all by default), its q, k, v the projection's views."""
    n = qkv.shape[1] if n is None else n
    q, k, v = qkv[:, :n].permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, n, D] each
    return scheme(q, k, v, x[:, :n], tokens[:, :n])


def time_op_training(cells: Sequence[Cell], shape: dict[str, int], repeats: int, device: torch.device, seed: int,
                     log) -> dict[str, dict[str, Any]]:
    """Forward + backward ms of each cell's op, interleaved with NoPE's (after one untimed call of each)."""
    B, H, T, D = (shape[k] for k in ("B", "H", "T", "D"))
    schemes = {c.name: build_op(c, H, D, seed, device).train() for c in cells}
    qkv, x, tokens = op_inputs(B, H, T, D, seed, device, grad=True)
    grad = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(seed)).to(device)

    def step(name: str) -> float:
        scheme = schemes[name]
        scheme.zero_grad(set_to_none=True)
        qkv.grad = x.grad = None
        sync(device)
        t0 = time.perf_counter()
        op_forward(scheme, qkv, x, tokens).backward(grad)
        sync(device)
        return time.perf_counter() - t0

    log(f"op train: B {B} × H {H} × T {T} × D {D}, forward + backward: warm-up + {repeats} round(s) × "
        f"{len(schemes)} variants, NoPE between each")
    for name in schemes:
        step(name)
    res = interleaved_rounds(list(schemes), cells[0].name, repeats, seed, lambda name: {"ms": step(name) * 1e3})
    return {name: r["ms"] for name, r in res.items()}

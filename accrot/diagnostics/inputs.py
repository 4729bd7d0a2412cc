"""What every diagnostic reads: each layer's q, k, v and scheme (in eval mode, no autocast) and the distances
measured. PaTH's transport by the per-query recurrence (:func:`path_walk`) lives with the schemes
(:mod:`accrot.position.walk`) and is importable from here too."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from accrot.position.walk import path_walk  # noqa: F401  (re-exported: the coherence walk reads it from here)

SCHEMA = "accrot.diagnostics/2"
DENSE_DISTANCES = 256  # every Δ below this is measured; beyond, a log-spaced grid
LOG_DISTANCES = 32
ROW_BUDGET = 1 << 22  # elements of one [B, H, rows, T] probability chunk
# the far pass's per-head sums ([H] each; see far_mass.scheme_far_sums)
FAR_SUMS = ("far_mass", "rotated", "unrotated", "incoherent", "near_as", "near_a", "far_sum", "far_sq",
            "far_count", "far_exp", "far_norm_sq", "near_top", "far_top", "top_rows", "far_root_log_n")


# -- per-layer inputs -------------------------------------------------------------------------------------------
@dataclass
class LayerInputs:
    """What one attention layer sees: its scheme, q, k, v ``[B, H, T, D]`` (float32), the normalised layer
    input x ``[B, T, d_model]`` and the tokens ``[B, T]``."""

    scheme: nn.Module
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    x: torch.Tensor
    tokens: torch.Tensor


def backbone(model: nn.Module) -> nn.Module:
    if hasattr(model, "blocks") and hasattr(model, "embed"):
        return model
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "blocks"):
        return inner
    raise TypeError(f"expected an accrot Transformer (or a module with .model), got {type(model).__name__}")


class eval_mode:
    """Eval mode, no grad, autocast off; the module's previous mode is restored on exit."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.was_training = model, model.training
        self.grad = torch.no_grad()

    def __enter__(self) -> None:
        self.model.eval()
        self.grad.__enter__()
        device = next(self.model.parameters()).device.type
        self.autocast = torch.autocast(device_type=device, enabled=False)
        self.autocast.__enter__()

    def __exit__(self, *exc) -> None:
        self.autocast.__exit__(*exc)
        self.grad.__exit__(*exc)
        self.model.train(self.was_training)


def layer_inputs(model: nn.Module, tokens: torch.Tensor) -> Iterator[LayerInputs]:
    """Walk the backbone block by block on ``tokens [B, T]``, yielding each layer's :class:`LayerInputs`.

    Call inside ``torch.no_grad`` with the model in ``eval()`` (the public functions do)."""
    net = backbone(model)
    device = next(net.parameters()).device
    tokens = tokens.to(device=device, dtype=torch.long)
    h = net.embed(tokens)  # [B, T, d_model]
    last = len(net.blocks) - 1
    for i, block in enumerate(net.blocks):
        x = block.attn_norm(h)  # [B, T, d_model] the scheme sees the normalised input
        q, k, v = block.attn.project(x)  # [B, H, T, D] each
        # contiguous: the diagnostics gather query / key rows, which is slow on project()'s strided views
        q, k, v = (t.float().contiguous() for t in (q, k, v))
        yield LayerInputs(block.attn.scheme, q, k, v, x, tokens)
        if i < last:  # the last block's output feeds no layer: its attention at 64× L is the costliest op
            h = block(h, tokens)


def batches(tokens: torch.Tensor, max_batch_tokens: int) -> Iterator[torch.Tensor]:
    if tokens.dim() != 2 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be [N, T] with T >= 1, got shape {tuple(tokens.shape)}")
    per = max(1, max_batch_tokens // tokens.shape[1])
    for i in range(0, tokens.shape[0], per):
        yield tokens[i : i + per]


def default_distances(length: int, dense: int = DENSE_DISTANCES, n_log: int = LOG_DISTANCES) -> list[int]:
    """Every Δ in [0, dense), then ``n_log`` log-spaced Δ, up to ⌊7·length/8⌋: the longest distances keep at
    least an eighth of the block's queries (beyond, a handful of pairs makes the curve pure noise)."""
    top = max(1, 7 * length // 8)
    dist = set(range(min(dense, top + 1)))
    if top > dense:
        dist.update(int(round(d)) for d in torch.logspace(math.log10(dense), math.log10(top), n_log).tolist())
    return sorted(dist)


def check_distances(distances: Sequence[int], T: int) -> torch.Tensor:
    d = torch.as_tensor(list(distances), dtype=torch.long)
    if d.numel() == 0 or d.min() < 0 or d.max() >= T:
        raise ValueError(f"distances must be non-empty integers in [0, {T - 1}] for blocks of {T} tokens")
    return d


def spread_indices(lo: int, hi: int, n: int | None, device: torch.device) -> torch.Tensor:
    """At most ``n`` evenly spaced integers of [lo, hi), ascending (all of them when n is None or the range is
    small)."""
    t, valid = spread_many(torch.tensor([lo], device=device), hi, n)
    return t[0, valid[0]]


def spread_many(lo: torch.Tensor, hi: int, n: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row i: at most ``n`` evenly spaced integers of [lo_i, hi), ascending and distinct, padded to a common width
    R: ``(t [len(lo), R], valid [len(lo), R])`` (padding repeats lo_i and is marked invalid)."""
    span = hi - lo  # [n_rows]
    R = int(span.max()) if n is None else min(n, int(span.max()))
    count = span.clamp(max=R)[:, None]  # [n_rows, 1] queries in row i
    j = torch.arange(R, device=lo.device)[None, :]  # [1, R]
    valid = j < count  # [n_rows, R]
    t = lo[:, None] + torch.div(j * span[:, None], count.clamp(min=1), rounding_mode="floor")  # step ≥ 1: distinct
    return torch.where(valid, t, lo[:, None]), valid

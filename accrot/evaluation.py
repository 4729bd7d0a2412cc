"""Multi-length evaluation (DESIGN §5): the same fixed blocks for every model, NLL per length.

For each evaluation length ℓ the data module supplies ``N`` non-overlapping blocks ``[N, ℓ+1]`` cut
from the validation stream. Every block is one independent forward pass starting at position 0
(ALiBi's non-overlapping protocol), run under ``torch.no_grad`` and batched so that at most
``max_batch_tokens`` tokens are in flight: memory grows linearly with ℓ because every kernel
(SDPA, the blockwise biased kernel, chunked PaTH) is linear in memory.

Reported per length: mean NLL and perplexity over all scored tokens, the NLL of the last
``train_length`` positions of each block ("last window": what a model sees beyond its training
length), and the NLL per position bucket (the per-position curve). The sums live in a torchmetrics
``Metric`` (:class:`PositionNLL`), so a sharded evaluation reduces over ranks like any other metric.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torchmetrics import Metric

SCHEMA = "accrot.extrapolation/1"


@dataclass
class LengthResult:
    """Evaluation at one length. ``bucket_nll[i]`` covers positions ``[i·bucket_width, (i+1)·bucket_width)``."""

    length: int
    multiplier: float
    blocks: int
    tokens: int
    nll: float
    ppl: float
    last_window_nll: float
    bucket_width: int
    bucket_nll: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class PositionNLL(Metric):
    """Summed NLL overall, over the last window, and per position bucket, with token counts.

    ``update(nll [b, ℓ])``; ``compute()`` gives the three means. States reduce by sum across ranks.
    """

    full_state_update = False

    def __init__(self, length: int, window: int, bucket_width: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.window = window
        n_buckets = math.ceil(length / bucket_width)
        self.register_buffer("bucket_of", torch.arange(length) // bucket_width, persistent=False)  # [ℓ]
        for name, size in (("total", ()), ("last", ()), ("blocks", ()), ("buckets", (n_buckets,))):
            self.add_state(name, default=torch.zeros(size, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("bucket_tokens", default=torch.bincount(self.bucket_of).double(), dist_reduce_fx="sum")
        self.bucket_tokens.zero_()

    def update(self, nll: torch.Tensor) -> None:
        nll = nll.double()  # [b, ℓ]
        self.total += nll.sum()
        self.last += nll[:, -self.window :].sum()
        self.blocks += nll.shape[0]
        self.buckets.index_add_(0, self.bucket_of, nll.sum(0))
        self.bucket_tokens.index_add_(0, self.bucket_of, torch.full_like(nll[0], nll.shape[0]))

    def compute(self) -> dict[str, torch.Tensor]:
        length = self.bucket_of.numel()
        return {
            "nll": self.total / (self.blocks * length),
            "last_window_nll": self.last / (self.blocks * self.window),
            "bucket_nll": self.buckets / self.bucket_tokens,
            "blocks": self.blocks,
        }


def bucket_width_for(length: int, train_length: int, max_buckets: int = 64) -> int:
    """Buckets of a quarter training length, widened so that no curve has more than ``max_buckets`` points."""
    width = max(1, train_length // 4)
    return max(width, math.ceil(length / max_buckets))


@torch.no_grad()
def evaluate_length(
    model: Callable[[torch.Tensor], torch.Tensor],
    blocks: torch.Tensor,
    train_length: int,
    multiplier: float = 1.0,
    max_batch_tokens: int = 16384,
    device: torch.device | str | None = None,
    sync: bool = False,
) -> LengthResult:
    """Score ``blocks [N, ℓ+1]`` (inputs ``[:, :-1]``, targets ``[:, 1:]``) with ``model: [b, ℓ] → [b, ℓ, V]``."""
    if blocks.dim() != 2 or blocks.shape[1] < 2:
        raise ValueError(f"blocks must be [N, length+1] with length >= 1, got shape {tuple(blocks.shape)}")
    n, length = blocks.shape[0], blocks.shape[1] - 1
    device = torch.device(device) if device is not None else blocks.device
    width = bucket_width_for(length, train_length)
    window = min(train_length, length)
    metric = PositionNLL(length, window, width, sync_on_compute=sync).to(device)
    per_batch = max(1, max_batch_tokens // length)
    for start in range(0, n, per_batch):
        chunk = blocks[start : start + per_batch].to(device=device, dtype=torch.long)  # [b, ℓ+1]
        logits = model(chunk[:, :-1])  # [b, ℓ, V]
        nll = F.cross_entropy(logits.float().transpose(1, 2), chunk[:, 1:], reduction="none")  # [b, ℓ]
        if not torch.isfinite(nll).all():
            raise FloatingPointError(f"evaluation at length {length} produced a non-finite NLL (blocks {start}..)")
        metric.update(nll)
    out = metric.compute()
    mean, blocks_seen = float(out["nll"]), int(out["blocks"])
    return LengthResult(
        length=length,
        multiplier=multiplier,
        blocks=blocks_seen,
        tokens=blocks_seen * length,
        nll=mean,
        ppl=math.exp(mean),
        last_window_nll=float(out["last_window_nll"]),
        bucket_width=width,
        bucket_nll=out["bucket_nll"].cpu().tolist(),
    )


def evaluate_lengths(
    model: Callable[[torch.Tensor], torch.Tensor],
    blocks_by_length: dict[int, torch.Tensor],
    train_length: int,
    max_batch_tokens: int = 16384,
    device: torch.device | str | None = None,
    progress: Callable[[Iterable], Iterable] | None = None,
) -> list[LengthResult]:
    """Evaluate every length in ``blocks_by_length`` (ascending); ``progress`` may wrap the iteration."""
    lengths = sorted(blocks_by_length)
    items = progress(lengths) if progress is not None else lengths
    return [
        evaluate_length(
            model, blocks_by_length[ln], train_length, ln / train_length, max_batch_tokens=max_batch_tokens,
            device=device,
        )
        for ln in items
    ]

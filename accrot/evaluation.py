"""Multi-length evaluation: the same fixed blocks for every model, NLL per length.

For each evaluation length ℓ the data module supplies ``N`` non-overlapping blocks ``[N, ℓ+1]`` cut
from the validation stream. Every block is one independent forward pass starting at position 0
(ALiBi's non-overlapping protocol), run under ``torch.no_grad`` and batched so that at most
``max_batch_tokens`` tokens are in flight: memory grows linearly with ℓ because every kernel
(SDPA, the blockwise biased kernel, chunked PaTH) is linear in memory.

Reported per length: mean NLL and perplexity over all scored tokens, the NLL of the last
``train_length`` positions of each block ("last window": what a model sees beyond its training
length), and the NLL and top-1 accuracy per position bucket (the per-position curves; a task that scores
answers only reports its answers' accuracy by where they sit in the block). The sums live in a torchmetrics
``Metric`` (:class:`PositionNLL`), so a sharded evaluation reduces over ranks like any other metric.

A block is ℓ + 1 consecutive tokens of the stream and nothing else: no beginning- or end-of-sequence token
is added, so every bucket holds real text only and no position scores a token the
data never had (documents inside a block stay joined by the corpus's own separator). Per-token NLL is
float32 with autocast off (:func:`token_nll`), the sums float64, whatever precision the model ran in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from rich.table import Table
from torchmetrics import Metric

from accrot.io import atomic_savefig, pyplot

SCHEMA = "accrot.extrapolation/1"


@dataclass
class LengthResult:
    """Evaluation at one length. ``bucket_nll[i]`` covers positions ``[i·bucket_width, (i+1)·bucket_width)``.

    ``tokens`` counts scored tokens (every position for a corpus; only answers for a synthetic task, whose
    data module supplies ``eval_mask``). ``nll_ci`` is a 95 % bootstrap interval over blocks.
    """

    length: int
    multiplier: float
    blocks: int
    tokens: int
    nll: float
    ppl: float
    accuracy: float
    last_window_nll: float
    nll_ci: list[float]
    bucket_width: int
    block_nll: list[float] = field(default_factory=list)  # mean NLL of each block's scored tokens (replicates)
    bucket_nll: list[float | None] = field(default_factory=list)  # None: no scored token in the bucket
    bucket_accuracy: list[float | None] = field(default_factory=list)  # top-1 accuracy per bucket, likewise
    accuracy_by_depth: dict[str, float] | None = None  # passkey: depth of the key → accuracy

    def to_dict(self) -> dict:
        return asdict(self)


class PositionNLL(Metric):
    """Summed NLL (overall, last window, per position bucket, per block), top-1 hits (overall, per bucket, per
    block) and scored-token counts.

    ``update(nll [b, ℓ], hits [b, ℓ], mask [b, ℓ])``; states reduce by sum (per-block ones by concatenation)
    across ranks, so a sharded evaluation gives the single-process numbers.
    """

    full_state_update = False

    def __init__(self, length: int, window: int, bucket_width: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.window = window
        n_buckets = math.ceil(length / bucket_width)
        self.register_buffer("bucket_of", torch.arange(length) // bucket_width, persistent=False)  # [ℓ]
        for name, size in (("total", ()), ("count", ()), ("hits", ()), ("last", ()), ("last_count", ()),
                           ("buckets", (n_buckets,)), ("bucket_hits", (n_buckets,)), ("bucket_count", (n_buckets,))):
            self.add_state(name, default=torch.zeros(size, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("block_nll", default=[], dist_reduce_fx="cat")
        self.add_state("block_count", default=[], dist_reduce_fx="cat")
        self.add_state("block_index", default=[], dist_reduce_fx="cat")
        self.add_state("block_hits", default=[], dist_reduce_fx="cat")

    def update(self, nll: torch.Tensor, hits: torch.Tensor, mask: torch.Tensor, index: torch.Tensor) -> None:
        """``index [b]``: the blocks' positions in the full evaluation set (restores order after a gather)."""
        m = mask.double()  # [b, ℓ]
        nll = nll.double() * m  # [b, ℓ] zero where unscored
        self.total += nll.sum()
        self.count += m.sum()
        hits = hits.double() * m  # [b, ℓ] zero where unscored
        self.hits += hits.sum()
        self.last += nll[:, -self.window :].sum()
        self.last_count += m[:, -self.window :].sum()
        self.buckets.index_add_(0, self.bucket_of, nll.sum(0))
        self.bucket_hits.index_add_(0, self.bucket_of, hits.sum(0))
        self.bucket_count.index_add_(0, self.bucket_of, m.sum(0))
        self.block_nll.append(nll.sum(1))
        self.block_count.append(m.sum(1))
        self.block_hits.append(hits.sum(1))
        self.block_index.append(index.to(self.total.device, torch.float64))

    def compute(self) -> dict[str, torch.Tensor]:
        cat = (lambda x: torch.cat(x) if isinstance(x, list) else x)  # noqa: E731 - list before sync, tensor after
        order = cat(self.block_index).argsort()  # the single-process order, however the blocks were sharded
        return {
            "nll": self.total / self.count,
            "count": self.count,
            "accuracy": self.hits / self.count,
            "last_window_nll": self.last / self.last_count.clamp_min(1),
            # a bucket with no scored token (a synthetic task scores answers only) has no NLL: NaN, not 0
            "bucket_nll": torch.where(self.bucket_count > 0, self.buckets / self.bucket_count.clamp_min(1), math.nan),
            "bucket_accuracy": torch.where(self.bucket_count > 0, self.bucket_hits / self.bucket_count.clamp_min(1),
                                           math.nan),
            "block_nll": cat(self.block_nll)[order],
            "block_count": cat(self.block_count)[order],
            "block_hits": cat(self.block_hits)[order],
        }


def bootstrap_ci(block_nll: torch.Tensor, block_count: torch.Tensor, n: int = 1000, seed: int = 0) -> list[float]:
    """95 % percentile interval of the token-weighted mean NLL, resampling whole blocks with replacement."""
    if block_nll.numel() < 2:
        mean = float(block_nll.sum() / block_count.sum().clamp_min(1))
        return [mean, mean]
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, block_nll.numel(), (n, block_nll.numel()), generator=gen)  # [n, N]
    means = block_nll.cpu()[idx].sum(1) / block_count.cpu()[idx].sum(1).clamp_min(1)  # [n]
    lo, hi = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=means.dtype)).tolist()
    return [lo, hi]


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``-log p(target)`` per position, ``[b, ℓ, V], [b, ℓ] → [b, ℓ]`` float32 whatever the autocast dtype.

    The log-softmax runs on float32 logits with autocast off: a bf16 log-softmax rounds each token's NLL to
    about 3 significant digits, which a per-position curve would show as noise of ±0.01 nats. The sums over
    tokens are float64 (:class:`PositionNLL`'s states).
    """
    with torch.autocast(logits.device.type, enabled=False):
        return F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")


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
    mask: torch.Tensor | None = None,
    shard: tuple[int, int] = (0, 1),
    depths: list[float] | None = None,
    targets: torch.Tensor | None = None,
) -> LengthResult:
    """Score ``blocks [N, ℓ+1]`` (inputs ``[:, :-1]``, targets ``[:, 1:]``) with ``model: [b, ℓ] → [b, ℓ, V]``.

    ``mask [N, ℓ]`` (bool) restricts scoring to some target positions (a synthetic task's answers).
    ``targets [N, ℓ]`` replaces ``blocks[:, 1:]`` as what is scored (a task whose answers the model does not read).
    ``shard = (rank, world)``: this process scores blocks ``rank::world``; with ``sync`` the metric then
    reduces over the process group, so every rank returns the numbers of the whole set.
    ``depths`` (one per block, passkey retrieval) adds the accuracy per depth.
    """
    if blocks.dim() != 2 or blocks.shape[1] < 2:
        raise ValueError(f"blocks must be [N, length+1] with length >= 1, got shape {tuple(blocks.shape)}")
    n, length = blocks.shape[0], blocks.shape[1] - 1
    for name, given in (("mask", mask), ("targets", targets)):
        if given is not None and given.shape != (n, length):
            raise ValueError(f"{name} must be [N, length] = {(n, length)}, got {tuple(given.shape)}")
    device = torch.device(device) if device is not None else blocks.device
    width = bucket_width_for(length, train_length)
    window = min(train_length, length)
    metric = PositionNLL(length, window, width, sync_on_compute=sync).to(device)
    per_batch = max(1, max_batch_tokens // length)
    rank, world = shard
    mine = torch.arange(rank, n, world)  # [n / world] this rank's block indices
    for start in range(0, mine.numel(), per_batch):
        index = mine[start : start + per_batch]  # [b]
        chunk = blocks[index].to(device=device, dtype=torch.long)  # [b, ℓ+1]
        logits = model(chunk[:, :-1])  # [b, ℓ, V] in the model's dtype (bf16 under bf16-mixed)
        wanted = chunk[:, 1:] if targets is None else targets[index].to(device=device, dtype=torch.long)  # [b, ℓ]
        nll = token_nll(logits, wanted)  # [b, ℓ] float32
        scored = torch.ones_like(wanted, dtype=torch.bool) if mask is None else mask[index].to(device)  # [b, ℓ]
        if not torch.isfinite(nll[scored]).all():
            raise FloatingPointError(
                f"evaluation at length {length} produced a non-finite NLL (blocks {index.tolist()[:4]}...)"
            )
        metric.update(nll, logits.argmax(-1) == wanted, scored, index)
    out = metric.compute()
    if not float(out["count"]) > 0:
        raise ValueError(f"evaluation at length {length} scored no token; the mask selects nothing")
    mean = float(out["nll"])
    by_depth = None
    if depths is not None:
        if len(depths) != n:
            raise ValueError(f"depths has {len(depths)} entries for {n} blocks")
        by_depth = {}
        for d in sorted(set(depths)):
            sel = torch.tensor([x == d for x in depths])
            by_depth[f"{d:g}"] = float(out["block_hits"][sel].sum() / out["block_count"][sel].sum().clamp_min(1))
    return LengthResult(
        length=length,
        multiplier=multiplier,
        blocks=int(out["block_nll"].numel()),
        tokens=int(out["count"]),
        nll=mean,
        ppl=math.exp(mean),
        accuracy=float(out["accuracy"]),
        last_window_nll=float(out["last_window_nll"]),
        nll_ci=bootstrap_ci(out["block_nll"], out["block_count"]),
        bucket_width=width,
        block_nll=(out["block_nll"] / out["block_count"].clamp_min(1)).cpu().tolist(),
        bucket_nll=[None if math.isnan(v) else v for v in out["bucket_nll"].cpu().tolist()],
        bucket_accuracy=[None if math.isnan(v) else v for v in out["bucket_accuracy"].cpu().tolist()],
        accuracy_by_depth=by_depth,
    )


def evaluate_lengths(
    model: Callable[[torch.Tensor], torch.Tensor],
    blocks_by_length: dict[int, torch.Tensor],
    train_length: int,
    max_batch_tokens: int = 16384,
    device: torch.device | str | None = None,
    progress: Callable[[Iterable], Iterable] | None = None,
    masks: dict[int, torch.Tensor] | None = None,
    shard: tuple[int, int] = (0, 1),
    depths: dict[int, list[float]] | None = None,
    targets: dict[int, torch.Tensor] | None = None,
) -> list[LengthResult]:
    """Evaluate every length in ``blocks_by_length`` (ascending); ``progress`` may wrap the iteration.

    With ``shard = (rank, world)``, world > 1, each rank scores its share of every length's blocks and the
    results are reduced over the default process group (a length with fewer blocks than ranks is scored
    whole on every rank instead).
    """
    lengths = sorted(blocks_by_length)
    items = progress(lengths) if progress is not None else lengths
    return [
        evaluate_length(
            model, blocks_by_length[ln], train_length, ln / train_length, max_batch_tokens=max_batch_tokens,
            device=device, mask=None if masks is None else masks.get(ln),
            shard=shard if blocks_by_length[ln].shape[0] >= shard[1] else (0, 1),
            sync=shard[1] > 1 and blocks_by_length[ln].shape[0] >= shard[1],
            depths=None if depths is None else depths.get(ln),
            targets=None if targets is None else targets.get(ln),
        )
        for ln in items
    ]


@dataclass
class EvalSets:
    """A data module's fixed evaluation material per length: blocks, and for synthetic tasks the scoring masks,
    the targets (which differ from ``blocks[:, 1:]`` where the model does not read the answers) and (passkey) each
    block's key depth."""

    blocks: dict[int, torch.Tensor]
    masks: dict[int, torch.Tensor] | None = None
    depths: dict[int, list[float]] | None = None
    targets: dict[int, torch.Tensor] | None = None


def eval_sets(dm, lengths: list[int], budget_tokens: int, min_blocks: int = 1) -> EvalSets:
    """Cut every length's evaluation set from ``dm`` (raises the data module's error if one cannot be filled):
    ``budget_tokens`` scored tokens per length, and at least ``min_blocks`` blocks (the longest lengths then score
    more, so that an interval over blocks has replicates there too)."""
    budget = {ln: max(budget_tokens, min_blocks * ln) for ln in lengths}
    blocks = {ln: dm.eval_blocks(ln, budget[ln]) for ln in lengths}
    masks = {ln: dm.eval_mask(ln, budget[ln]) for ln in lengths} if hasattr(dm, "eval_mask") else None
    depths = {ln: list(dm.eval_depths(ln, budget[ln])) for ln in lengths} if hasattr(dm, "eval_depths") else None
    targets = {ln: dm.eval_targets(ln, budget[ln]) for ln in lengths} if hasattr(dm, "eval_targets") else None
    return EvalSets(blocks, masks, depths, targets)


# -- the same targets at every length: the rise with length, paired per anchor -----------------------------------
SAME_TARGET_ANCHORS = 24  # windows per length (each one forward of m·L tokens); their differences are the replicates


def same_target_k(train_length: int) -> int:
    """Targets scored per window: the last quarter of a training length (at least 1). Few enough that every
    scored target has ≥ ¾ L of the window before it even at 1×, so the 1× reference is no cold start."""
    return max(1, train_length // 4)


def same_target_budget(anchors: int, lengths: Sequence[int], budget_tokens: int) -> int:
    """Windows per length for the same-target rise: ``anchors``, but never more tokens in all than the per-length
    blocks' own budget (``len(lengths) · budget_tokens``), so the rise at most doubles an evaluation's cost; at
    least 2, the fewest an interval needs. (The study's 24 windows at 1–32× L cost 0.98× the blocks.)"""
    return max(2, min(anchors, len(lengths) * budget_tokens // max(1, sum(lengths))))


def same_target_anchors(stream_tokens: int, longest: int, n: int) -> list[int]:
    """``n`` anchors spread evenly over the positions a window of ``longest`` tokens can end at: anchor a is the
    position of the last scored target, so every window [a − ℓ, a] (ℓ inputs, ℓ targets) lies in the stream."""
    first, last = longest, stream_tokens - 1  # the window of the longest length needs `longest` tokens before a
    if last < first:
        raise ValueError(f"the same-target windows need {longest + 1} tokens; the stream has {stream_tokens}")
    if n <= 1 or last == first:
        return [last]
    return sorted({first + (i * (last - first)) // (n - 1) for i in range(n)})


@torch.no_grad()
def evaluate_same_targets(
    model: Callable[[torch.Tensor], torch.Tensor],
    stream: torch.Tensor,
    lengths: Sequence[int],
    train_length: int,
    k: int | None = None,
    anchors: int = SAME_TARGET_ANCHORS,
    max_batch_tokens: int = 16384,
    device: torch.device | str | None = None,
) -> dict:
    """The rise with length on the same targets: for every anchor a (spread over ``stream``) and length ℓ, the
    window ``stream[a − ℓ : a + 1]`` is one forward pass of ℓ tokens, and its last ``k`` targets (the tokens up
    to a) are scored. Every length scores exactly the same tokens, each with ℓ tokens of context, so
    ΔNLL(ℓ) = NLL(targets | ℓ) − NLL(targets | L) is paired per anchor and its interval carries the text's noise
    (per-length blocks score different text, and their 1× averages cold-start positions).

    The reference is the training length L itself (scored even when ``lengths`` lacks it). A model whose
    receptive field is finite (a sliding window, a bias steep enough) has a rise of 0 at every length.
    Returns ``{"k", "anchors", "reference_length", "lengths": [{"length", "multiplier", "nll", "rise",
    "rise_ci", "anchor_nll"}]}``: ``rise_ci`` is a 95 % Student-t interval over anchors of the paired differences.
    """
    from scipy import stats

    k = same_target_k(train_length) if k is None else k
    wanted = sorted({*map(int, lengths), int(train_length)})
    if k < 1 or k > wanted[0]:
        raise ValueError(f"same-target k={k} must lie in [1, {wanted[0]}] (the shortest length)")
    device = torch.device(device) if device is not None else stream.device
    ends = same_target_anchors(stream.numel(), wanted[-1], anchors)
    per_length: dict[int, torch.Tensor] = {}
    for ln in wanted:
        nll = torch.empty(len(ends), dtype=torch.float64)  # [n] mean NLL of each anchor's k targets
        per_batch = max(1, max_batch_tokens // ln)
        for i in range(0, len(ends), per_batch):
            batch = ends[i : i + per_batch]
            chunk = torch.stack([stream[a - ln : a + 1] for a in batch]).to(device=device, dtype=torch.long)
            scored = token_nll(model(chunk[:, :-1])[:, -k:], chunk[:, -k:])  # [b, k] the tokens up to a
            if not torch.isfinite(scored).all():
                raise FloatingPointError(f"same-target evaluation at length {ln} produced a non-finite NLL")
            nll[i : i + len(batch)] = scored.double().mean(1).cpu()
        per_length[ln] = nll
    ref = per_length[int(train_length)]
    rows = []
    for ln in wanted:
        diff = per_length[ln] - ref  # [n] paired per anchor
        mean = float(diff.mean())
        if len(ends) > 1 and float(diff.std()) > 0:
            half = float(stats.t.ppf(0.975, len(ends) - 1)) * float(diff.std()) / math.sqrt(len(ends))
        else:
            half = 0.0
        rows.append({"length": ln, "multiplier": ln / train_length, "nll": float(per_length[ln].mean()),
                     "rise": mean, "rise_ci": [mean - half, mean + half],
                     "anchor_nll": per_length[ln].tolist()})
    return {"k": k, "anchors": len(ends), "reference_length": int(train_length), "lengths": rows}


@torch.no_grad()
def evaluate_sliding(
    model: Callable[[torch.Tensor], torch.Tensor],
    stream: torch.Tensor,
    context: int,
    stride: int,
    budget_tokens: int,
    max_batch_tokens: int = 16384,
    device: torch.device | str | None = None,
) -> dict:
    """Sliding-window NLL (analysis protocol): windows of ``context`` tokens every ``stride`` tokens.

    The first window scores all its positions, every later one only its last ``stride`` positions, so each
    of the first ``budget_tokens`` targets of ``stream`` is scored once with up to ``context`` tokens of
    history — the best a model can do with that much context, not what it does on a fresh block.
    """
    if not 0 < stride <= context:
        raise ValueError(f"stride={stride} must lie in [1, context={context}]")
    budget = min(budget_tokens, stream.numel() - 1)
    if budget < context:
        raise ValueError(f"sliding window of {context} tokens needs {context + 1} tokens; the stream has {stream.numel()}")
    device = torch.device(device) if device is not None else stream.device
    starts = list(range(0, budget - context + 1, stride))  # window w covers targets [start, start + context)
    total, count = torch.zeros((), dtype=torch.float64), 0
    per_batch = max(1, max_batch_tokens // context)
    for i in range(0, len(starts), per_batch):
        batch = starts[i : i + per_batch]
        chunk = torch.stack([stream[s : s + context + 1] for s in batch]).to(device=device, dtype=torch.long)
        nll = token_nll(model(chunk[:, :-1]), chunk[:, 1:])  # [b, context]
        keep = torch.full((len(batch), context), False, device=device)
        keep[:, context - stride :] = True
        if batch[0] == 0:
            keep[0] = True  # the first window scores everything it sees
        total += nll[keep].double().sum().cpu()
        count += int(keep.sum())
    mean = float(total / count)
    return {"context": context, "stride": stride, "tokens": count, "nll": mean, "ppl": math.exp(mean)}


# -- presenting results: the table and figure of one run or several side by side ----------------------------------
def smoothed_positions(buckets: Sequence[float | None], width: int, n_bins: int = 24) -> tuple[list[float], list[float]]:
    """Per-position NLL buckets (each ``width`` tokens, already pooled over blocks) merged into ``n_bins``
    log-spaced position bins: ``(bin centres, mean NLL)``. At 64× L the raw curve has 256 noisy buckets;
    log bins keep the near positions resolved and average the far ones."""
    n = len(buckets)
    if n == 0:
        return [], []
    edges = sorted({0, *(int(round(x)) for x in _logspace(1, n, n_bins))} | {n})
    xs, ys = [], []
    for lo, hi in zip(edges, edges[1:]):
        vals = [b for b in buckets[lo:hi] if b is not None]
        if vals:
            xs.append(0.5 * (lo + hi) * width)
            ys.append(sum(vals) / len(vals))  # equal token counts per bucket: a plain mean pools them
    return xs, ys


def _logspace(lo: float, hi: float, n: int) -> list[float]:
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)] if n > 1 and hi > lo else [lo]


def plot_curves(
    curves: Mapping[str, Sequence[Mapping]],
    train_length: int,
    path: str | Path,
    title: str = "",
    styles: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """Two panels: NLL vs evaluation length (log₂ axis, training length marked) and per-position NLL in log-spaced
    bins (:func:`smoothed_positions`), one legend beside them (outside the data); a single curve's label goes in
    the title instead.

    ``curves`` maps a label (a scheme, or a training step) to its list of per-length result dicts
    (the ``lengths`` entries of ``extrapolation.json``); ``styles`` maps a label to its ``plot`` keywords (colour,
    marker, linestyle: a study variant's look); a label without one takes the next colour of the cycle.
    """
    plt = pyplot()
    fig, (ax_len, ax_pos) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    for label, rows in curves.items():
        rows = sorted(rows, key=lambda r: r["length"])
        style = {"marker": "o", **(styles or {}).get(label, {})}
        line = ax_len.plot([r["length"] for r in rows], [r["nll"] for r in rows], ms=4, label=label, **style)[0]
        longest = rows[-1]
        width = longest["bucket_width"]
        xs, ys = smoothed_positions(longest["bucket_nll"], width)  # the raw buckets are too noisy to tell apart
        ax_pos.plot(xs, ys, color=line.get_color(), linestyle=line.get_linestyle(), lw=1.1)
    for ax in (ax_len, ax_pos):
        ax.set_xscale("log", base=2)
        ax.axvline(train_length, color="grey", linestyle="--", linewidth=1)
        ax.grid(True, alpha=0.3)
    ax_len.set_xlabel("evaluation length (tokens)")
    ax_len.set_ylabel("mean NLL (nats/token)")
    ax_len.set_title("NLL vs length (dashed: training length)")
    ax_pos.set_xlabel("position in block (log bins)")
    ax_pos.set_ylabel("NLL (nats/token)")
    longest = max(r["length"] for rows in curves.values() for r in rows)
    ax_pos.set_title(f"per-position NLL at the longest length (ℓ = {longest})")
    if len(curves) > 1:
        fig.legend(*ax_len.get_legend_handles_labels(), loc="outside right upper", fontsize=8, frameon=False)
    else:  # one curve (`accrot eval`): its label in the title, no legend to look up
        title = "\n".join(t for t in (title, *curves) if t)
    if title:
        fig.suptitle(title)
    atomic_savefig(fig, path)
    plt.close(fig)
    return Path(path)


def nll_table(curves: Mapping[str, Sequence[Mapping]], train_length: int, title: str = "NLL per length",
              field_: str = "nll") -> Table:
    """A rich table: one row per label, one column per evaluation length (multiple of the training length);
    ``field_="accuracy"``: the answers' accuracy instead of the NLL."""
    lengths = sorted({r["length"] for rows in curves.values() for r in rows})
    table = Table(title=title)
    table.add_column("scheme")
    for ln in lengths:
        table.add_column(f"{ln / train_length:g}×", justify="right")
    for label, rows in curves.items():
        by_len = {r["length"]: r[field_] for r in rows}
        table.add_row(label, *(f"{by_len[ln]:.3f}" if ln in by_len else "-" for ln in lengths))
    return table


def rise_table(rises: Mapping[str, Mapping], train_length: int,
               title: str = "same-target rise NLL(m) − NLL(1×), nats, 95 % interval over anchors") -> Table:
    """A rich table of :func:`evaluate_same_targets` results: one row per label, one column per length."""
    lengths = sorted({r["length"] for same in rises.values() for r in same["lengths"]})
    table = Table(title=title)
    table.add_column("scheme")
    for ln in lengths:
        table.add_column(f"{ln / train_length:g}×", justify="right")
    for label, same in rises.items():  # the rise, then its interval's half-width under it (80 columns hold both)
        by_len = {r["length"]: r for r in same["lengths"]}
        rows = [by_len.get(ln) for ln in lengths]
        table.add_row(label, *("-" if r is None else f"{r['rise']:+.3f}" for r in rows))
        table.add_row("  ± 95 %", *("" if r is None else f"±{(r['rise_ci'][1] - r['rise_ci'][0]) / 2:.3f}"
                                    for r in rows), style="dim")
    return table

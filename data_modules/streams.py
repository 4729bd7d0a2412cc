"""Token-stream data modules: one train stream, one validation stream, fixed evaluation blocks.

:class:`TokenStreamDataModule` is the base every corpus shares (the embedded stdlib, Hugging Face datasets):
a subclass only implements :meth:`TokenStreamDataModule.load_streams`; the base turns the two 1-D streams into

* training samples: non-overlapping windows of ``seq_len + 1`` tokens of the train stream, starting at an
  offset in ``[0, seq_len]`` drawn from ``seed``; input = window[:-1], target = window[1:]. Epoch e visits them
  in an order that is a pure function of (seed, e) (:class:`ResumableSampler`), and the train loader is
  resumable (:class:`ResumableLoader`): a run resumed mid-epoch trains on exactly the batches the
  uninterrupted run would have;
* the per-epoch validation loader: the first ``val_blocks`` non-overlapping windows of the validation stream;
* the fixed evaluation sets of :meth:`TokenStreamDataModule.eval_blocks`: for each length, the validation
  stream cut from its start into non-overlapping blocks of ``length + 1``, identical for every model.

Batches are ``(inputs [B, T] int64, targets [B, T] int64)`` tuples.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from accrot.errors import DataError
from data_modules.tokenizer import ByteTokenizer, Tokenizer

log = logging.getLogger(__name__)


def check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"{name}={value!r} is not valid; use an integer >= {minimum}")


@dataclass
class TokenStreams:
    """What a corpus loads: two 1-D integer token streams and the facts that identify them.

    Attributes:
        train: ``[N_train]`` token ids (uint8 for bytes, int64 otherwise).
        validation: ``[N_val]`` token ids; never overlaps ``train``.
        fingerprint: sha256 hex identifying the data; ``None`` = hash of the two streams.
        info: source-specific facts for :meth:`TokenStreamDataModule.describe` (JSON-serialisable);
            ``info["splits"][name]`` is merged with the token counts of that split.
    """

    train: torch.Tensor
    validation: torch.Tensor
    fingerprint: str | None = None
    info: dict = field(default_factory=dict)


class TokenWindows(Dataset):
    """Non-overlapping windows of ``seq_len + 1`` tokens of a 1-D stream.

    Item i is ``(stream[s : s + T], stream[s + 1 : s + T + 1])`` as int64 with ``s = i (T + 1)``, T = seq_len;
    a trailing partial window is dropped; ``limit`` keeps only the first windows.
    """

    def __init__(self, stream: torch.Tensor, seq_len: int, limit: int | None = None) -> None:
        self.stream, self.seq_len = stream, seq_len
        n = stream.numel() // (seq_len + 1)
        self.n = n if limit is None else min(n, limit)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(f"window {i} out of range for {self.n} windows")
        w = self.seq_len + 1
        window = self.stream[i * w : (i + 1) * w].long()  # [T + 1]
        return window[:-1], window[1:]  # [T], [T]


def _epoch_seed(seed: int, epoch: int) -> int:
    """SplitMix64 of (seed, epoch): (0, 1) and (1, 0) give unrelated orders (``seed + epoch`` would not)."""
    mask = (1 << 64) - 1
    z = ((seed & mask) * 0x9E3779B97F4A7C15 + (epoch & mask) + 0x632BE59BD9B4E019) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


class ResumableSampler(DistributedSampler):
    """The training order: epoch e is ``randperm(N)`` from a generator seeded by (seed, e), a pure function.

    Under DDP each of the ``num_replicas`` ranks takes every ``num_replicas``-th index of it (the tail that
    does not divide evenly is dropped, as ``DistributedSampler(drop_last=True)`` does); Lightning leaves a
    ``DistributedSampler`` in place instead of swapping in its own. :meth:`resume` skips the first batches
    of one epoch, so a run restored mid-epoch continues that epoch's order where it stopped.
    """

    def __init__(self, dataset: Dataset, batch_size: int, seed: int, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.batch_size = batch_size
        self._skip: tuple[int, int] | None = None  # (epoch, batches of it already trained on)

    def resume(self, epoch: int, batches: int) -> None:
        self.set_epoch(epoch)
        self._skip = (epoch, batches)

    def skipped(self) -> int:
        """Batches of the current epoch the next iteration leaves out."""
        return self._skip[1] if self._skip is not None and self._skip[0] == self.epoch else 0

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(_epoch_seed(self.seed, self.epoch))
        order = torch.randperm(len(self.dataset), generator=g)[: self.total_size]  # [num_replicas · num_samples]
        mine = order[self.rank : self.total_size : self.num_replicas].tolist()  # [num_samples]
        start = self.skipped() * self.batch_size
        self._skip = None  # once: the next epoch starts from its beginning
        return iter(mine[start:])


class ResumableLoader(DataLoader):
    """A train DataLoader whose position is checkpointed (Lightning calls ``state_dict`` of a stateful
    loader when it saves, and ``load_state_dict`` before it iterates again).

    The state is ``{"epoch", "batches"}``: the epoch in progress and how many of its batches were trained on.
    ``progress`` (set by the data module) reads both from the trainer, which knows them exactly whatever the
    loader has prefetched; without a trainer the loader counts the batches it handed out, and a full pass
    moves it to the next epoch (Lightning sets the epoch itself).
    """

    def __init__(self, dataset: Dataset, *args, progress: Callable[[], tuple[int, int] | None] | None = None,
                 **kwargs) -> None:
        super().__init__(dataset, *args, **kwargs)
        self.progress = progress
        self._handed_out = 0

    @property
    def resumable(self) -> bool:
        """False once Lightning has swapped the sampler for one of its own (then the state is not used)."""
        return isinstance(self.sampler, ResumableSampler)

    def __iter__(self) -> Iterator:
        self._handed_out = self.sampler.skipped() if self.resumable else 0
        for batch in super().__iter__():
            self._handed_out += 1
            yield batch
        if self.resumable:
            self.sampler.set_epoch(self.sampler.epoch + 1)  # a full pass: the next one is the next epoch
        self._handed_out = 0

    def state_dict(self) -> dict:
        done = self.progress() if self.progress is not None else None
        epoch, batches = done if done is not None else (getattr(self.sampler, "epoch", 0), self._handed_out)
        return {"epoch": int(epoch), "batches": int(batches)}

    def load_state_dict(self, state: dict) -> None:
        if not self.resumable or not state:
            return
        epoch, batches = int(state["epoch"]), int(state["batches"])
        if batches >= len(self):  # saved as the epoch ended: the next one starts from its beginning
            epoch, batches = epoch + 1, 0
        self.sampler.resume(epoch, batches)


class TokenStreamDataModule(L.LightningDataModule):
    """Base of the corpora: train/validation token streams, loaders and fixed evaluation blocks.

    Streams are loaded lazily by :meth:`load_streams` (subclass hook) on first use and cached in memory.

    Args:
        seq_len: training length T; samples are windows of T + 1 tokens.
        batch_size: windows per batch (train and per-epoch validation).
        num_workers: DataLoader worker processes.
        seed: seeds the train window offset and each epoch's order (not the train/validation split).
        val_blocks: number of blocks of T + 1 tokens in the per-epoch validation loader.
        max_train_tokens: keep only the first tokens of the train stream (quick tests); None = all.
    """

    def __init__(
        self,
        seq_len: int = 128,
        batch_size: int = 16,
        num_workers: int = 0,
        seed: int = 0,
        val_blocks: int = 64,
        max_train_tokens: int | None = None,
    ) -> None:
        super().__init__()
        # a 1-token window has no context: nothing for a position scheme to act on, and its evaluation, whose
        # per-position buckets and same-target windows need at least two positions, would fail after training
        check_int("seq_len", seq_len, 2)
        check_int("batch_size", batch_size, 1)
        check_int("num_workers", num_workers, 0)
        check_int("seed", seed, 0)
        check_int("val_blocks", val_blocks, 1)
        if max_train_tokens is not None:
            check_int("max_train_tokens", max_train_tokens, 2)
        self.save_hyperparameters()
        self.seq_len, self.batch_size, self.num_workers = seq_len, batch_size, num_workers
        self.seed, self.val_blocks, self.max_train_tokens = seed, val_blocks, max_train_tokens
        self.tokenizer: Tokenizer = ByteTokenizer()
        self._streams: TokenStreams | None = None
        self._train_tokens_loaded = 0
        self.eval_counts: dict[int, dict[str, int]] = {}

    # --- the subclass hook -------------------------------------------------------------------------

    def load_streams(self) -> TokenStreams:  # pragma: no cover - abstract
        """Read and tokenise the corpus; raise :class:`DataError` for missing or empty data."""
        raise NotImplementedError

    # --- streams -----------------------------------------------------------------------------------

    @property
    def streams(self) -> TokenStreams:
        if self._streams is None:
            s = self.load_streams()
            for name, t in (("train", s.train), ("validation", s.validation)):
                if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
                    raise DataError(
                        f"{name} stream has shape {tuple(t.shape)} and dtype {t.dtype}; expected 1-D token ids"
                    )
                if t.numel() == 0:
                    raise DataError(f"the {name} stream is empty; pass a corpus with data in both splits")
            self._train_tokens_loaded = s.train.numel()
            if self.max_train_tokens is not None:
                s.train = s.train[: self.max_train_tokens]
            self._streams = s
        return self._streams

    @property
    def train_stream(self) -> torch.Tensor:
        """``[N_train]`` token ids (after ``max_train_tokens``)."""
        return self.streams.train

    @property
    def val_stream(self) -> torch.Tensor:
        """``[N_val]`` token ids: the source of the validation loader and of every evaluation set."""
        return self.streams.validation

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def fingerprint(self) -> str:
        """sha256 hex of the corpus and its split (subclasses define it; default: the bytes of both streams).

        It identifies the data before ``max_train_tokens``; :meth:`describe` records the cap, seq_len and offset.
        """
        s = self.streams
        if s.fingerprint is None:
            h = hashlib.sha256()
            for name, t in (("train", s.train), ("validation", s.validation)):
                h.update(f"{name}:{t.dtype}:{t.numel()}\0".encode())
                h.update(t.contiguous().numpy().tobytes())
            s.fingerprint = h.hexdigest()
        return s.fingerprint

    @property
    def train_offset(self) -> int:
        """First token of the first training window, in ``[0, seq_len]``, a function of ``seed`` only."""
        g = torch.Generator().manual_seed(self.seed)
        return int(torch.randint(self.seq_len + 1, (), generator=g))

    # --- datasets ----------------------------------------------------------------------------------

    def train_dataset(self) -> TokenWindows:
        ds = TokenWindows(self.train_stream[self.train_offset :], self.seq_len)
        if len(ds) < self.batch_size:
            raise DataError(
                f"the train stream ({self.train_stream.numel()} tokens from offset {self.train_offset}) holds "
                f"{len(ds)} windows of seq_len+1={self.seq_len + 1} tokens, fewer than batch_size={self.batch_size}; "
                "use a smaller seq_len or batch_size, or more training data"
            )
        return ds

    def val_dataset(self) -> TokenWindows:
        n = self.val_stream.numel()
        if n < self.seq_len + 1:
            raise DataError(
                f"seq_len={self.seq_len} needs {self.seq_len + 1} tokens per validation block but the validation "
                f"stream has {n}; use seq_len up to {n - 1} or more validation data"
            )
        return TokenWindows(self.val_stream, self.seq_len, limit=self.val_blocks)

    def setup(self, stage: str | None = None) -> None:
        # Load and check now so a bad corpus fails before the first step, not inside the loop.
        if stage in (None, "fit"):
            self.train_dataset()
        if stage in (None, "fit", "validate"):
            self.val_dataset()

    def train_dataloader(self) -> ResumableLoader:
        # The order of epoch e is a function of (seed, e) and the loader's position is checkpointed, so a
        # resumed run sees the batches of an uninterrupted one. Under DDP the sampler shards by rank itself.
        trainer = self.trainer
        replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        dataset = self.train_dataset()
        if len(dataset) < self.batch_size * replicas:
            raise DataError(
                f"the train stream holds {len(dataset)} windows, fewer than batch_size={self.batch_size} on each of "
                f"{replicas} devices; use a smaller batch_size or seq_len, or more training data"
            )
        return ResumableLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=ResumableSampler(dataset, self.batch_size, self.seed, replicas, rank),
            drop_last=True,  # constant batch shape; train_dataset() guarantees at least one batch
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            # a loader of its own: the workers' base seed never draws from torch's global RNG
            generator=torch.Generator().manual_seed(self.seed),
            progress=self._trained_batches,
        )

    def _trained_batches(self) -> tuple[int, int] | None:
        """(epoch, batches of it trained on) from the trainer; None outside ``fit``."""
        trainer = self.trainer
        if trainer is None or trainer.state.fn != "fit":
            return None
        return trainer.current_epoch, trainer.fit_loop.epoch_loop.batch_progress.current.processed

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            self.val_dataset(),
            batch_size=self.batch_size,
            shuffle=False,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    # --- evaluation --------------------------------------------------------------------------------

    def eval_blocks(self, length: int, budget_tokens: int, record: bool = True) -> torch.Tensor:
        """The fixed evaluation set for one length: ``[N, length + 1]`` int64, non-overlapping blocks spread evenly
        over the whole validation stream: block i is slot ⌊i·S/N⌋ of the S = ⌊len(val) / (length + 1)⌋ slots,
        val[s(length+1) : (s+1)(length+1)] (block 0 starts the stream).

        Spread, not the first N blocks: a verdict read on the evaluation then generalises to the validation split
        (every file of it at short lengths), not to its first few files.
        N = max(1, budget_tokens // length) blocks, so every length scores about ``budget_tokens`` targets.
        When the validation stream holds fewer than N blocks (but at least one), all that fit are used and
        the count is recorded in :attr:`eval_counts` (and :meth:`describe`): with a budget above the stream,
        every length then scores nearly the whole stream, so budgets stay comparable across lengths.
        Not even one block raises :class:`DataError`. ``record=False`` (the diagnostics' own blocks) leaves the
        record of the evaluation sets as it is.
        """
        check_int("evaluation length", length, 1)
        check_int("budget_tokens", budget_tokens, 1)
        stream = self.val_stream
        fit = stream.numel() // (length + 1)
        if fit == 0:
            raise DataError(
                f"evaluation length {length} needs {length + 1} tokens per block but the validation stream has "
                f"{stream.numel()}; use lengths up to {stream.numel() - 1} or more validation data"
            )
        requested = max(1, budget_tokens // length)
        n = min(requested, fit)
        if record and n < requested and self.eval_counts.get(length, {}).get("requested") != requested:
            log.warning(
                "evaluation length %d: the validation stream holds %d of the %d blocks the budget of %d tokens asks for; using %d",
                length,
                fit,
                requested,
                budget_tokens,
                n,
            )
        if record:
            self.eval_counts[length] = {"requested": requested, "blocks": n, "tokens": n * length}
        slots = torch.div(torch.arange(n) * fit, n, rounding_mode="floor")  # [N] distinct, ascending, from 0
        starts = slots * (length + 1)
        return stream[starts[:, None] + torch.arange(length + 1)].long()  # [N, L + 1], a fresh copy

    # --- records -----------------------------------------------------------------------------------

    def describe(self) -> dict:
        """JSON-serialisable facts that identify the data of a run (written into every run directory)."""
        s = self.streams
        info = {k: v for k, v in s.info.items() if k != "splits"}
        splits = {name: dict(s.info.get("splits", {}).get(name, {})) for name in ("train", "validation")}
        splits["train"].update(tokens=s.train.numel(), tokens_loaded=self._train_tokens_loaded)
        splits["validation"]["tokens"] = s.validation.numel()
        tokenizer = self.tokenizer
        return {
            **info,
            "fingerprint": self.fingerprint,
            "tokenizer": {"name": tokenizer.name, "vocab_size": tokenizer.vocab_size},
            "splits": splits,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "max_train_tokens": self.max_train_tokens,
            "train_offset": self.train_offset,
            "train_windows": s.train[self.train_offset :].numel() // (self.seq_len + 1),
            "val_blocks": min(self.val_blocks, s.validation.numel() // (self.seq_len + 1)),
            "eval_blocks": {str(k): dict(v) for k, v in sorted(self.eval_counts.items())},
        }

    # The train position is the train loader's state (:class:`ResumableLoader`); the data module itself holds
    # nothing that changes while training (checkpoints of earlier versions stored a generator here: ignored).
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass

"""Synthetic tasks for controlled experiments: offset copy and passkey retrieval.

Both modules share :class:`TokenStreamDataModule`'s interface (the CLI's data base class) but have no token
streams: every sequence is generated on demand on the CPU from a ``torch.Generator`` seeded by
``sha256("accrot.synthetic/<task>/<seed>/<split>/<length>/<index>")``, so

* training item i (split ``train``, length ``seq_len``) is the same in every process and every epoch, and the
  ``10**6``-item map-style dataset shards under DDP like any other;
* evaluation block i at length ℓ (split ``eval``) is the same for every model, whatever the budget (block i
  does not depend on N); the per-epoch validation loader is the first ``val_blocks`` evaluation blocks at
  ``seq_len``; evaluation seeds never equal training seeds.

Batches are ``(inputs [B, T], targets [B, T])`` int64 with ``targets = -100`` wherever nothing is scored
(only answers are; the loss uses ``ignore_index=-100``). :meth:`SyntheticDataModule.eval_blocks` gives
``[N, ℓ + 1]`` tokens as the model reads them, :meth:`SyntheticDataModule.eval_targets` the ``[N, ℓ]`` targets
(blocks[:, 1:], except where a task hides its answers from the model: :func:`model_view`) and
:meth:`SyntheticDataModule.eval_mask` the scored ones.

**Offset copy** (:class:`LocalDependencyDataModule`; the study's lower bound in its purest form).
Tokens ``0 .. n_content-1`` are content, ``n_content + k - 1`` is the cue C_k (k = 1..K, K = ``max_offset``).
A sequence x of n = ℓ + 1 tokens is drawn as

1. ``x ~ uniform content tokens`` (``[n]``);
2. m = min(max(1, ⌊cue_rate · ℓ⌋), ⌈(ℓ − K)/2⌉) cue positions, uniform over the sets of positions in
   ``[K, ℓ − 1]`` that are at least 2 apart (so a cue never lands on an answer, every cue has its answer
   inside the sequence, and ``p − k ≥ 0``);
3. per cue p an offset k uniform over ``{k ≤ K : x[p − k] is not a cue}`` (never empty: x[p − 1] is not a cue);
4. left to right, x[p] = C_k and the answer x[p + 1] = x[p − k] (the token k positions before the cue in the
   final sequence; it may itself be an earlier answer, which is a content token too).

Only answers are scored: in targets = x[1:], index p (the cue's index) holds the answer. The answer is always
within K tokens, so only the far set grows with the length.

**Passkey retrieval** (:class:`PasskeyDataModule`, bytes). A sequence of n = ℓ + 1 bytes is
``filler[:P] + KEY + filler[P:] + QUESTION + key`` where ``filler`` is the last F bytes of the sentences
:data:`FILLER` repeated (a window of a longer text: it may begin inside a sentence, it ends at a sentence end,
and it reads continuously around the key), F = n − len(KEY) − len(QUESTION) − digits, and the key is ``digits``
uniform decimal digits. P is a sentence boundary of the filler (the start of a whole sentence, i.e. right after
". ", or F): for evaluation block i, the one nearest to ``depths[i % len(depths)] · F`` (ties: the earlier), so
the key sits within one sentence (≤ 22 bytes) of its depth; for training, uniform over the boundaries. The scored
targets are the final ``digits`` bytes. Keys are split once for all seeds: a key is reserved for
evaluation iff ``sha256(key)[0] < 32`` (1/8 of keys), so an evaluation sequence never equals a training one
(training keys are redrawn until they are not reserved, evaluation keys until they are).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch.utils.data import Dataset, TensorDataset

from accrot.errors import DataError
from data_modules.streams import TokenStreamDataModule, TokenStreams, check_int
from data_modules.tokenizer import ByteTokenizer

GENERATOR_VERSION = 1  # bump when a generation rule changes: it is part of every fingerprint
TRAIN_SAMPLES = 10**6  # length of the (effectively infinite) training dataset
IGNORE_INDEX = -100

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
KEY_TEMPLATE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "What is the pass key? The pass key is "
EVAL_KEY_BYTE = 32  # a key is an evaluation key iff sha256(key)[0] < 32: 1/8 of all keys


def item_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts`` (task, seed, split, length, index): stable across processes and runs."""
    digest = hashlib.sha256("/".join(["accrot.synthetic", *map(str, parts)]).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _generator(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(item_seed(*parts))


# ---------------------------------------------------------------------------------------------------
# the tasks: pure, picklable sample generators (a DataLoader worker gets the task, not the data module)
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OffsetCopyTask:
    """The offset-copy generator (module docstring, rules 1-4)."""

    n_content: int
    max_offset: int
    cue_rate: float

    name = "local_dependency"

    @property
    def vocab_size(self) -> int:
        return self.n_content + self.max_offset

    @property
    def min_length(self) -> int:
        return self.max_offset + 1  # one cue at position K with its answer at K + 1 = ℓ

    def n_cues(self, length: int) -> int:
        capacity = (length - self.max_offset + 1) // 2  # positions [K, ℓ-1], at least 2 apart
        return min(max(1, math.floor(self.cue_rate * length)), capacity)

    def sample(self, g: torch.Generator, length: int, split: str, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x [ℓ+1] int64, mask [ℓ] bool)``; ``split`` and ``index`` do not change the rules."""
        K, n = self.max_offset, length + 1
        x = torch.randint(self.n_content, (n,), generator=g)  # [n] content tokens
        m = self.n_cues(length)
        slots = length - K - m + 1  # m sorted draws from [0, slots) + their rank = m positions >= 2 apart
        cues = K + torch.randperm(slots, generator=g)[:m].sort().values + torch.arange(m)  # [m] in [K, ℓ-1]
        is_cue = torch.zeros(n, dtype=torch.bool)
        is_cue[cues] = True
        offsets = torch.arange(1, K + 1)  # [K]
        valid = ~is_cue[cues[:, None] - offsets]  # [m, K]; column 0 (k = 1) is always True
        k = torch.multinomial(valid.double(), 1, generator=g).squeeze(1) + 1  # [m] uniform over valid offsets
        # answer p+1 copies position p-k, which may be an earlier answer: follow the copy chains to their
        # content roots by pointer jumping (each pass doubles the resolved chain length)
        source = torch.arange(n)  # [n]
        source[cues + 1] = cues - k
        while True:
            jumped = source[source]
            if torch.equal(jumped, source):
                break
            source = jumped
        x = x[source]
        x[cues] = self.n_content + k - 1  # C_k
        return x, is_cue[:length].clone()  # scored target index = the cue's index


def _filler_text(size: int) -> tuple[bytes, int]:
    """FILLER repeated, at least one repetition longer than ``size``, and where its last ``size`` bytes start."""
    text = FILLER.encode() * (size // len(FILLER) + 2)
    return text, len(text) - size


@functools.lru_cache(maxsize=64)
def _filler(size: int) -> bytes:
    """The last ``size`` bytes of FILLER repeated: continuous text that ends on a sentence boundary."""
    text, start = _filler_text(size)
    return text[start:]


@functools.lru_cache(maxsize=64)
def _boundaries(size: int) -> tuple[int, ...]:
    """Where the key may go in ``_filler(size)``: the start of every whole sentence (right after ". "), and ``size``.

    The filler usually begins inside a sentence (it is a window of a longer text); that fragment is never split.
    """
    text, start = _filler_text(size)  # start >= len(FILLER), so text[start + b - 2] exists
    return tuple(b for b in range(size + 1) if b == size or text[start + b - 2 : start + b] == b". ")


@dataclass(frozen=True)
class PasskeyTask:
    """The passkey generator (module docstring)."""

    digits: int
    depths: tuple[float, ...]

    name = "passkey"
    vocab_size = 256

    @property
    def fixed_bytes(self) -> int:
        """Bytes that are not filler: the key sentence, the question and the answer digits."""
        return len(KEY_TEMPLATE.format(key="0" * self.digits)) + len(QUESTION) + self.digits

    @property
    def min_length(self) -> int:
        return self.fixed_bytes - 1  # n = ℓ + 1 bytes hold everything with no filler

    def filler_bytes(self, length: int) -> int:
        return length + 1 - self.fixed_bytes

    def key_position(self, length: int, depth: float) -> int:
        """Byte offset P of the key sentence at ``depth``: the filler's sentence boundary nearest to depth·F."""
        F = self.filler_bytes(length)
        return min(_boundaries(F), key=lambda b: (abs(b - depth * F), b))

    @staticmethod
    def is_eval_key(key: str) -> bool:
        return hashlib.sha256(key.encode()).digest()[0] < EVAL_KEY_BYTE

    def draw_key(self, g: torch.Generator, split: str) -> str:
        want_eval = split != "train"
        while True:  # 8/7 draws on average for training keys, 8 for evaluation keys
            key = "".join(map(str, torch.randint(10, (self.digits,), generator=g).tolist()))
            if self.is_eval_key(key) == want_eval:
                return key

    def sample(self, g: torch.Generator, length: int, split: str, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x [ℓ+1] int64 bytes, mask [ℓ] bool)``; evaluation block ``index`` sits at depths[index % len]."""
        key = self.draw_key(g, split)
        F = self.filler_bytes(length)
        if split == "train":
            bounds = _boundaries(F)
            P = bounds[int(torch.randint(len(bounds), (), generator=g))]
        else:
            P = self.key_position(length, self.depths[index % len(self.depths)])
        f = _filler(F)
        text = f[:P] + KEY_TEMPLATE.format(key=key).encode() + f[P:] + QUESTION.encode() + key.encode()
        x = torch.tensor(list(text), dtype=torch.long)  # [ℓ+1]
        mask = torch.zeros(length, dtype=torch.bool)
        mask[-self.digits :] = True  # targets[ℓ-d:] are the key's digits
        return x, mask


def model_view(task, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(what the model reads [ℓ+1], targets [ℓ])`` of a sample ``x [ℓ+1]`` whose scored targets are ``mask [ℓ]``.

    The targets are ``x[1:]``. A task whose answers are not fed back (``task.hidden_answer``, a byte) shows that
    byte instead of each answer in what the model reads, so a later answer cannot be read off an earlier one
    (the state-tracking tasks: an answer fed back would turn a running state into a one-step lookup).
    """
    targets = x[1:].clone()  # [ℓ]
    hidden = getattr(task, "hidden_answer", None)
    if hidden is not None:
        x = x.clone()
        x[1:][mask] = hidden
    return x, targets


class SyntheticSamples(Dataset):
    """Item i = ``(inputs [T], targets [T])`` of the sample seeded by (task, seed, split, length, i): the model's view
    without its last byte (:func:`model_view`) and the targets, -100 off the answers."""

    def __init__(self, task, seed: int, split: str, length: int, size: int) -> None:
        self.task, self.seed, self.split, self.length, self.size = task, seed, split, length, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.size:
            raise IndexError(f"sample {i} out of range for {self.size} samples")
        x, mask = self.task.sample(_generator(self.task.name, self.seed, self.split, self.length, i),
                                   self.length, self.split, i)  # [T+1], [T]
        x, targets = model_view(self.task, x, mask)
        return x[:-1], torch.where(mask, targets, IGNORE_INDEX)  # [T], [T]


class SymbolTokenizer:
    """Readable ids for the offset-copy vocabulary: content ``t<i>``, cue ``C<k>`` (for logs and debugging)."""

    name = "offset-copy"

    def __init__(self, n_content: int, max_offset: int) -> None:
        self.n_content, self.vocab_size = n_content, n_content + max_offset

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        bad = next((v for v in values if not 0 <= v < self.vocab_size), None)
        if bad is not None:
            raise DataError(f"token id {bad} is outside the offset-copy vocabulary 0..{self.vocab_size - 1}")
        return " ".join(f"t{v}" if v < self.n_content else f"C{v - self.n_content + 1}" for v in values)

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            kind, num = word[:1], word[1:]
            if kind not in ("t", "C") or not num.isdigit():
                raise DataError(f"{word!r} is not an offset-copy symbol; use t<i> (content) or C<k> (cue)")
            ids.append(int(num) if kind == "t" else self.n_content + int(num) - 1)
        self.decode(ids)  # range check
        return ids

    def describe(self) -> dict:
        return {"name": self.name, "vocab_size": self.vocab_size}


# ---------------------------------------------------------------------------------------------------
# the data modules
# ---------------------------------------------------------------------------------------------------
class SyntheticDataModule(TokenStreamDataModule):
    """Shared loaders, evaluation sets and records of the synthetic tasks (a subclass sets ``self.task``).

    It subclasses :class:`TokenStreamDataModule` for its interface (the CLI accepts subclasses of it) but has no
    streams: :meth:`load_streams` raises :class:`DataError`.
    """

    task: OffsetCopyTask | PasskeyTask

    def __init__(self, seq_len: int, batch_size: int, num_workers: int, seed: int, val_blocks: int) -> None:
        super().__init__(seq_len=seq_len, batch_size=batch_size, num_workers=num_workers, seed=seed,
                         val_blocks=val_blocks)
        # the base's save_hyperparameters() recorded the whole __init__ chain (the subclass's task arguments too);
        # drop its stream cap, which synthetic data does not have
        self.remove_ignored_hparams(["max_train_tokens"])
        self._eval_sets: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._fingerprint: str | None = None

    def load_streams(self) -> TokenStreams:
        raise DataError(f"the {self.task.name} task has no token streams; use eval_blocks() and the loaders")

    @property
    def vocab_size(self) -> int:
        return self.task.vocab_size

    def _check_length(self, name: str, length: int) -> None:
        check_int(name, length, 1)
        if length < self.task.min_length:
            raise DataError(f"{name} {length} is too short for the {self.task.name} task; "
                            f"use lengths >= {self.task.min_length}")

    # --- datasets ----------------------------------------------------------------------------------

    def train_dataset(self) -> SyntheticSamples:
        return SyntheticSamples(self.task, self.seed, "train", self.seq_len, TRAIN_SAMPLES)

    def val_dataset(self) -> TensorDataset:
        blocks, mask, targets = self._blocks(self.seq_len, self.val_blocks)  # the first evaluation blocks at seq_len
        return TensorDataset(blocks[:, :-1], torch.where(mask, targets, IGNORE_INDEX))  # [N, T] each

    # --- evaluation --------------------------------------------------------------------------------

    def _blocks(self, length: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first ``n`` evaluation samples at ``length``: ``(blocks [n, ℓ+1] as the model reads them, mask [n, ℓ],
        targets [n, ℓ])``, cached."""
        if (length, n) not in self._eval_sets:
            samples = [self.task.sample(_generator(self.task.name, self.seed, "eval", length, i), length, "eval", i)
                       for i in range(n)]
            views = [model_view(self.task, x, m) for x, m in samples]
            blocks = torch.stack([x for x, _ in views])  # [n, ℓ+1]
            mask = torch.stack([m for _, m in samples])  # [n, ℓ]
            targets = torch.stack([t for _, t in views])  # [n, ℓ]
            self._eval_sets[(length, n)] = (blocks, mask, targets)
        return self._eval_sets[(length, n)]

    def eval_set(self, length: int, budget_tokens: int, record: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """``(blocks [N, ℓ+1] int64, mask [N, ℓ] bool)``, N = max(1, budget_tokens // ℓ), as fresh copies.

        Block i depends only on (task, seed, ℓ, i), never on N; the counts are recorded in :meth:`describe`
        unless ``record=False`` (the diagnostics' own blocks).
        """
        self._check_length("evaluation length", length)
        check_int("budget_tokens", budget_tokens, 1)
        n = max(1, budget_tokens // length)
        blocks, mask, _ = self._blocks(length, n)
        if record:
            self.eval_counts[length] = {"requested": n, "blocks": n, "tokens": n * length, "scored": int(mask.sum())}
        return blocks.clone(), mask.clone()

    def eval_blocks(self, length: int, budget_tokens: int, record: bool = True) -> torch.Tensor:
        """The fixed evaluation set at one length as the model reads it: ``[N, length + 1]`` int64,
        N = max(1, budget_tokens // length) (inputs ``[:, :-1]``; hidden answers shown as the task's
        ``hidden_answer`` byte)."""
        return self.eval_set(length, budget_tokens, record)[0]

    def eval_mask(self, length: int, budget_tokens: int) -> torch.Tensor:
        """``[N, length]`` bool: the scored target positions of :meth:`eval_blocks`."""
        return self.eval_set(length, budget_tokens)[1]

    def eval_targets(self, length: int, budget_tokens: int) -> torch.Tensor:
        """``[N, length]`` int64: the targets of :meth:`eval_blocks`; ``blocks[:, 1:]`` unless the task hides its
        answers from the model's input (:func:`model_view`)."""
        self.eval_set(length, budget_tokens, record=False)  # checks the arguments
        return self._blocks(length, max(1, budget_tokens // length))[2].clone()

    # --- records -----------------------------------------------------------------------------------

    def task_parameters(self) -> dict:
        """What defines the task's data, besides the seed and the lengths (subclass hook)."""
        return asdict(self.task)

    @property
    def fingerprint(self) -> str:
        """sha256 hex of the task, its parameters, the seed and the generator version, plus the bytes of a few
        samples at the task's shortest length (so a change in the rules or in torch's RNG shows up)."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            spec = {"task": self.task.name, "version": GENERATOR_VERSION, "seed": self.seed,
                    "parameters": self.task_parameters()}
            h.update(json.dumps(spec, sort_keys=True).encode())
            length = self.task.min_length
            for split in ("train", "eval"):
                for i in range(2):
                    x, mask = self.task.sample(_generator(self.task.name, self.seed, split, length, i),
                                               length, split, i)
                    h.update(x.numpy().tobytes() + mask.numpy().tobytes())
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def describe(self) -> dict:
        """JSON-serialisable facts that identify the data of a run (written into every run directory)."""
        return {
            "task": self.task.name,
            "parameters": self.task_parameters(),
            "seed": self.seed,
            "fingerprint": self.fingerprint,
            "generator_version": GENERATOR_VERSION,
            "tokenizer": self.tokenizer.describe(),
            "seq_len": self.seq_len,
            "min_length": self.task.min_length,
            "train_samples": TRAIN_SAMPLES,
            "val_blocks": self.val_blocks,
            "eval_blocks": {str(k): dict(v) for k, v in sorted(self.eval_counts.items())},
        }


class LocalDependencyDataModule(SyntheticDataModule):
    """Offset copy: cue C_k is followed by the content token k positions before it; only answers are scored.

    Generation rules: module docstring. ``vocab_size = n_content + max_offset`` (content ids first, then C_1..C_K).

    Args:
        seq_len: training length T (inputs and targets of T tokens from sequences of T + 1).
        n_content: number of content tokens.
        max_offset: K, the number of cue tokens and the largest copy offset; must be < seq_len.
        cue_rate: cues per token, in (0, 0.5] (a cue and its answer take two positions).
        batch_size, seed, num_workers, val_blocks: as in :class:`TokenStreamDataModule`.
    """

    def __init__(
        self,
        seq_len: int = 128,
        n_content: int = 64,
        max_offset: int = 8,
        cue_rate: float = 0.1,
        batch_size: int = 16,
        seed: int = 0,
        num_workers: int = 0,
        val_blocks: int = 32,
    ) -> None:
        check_int("n_content", n_content, 2)
        check_int("max_offset", max_offset, 1)
        check_int("seq_len", seq_len, 2)
        if max_offset >= seq_len:
            raise DataError(f"max_offset={max_offset} is not valid for seq_len={seq_len}; use 1 <= max_offset < seq_len")
        if isinstance(cue_rate, bool) or not isinstance(cue_rate, (int, float)) or not 0 < cue_rate <= 0.5:
            raise DataError(f"cue_rate={cue_rate!r} is not valid; use a number in (0, 0.5]")
        super().__init__(seq_len, batch_size, num_workers, seed, val_blocks)
        self.n_content, self.max_offset, self.cue_rate = n_content, max_offset, float(cue_rate)
        self.task = OffsetCopyTask(n_content=n_content, max_offset=max_offset, cue_rate=float(cue_rate))
        self.tokenizer = SymbolTokenizer(n_content, max_offset)


class DepthTaskDataModule(SyntheticDataModule):
    """A retrieval task whose evaluation block i hides its key at ``task.depths[i % len]`` (passkey and the tasks of
    :mod:`data_modules.retrieval`): accuracy is reported per depth (:meth:`eval_depths`)."""

    @property
    def min_length(self) -> int:
        """The shortest sequence (in targets) that holds the task's key sentences, the question and the answer."""
        return self.task.min_length

    def eval_depths(self, length: int, budget_tokens: int) -> list[float]:
        """The depth of each block of :meth:`eval_blocks` (same arguments): ``depths[i % len(depths)]``."""
        self._check_length("evaluation length", length)
        check_int("budget_tokens", budget_tokens, 1)
        n = max(1, budget_tokens // length)
        return [self.task.depths[i % len(self.task.depths)] for i in range(n)]


class PasskeyDataModule(DepthTaskDataModule):
    """Passkey retrieval in byte-level filler; the key's digits at the end are the only scored targets.

    Generation rules: module docstring. Training sequences have ``seq_len + 1`` bytes and the key at a uniformly
    drawn sentence boundary; evaluation block i puts it at ``depths[i % len(depths)]`` (:meth:`eval_depths`).

    Args:
        seq_len: training length T; at least :attr:`min_length` (101 bytes for 5 digits).
        digits: length of the key (3..32; fewer digits leave too few keys to hold evaluation keys out).
        depths: key depths of the evaluation blocks, fractions of the filler in [0, 1], cycled over the blocks.
        batch_size, seed, num_workers, val_blocks: as in :class:`TokenStreamDataModule`.
    """

    def __init__(
        self,
        seq_len: int = 128,
        digits: int = 5,
        depths: list[float] = [0.0, 0.25, 0.5, 0.75, 1.0],  # noqa: B006 - jsonargparse shows the default
        batch_size: int = 16,
        seed: int = 0,
        num_workers: int = 0,
        val_blocks: int = 32,
    ) -> None:
        check_int("digits", digits, 3)
        if digits > 32:
            raise DataError(f"digits={digits} is not valid; use an integer in 3..32")
        if (
            not isinstance(depths, (list, tuple))
            or not depths
            or any(isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 1 for d in depths)
        ):
            raise DataError(f"depths={depths!r} is not valid; use a non-empty list of fractions in [0, 1]")
        task = PasskeyTask(digits=digits, depths=tuple(float(d) for d in depths))
        check_int("seq_len", seq_len, 1)
        if seq_len < task.min_length:
            raise DataError(f"seq_len={seq_len} cannot hold the pass key and the question; "
                            f"use seq_len >= {task.min_length} for digits={digits}")
        super().__init__(seq_len, batch_size, num_workers, seed, val_blocks)
        self.digits, self.depths = digits, list(task.depths)
        self.task = task
        self.tokenizer = ByteTokenizer()

    def key_position(self, length: int, depth: float) -> int:
        """Byte offset of the key sentence in a block of ``length`` at ``depth`` (a sentence boundary)."""
        self._check_length("evaluation length", length)
        return self.task.key_position(length, depth)

    def task_parameters(self) -> dict:
        return {**asdict(self.task), "depths": list(self.task.depths), "filler": FILLER, "key": KEY_TEMPLATE,
                "question": QUESTION, "eval_key_fraction": EVAL_KEY_BYTE / 256}

    def _check_length(self, name: str, length: int) -> None:
        check_int(name, length, 1)
        if length < self.task.min_length:
            raise DataError(f"{name} {length} cannot hold the pass key and the question; "
                            f"the minimum is {self.task.min_length} for digits={self.digits}")

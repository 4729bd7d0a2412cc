"""Packing a dataset's documents into the train and validation token streams of
:class:`~data_modules.hf.HFDataModule`, and the cache files that keep them between runs.

* Streams: the non-empty documents of a split in order, joined by a separator (bytes: ``"\\n\\n"``, a Hugging
  Face tokenizer: its eos id). Empty and null documents are skipped and counted.
* Cache: both streams as one ``.npy`` (train then validation; uint8 for bytes, else the smallest of uint16 /
  int32 that holds the vocabulary) plus a ``.json`` of facts. Files are written to a temporary name and
  ``os.replace``-d, so concurrent DDP ranks can race safely; later runs memory-map the ``.npy``.
* Fingerprint: sha256 over the tokenizer's name and, per split, its name, dtype, length and token bytes: the
  same documents give the same fingerprint wherever they lie or are cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from accrot.errors import DataError
from data_modules.split import document_fraction
from data_modules.tokenizer import ByteTokenizer, Tokenizer

log = logging.getLogger("data_modules.hf")  # the Hugging Face data module's one logger

BYTE_SEPARATOR = b"\n\n"
# Bump when the stream layout or the key changes: old cache files are then simply not found.
CACHE_VERSION = 1
FINGERPRINT_TAG = b"accrot/hf-streams/v1\0"
BATCH = 1024  # documents per batch when reading a split
TARGETS = ("train", "validation")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/accrot/streams``, else ``~/.cache/accrot/streams``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accrot" / "streams"


def stream_dtype(vocab_size: int) -> np.dtype:
    """The smallest integer dtype that holds every token id of the vocabulary."""
    for dtype in (np.uint8, np.uint16, np.int32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise DataError(f"vocabulary of {vocab_size} tokens does not fit int32; use a smaller tokenizer")


def separator_label(tokenizer: Tokenizer) -> str:
    """What joins two documents, as run records print it."""
    return BYTE_SEPARATOR.decode() if isinstance(tokenizer, ByteTokenizer) else f"eos id {tokenizer.eos_id}"


class StreamPacker:
    """Tokenises the documents of a dataset's splits into a train and a validation stream, counting them.

    Args:
        tokenizer: :class:`ByteTokenizer` or a Hugging Face tokenizer (``encode_batch``, ``eos_id``).
        column: the text column.
        val_fraction: a carved split's document i goes to validation iff ``document_fraction(i)`` is below it.
        label: how messages name a split (``'corpus.jsonl'``).
    """

    def __init__(self, tokenizer: Tokenizer, column: str, val_fraction: float, label: Callable[[str], str]) -> None:
        self.tokenizer, self.column, self.val_fraction, self.label = tokenizer, column, val_fraction, label
        self.dtype = stream_dtype(tokenizer.vocab_size)
        self.is_bytes = isinstance(tokenizer, ByteTokenizer)
        self.sep = np.frombuffer(BYTE_SEPARATOR, np.uint8) if self.is_bytes else np.array([tokenizer.eos_id])
        self.parts: dict[str, list[np.ndarray]] = {s: [] for s in TARGETS}
        self.stats = {s: {"documents": 0, "empty_documents": 0} for s in TARGETS}
        self.fractions: list[float] = []  # of the non-empty documents, when carving

    def read(self, ds, split: str, target: str | None) -> None:
        """Add the documents of ``ds`` (split ``split``) to stream ``target``; None = carve each one."""
        if ds.num_rows == 0:
            raise DataError(f"{self.label(split)} holds no documents; pass data with at least one document")
        pending: dict[str, list[str]] = {s: [] for s in TARGETS}
        missing, first_missing = 0, None
        for index, text in enumerate(self._documents(ds, split)):
            if text is None:  # a row without the column (JSON) or a null: counted as empty, and said once
                missing += 1
                first_missing = index if first_missing is None else first_missing
            self._route(index, text, target, pending)
        if missing:
            log.warning(f"accrot: warning: {missing} of {ds.num_rows} rows of {self.label(split)} have no "
                        f"'{self.column}' (row {first_missing} is the first); they are skipped as empty documents "
                        "(run.json counts them)")
        for to, texts in pending.items():
            if texts:
                self._add(to, texts)
        if target is not None and not self.parts[target]:
            raise DataError(
                f"all {ds.num_rows} documents of {self.label(split)} are empty (column '{self.column}'); "
                "pass data with non-empty documents"
            )

    def _documents(self, ds, split: str) -> Iterator[str | None]:
        """The ``column`` of one split, as Python strings (None for nulls)."""
        if self.column not in ds.column_names:
            raise DataError(
                f"column '{self.column}' is not in {self.label(split)}; columns: {', '.join(ds.column_names)}; "
                "pass column=<one of them>"
            )
        feature = ds.features[self.column]
        dtype = getattr(feature, "dtype", None)
        if dtype not in ("string", "large_string"):
            texts = [c for c, f in ds.features.items() if getattr(f, "dtype", None) in ("string", "large_string")]
            raise DataError(
                f"column '{self.column}' of {self.label(split)} holds {dtype or type(feature).__name__}, not text; "
                f"text columns: {', '.join(texts) or 'none'}"
            )
        for batch in ds.select_columns([self.column]).with_format("arrow").iter(batch_size=BATCH):
            yield from batch.column(self.column).to_pylist()

    def _route(self, index: int, text: str | None, target: str | None, pending: dict[str, list[str]]) -> None:
        """Count document ``index`` in its stream and queue it for tokenising unless it is empty."""
        to, f = target, 0.0
        if to is None:
            f = document_fraction(index)
            to = "validation" if f < self.val_fraction else "train"
        if not text:
            self.stats[to]["empty_documents"] += 1
            return
        if target is None:
            self.fractions.append(f)
        self.stats[to]["documents"] += 1
        pending[to].append(text)
        if len(pending[to]) >= BATCH:
            self._add(to, pending[to])
            pending[to] = []

    def _add(self, target: str, texts: list[str]) -> None:
        if self.is_bytes:
            encoded = [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]
        else:
            encoded = [np.asarray(ids, dtype=np.int64) for ids in self.tokenizer.encode_batch(texts)]
        for ids in encoded:
            if self.parts[target]:
                self.parts[target].append(self.sep)
            self.parts[target].append(ids)

    def streams(self) -> dict[str, np.ndarray]:
        """Stream name -> ``[N]`` token ids of :attr:`dtype`."""
        return {s: np.concatenate(p).astype(self.dtype, copy=False) for s, p in self.parts.items()}

    def fingerprint(self, streams: dict[str, np.ndarray]) -> str:
        """sha256 hex of the tokenizer's name and each stream's name, dtype, length and tokens."""
        h = hashlib.sha256(FINGERPRINT_TAG + self.tokenizer.name.encode() + b"\0")
        for s in TARGETS:
            h.update(f"{s}:{self.dtype.str}:{streams[s].size}\0".encode())
            h.update(streams[s].tobytes())
        return h.hexdigest()


# --- cache files ----------------------------------------------------------------------------------


def read_cache(npy: Path) -> tuple[np.ndarray, dict] | None:
    """The packed streams (memory-mapped) and their facts; None when absent or unreadable (then rebuilt)."""
    meta_file = npy.with_suffix(".json")
    if not (npy.is_file() and meta_file.is_file()):
        return None
    try:
        meta = json.loads(meta_file.read_text())
        array = np.load(npy, mmap_mode="c")  # copy-on-write map: writable for torch, never written back
        if meta.get("version") != CACHE_VERSION or array.ndim != 1 or array.size != sum(meta["lengths"]):
            raise ValueError("stale layout")
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("ignoring unreadable stream cache %s (%s); rebuilding it", npy, err)
        return None
    return array, meta


def write_cache(npy: Path, array: np.ndarray, meta: dict) -> None:
    """Write ``npy`` and its ``.json``, each atomically (a temporary file, then ``os.replace``)."""
    npy.parent.mkdir(parents=True, exist_ok=True)
    for target, write in (
        (npy, lambda f: np.save(f, array, allow_pickle=False)),
        (npy.with_suffix(".json"), lambda f: f.write(json.dumps(meta, indent=1).encode())),
    ):
        fd, tmp = tempfile.mkstemp(dir=npy.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)  # atomic: readers see the old file, or none, or the whole new one
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

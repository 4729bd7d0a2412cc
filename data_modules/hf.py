"""Hugging Face datasets as token streams: a hub name, or local text / JSONL / JSON / Parquet files.

:class:`HFDataModule` checks its source at construction (:mod:`data_modules.hf_source`) and packs it into
cached token streams on first use (:mod:`data_modules.hf_pack`).

* Validation: split ``val_split`` when the source has it; with ``val_split=None``, or when the source has
  nothing but ``train_split`` (one local file, a train-only hub dataset), documents of ``train_split`` are
  carved by their hashed index (:func:`data_modules.split.document_fraction`), never in both splits. Any other
  missing split is an error naming the ones there are.
* Cache key: the sha256 of the source's identity: path (resolved), hub config, splits, ``val_fraction``,
  column, tokenizer, and each local file's size and mtime, or each hub split's ``datasets`` fingerprint. The
  files live under ``cache_dir`` (default ``$XDG_CACHE_HOME/accrot/streams``, else ``~/.cache/accrot/streams``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from accrot.errors import DataError
from data_modules import hf_source
from data_modules.hf_pack import (
    CACHE_VERSION,
    StreamPacker,
    default_cache_dir,
    read_cache,
    separator_label,
    write_cache,
)
from data_modules.hf_source import LocalFiles, first_line, looks_local, resolve_local
from data_modules.split import DOCUMENT_SALT, check_both_splits, salt_label
from data_modules.streams import TokenStreamDataModule, TokenStreams
from data_modules.tokenizer import ByteTokenizer, Tokenizer

log = logging.getLogger(__name__)


# --- tokenizers -----------------------------------------------------------------------------------


class HFTokenizer:
    """A Hugging Face tokenizer behind the :class:`~data_modules.tokenizer.Tokenizer` protocol.

    ``vocab_size = len(tokenizer)`` (added tokens included); no special tokens are added inside a document,
    documents are separated by ``eos_id``.
    """

    def __init__(self, name: str, tokenizer) -> None:
        self.name, self.tokenizer = name, tokenizer
        self.vocab_size = len(tokenizer)
        eos = tokenizer.eos_token_id
        if eos is None:
            eos = getattr(tokenizer, "sep_token_id", None)
        if eos is None:
            raise DataError(
                f"tokenizer '{name}' has neither an eos nor a sep token to separate documents; "
                "use a tokenizer with an eos token or tokenizer='bytes'"
            )
        self.eos_id = int(eos)

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # verbose=False: no "sequence longer than model_max_length" warning; documents are cut by the windows
        out = self.tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False, verbose=False)
        return out["input_ids"]

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return self.tokenizer.decode(values)

    def identity(self) -> dict:
        """What the cache key needs to tell two tokenizers apart."""
        return {
            "name": self.name,
            "class": type(self.tokenizer).__name__,
            "name_or_path": str(getattr(self.tokenizer, "name_or_path", self.name)),
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
        }


def load_tokenizer(name: str) -> Tokenizer:
    """``"bytes"`` -> :class:`ByteTokenizer`; anything else -> a cached/local Hugging Face tokenizer.

    ``transformers`` loads it with ``local_files_only=True``: nothing is ever downloaded here.
    """
    if name == "bytes":
        return ByteTokenizer()
    if not name.strip():
        raise DataError("tokenizer='' is not valid; use 'bytes' or a Hugging Face tokenizer name or directory")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DataError(
            f"tokenizer '{name}' needs the transformers package, which is not installed; "
            "install it (pip install transformers) or use tokenizer='bytes'"
        ) from None
    try:
        tok = AutoTokenizer.from_pretrained(os.path.expanduser(name), local_files_only=True)
    except Exception as err:  # noqa: BLE001 - OSError / ValueError / HF errors all mean "not available here"
        raise DataError(
            f"tokenizer '{name}' is not cached locally ({type(err).__name__}: {first_line(err)}); "
            "pass tokenizer='bytes', a local tokenizer directory, or load it once online "
            f"(AutoTokenizer.from_pretrained('{name}'))"
        ) from None
    return HFTokenizer(name, tok)


def _tokenizer_identity(tokenizer: Tokenizer) -> dict:
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer.identity()
    return {"name": tokenizer.name, "vocab_size": tokenizer.vocab_size}


# --- the data module ------------------------------------------------------------------------------


class HFDataModule(TokenStreamDataModule):
    """A Hugging Face dataset (hub name or local text/JSONL/JSON/Parquet) as cached token streams.

    The source is resolved and checked at construction (local files listed; a hub name that is offline
    and not cached fails here, in well under 2 s); documents are read, tokenised and cached on first use.

    Args:
        path: hub dataset name (``wikitext``, ``Salesforce/wikitext``) or a local file, directory or glob.
        name: hub dataset config (``wikitext-2-raw-v1``); None = the dataset's default.
        train_split: split that provides the train stream.
        val_split: split that provides the validation stream; None = carve ``val_fraction`` of the documents
            of ``train_split`` (also done when the source holds no split but ``train_split``).
        val_fraction: expected fraction of documents carved into validation, in (0, 1).
        column: the text column (text files: always ``text``).
        tokenizer: ``bytes`` or a Hugging Face tokenizer name / local directory (cached only; needs transformers).
        cache_dir: where packed streams are cached; None = ``$XDG_CACHE_HOME/accrot/streams``
            (``~/.cache/accrot/streams``).
        **kwargs: seq_len, batch_size, num_workers, seed, val_blocks, max_train_tokens of
            :class:`TokenStreamDataModule`.
    """

    def __init__(
        self,
        path: str,
        name: str | None = None,
        train_split: str = "train",
        val_split: str | None = "validation",
        val_fraction: float = 0.05,
        column: str = "text",
        tokenizer: str = "bytes",
        cache_dir: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self._check_arguments(path, train_split, val_split, val_fraction, column)
        self.path, self.name = path, name
        self.train_split, self.val_split, self.val_fraction = train_split, val_split, float(val_fraction)
        self.column = column
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.tokenizer = load_tokenizer(tokenizer)
        self.local: LocalFiles | None = None
        self.offline: str | None = None
        self.cache_hit: bool | None = None  # set by load_streams: whether the packed streams were on disk
        self._cache_file: Path | None = None
        if looks_local(path):
            self.local = resolve_local(path)
            if name is not None:
                raise DataError(
                    f"name={name!r} is a hub dataset config but path '{path}' is local; drop name or pass a hub dataset"
                )
            if train_split not in self.local.splits:
                raise DataError(self._missing_split("train_split", train_split, sorted(self.local.splits)))
        else:
            self.offline = hf_source.hub_offline()
            if self.offline:
                self._hub_from_cache()  # not cached -> DataError now, before any run directory exists

    @staticmethod
    def _check_arguments(path, train_split, val_split, val_fraction, column) -> None:
        if not isinstance(path, str) or not path.strip():
            raise DataError(f"path={path!r} is not valid; pass a hub dataset name or a local file, directory or glob")
        if isinstance(val_fraction, bool) or not (isinstance(val_fraction, (int, float)) and 0.0 < val_fraction < 1.0):
            raise DataError(f"val_fraction={val_fraction!r} is not valid; use a number strictly between 0 and 1")
        for key, value in (("train_split", train_split), ("column", column)):
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"{key}={value!r} is not valid; pass a non-empty name")
        if val_split is not None and (not val_split.strip() or val_split == train_split):
            raise DataError(
                f"val_split={val_split!r} is not valid; name a split other than train_split={train_split!r}, "
                "or pass null to carve val_fraction of the train documents"
            )

    # --- sources ----------------------------------------------------------------------------------

    @property
    def source(self) -> str:
        return "local" if self.local is not None else "hub"

    def _missing_split(self, key: str, split: str, available: list[str]) -> str:
        valid = ", ".join(available)
        hint = "" if key == "train_split" else " or val_split=null to carve val_fraction of the train documents"
        return f"{key}={split!r} is not a split of '{self.path}'; splits: {valid}; pass one of them{hint}"

    def _hub_from_cache(self):
        return hf_source.hub_from_cache(self.path, self.name, self.offline)

    def _label(self, split: str) -> str:
        return self.local.label(split) if self.local is not None else f"'{self.path}' split '{split}'"

    # --- cache --------------------------------------------------------------------------------------

    def _key(self, source: dict) -> str:
        spec = {
            "version": CACHE_VERSION,
            "source": self.source,
            "path": str(self.local.base) if self.local else self.path,
            "name": self.name,
            "train_split": self.train_split,
            "val_split": self.val_split,
            "val_fraction": self.val_fraction,
            "column": self.column,
            "tokenizer": _tokenizer_identity(self.tokenizer),
            **source,
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()

    def _local_identity(self) -> dict:
        assert self.local is not None
        files = {}
        for split, paths in sorted(self.local.splits.items()):
            files[split] = []
            for p in paths:
                st = p.stat()
                files[split].append([str(p), st.st_size, st.st_mtime_ns])
        return {"format": self.local.format, "files": files}

    @property
    def cache_file(self) -> Path | None:
        """The ``.npy`` of the packed streams (set once the streams are loaded)."""
        return self._cache_file

    # --- streams ------------------------------------------------------------------------------------

    def load_streams(self) -> TokenStreams:
        with contextlib.ExitStack() as stack:
            if self.local is not None:
                npy = self.cache_dir / f"{self._key(self._local_identity())}.npy"
                cached = read_cache(npy)
                if cached is None:
                    self.cache_dir.mkdir(parents=True, exist_ok=True)
                    # datasets' Arrow copy of the files is only needed while packing
                    workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix=".datasets-", dir=self.cache_dir))
                    dd = hf_source.load_local(self.path, self.local, workdir)
            else:
                dd = self._hub_from_cache() if self.offline else hf_source.hub_online(self.path, self.name)
                prints = {split: getattr(ds, "_fingerprint", None) for split, ds in sorted(dd.items())}
                npy = self.cache_dir / f"{self._key({'fingerprints': prints})}.npy"
                cached = read_cache(npy)
            if cached is None:
                array, meta = self._pack(dd)
                write_cache(npy, array, meta)
                cached = (np.load(npy, mmap_mode="c"), meta)
                self.cache_hit = False
                log.info("packed %s into %s", self.path, npy)
            else:
                self.cache_hit = True
        array, meta = cached
        self._cache_file = npy
        n_train = meta["lengths"][0]
        stream = torch.from_numpy(array)  # [N_train + N_val], memory-mapped
        info = dict(meta["info"])
        info["cache"] = {"file": str(npy), "hit": self.cache_hit}
        return TokenStreams(stream[:n_train], stream[n_train:], fingerprint=meta["fingerprint"], info=info)

    def _splits_to_read(self, available: list[str]) -> tuple[str | None, str]:
        """(validation split or None = carve, a sentence saying where validation comes from)."""
        if self.train_split not in available:
            raise DataError(self._missing_split("train_split", self.train_split, available))
        if self.val_split is None:
            return None, "carved"
        if self.val_split in available:
            return self.val_split, f"split '{self.val_split}'"
        if available == [self.train_split]:
            log.info(
                "'%s' has no split '%s' (only '%s'); carving val_fraction=%g of its documents",
                self.path, self.val_split, self.train_split, self.val_fraction,
            )
            return None, "carved"
        raise DataError(self._missing_split("val_split", self.val_split, available))

    def _pack(self, dd) -> tuple[np.ndarray, dict]:
        """Tokenise and join the documents: ``[N_train + N_val]`` ids of the smallest dtype, and the facts."""
        available = sorted(dd.keys())
        val_split, origin = self._splits_to_read(available)
        packer = StreamPacker(self.tokenizer, self.column, self.val_fraction, self._label)
        if val_split is None:
            packer.read(dd[self.train_split], self.train_split, None)
            self._check_carved(packer)
        else:
            packer.read(dd[self.train_split], self.train_split, "train")
            packer.read(dd[val_split], val_split, "validation")
        streams = packer.streams()
        meta = {
            "version": CACHE_VERSION,
            "lengths": [int(streams["train"].size), int(streams["validation"].size)],
            "fingerprint": packer.fingerprint(streams),
            "info": self._info(packer, available, val_split, origin),
        }
        return np.concatenate([streams["train"], streams["validation"]]), meta

    def _info(self, packer: StreamPacker, available: list[str], val_split: str | None, origin: str) -> dict:
        """The facts of the packed streams that :meth:`describe` reports (source, files, splits, counts)."""
        splits = {s: dict(packer.stats[s]) for s in packer.parts}
        if self.local is not None:
            for s, split in (("train", self.train_split), ("validation", val_split)):
                if split is not None:
                    splits[s]["files"] = len(self.local.splits[split])
        splits["train"]["from"] = f"split '{self.train_split}'"
        splits["validation"]["from"] = (
            f"split '{val_split}'" if val_split else f"carved from split '{self.train_split}'"
        )
        info: dict = {"source": self.source, "column": self.column}
        if self.local is not None:
            files = [self.local.rel(p) for fs in self.local.splits.values() for p in fs]
            info.update(
                path=str(self.local.base) if len(files) > 1 else str(self.local.splits[self.train_split][0]),
                format=self.local.format,
                files=sorted(files)[:100],
                n_files=len(files),
                empty_files_skipped=len(self.local.empty),
                other_files_ignored=self.local.ignored,
            )
        else:
            info.update(dataset=self.path, config=self.name, available_splits=available)
        info.update(
            train_split=self.train_split,
            validation=origin if val_split else (
                f"carved: sha1(salt + document index) < val_fraction={self.val_fraction} of split "
                f"'{self.train_split}', salt {salt_label(DOCUMENT_SALT)}"
            ),
            separator=separator_label(self.tokenizer),
            stream_dtype=packer.dtype.name,
            splits=splits,
        )
        return info

    def _check_carved(self, packer: StreamPacker) -> None:
        """:class:`DataError` when carving left the train or the validation stream without documents."""
        where = self._label(self.train_split)
        if not packer.fractions:
            empty = sum(packer.stats[s]["empty_documents"] for s in ("train", "validation"))
            raise DataError(
                f"all {empty} documents of {where} are empty (column '{self.column}'); pass data with non-empty documents"
            )
        check_both_splits(packer.fractions, self.val_fraction, "documents", f"of {where}")

"""Hugging Face datasets as token streams: a hub name, or local text / JSONL / JSON / Parquet files (DESIGN §4).

* Source: ``path`` is local when it exists, starts with ``/ ./ ../ ~``, holds a glob character or ends in a data
  file extension; anything else is a hub name (``wikitext``, ``Salesforce/wikitext``). Local files are read with
  ``datasets.load_dataset("text" | "json" | "parquet", data_files=...)``; a ``.txt`` file is one document
  (``sample_by="document"``), a JSON/Parquet row is one document (its ``column``).
* Local splits: a single file is split ``train``. The files of a directory or glob are split by the keywords
  ``datasets`` uses in file names (``train``, ``validation``/``valid``/``dev``/``val``, ``test``/``eval``); when
  no file names a split, all of them are ``train``.
* Validation: split ``val_split`` when the source has it; with ``val_split=None``, or when the source has
  nothing but ``train_split`` (one local file, a train-only hub dataset), document i of ``train_split`` goes to
  validation iff ``sha1(salt + str(i))`` read as a fraction of 2⁶⁴ is below ``val_fraction``: independent of
  machine and seed, never in both splits. Any other missing split is an error naming the ones there are.
* Streams: the non-empty documents of a split in order, joined by a separator (bytes: ``"\\n\\n"``, a Hugging
  Face tokenizer: its eos id). Empty and null documents are skipped and counted.
* Offline (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set, or the hub's host unreachable within 1.5 s): a hub
  name is looked up only in the local ``datasets`` cache, with ``datasets``' own cache builder (no network
  call, no retries); not cached -> a one-line :class:`DataError` at construction.
* Cache: both streams as one ``.npy`` (train then validation; uint8 for bytes, else the smallest of uint16 /
  int32 that holds the vocabulary) plus a ``.json`` of facts, under ``cache_dir`` (default
  ``$XDG_CACHE_HOME/accrot/streams``, else ``~/.cache/accrot/streams``). The file name is the sha256 of the
  source's identity: path (resolved), hub config, splits, ``val_fraction``, column, tokenizer, and each local
  file's size and mtime, or each hub split's ``datasets`` fingerprint. Files are written to a temporary
  name and ``os.replace``-d (concurrent DDP ranks can race safely); later runs memory-map the ``.npy``.
* Fingerprint: sha256 over the tokenizer's name and, per split, its name, dtype, length and token bytes. It
  depends on content only: the same documents give the same fingerprint wherever they lie or are cached.
"""

from __future__ import annotations

import contextlib
import glob as globlib
import hashlib
import json
import logging
import math
import os
import re
import socket
import tempfile
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from data_modules.errors import DataError
from data_modules.streams import TokenStreamDataModule, TokenStreams
from data_modules.tokenizer import ByteTokenizer, Tokenizer

log = logging.getLogger(__name__)

FORMATS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# Suffixes that make a path that does not exist read as a (missing) local file rather than a hub name.
LOCAL_SUFFIXES = set(FORMATS) | {".csv", ".tsv", ".arrow", ".gz", ".bz2", ".xz", ".zst", ".zip", ".md", ".raw"}
# The split keywords of `datasets` (datasets.data_files.SPLIT_KEYWORDS), delimited by its non-word characters.
SPLIT_KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_SEP = r"[-._ 0-9/]"
_SPLIT_RE = {
    split: re.compile(rf"(?:^|{_SEP})(?:{'|'.join(words)})(?:{_SEP}|$)") for split, words in SPLIT_KEYWORDS.items()
}
BYTE_SEPARATOR = b"\n\n"
# Part of the carved split's definition: changing it reshuffles which documents are validation.
SPLIT_SALT = b"accrot/document-split/v1\0"
# Bump when the stream layout or the key changes: old cache files are then simply not found.
CACHE_VERSION = 1
FINGERPRINT_TAG = b"accrot/hf-streams/v1\0"
_TRUE = {"1", "ON", "YES", "TRUE"}
_BATCH = 1024  # documents per batch when reading a split


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/accrot/streams``, else ``~/.cache/accrot/streams``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accrot" / "streams"


def offline_reason() -> str | None:
    """``"HF_HUB_OFFLINE=1"`` when an offline variable is set to a true value, else None."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        value = os.environ.get(var, "")
        if value.upper() in _TRUE:
            return f"{var}={value}"
    return None


def network_problem(timeout: float = 1.5) -> str | None:
    """Why the Hugging Face hub (or the HTTPS proxy in front of it) cannot be reached; None when it answers.

    One TCP connection with a hard ``timeout`` (name resolution included, in a daemon thread), so an
    unplugged machine fails in seconds instead of waiting out ``datasets``' retries.
    """
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    target = urllib.parse.urlsplit(urllib.request.getproxies().get("https") or endpoint)
    host = target.hostname or "huggingface.co"
    port = target.port or (80 if target.scheme == "http" else 443)
    outcome: list[OSError | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(err)

    thread = threading.Thread(target=probe, daemon=True, name="accrot-hub-probe")
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"no network: {host}:{port} did not answer within {timeout:g} s"
    if outcome[0] is not None:
        return f"no network: cannot reach {host}:{port}"
    return None


def looks_local(path: str) -> bool:
    """Whether ``path`` names local files (see the module docstring) rather than a hub dataset."""
    if os.path.exists(os.path.expanduser(path)) or path.startswith(("/", "./", "../", "~", ".\\", "..\\")):
        return True
    if any(c in path for c in "*?["):
        return True
    return Path(path).suffix.lower() in LOCAL_SUFFIXES


def document_fraction(index: int) -> float:
    """Deterministic number in [0, 1) for a document index; validation iff it is below ``val_fraction``."""
    digest = hashlib.sha1(SPLIT_SALT + str(index).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_of(relpath: str) -> str | None:
    """The split a file's relative path names (``data/train-00000-of-00002.parquet`` -> train), or None."""
    stem = relpath[: -len(Path(relpath).suffix)] if Path(relpath).suffix else relpath
    stem = stem.lower()
    for split, pattern in _SPLIT_RE.items():
        if pattern.search(stem):
            return split
    return None


def stream_dtype(vocab_size: int) -> np.dtype:
    """The smallest integer dtype that holds every token id of the vocabulary."""
    for dtype in (np.uint8, np.uint16, np.int32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise DataError(f"vocabulary of {vocab_size} tokens does not fit int32; use a smaller tokenizer")


def _one_line(text: object) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return re.sub(r"\s+", " ", lines[0] if lines else "")[:300]


def _chain(err: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    e: BaseException | None = err
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


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
            f"tokenizer '{name}' is not cached locally ({type(err).__name__}: {_one_line(err)}); "
            "pass tokenizer='bytes', a local tokenizer directory, or load it once online "
            f"(AutoTokenizer.from_pretrained('{name}'))"
        ) from None
    return HFTokenizer(name, tok)


def _tokenizer_identity(tokenizer: Tokenizer) -> dict:
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer.identity()
    return {"name": tokenizer.name, "vocab_size": tokenizer.vocab_size}


# --- local files ----------------------------------------------------------------------------------


@dataclass
class LocalFiles:
    """The files of a local ``path``, grouped by split.

    Attributes:
        base: the directory file names are shown relative to.
        format: ``text``, ``json`` or ``parquet`` (the ``datasets`` builder).
        splits: split name -> sorted non-empty files.
        empty: empty files skipped.
        ignored: files of other extensions skipped in a directory or glob.
    """

    base: Path
    format: str
    splits: dict[str, list[Path]]
    empty: list[Path] = field(default_factory=list)
    ignored: int = 0

    def rel(self, p: Path) -> str:
        try:
            return p.relative_to(self.base).as_posix()
        except ValueError:
            return str(p)

    def label(self, split: str) -> str:
        """How messages name the files of a split: one file's name, or ``dir (N files)``."""
        files = self.splits[split]
        if len(files) == 1:
            return f"'{files[0].name}'"
        return f"'{self.base}' ({len(files)} {split} files)"


def _glob_base(pattern: str) -> Path:
    parts = Path(pattern).parts
    fixed = []
    for part in parts:
        if any(c in part for c in "*?["):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")


def resolve_local(path: str) -> LocalFiles:
    """List and group the files of a local ``path`` (file, directory or glob); :class:`DataError` if unusable."""
    expanded = os.path.expanduser(path)
    valid = ", ".join(sorted(FORMATS))
    if any(c in path for c in "*?[") and not os.path.exists(expanded):
        base = _glob_base(expanded).resolve()
        found = sorted(Path(p).resolve() for p in globlib.glob(expanded, recursive=True) if os.path.isfile(p))
        where = f"glob '{path}'"
        if not found:
            raise DataError(f"data path glob '{path}' matches no files; pass a file, a directory or a glob of {valid} files")
    elif os.path.isdir(expanded):
        base = Path(expanded).resolve()
        found = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            found += [Path(dirpath) / n for n in filenames if not n.startswith(".")]
        found.sort()
        where = f"directory '{path}'"
    elif os.path.isfile(expanded):
        file = Path(expanded).resolve()
        suffix = file.suffix.lower()
        if suffix not in FORMATS:
            raise DataError(
                f"data file '{path}' has unsupported extension '{suffix or '(none)'}'; use one of {valid}"
            )
        if file.stat().st_size == 0:
            raise DataError(f"data file '{path}' is empty; pass a file with at least one document")
        return LocalFiles(base=file.parent, format=FORMATS[suffix], splits={"train": [file]})
    else:
        raise DataError(
            f"data path '{path}' does not exist; pass an existing {valid} file, a directory or a glob of them, "
            "or a Hugging Face hub dataset name"
        )

    usable = [p for p in found if p.suffix.lower() in FORMATS]
    if not usable:
        raise DataError(f"{where} holds no {valid} files; pass a path with data files of those formats")
    formats = sorted({FORMATS[p.suffix.lower()] for p in usable})
    if len(formats) > 1:
        suffixes = ", ".join(sorted({p.suffix.lower() for p in usable}))
        raise DataError(f"{where} mixes formats ({suffixes}); point path at files of one format")
    files = LocalFiles(base=base, format=formats[0], splits={}, ignored=len(found) - len(usable))
    nonempty = [p for p in usable if p.stat().st_size > 0]
    files.empty = [p for p in usable if p.stat().st_size == 0]
    if not nonempty:
        raise DataError(f"all {len(usable)} data files of {where} are empty; pass files with documents")
    named = {p: split_of(files.rel(p)) for p in nonempty}
    unnamed = [p for p, s in named.items() if s is None]
    if len(unnamed) == len(nonempty):
        files.splits = {"train": nonempty}
    elif unnamed:
        examples = ", ".join(files.rel(p) for p in unnamed[:3])
        raise DataError(
            f"{where}: some files name a split (train/validation/test) and {len(unnamed)} do not ({examples}); "
            "name every file by its split or point path at the files of one split"
        )
    else:
        for p, s in named.items():
            files.splits.setdefault(s, []).append(p)
    return files


def _describe_bad_utf8(files: Sequence[Path], rel) -> str | None:
    """The first file that is not UTF-8, as ``file 'x' is not valid UTF-8 (byte 0x.. at offset N)``."""
    for p in files:
        data = p.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as err:
            return f"file '{rel(p)}' is not valid UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start})"
    return None


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No progress bars or info logs from ``datasets`` while it reads local files or its cache."""
    import datasets

    bars = datasets.is_progress_bar_enabled()
    verbosity = datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


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
        seq_len, batch_size, num_workers, seed, val_blocks, max_train_tokens: see :class:`TokenStreamDataModule`.
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
        seq_len: int = 128,
        batch_size: int = 16,
        num_workers: int = 0,
        seed: int = 0,
        val_blocks: int = 64,
        max_train_tokens: int | None = None,
    ) -> None:
        super().__init__(
            seq_len=seq_len,
            batch_size=batch_size,
            num_workers=num_workers,
            seed=seed,
            val_blocks=val_blocks,
            max_train_tokens=max_train_tokens,
        )
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
            self.offline = offline_reason() or network_problem()
            if self.offline:
                self._hub_from_cache()  # not cached -> DataError now, before any run directory exists

    # --- sources ----------------------------------------------------------------------------------

    @property
    def source(self) -> str:
        return "local" if self.local is not None else "hub"

    def _missing_split(self, key: str, split: str, available: list[str]) -> str:
        valid = ", ".join(available)
        hint = "" if key == "train_split" else " or val_split=null to carve val_fraction of the train documents"
        return f"{key}={split!r} is not a split of '{self.path}'; splits: {valid}; pass one of them{hint}"

    def _hub_from_cache(self):
        """The hub dataset from the local ``datasets`` cache only (``datasets``' own cache builder: no network)."""
        from datasets.packaged_modules.cache.cache import Cache

        with _quiet_datasets():
            try:
                builder = Cache(
                    repo_id=self.path,
                    dataset_name=self.path.split("/")[-1],
                    config_name=self.name,
                    version="auto",
                    hash="auto",
                )
                return builder.as_dataset()
            except Exception as err:  # noqa: BLE001 - any failure here means "not usable from the cache"
                cached = re.search(r"Available configs in the cache: \[(.*)\]", str(err))
                if self.name is not None and cached:
                    configs = cached.group(1).replace("'", "")
                    raise DataError(
                        f"dataset '{self.path}' config '{self.name}' is not available offline ({self.offline}) and "
                        f"is not cached; cached configs: {configs}; pass name=<one of them> or run once online"
                    ) from None
                raise DataError(
                    f"dataset '{self.path}' is not available offline ({self.offline}) and is not cached; "
                    "pass a local path (text/JSONL/Parquet) or run once online"
                ) from None

    def _hub_online(self):
        import datasets

        try:
            return datasets.load_dataset(self.path, self.name)
        except Exception as err:  # noqa: BLE001 - turned into one line naming the dataset
            kinds = {type(e).__name__ for e in _chain(err)}
            if kinds & {"ConnectionError", "OfflineModeIsEnabled", "ConnectError", "TimeoutException"}:
                raise DataError(
                    f"dataset '{self.path}' could not be downloaded ({_one_line(err)}); "
                    "pass a local path (text/JSONL/Parquet) or retry online"
                ) from None
            if "DatasetNotFoundError" in kinds:
                raise DataError(
                    f"dataset '{self.path}' is not on the Hugging Face hub or cannot be accessed; "
                    "check the name (e.g. 'Salesforce/wikitext') or pass a local path"
                ) from None
            raise DataError(f"dataset '{self.path}' (name={self.name!r}) cannot be loaded: {_one_line(err)}") from None

    def _load_local(self, workdir: str):
        import datasets
        import pyarrow as pa
        from datasets.exceptions import DatasetGenerationError

        assert self.local is not None
        local = self.local
        kwargs = {"sample_by": "document"} if local.format == "text" else {}
        data_files = {split: [str(p) for p in files] for split, files in local.splits.items()}
        with _quiet_datasets():
            try:
                return datasets.load_dataset(local.format, data_files=data_files, cache_dir=workdir, **kwargs)
            except (DatasetGenerationError, pa.ArrowException, ValueError, OSError, StopIteration) as err:
                # what datasets raises for a file it cannot parse; anything else is a bug and propagates
                if any(isinstance(e, UnicodeDecodeError) for e in _chain(err)):
                    bad = _describe_bad_utf8([p for fs in local.splits.values() for p in fs], local.rel)
                    if bad:
                        raise DataError(f"{bad}; convert it to UTF-8 (e.g. iconv -t utf-8) or remove it") from None
                root = _chain(err)[-1]
                raise DataError(
                    f"cannot read '{self.path}' as {local.format} ({type(root).__name__}: {_one_line(root)}); "
                    f"pass valid {', '.join(k for k, v in FORMATS.items() if v == local.format)} files"
                ) from None

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

    def _read_cache(self, npy: Path) -> tuple[np.ndarray, dict] | None:
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

    def _write_cache(self, npy: Path, array: np.ndarray, meta: dict) -> None:
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

    # --- streams ------------------------------------------------------------------------------------

    def load_streams(self) -> TokenStreams:
        with contextlib.ExitStack() as stack:
            if self.local is not None:
                npy = self.cache_dir / f"{self._key(self._local_identity())}.npy"
                cached = self._read_cache(npy)
                if cached is None:
                    self.cache_dir.mkdir(parents=True, exist_ok=True)
                    # datasets' Arrow copy of the files is only needed while packing
                    workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix=".datasets-", dir=self.cache_dir))
                    dd = self._load_local(workdir)
            else:
                dd = self._hub_from_cache() if self.offline else self._hub_online()
                prints = {split: getattr(ds, "_fingerprint", None) for split, ds in sorted(dd.items())}
                npy = self.cache_dir / f"{self._key({'fingerprints': prints})}.npy"
                cached = self._read_cache(npy)
            if cached is None:
                array, meta = self._pack(dd)
                self._write_cache(npy, array, meta)
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

    def _label(self, split: str) -> str:
        return self.local.label(split) if self.local is not None else f"'{self.path}' split '{split}'"

    def _documents(self, ds, split: str) -> Iterator[str | None]:
        """The ``column`` of one split, as Python strings (None for nulls)."""
        if self.column not in ds.column_names:
            raise DataError(
                f"column '{self.column}' is not in {self._label(split)}; columns: {', '.join(ds.column_names)}; "
                "pass column=<one of them>"
            )
        feature = ds.features[self.column]
        dtype = getattr(feature, "dtype", None)
        if dtype not in ("string", "large_string"):
            texts = [c for c, f in ds.features.items() if getattr(f, "dtype", None) in ("string", "large_string")]
            raise DataError(
                f"column '{self.column}' of {self._label(split)} holds {dtype or type(feature).__name__}, not text; "
                f"text columns: {', '.join(texts) or 'none'}"
            )
        for batch in ds.select_columns([self.column]).with_format("arrow").iter(batch_size=_BATCH):
            yield from batch.column(self.column).to_pylist()

    def _pack(self, dd) -> tuple[np.ndarray, dict]:
        """Tokenise and join the documents: ``[N_train + N_val]`` ids of the smallest dtype, and the facts."""
        available = sorted(dd.keys())
        val_split, origin = self._splits_to_read(available)
        tok = self.tokenizer
        dtype = stream_dtype(tok.vocab_size)
        sep = np.frombuffer(BYTE_SEPARATOR, np.uint8) if isinstance(tok, ByteTokenizer) else np.array([tok.eos_id])
        parts: dict[str, list[np.ndarray]] = {"train": [], "validation": []}
        stats = {s: {"documents": 0, "empty_documents": 0} for s in parts}
        fractions: list[float] = []  # of the non-empty documents, when carving

        def add(target: str, texts: list[str]) -> None:
            if isinstance(tok, ByteTokenizer):
                encoded = [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]
            else:
                encoded = [np.asarray(ids, dtype=np.int64) for ids in tok.encode_batch(texts)]
            for ids in encoded:
                if parts[target]:
                    parts[target].append(sep)
                parts[target].append(ids)

        reads = [(self.train_split, None)] if val_split is None else [(self.train_split, "train"), (val_split, "validation")]
        for split, target in reads:
            ds = dd[split]
            if ds.num_rows == 0:
                raise DataError(f"{self._label(split)} holds no documents; pass data with at least one document")
            pending: dict[str, list[str]] = {"train": [], "validation": []}
            missing, first_missing = 0, None
            for index, text in enumerate(self._documents(ds, split)):
                if text is None:  # a row without the column (JSON) or a null: counted as empty, and said once
                    missing += 1
                    first_missing = index if first_missing is None else first_missing
                to, f = target, 0.0
                if to is None:
                    f = document_fraction(index)
                    to = "validation" if f < self.val_fraction else "train"
                if not text:
                    stats[to]["empty_documents"] += 1
                    continue
                if target is None:
                    fractions.append(f)
                stats[to]["documents"] += 1
                pending[to].append(text)
                if len(pending[to]) >= _BATCH:
                    add(to, pending[to])
                    pending[to] = []
            if missing:
                log.warning(f"accrot: warning: {missing} of {ds.num_rows} rows of {self._label(split)} have no "
                            f"'{self.column}' (row {first_missing} is the first); they are skipped as empty documents "
                            "(run.json counts them)")
            for to, texts in pending.items():
                if texts:
                    add(to, texts)
            if target is not None and not parts[target]:
                raise DataError(
                    f"all {ds.num_rows} documents of {self._label(split)} are empty (column '{self.column}'); "
                    "pass data with non-empty documents"
                )
        if val_split is None:
            self._check_carved(stats, fractions)
        streams = {s: np.concatenate(p).astype(dtype, copy=False) for s, p in parts.items()}
        h = hashlib.sha256(FINGERPRINT_TAG + tok.name.encode() + b"\0")
        for s in ("train", "validation"):
            h.update(f"{s}:{dtype.str}:{streams[s].size}\0".encode())
            h.update(streams[s].tobytes())
        splits = {s: dict(stats[s]) for s in parts}
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
                f"'{self.train_split}', salt {SPLIT_SALT.decode().rstrip(chr(0))}"
            ),
            separator=BYTE_SEPARATOR.decode() if isinstance(tok, ByteTokenizer) else f"eos id {tok.eos_id}",
            stream_dtype=dtype.name,
            splits=splits,
        )
        meta = {
            "version": CACHE_VERSION,
            "lengths": [int(streams["train"].size), int(streams["validation"].size)],
            "fingerprint": h.hexdigest(),
            "info": info,
        }
        return np.concatenate([streams["train"], streams["validation"]]), meta

    def _check_carved(self, stats: dict, fractions: list[float]) -> None:
        n = len(fractions)
        where = self._label(self.train_split)
        if n == 0:
            raise DataError(
                f"all {stats['train']['empty_documents'] + stats['validation']['empty_documents']} documents of "
                f"{where} are empty (column '{self.column}'); pass data with non-empty documents"
            )
        if stats["validation"]["documents"] == 0:
            lowest = math.floor(min(fractions) * 1e4) / 1e4 + 1e-4
            raise DataError(
                f"val_fraction={self.val_fraction} puts none of the {n} documents of {where} in the validation "
                f"split; use val_fraction >= {lowest:.4f} or more documents"
            )
        if stats["train"]["documents"] == 0:
            highest = math.floor(max(fractions) * 1e4) / 1e4
            raise DataError(
                f"val_fraction={self.val_fraction} puts all {n} documents of {where} in the validation split; "
                f"use val_fraction <= {highest:.4f} or more documents"
            )

"""Where :class:`~data_modules.hf.HFDataModule`'s documents come from: local files or a hub dataset, read with
``datasets``. Every way a source can be unusable becomes one :class:`DataError` line.

* Local or hub: ``path`` is local when it exists, starts with ``/ ./ ../ ~``, holds a glob character or ends
  in a data file extension; anything else is a hub name (``wikitext``, ``Salesforce/wikitext``).
* Local files are read with ``datasets.load_dataset("text" | "json" | "parquet", data_files=...)``; a ``.txt``
  file is one document (``sample_by="document"``), a JSON/Parquet row is one document.
* Local splits: a single file is split ``train``. The files of a directory or glob are split by ``datasets``' own
  patterns (:mod:`datasets.data_files`, matched as its file resolution matches them): the hub's
  ``data/{split}-00000-of-00001.*`` shards, then a directory named by a split keyword (``train``,
  ``validation``/``valid``/``dev``/``val``, ``test``/``eval``, …), then such a keyword in the file name; when no
  file names a split, all of them are ``train``.
* Offline (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set, or the hub's host unreachable within 1.5 s): a
  hub name is looked up only in the local ``datasets`` cache, with ``datasets``' own cache builder (no network
  call, no retries), so a machine without network fails in seconds.
"""

from __future__ import annotations

import contextlib
import functools
import glob as globlib
import os
import re
import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from accrot.errors import DataError

FORMATS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
VALID_FORMATS = ", ".join(sorted(FORMATS))
# Suffixes that make a path that does not exist read as a (missing) local file rather than a hub name.
LOCAL_SUFFIXES = set(FORMATS) | {".csv", ".tsv", ".arrow", ".gz", ".bz2", ".xz", ".zst", ".zip", ".md", ".raw"}
_TRUE = {"1", "ON", "YES", "TRUE"}
_GLOB_CHARS = "*?["


def first_line(text: object) -> str:
    """The first non-blank line of ``text``, whitespace collapsed, at most 300 characters."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return re.sub(r"\s+", " ", lines[0] if lines else "")[:300]


def error_chain(err: BaseException) -> list[BaseException]:
    """``err`` and its causes / contexts, outermost first."""
    chain: list[BaseException] = []
    e: BaseException | None = err
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


# --- local or hub, online or offline --------------------------------------------------------------


def looks_local(path: str) -> bool:
    """Whether ``path`` names local files (see the module docstring) rather than a hub dataset."""
    if os.path.exists(os.path.expanduser(path)) or path.startswith(("/", "./", "../", "~", ".\\", "..\\")):
        return True
    if any(c in path for c in _GLOB_CHARS):
        return True
    return Path(path).suffix.lower() in LOCAL_SUFFIXES


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


def hub_offline() -> str | None:
    """Why the hub cannot be used (an offline variable, no network), or None when it can."""
    return offline_reason() or network_problem()


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


@functools.cache
def _split_patterns() -> tuple[re.Pattern[str], list[tuple[str, re.Pattern[str]]]]:
    """``datasets``' sharded-file pattern and its (split, pattern) list in the order it tries them (directory names,
    then file names; train, validation, test), each a regex from fsspec's glob translation, the one its file
    resolution (an fsspec glob) matches paths with, so a file is named by a split exactly when ``datasets`` would
    find it under that split's pattern."""
    from datasets.data_files import (
        DEFAULT_PATTERNS_SPLIT_IN_DIR_NAME,
        DEFAULT_PATTERNS_SPLIT_IN_FILENAME,
        SPLIT_PATTERN_SHARDED,
    )
    from fsspec.utils import glob_translate

    sharded = re.compile(glob_translate(SPLIT_PATTERN_SHARDED.replace("{split}", "*")))
    keywords = [
        (str(split), re.compile(glob_translate(pattern)))
        for group in (DEFAULT_PATTERNS_SPLIT_IN_DIR_NAME, DEFAULT_PATTERNS_SPLIT_IN_FILENAME)
        for split, patterns in group.items()
        for pattern in patterns
    ]
    return sharded, keywords


def split_of(relpath: str) -> str | None:
    """The split a file's relative posix path names (``data/train-00000-of-00002.parquet`` -> train), or None.

    Per file rather than per directory as ``datasets`` decides, so that a file naming no split is reported instead
    of silently dropped; a file that two splits' patterns match goes to the first only (no document in two splits).
    """
    import datasets
    from datasets.data_files import SPLIT_PATTERN_SHARDED
    from datasets.utils.py_utils import string_to_dict

    sharded, keywords = _split_patterns()
    if sharded.match(relpath):  # the hub's layout names any split: data/<split>-00000-of-00002.parquet
        parts = string_to_dict(relpath.rsplit("/", 1)[-1], SPLIT_PATTERN_SHARDED.rsplit("/", 1)[-1])
        if parts:
            with contextlib.suppress(ValueError):  # a name datasets refuses for a split names no split
                return str(datasets.NamedSplit(parts["split"]))
    return next((split for split, pattern in keywords if pattern.match(relpath)), None)


def _glob_base(pattern: str) -> Path:
    parts = Path(pattern).parts
    fixed = []
    for part in parts:
        if any(c in part for c in _GLOB_CHARS):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")


def _list_glob(path: str, expanded: str) -> tuple[Path, list[Path], str]:
    """(base, sorted files, how messages name it) of a glob; :class:`DataError` when it matches nothing."""
    base = _glob_base(expanded).resolve()
    found = sorted(Path(p).resolve() for p in globlib.glob(expanded, recursive=True) if os.path.isfile(p))
    if not found:
        raise DataError(
            f"data path glob '{path}' matches no files; pass a file, a directory or a glob of {VALID_FORMATS} files"
        )
    return base, found, f"glob '{path}'"


def _list_directory(path: str, expanded: str) -> tuple[Path, list[Path], str]:
    """(base, sorted files, how messages name it) of a directory; hidden files and directories are skipped."""
    base = Path(expanded).resolve()
    found = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [Path(dirpath) / n for n in filenames if not n.startswith(".")]
    found.sort()
    return base, found, f"directory '{path}'"


def _single_file(path: str, expanded: str) -> LocalFiles:
    """One data file: split ``train``; :class:`DataError` for another extension or an empty file."""
    file = Path(expanded).resolve()
    suffix = file.suffix.lower()
    if suffix not in FORMATS:
        raise DataError(
            f"data file '{path}' has unsupported extension '{suffix or '(none)'}'; use one of {VALID_FORMATS}"
        )
    if file.stat().st_size == 0:
        raise DataError(f"data file '{path}' is empty; pass a file with at least one document")
    return LocalFiles(base=file.parent, format=FORMATS[suffix], splits={"train": [file]})


def _one_format(usable: list[Path], where: str) -> str:
    """The ``datasets`` builder of the data files; :class:`DataError` for none or a mix of formats."""
    if not usable:
        raise DataError(f"{where} holds no {VALID_FORMATS} files; pass a path with data files of those formats")
    formats = sorted({FORMATS[p.suffix.lower()] for p in usable})
    if len(formats) > 1:
        suffixes = ", ".join(sorted({p.suffix.lower() for p in usable}))
        raise DataError(f"{where} mixes formats ({suffixes}); point path at files of one format")
    return formats[0]


def _group_by_split(files: LocalFiles, nonempty: list[Path], where: str) -> dict[str, list[Path]]:
    """Split name -> files: by the split each file name names, or all ``train`` when none names one."""
    named = {p: split_of(files.rel(p)) for p in nonempty}
    unnamed = [p for p, s in named.items() if s is None]
    if len(unnamed) == len(nonempty):
        return {"train": nonempty}
    if unnamed:
        examples = ", ".join(files.rel(p) for p in unnamed[:3])
        raise DataError(
            f"{where}: some files name a split (train/validation/test) and {len(unnamed)} do not ({examples}); "
            "name every file by its split or point path at the files of one split"
        )
    splits: dict[str, list[Path]] = {}
    for p, s in named.items():
        splits.setdefault(s, []).append(p)
    return splits


def resolve_local(path: str) -> LocalFiles:
    """List and group the files of a local ``path`` (file, directory or glob); :class:`DataError` if unusable."""
    expanded = os.path.expanduser(path)
    if any(c in path for c in _GLOB_CHARS) and not os.path.exists(expanded):
        base, found, where = _list_glob(path, expanded)
    elif os.path.isdir(expanded):
        base, found, where = _list_directory(path, expanded)
    elif os.path.isfile(expanded):
        return _single_file(path, expanded)
    else:
        raise DataError(
            f"data path '{path}' does not exist; pass an existing {VALID_FORMATS} file, a directory or a glob of "
            "them, or a Hugging Face hub dataset name"
        )
    usable = [p for p in found if p.suffix.lower() in FORMATS]
    files = LocalFiles(base=base, format=_one_format(usable, where), splits={}, ignored=len(found) - len(usable))
    nonempty = [p for p in usable if p.stat().st_size > 0]
    files.empty = [p for p in usable if p.stat().st_size == 0]
    if not nonempty:
        raise DataError(f"all {len(usable)} data files of {where} are empty; pass files with documents")
    files.splits = _group_by_split(files, nonempty, where)
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


# --- reading with datasets ------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
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


def load_local(path: str, local: LocalFiles, workdir: str):
    """The ``DatasetDict`` of local files (``datasets``' Arrow copy goes to ``workdir``)."""
    import datasets
    import pyarrow as pa
    from datasets.exceptions import DatasetGenerationError

    kwargs = {"sample_by": "document"} if local.format == "text" else {}
    data_files = {split: [str(p) for p in files] for split, files in local.splits.items()}
    with quiet_datasets():
        try:
            return datasets.load_dataset(local.format, data_files=data_files, cache_dir=workdir, **kwargs)
        except (DatasetGenerationError, pa.ArrowException, ValueError, OSError, StopIteration) as err:
            # what datasets raises for a file it cannot parse; anything else is a bug and propagates
            if any(isinstance(e, UnicodeDecodeError) for e in error_chain(err)):
                bad = _describe_bad_utf8([p for fs in local.splits.values() for p in fs], local.rel)
                if bad:
                    raise DataError(f"{bad}; convert it to UTF-8 (e.g. iconv -t utf-8) or remove it") from None
            root = error_chain(err)[-1]
            raise DataError(
                f"cannot read '{path}' as {local.format} ({type(root).__name__}: {first_line(root)}); "
                f"pass valid {', '.join(k for k, v in FORMATS.items() if v == local.format)} files"
            ) from None


def hub_from_cache(path: str, name: str | None, offline: str | None):
    """The hub dataset from the local ``datasets`` cache only (``datasets``' own cache builder: no network).

    ``offline`` (why the hub is not used) goes into the message when the dataset is not cached.
    """
    from datasets.packaged_modules.cache.cache import Cache

    with quiet_datasets():
        try:
            builder = Cache(
                repo_id=path,
                dataset_name=path.split("/")[-1],
                config_name=name,
                version="auto",
                hash="auto",
            )
            return builder.as_dataset()
        except Exception as err:  # noqa: BLE001 - any failure here means "not usable from the cache"
            cached = re.search(r"Available configs in the cache: \[(.*)\]", str(err))
            if name is not None and cached:
                configs = cached.group(1).replace("'", "")
                raise DataError(
                    f"dataset '{path}' config '{name}' is not available offline ({offline}) and "
                    f"is not cached; cached configs: {configs}; pass name=<one of them> or run once online"
                ) from None
            raise DataError(
                f"dataset '{path}' is not available offline ({offline}) and is not cached; "
                "pass a local path (text/JSONL/Parquet) or run once online"
            ) from None


def hub_online(path: str, name: str | None):
    """The hub dataset through ``datasets.load_dataset`` (downloads it unless cached)."""
    import datasets

    try:
        return datasets.load_dataset(path, name)
    except Exception as err:  # noqa: BLE001 - turned into one line naming the dataset
        kinds = {type(e).__name__ for e in error_chain(err)}
        if kinds & {"ConnectionError", "OfflineModeIsEnabled", "ConnectError", "TimeoutException"}:
            raise DataError(
                f"dataset '{path}' could not be downloaded ({first_line(err)}); "
                "pass a local path (text/JSONL/Parquet) or retry online"
            ) from None
        if "DatasetNotFoundError" in kinds:
            raise DataError(
                f"dataset '{path}' is not on the Hugging Face hub or cannot be accessed; "
                "check the name (e.g. 'Salesforce/wikitext') or pass a local path"
            ) from None
        raise DataError(f"dataset '{path}' (name={name!r}) cannot be loaded: {first_line(err)}") from None

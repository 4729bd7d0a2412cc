"""The embedded default corpus: the running interpreter's standard-library sources, as bytes.

About 11 MB of real Python with long-range structure (imports, definitions used hundreds of lines later),
present wherever the code runs, so nothing is downloaded. ``root`` points the same machinery at any other
directory of text files.

* Files: ``glob`` (``**`` = any number of directories) over ``root``, relative paths with ``/``; directories
  named in ``exclude_dirs`` and hidden directories (``.git``) are pruned. For the stdlib the default prunes
  ``site-packages``, ``dist-packages``, ``test``/``tests`` (this covers lib2to3's tests), ``idlelib`` and
  ``__pycache__``. Empty files (many ``__init__.py``) are skipped and counted.
* Split: a file goes to validation iff the hashed fraction of its relative path is below ``val_fraction``
  (:mod:`data_modules.split`): independent of listing order, machine and seed, never both splits.
* Streams: the files of a split in sorted order of relative path, their raw bytes joined by ``"\\n\\n"``.
  Bytes are read as they are: the tokenizer is bytes, so no file is decoded and a non-UTF-8 file costs
  nothing (the stdlib of 3.11 is all UTF-8).
* Fingerprint: sha256 over each split's name and, per file in order, relative path, length and content.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from fnmatch import fnmatchcase
from pathlib import Path

from accrot.errors import DataError
from data_modules.split import FILE_SALT, check_both_splits, file_fraction, salt_label
from data_modules.streams import TokenStreamDataModule, TokenStreams
from data_modules.tokenizer import ByteTokenizer

STDLIB_EXCLUDE_DIRS = ("site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__")
DEFAULT_EXCLUDE_DIRS = ("__pycache__",)
SEPARATOR = b"\n\n"


def stdlib_root() -> Path:
    """Directory of the running interpreter's standard library (the base interpreter's, inside a venv)."""
    return Path(sysconfig.get_paths()["stdlib"])


def glob_match(relpath: str, pattern: str) -> bool:
    """``relpath`` (``/``-separated) matches ``pattern``: ``**`` spans zero or more directories, other
    components match one name with :func:`fnmatch.fnmatchcase` (``*``, ``?``, ``[...]``)."""
    parts = relpath.split("/")
    pat = [p for p in pattern.split("/") if p not in ("", ".")]

    def match(i: int, j: int) -> bool:
        if j == len(pat):
            return i == len(parts)
        if pat[j] == "**":
            return any(match(k, j + 1) for k in range(i, len(parts) + 1))
        return i < len(parts) and fnmatchcase(parts[i], pat[j]) and match(i + 1, j + 1)

    return match(0, 0)


def list_files(root: Path, pattern: str, exclude_dirs: tuple[str, ...]) -> list[tuple[str, int]]:
    """Sorted ``(relative path, size in bytes)`` of the files under ``root`` matching ``pattern``."""
    excluded = set(exclude_dirs)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in excluded and not d.startswith(".")]
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if glob_match(rel, pattern):
                path = os.path.join(dirpath, name)
                if os.path.isfile(path):
                    found.append((rel, os.path.getsize(path)))
    return sorted(found)


class StdlibDataModule(TokenStreamDataModule):
    """The default corpus: Python stdlib sources (or ``root``'s text files) as byte streams, split by file.

    Files are listed and split at construction, so a bad ``root``/``glob``/``val_fraction`` fails before any
    run directory exists; contents are read on first use (about 0.1 s for the stdlib) and kept in memory.

    Args:
        root: directory of text files; None = the running interpreter's standard library.
        glob: which files under ``root``, relative (``**`` = any depth).
        val_fraction: expected fraction of files in the validation split, in (0, 1).
        exclude_dirs: directory names pruned at any depth; None = the stdlib list for the stdlib,
            ``__pycache__`` otherwise. Hidden directories are always pruned.
        **kwargs: seq_len, batch_size, num_workers, seed, val_blocks, max_train_tokens of
            :class:`TokenStreamDataModule`.
    """

    def __init__(
        self,
        root: str | None = None,
        glob: str = "**/*.py",
        val_fraction: float = 0.05,
        exclude_dirs: list[str] | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if not (isinstance(val_fraction, (int, float)) and 0.0 < val_fraction < 1.0):
            raise DataError(
                f"val_fraction={val_fraction!r} is not valid; use a number strictly between 0 and 1"
            )
        if not glob.strip():
            raise DataError(f"glob={glob!r} is not valid; pass a pattern relative to root, e.g. '**/*.py'")
        self.source = "stdlib" if root is None else "directory"
        self.root = stdlib_root() if root is None else Path(root).expanduser()
        if not self.root.exists():
            raise DataError(
                f"data root '{self.root}' does not exist; pass an existing directory of text files"
            )
        if not self.root.is_dir():
            raise DataError(
                f"data root '{self.root}' is not a directory; pass an existing directory of text files"
            )
        self.glob, self.val_fraction = glob, float(val_fraction)
        if exclude_dirs is None:
            exclude_dirs = STDLIB_EXCLUDE_DIRS if root is None else DEFAULT_EXCLUDE_DIRS
        self.exclude_dirs = tuple(exclude_dirs)
        self.tokenizer = ByteTokenizer()
        self.train_files, self.val_files, self.empty_files = self._split_files()

    def _split_files(self) -> tuple[list[str], list[str], int]:
        files = list_files(self.root, self.glob, self.exclude_dirs)
        where = f"under '{self.root}'"
        if not files:
            raise DataError(
                f"no files {where} match glob '{self.glob}'; pass a glob that matches text files, e.g. '**/*.txt'"
            )
        names = [rel for rel, size in files if size > 0]
        if not names:
            raise DataError(
                f"all {len(files)} files {where} matching '{self.glob}' are empty; pass a directory of non-empty text files"
            )
        fractions = {rel: file_fraction(rel) for rel in names}
        check_both_splits(list(fractions.values()), self.val_fraction, "files", where)
        val = [rel for rel in names if fractions[rel] < self.val_fraction]
        train = [rel for rel in names if fractions[rel] >= self.val_fraction]
        return train, val, len(files) - len(names)

    def load_streams(self) -> TokenStreams:
        h = hashlib.sha256()
        streams, splits = {}, {}
        for split, names in (("train", self.train_files), ("validation", self.val_files)):
            h.update(split.encode() + b"\0")
            buf = bytearray()
            for i, rel in enumerate(names):
                path = self.root / rel
                try:
                    data = path.read_bytes()
                except OSError as err:
                    raise DataError(
                        f"cannot read '{path}' ({err.strerror}); pass a directory of readable text files"
                    ) from None
                h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + len(data).to_bytes(8, "little"))
                h.update(data)
                if i:
                    buf += SEPARATOR
                buf += data
            streams[split] = self.tokenizer.encode_bytes(buf)  # [N] uint8
            splits[split] = {"files": len(names), "bytes": len(buf)}
        info = {
            "source": self.source,
            "root": str(self.root),
            "glob": self.glob,
            "exclude_dirs": list(self.exclude_dirs),
            "val_fraction": self.val_fraction,
            "split": "sha1(salt + relative path) < val_fraction, salt " + salt_label(FILE_SALT),
            "separator": SEPARATOR.decode(),
            "empty_files_skipped": self.empty_files,
            "splits": splits,
        }
        if self.source == "stdlib":
            info["python"] = platform.python_version()
        return TokenStreams(streams["train"], streams["validation"], fingerprint=h.hexdigest(), info=info)

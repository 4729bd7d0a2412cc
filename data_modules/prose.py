"""Prose without a download: the King James Bible as Debian's ``bible-kjv`` package prints it, as bytes.

Why this text. The embedded corpus is code, whose long-range structure is lexical (a name defined here is used
there). A study of extrapolation also needs narrative prose, where what is far away matters through people,
places and events rather than identifiers: 4.4 MB of it, in 1189 chapters of 66 books, that any Debian or
Ubuntu machine installs from its package mirror (``apt-get install bible-kjv``) and that no run downloads.
The other packaged text we considered, ``python3.11-doc``'s 11 MB of reStructuredText, is mostly about
code, markup and tables: too close to the corpus it is meant to contrast with.

* Text: ``bible -f Gen1:1-Rev22:21`` prints one verse per line, ``Ge1:1 In the beginning ...``. The
  reference before the first space is dropped and a chapter's verses are joined by single spaces, so a
  chapter reads as one paragraph of running text with no numbers in it.
* Documents and split: a chapter is a document named ``<book>/<chapter>`` (``Ge/1``); it goes to validation iff
  its hashed fraction is below ``val_fraction`` (:mod:`data_modules.split`, the stdlib corpus's salt and rule):
  independent of order, machine and seed, never in both splits.
* Streams: the chapters of a split in canonical order (Genesis to Revelation), joined
  by ``"\\n\\n"``, as bytes (the text is ASCII).
* Fingerprint: sha256 over each split's name and, per chapter in order, its name, length and content; the
  package's version is recorded beside it.

A folder of your own ``.txt`` files needs no new code: ``StdlibDataModule(root=DIR, glob="**/*.txt")`` splits
them by file the same way (data_modules/README.md, "Your own text").
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess

from accrot.errors import DataError
from data_modules.split import FILE_SALT, check_both_splits, file_fraction, salt_label
from data_modules.stdlib import SEPARATOR
from data_modules.streams import TokenStreamDataModule, TokenStreams
from data_modules.tokenizer import ByteTokenizer

PACKAGE = "bible-kjv"
COMMAND = ("bible", "-f", "Gen1:1-Rev22:21")
_VERSE = re.compile(r"^(?P<book>\d?[A-Za-z]+)(?P<chapter>\d+):(?P<verse>\d+) (?P<text>.*)$")
INSTALL = f"install Debian's {PACKAGE} package (apt-get install {PACKAGE}), which provides `bible`"


def require_program(program: str = "bible") -> str:
    """The path of ``bible``, or a one-line :class:`DataError` that names the package to install."""
    found = shutil.which(program)
    if found is None:
        raise DataError(f"the prose corpus needs `{program}`, which is not installed; {INSTALL}")
    return found


def _run(program: str) -> str:
    try:
        out = subprocess.run([program, *COMMAND[1:]], capture_output=True, check=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as err:
        raise DataError(f"`{' '.join(COMMAND)}` failed ({type(err).__name__}); reinstall it: {INSTALL}") from None
    try:
        return out.stdout.decode("ascii")
    except UnicodeDecodeError:
        raise DataError(f"`{' '.join(COMMAND)}` printed non-ASCII text; reinstall it: {INSTALL}") from None


def kjv_chapters(text: str) -> list[tuple[str, str]]:
    """``[(name, chapter text)]`` in canonical order from ``bible -f``'s output (one ``Ref text`` line per verse)."""
    chapters: dict[str, list[str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _VERSE.match(line)
        if m is None:
            raise DataError(f"line {number} of `{' '.join(COMMAND)}` is not a verse ({line[:40]!r}); "
                            f"reinstall it: {INSTALL}")
        chapters.setdefault(f"{m['book']}/{int(m['chapter'])}", []).append(m["text"].strip())
    return [(name, " ".join(verses)) for name, verses in chapters.items()]


def _package_version() -> str | None:
    dpkg = shutil.which("dpkg-query")
    if dpkg is None:
        return None
    out = subprocess.run([dpkg, "-W", "-f", "${Version}", PACKAGE], capture_output=True, text=True)
    return (out.stdout.strip() or None) if out.returncode == 0 else None


class KJVDataModule(TokenStreamDataModule):
    """Narrative prose: the King James Bible from Debian's ``bible-kjv``, split by chapter (module docstring).

    The text is read and split at construction (about 0.2 s), so a missing package fails before any run
    directory exists, with one line naming it.

    Args:
        val_fraction: expected fraction of chapters in the validation split, in (0, 1).
        program: the ``bible`` executable (a name on PATH or a path).
        **kwargs: seq_len, batch_size, num_workers, seed, val_blocks, max_train_tokens of
            :class:`TokenStreamDataModule`.
    """

    def __init__(self, val_fraction: float = 0.05, program: str = "bible", **kwargs) -> None:
        super().__init__(**kwargs)
        if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
            raise DataError(f"val_fraction={val_fraction!r} is not valid; use a number strictly between 0 and 1")
        found = require_program(program)
        self.program, self.val_fraction = found, float(val_fraction)
        self.tokenizer = ByteTokenizer()
        self.chapters = kjv_chapters(_run(found))
        if not self.chapters:
            raise DataError(f"`{' '.join(COMMAND)}` printed no verse; reinstall it: {INSTALL}")
        fractions = [file_fraction(name) for name, _ in self.chapters]
        check_both_splits(fractions, self.val_fraction, "chapters", f"of {PACKAGE}")
        self.val_chapters = [c for c, f in zip(self.chapters, fractions, strict=True) if f < self.val_fraction]
        self.train_chapters = [c for c, f in zip(self.chapters, fractions, strict=True) if f >= self.val_fraction]

    def load_streams(self) -> TokenStreams:
        h = hashlib.sha256()
        streams, splits = {}, {}
        for split, chapters in (("train", self.train_chapters), ("validation", self.val_chapters)):
            h.update(split.encode() + b"\0")
            docs = []
            for name, text in chapters:
                data = text.encode("ascii")
                h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
                docs.append(data)
            buf = SEPARATOR.join(docs)
            streams[split] = self.tokenizer.encode_bytes(buf)  # [N] uint8
            splits[split] = {"chapters": len(chapters), "bytes": len(buf)}
        info = {
            "source": PACKAGE,
            "package_version": _package_version(),
            "command": " ".join(COMMAND),
            "val_fraction": self.val_fraction,
            "split": "sha1(salt + '<book>/<chapter>') < val_fraction, salt " + salt_label(FILE_SALT),
            "separator": SEPARATOR.decode(),
            "splits": splits,
        }
        return TokenStreams(streams["train"], streams["validation"], fingerprint=h.hexdigest(), info=info)

"""The hashed train/validation split every corpus uses: an item is validation iff its fraction is below
``val_fraction``.

The fraction of an item is ``sha1(salt + key)``'s first 8 bytes read as a fraction of 2⁶⁴: a function of the
item's identity only (not of listing order, machine or seed), so an item is never in both splits. The salt is
part of the split's definition: changing it reshuffles which items are validation.
"""

from __future__ import annotations

import hashlib
import math

from accrot.errors import DataError

FILE_SALT = b"accrot/file-split/v1\0"  # files of a directory (the stdlib corpus), keyed by relative path
DOCUMENT_SALT = b"accrot/document-split/v1\0"  # documents of a dataset split, keyed by index


def split_fraction(salt: bytes, key: str) -> float:
    """Deterministic number in [0, 1) for ``key``; validation iff it is below ``val_fraction``."""
    digest = hashlib.sha1(salt + key.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def file_fraction(relpath: str) -> float:
    """The fraction of a file, by its ``/``-separated relative path."""
    return split_fraction(FILE_SALT, relpath)


def document_fraction(index: int) -> float:
    """The fraction of a document, by its index in its dataset split."""
    return split_fraction(DOCUMENT_SALT, str(index))


def salt_label(salt: bytes) -> str:
    """The salt as run records print it (without its trailing NUL)."""
    return salt.decode().rstrip("\0")


def check_both_splits(fractions: list[float], val_fraction: float, items: str, where: str) -> None:
    """:class:`DataError` when ``val_fraction`` puts none or all of the ``fractions`` in validation.

    The message names the bound on ``val_fraction`` that would put one item on the empty side.
    ``items`` names them (``files``), ``where`` says where they are (``under 'dir'``).
    """
    n = len(fractions)
    if not any(f < val_fraction for f in fractions):
        lowest = math.floor(min(fractions) * 1e4) / 1e4 + 1e-4
        raise DataError(
            f"val_fraction={val_fraction} puts none of the {n} {items} {where} in the validation "
            f"split; use val_fraction >= {lowest:.4f} or more {items}"
        )
    if all(f < val_fraction for f in fractions):
        highest = math.floor(max(fractions) * 1e4) / 1e4
        raise DataError(
            f"val_fraction={val_fraction} puts all {n} {items} {where} in the validation split; "
            f"use val_fraction <= {highest:.4f} or more {items}"
        )

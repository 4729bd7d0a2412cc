"""The one exception every data module raises for bad data input (DESIGN §7)."""

from __future__ import annotations


class DataError(ValueError):
    """Bad data input: a missing or empty corpus, an impossible split, a length the data cannot fill.

    The message is one line naming the offending value and what would be valid; the CLI prints it
    and exits with status 2, without a traceback.
    """

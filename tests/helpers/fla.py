"""Whether fla's tests can run: they skip, with one reason line, only where fla's ops (``fla-core``) are not
installed. An fla that is installed and does not import, or whose kernel raises, makes them fail: a broken
install must never read as a skip."""

from __future__ import annotations

import importlib.util

import pytest

from accrot.ops.path.fla import FLA_INSTALL, FLA_PACKAGE


def fla_missing() -> str | None:
    """The one-line skip reason where fla is not installed; None where it is (working or not)."""
    if importlib.util.find_spec("fla") is None:
        return f"{FLA_PACKAGE} is not installed ({FLA_INSTALL}; it imports on a CPU too, with Triton)"
    return None


FLA_MISSING = fla_missing()
needs_fla = pytest.mark.skipif(FLA_MISSING is not None, reason=FLA_MISSING or "")

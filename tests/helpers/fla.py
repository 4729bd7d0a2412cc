"""Whether fla's tests can run: they skip, with one reason line, only where fla's ops (``fla-core``) are not
installed, and never under ``CI=true`` (CI installs fla-core and Triton through the peers extra, so a missing fla
there fails its tests instead of passing them by skipping). An fla that is installed and does not import, or whose
kernel raises, makes them fail: a broken install must never read as a skip."""

from __future__ import annotations

import importlib
import importlib.util
import os
import warnings
from types import ModuleType

import pytest

from accrot.ops.path.fla import FLA_IMPORT_NOTICES, FLA_INSTALL, FLA_PACKAGE


def fla_missing() -> str | None:
    """The one-line skip reason where fla is not installed; None where it is (working or not), and under CI=true."""
    if importlib.util.find_spec("fla") is None and os.environ.get("CI") != "true":
        return f"{FLA_PACKAGE} is not installed ({FLA_INSTALL}; it imports on a CPU too, with Triton)"
    return None


FLA_MISSING = fla_missing()
needs_fla = pytest.mark.skipif(FLA_MISSING is not None, reason=FLA_MISSING or "")


def import_fla(module: str) -> ModuleType:
    """An fla module, imported with fla's known import-time notices ignored (on a CPU it says it falls back to
    one); any other warning or error propagates, so a broken fla fails the test that imports it."""
    with warnings.catch_warnings():
        for category, message in FLA_IMPORT_NOTICES:
            warnings.filterwarnings("ignore", message=message, category=category)
        return importlib.import_module(module)

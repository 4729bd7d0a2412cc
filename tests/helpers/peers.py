"""The peers' code as test oracles: import a peer library or say, in one line, why its checks cannot run.

Where a peer is not installed (``make install`` puts every one in .venv through the ``peers`` extra), its tests skip
with the reason; under ``CI=true`` they fail instead, so a CI run can never pass with an outside check skipped. A
peer that is installed and fails to import is an error, never a skip."""

from __future__ import annotations

import importlib
import os
import warnings
from types import ModuleType

import pytest


def peer(module: str, package: str, notices: tuple[tuple[type[Warning], str], ...] = ()) -> ModuleType:
    """``module`` imported, the peer's own import-time ``notices`` (category, message regex) ignored and any other
    warning left to the suite's filters; its absence (``package`` not installed) skips the test, or fails it under
    CI=true."""
    try:
        with warnings.catch_warnings():
            for category, message in notices:
                warnings.filterwarnings("ignore", message=message, category=category)
            return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is None or module.split(".")[0] != error.name.split(".")[0]:
            raise  # installed, but something it imports is missing: a broken install, not a skip
        why = f"{package} is not installed (the peers extra: make install)"
        if os.environ.get("CI") == "true":
            pytest.fail(why + " and CI=true: the outside checks must run")
        pytest.skip(why)

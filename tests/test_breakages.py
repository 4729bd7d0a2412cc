"""The deliberate-breakage list (tests/helpers/breakages.py, ``make breakages``) stays applicable: every entry's edit
still finds its text exactly once and names test files that exist, so the list cannot silently go stale."""

from __future__ import annotations

import pytest

from tests.helpers.breakages import BREAKAGES, REPO, stale


@pytest.mark.parametrize("breakage", BREAKAGES, ids=[b.name for b in BREAKAGES])
def test_breakage_still_applies(breakage):
    assert stale(breakage) is None, f"{breakage.name}: {stale(breakage)}"
    assert breakage.old != breakage.new
    files = [t for t in breakage.tests if t.startswith("tests/")]
    assert files and all((REPO / f).is_file() for f in files)


def test_names_are_unique():
    assert len({b.name for b in BREAKAGES}) == len(BREAKAGES)

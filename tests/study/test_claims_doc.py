"""CLAIMS.md's tables are the claim functions' own: generated from them, so a constant or a rule is written once."""

from __future__ import annotations

from pathlib import Path

import accrot.study.claims as claims

DOC = Path(claims.__file__).with_name("CLAIMS.md")


def test_the_claims_tables_are_what_the_claim_functions_generate():
    text = DOC.read_text()
    assert claims.rewrite_doc(text) == text, "regenerate with: python -m accrot.study.claims --write"
    ids = [line.split("|")[1].strip() for line in claims.claims_table().splitlines()[2:]]
    assert ids == ["C1", "C1-ext", "C2", "C3", "C4", "C5", "T1", "T2", "T3", "T4", "T5", "N1", "S1", "S2", "S3"]


def test_a_changed_constant_shows_in_the_generated_table(monkeypatch):
    """The check can fail: a tolerance moved in the code makes the file stale."""
    before = claims.claims_table()
    monkeypatch.setattr(claims, "C5_TOLERANCE", 0.03)
    after = claims.claims_table()
    assert "under 3%" in after and "under 3%" not in before
    assert claims.rewrite_doc(DOC.read_text()) != DOC.read_text()


def test_the_variant_sets_follow_the_facts():
    table = claims.variant_sets_table()
    assert "PaTH / PaTH-FoX" in table  # C4's pair of the default study
    s3_rotation_only = next(line for line in table.splitlines() if line.startswith("| S3: rotation-only"))
    assert "accum-learned+values+gate" in s3_rotation_only  # an output gate is no far-mass control

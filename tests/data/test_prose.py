"""The prose corpus (Debian's bible-kjv): chapters split without overlap, a stable fingerprint, references
stripped, fixed evaluation blocks, and a one-line error naming the package when it is missing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from accrot.errors import DataError
from data_modules.prose import KJVDataModule, kjv_chapters
from data_modules.split import file_fraction


def _need_bible() -> None:
    if shutil.which("bible") is None:
        message = "Debian's bible-kjv is not installed (apt-get install bible-kjv)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " and CI=true")
        pytest.skip(message)


@pytest.fixture(scope="module")
def kjv():
    _need_bible()
    return KJVDataModule(seq_len=128)


def test_chapters_split_without_overlap_by_their_hashed_names(kjv):
    names = [n for n, _ in kjv.chapters]
    assert len(names) == 1189 and len(set(names)) == 1189  # the protestant canon's chapters, each once
    assert names[0] == "Ge/1" and names[-1] == "Rev/22"
    train = {n for n, _ in kjv.train_chapters}
    val = {n for n, _ in kjv.val_chapters}
    assert train.isdisjoint(val) and train | val == set(names)
    assert val == {n for n in names if file_fraction(n) < 0.05}
    assert 0.02 < len(val) / len(names) < 0.08
    again = KJVDataModule(seq_len=64, val_fraction=0.05)
    assert [n for n, _ in again.val_chapters] == [n for n, _ in kjv.val_chapters]  # not a function of seq_len


def test_streams_are_the_chapters_as_running_text(kjv):
    val = bytes(kjv.val_stream.tolist()).decode("ascii")
    docs = val.split("\n\n")
    assert len(docs) == len(kjv.val_chapters)
    for doc, (_, text) in zip(docs, kjv.val_chapters, strict=True):
        assert doc == text
    assert not re.search(r"\b\d?[A-Z][a-z]*\d+:\d+ ", val)  # no verse reference survived
    assert kjv.train_stream.numel() + kjv.val_stream.numel() > 4_000_000


def test_fingerprint_is_stable_and_follows_the_split(kjv):
    assert kjv.fingerprint == KJVDataModule(seq_len=128).fingerprint
    assert KJVDataModule(seq_len=128, val_fraction=0.1).fingerprint != kjv.fingerprint
    info = kjv.describe()
    assert info["source"] == "bible-kjv" and info["command"] == "bible -f Gen1:1-Rev22:21"
    assert info["splits"]["validation"]["chapters"] == len(kjv.val_chapters)


def test_evaluation_blocks_are_fixed_slices_of_the_validation_stream(kjv):
    blocks = kjv.eval_blocks(1024, 8192)
    assert blocks.shape == (8, 1025)
    val = kjv.val_stream.long()
    fit = val.numel() // 1025  # spread over the whole split: block i is slot floor(i * fit / 8)
    assert fit > 8
    for i in range(8):
        s = i * fit // 8
        assert torch.equal(blocks[i], val[s * 1025 : (s + 1) * 1025])
    assert torch.equal(blocks, KJVDataModule(seq_len=128).eval_blocks(1024, 8192))


def test_verse_lines_are_parsed_and_anything_else_refused(tmp_path):
    text = "Ge1:1 In the beginning.\nGe1:2 And the earth.\nGe2:1 Thus the heavens.\n1Sm1:1 Now there was.\n"
    assert kjv_chapters(text) == [("Ge/1", "In the beginning. And the earth."), ("Ge/2", "Thus the heavens."),
                                  ("1Sm/1", "Now there was.")]
    with pytest.raises(DataError, match="line 2 .* is not a verse"):
        kjv_chapters("Ge1:1 In the beginning.\nnot a verse\n")


def test_a_missing_package_is_one_line_naming_it():
    with pytest.raises(DataError) as err:
        KJVDataModule(seq_len=128, program="/nonexistent/bible")
    assert "apt-get install bible-kjv" in str(err.value) and "\n" not in str(err.value)


def test_ablation_without_the_package_stops_before_any_worker(tmp_path):
    """`accrot ablation --datasets corpus prose` on a machine without bible: one line, exit 2, nothing written."""
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # the venv's bin: no /usr/bin/bible
    out = tmp_path / "results"
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "accrot"), "ablation", "--size", "tiny", "--datasets", "corpus",
                           "prose", "--out", str(out), "--workers", "0"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "apt-get install bible-kjv" in lines[0]
    assert not out.exists()

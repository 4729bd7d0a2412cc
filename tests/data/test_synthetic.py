"""Synthetic tasks: deterministic per seed, answers where they claim, only answers scored, eval ≠ train, errors."""

from __future__ import annotations

import json
import pickle
import re

import pytest
import torch

from accrot.cli import main
from data_modules import DataError, LocalDependencyDataModule, PasskeyDataModule
from data_modules.synthetic import FILLER, KEY_TEMPLATE, QUESTION, PasskeyTask

IGNORE = -100
LONGEST_SENTENCE = max(len(s) + 2 for s in FILLER.split(". ") if s)  # "There and back again. " = 22 bytes


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg
    return msg


def local(**kw) -> LocalDependencyDataModule:
    return LocalDependencyDataModule(**{"seq_len": 32, "batch_size": 4, "val_blocks": 6, **kw})


def passkey(**kw) -> PasskeyDataModule:
    return PasskeyDataModule(**{"batch_size": 4, "val_blocks": 6, **kw})


# --- offset copy ----------------------------------------------------------------------------------


def check_offset_copy(x: torch.Tensor, scored: torch.Tensor, n_content: int, K: int, cue_rate: float) -> None:
    """``x [ℓ+1]`` tokens, ``scored [ℓ]``: every scored target is the content token k before the cue C_k."""
    length = x.numel() - 1
    is_cue = x >= n_content  # [ℓ+1]
    assert not is_cue[-1] and not is_cue[:K].any()  # never in the first K positions, always followed by an answer
    cues = is_cue.nonzero().squeeze(1)
    assert torch.equal(scored, is_cue[:-1])  # exactly the cues' indices are scored
    assert (cues.diff() >= 2).all()  # a cue never sits on an answer
    assert cues.numel() == min(max(1, int(cue_rate * length)), (length - K + 1) // 2)
    for i in cues.tolist():
        k = int(x[i]) - n_content + 1
        assert 1 <= k <= K
        assert not is_cue[i - k], "the referenced position holds a cue"
        assert x[i + 1] == x[i - k], f"answer at {i + 1} is not the token {k} before the cue"


@pytest.mark.parametrize("length", [9, 10, 64, 301], ids=lambda n: f"L{n}")
def test_local_answers_are_where_they_claim(length):
    dm = local()
    blocks, mask = dm.eval_blocks(length, 6 * length), dm.eval_mask(length, 6 * length)
    assert blocks.shape == (6, length + 1) and blocks.dtype == torch.int64
    assert mask.shape == (6, length) and mask.dtype == torch.bool
    assert blocks.min() >= 0 and blocks.max() < dm.vocab_size == 72
    for x, m in zip(blocks, mask, strict=True):
        check_offset_copy(x, m, 64, 8, 0.1)
        targets = x[1:]
        for i in m.nonzero().squeeze(1).tolist():  # the brief's statement, in targets = blocks[:, 1:]
            k = int(x[i]) - 64 + 1
            assert targets[i] == x[i - k]


def test_local_every_offset_occurs_and_dense_cues_still_resolve():
    dm = local(max_offset=4, cue_rate=0.5, n_content=3)
    blocks, mask = dm.eval_blocks(200, 2000), dm.eval_mask(200, 2000)
    for x, m in zip(blocks, mask, strict=True):
        check_offset_copy(x, m, 3, 4, 0.5)
    ks = blocks[:, :-1][mask] - 3 + 1
    assert set(ks.tolist()) == {1, 2, 3, 4}


def test_local_train_items_and_loader():
    dm = local()
    for i in (0, 1, 999_999):
        x, t = dm.train_dataset()[i]
        assert x.shape == t.shape == (32,) and x.dtype == t.dtype == torch.int64
        scored = t != IGNORE
        assert torch.equal(scored, x >= 64)  # scored exactly at the cues
        for i in scored.nonzero().squeeze(1).tolist():
            k = int(x[i]) - 64 + 1
            assert t[i] == x[i - k] < 64
    dm.setup("fit")
    inputs, targets = next(iter(dm.train_dataloader()))
    assert inputs.shape == targets.shape == (4, 32) and inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(targets != IGNORE, inputs >= 64)  # -100 everywhere but after a cue
    val = [b for b in dm.val_dataloader()]
    blocks, mask = dm.eval_blocks(32, 6 * 32), dm.eval_mask(32, 6 * 32)
    assert torch.equal(torch.cat([b[0] for b in val]), blocks[:, :-1])  # val = the first evaluation blocks
    assert torch.equal(torch.cat([b[1] for b in val]), torch.where(mask, blocks[:, 1:], IGNORE))


def test_local_deterministic_per_seed():
    a, b, c = local(), local(), local(seed=1)
    assert torch.equal(a.eval_blocks(50, 500), b.eval_blocks(50, 500))
    assert torch.equal(a.eval_mask(50, 500), b.eval_mask(50, 500))
    assert all(torch.equal(x, y) for x, y in zip(a.train_dataset()[7], b.train_dataset()[7], strict=True))
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    assert not torch.equal(a.eval_blocks(50, 500), c.eval_blocks(50, 500))
    assert not torch.equal(a.train_dataset()[7][0], c.train_dataset()[7][0])
    assert a.fingerprint != c.fingerprint != local(cue_rate=0.2).fingerprint
    # block i does not depend on the budget, and the caller cannot corrupt the cache
    assert torch.equal(a.eval_blocks(50, 100), a.eval_blocks(50, 500)[:2])
    a.eval_blocks(50, 500).zero_()
    assert torch.equal(a.eval_blocks(50, 500), b.eval_blocks(50, 500))


def test_local_eval_differs_from_training():
    dm = local()
    train = {tuple(dm.train_dataset()[i][0].tolist()) for i in range(400)}
    for length in (32, 64):  # the evaluation sets, and the evaluation samples of the training seed stream
        blocks = dm.eval_blocks(length, 64 * length)
        assert not {tuple(x[:-1].tolist()) for x in blocks} & train
    assert not {tuple(x[:-1].tolist()) for x in dm.eval_blocks(32, 6400)} & train


def test_local_records_and_pickles():
    dm = local()
    dm.eval_blocks(64, 640)
    info = json.loads(json.dumps(dm.describe()))
    assert info["task"] == "local_dependency" and info["seed"] == 0 and info["fingerprint"] == dm.fingerprint
    assert info["parameters"] == {"n_content": 64, "max_offset": 8, "cue_rate": 0.1}
    assert info["eval_blocks"]["64"]["blocks"] == 10 and info["eval_blocks"]["64"]["scored"] == 60
    assert dm.tokenizer.decode(dm.tokenizer.encode("t0 t63 C1 C8")) == "t0 t63 C1 C8"
    assert dm.tokenizer.encode("t63 C1 C8") == [63, 64, 71]
    assert dict(local(cue_rate=0.2).hparams) == {"seq_len": 32, "batch_size": 4, "num_workers": 0, "seed": 0,
                                                 "val_blocks": 6, "n_content": 64, "max_offset": 8, "cue_rate": 0.2}
    ds = pickle.loads(pickle.dumps(dm.train_dataset()))  # DataLoader workers under spawn
    assert torch.equal(ds[3][0], dm.train_dataset()[3][0])


# --- passkey -------------------------------------------------------------------------------------


KEY_RE = re.compile(r"The pass key is (\d+)\. Remember it\. (\d+) is the pass key\. ")


def parse_passkey(x: torch.Tensor, digits: int) -> tuple[int, str, str]:
    """``(P, key, filler + question)`` of one sequence, checking its layout."""
    text = bytes(x.tolist()).decode()
    (m,) = list(KEY_RE.finditer(text))
    assert m.group(1) == m.group(2) and len(m.group(1)) == digits
    key = m.group(1)
    rest = text[: m.start()] + text[m.end() :]
    assert rest.endswith(QUESTION + key)
    filler = rest[: -len(QUESTION + key)]
    assert filler == "" or (filler in FILLER * (len(filler) // len(FILLER) + 2) and filler.endswith(". "))
    assert m.start() == 0 or text[: m.start()].endswith(". ")  # the key starts a sentence
    return m.start(), key, filler


@pytest.mark.parametrize("length", [101, 128, 400], ids=lambda n: f"L{n}")
def test_passkey_answers_are_at_the_stated_depth(length):
    dm = passkey()
    blocks, mask = dm.eval_blocks(length, 10 * length), dm.eval_mask(length, 10 * length)
    depths = dm.eval_depths(length, 10 * length)
    assert blocks.shape == (10, length + 1) and mask.shape == (10, length) and blocks.max() < dm.vocab_size == 256
    assert depths == [0.0, 0.25, 0.5, 0.75, 1.0] * 2
    F = length + 1 - len(KEY_TEMPLATE.format(key="12345")) - len(QUESTION) - 5
    for x, m, depth in zip(blocks, mask, depths, strict=True):
        P, key, filler = parse_passkey(x, 5)
        assert len(filler) == F
        assert torch.equal(m, torch.arange(length) >= length - 5)  # only the final digits are scored
        assert bytes(x[1:][m].tolist()).decode() == key  # the scored targets are the key inserted above
        assert abs(P - depth * F) <= LONGEST_SENTENCE  # within a sentence of the stated depth
        assert P == dm.key_position(length, depth)
        assert PasskeyTask.is_eval_key(key)


def test_passkey_train_items_and_loader():
    dm = passkey(seq_len=160, digits=3, depths=[0.5])
    keys, positions = set(), set()
    for i in range(60):
        x, t = dm.train_dataset()[i]
        assert x.shape == t.shape == (160,) and x.dtype == t.dtype == torch.int64
        assert (t[:-3] == IGNORE).all() and (t[-3:] != IGNORE).all()
        P, key, _ = parse_passkey(torch.cat([x, t[-1:]]), 3)
        assert bytes(t[-3:].tolist()).decode() == key and not PasskeyTask.is_eval_key(key)
        keys.add(key)
        positions.add(P)
    assert len(keys) > 50 and len(positions) > 2  # keys and depths vary
    dm.setup("fit")
    inputs, targets = next(iter(dm.train_dataloader()))
    assert inputs.shape == targets.shape == (4, 160) and targets.dtype == torch.int64
    assert ((targets != IGNORE).sum(1) == 3).all()


def test_passkey_deterministic_and_disjoint_from_training():
    a, b, c = passkey(), passkey(), passkey(seed=3)
    assert torch.equal(a.eval_blocks(200, 2000), b.eval_blocks(200, 2000))
    assert torch.equal(a.train_dataset()[5][0], b.train_dataset()[5][0]) and a.fingerprint == b.fingerprint
    assert not torch.equal(a.eval_blocks(200, 2000), c.eval_blocks(200, 2000)) and a.fingerprint != c.fingerprint
    train = {tuple(a.train_dataset()[i][0].tolist()) for i in range(300)}
    evals = {tuple(x[:-1].tolist()) for x in a.eval_blocks(128, 128 * 64)}
    assert not train & evals
    info = json.loads(json.dumps(a.describe()))
    assert info["task"] == "passkey" and info["parameters"]["digits"] == 5 and info["min_length"] == 101


def test_passkey_too_short_lengths():
    dm = passkey()
    with pytest.raises(DataError) as err:
        dm.eval_blocks(100, 1000)
    assert "100" in one_line(err) and "101" in one_line(err)
    with pytest.raises(DataError) as err:
        passkey(seq_len=64)
    assert "seq_len=64" in one_line(err) and "101" in one_line(err)


# --- bad arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, kw, name",
    [
        (local, {"seq_len": 0}, "seq_len"),
        (local, {"n_content": 1}, "n_content"),
        (local, {"max_offset": 0}, "max_offset"),
        (local, {"max_offset": 32}, "max_offset"),
        (local, {"cue_rate": 0.0}, "cue_rate"),
        (local, {"cue_rate": 0.6}, "cue_rate"),
        (local, {"cue_rate": float("nan")}, "cue_rate"),
        (local, {"batch_size": 0}, "batch_size"),
        (local, {"seed": -1}, "seed"),
        (local, {"num_workers": -1}, "num_workers"),
        (local, {"val_blocks": 0}, "val_blocks"),
        (passkey, {"digits": 2}, "digits"),
        (passkey, {"digits": 33}, "digits"),
        (passkey, {"depths": []}, "depths"),
        (passkey, {"depths": [0.5, 1.5]}, "depths"),
        (passkey, {"batch_size": -2}, "batch_size"),
    ],
    ids=lambda v: v.__name__ if callable(v) else None,
)
def test_bad_arguments_raise_one_line(make, kw, name):
    with pytest.raises(DataError) as err:
        make(**kw)
    assert one_line(err).startswith(name)


def test_local_too_short_evaluation_length():
    with pytest.raises(DataError) as err:
        local().eval_blocks(8, 800)
    assert "8" in one_line(err) and ">= 9" in one_line(err)
    with pytest.raises(DataError, match="budget_tokens"):
        local().eval_mask(16, 0)


# --- end to end ----------------------------------------------------------------------------------


@pytest.mark.parametrize("task, vocab", [("LocalDependencyDataModule", 72), ("PasskeyDataModule", 256)],
                         ids=["local", "passkey"])
def test_fit_through_the_cli(task, vocab, tmp_path):
    rc = main(["fit", "--config", "tiny", f"--data=data_modules.{task}",  # vocab_size follows the data
               "--trainer.fast_dev_run=true", "--wandb=disabled", "--trainer.enable_progress_bar=false",
               "--extrapolation.multipliers=[1,2]", "--extrapolation.budget_tokens=512", f"--root={tmp_path}"])
    assert rc == 0
    (path,) = tmp_path.glob("*/*/extrapolation.json")
    (record,) = tmp_path.glob("*/*/run.json")
    assert json.loads(record.read_text())["hparams"]["vocab_size"] == vocab
    doc = json.loads(path.read_text())
    assert doc["data"]["task"] == {"LocalDependencyDataModule": "local_dependency", "PasskeyDataModule": "passkey"}[task]
    first = doc["final"]["lengths"][0]
    if task == "PasskeyDataModule":  # accuracy per length × depth of the key
        assert set(first["accuracy_by_depth"]) <= {"0", "0.25", "0.5", "0.75", "1"} and first["accuracy_by_depth"]
    assert first["length"] == 128 and first["tokens"] == doc["data"]["eval_blocks"]["128"]["scored"]  # answers only

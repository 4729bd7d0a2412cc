"""The embedded corpus and the token-stream base: deterministic split, fixed evaluation blocks, loaders, errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler

from data_modules import ByteTokenizer, DataError, StdlibDataModule, TokenWindows
from data_modules.split import file_fraction
from data_modules.stdlib import SEPARATOR, STDLIB_EXCLUDE_DIRS, glob_match, list_files


@pytest.fixture(scope="module")
def stdlib() -> StdlibDataModule:
    return StdlibDataModule()


def write_corpus(root: Path, n: int = 20, order: range | None = None) -> Path:
    """``n`` small distinct files in two directories (plus noise the loader must skip)."""
    for i in order or range(n):
        sub = root / ("pkg" if i % 2 else "") / f"mod{i:02d}.py"
        sub.parent.mkdir(parents=True, exist_ok=True)
        sub.write_text(f"# module {i}\n" + "".join(f"value_{i}_{j} = {i * j}  # ü\n" for j in range(40)))
    (root / "__pycache__").mkdir(exist_ok=True)
    (root / "__pycache__" / "mod00.py").write_text("stale = 1\n")  # pruned directory
    (root / "empty.py").write_text("")  # skipped, counted
    (root / "notes.txt").write_text("not matched by the glob\n")
    return root


def tiny(root: Path, **kw) -> StdlibDataModule:
    kw = {"val_fraction": 0.3, "seq_len": 16, "batch_size": 4, "val_blocks": 8, **kw}
    return StdlibDataModule(root=str(root), **kw)


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg
    return msg


# --- the stdlib corpus ----------------------------------------------------------------------------


def test_stdlib_split_is_deterministic_and_disjoint(stdlib):
    again = StdlibDataModule()
    assert again.train_files == stdlib.train_files and again.val_files == stdlib.val_files
    assert again.fingerprint == stdlib.fingerprint and len(stdlib.fingerprint) == 64
    assert not set(stdlib.train_files) & set(stdlib.val_files)
    n = len(stdlib.train_files) + len(stdlib.val_files)
    assert n > 300 and 0.02 < len(stdlib.val_files) / n < 0.10  # val_fraction = 0.05
    for rel in stdlib.train_files + stdlib.val_files:
        assert not set(rel.split("/")[:-1]) & set(STDLIB_EXCLUDE_DIRS), rel
    assert stdlib.train_files == sorted(stdlib.train_files)


def test_stdlib_streams_are_the_files_of_their_split(stdlib):
    for stream, files in ((stdlib.train_stream, stdlib.train_files), (stdlib.val_stream, stdlib.val_files)):
        expected = SEPARATOR.join((stdlib.root / rel).read_bytes() for rel in files)
        assert stream.dtype == torch.uint8 and bytes(stream.numpy()) == expected
    assert stdlib.train_stream.numel() > 5_000_000 and stdlib.val_stream.numel() > 100_000
    train = bytes(stdlib.train_stream.numpy())
    for rel in stdlib.val_files:  # no validation file reappears in training
        assert (stdlib.root / rel).read_bytes() not in train, rel


def test_stdlib_eval_blocks_are_fixed_and_non_overlapping(stdlib):
    length, budget = 512, 4096
    blocks = stdlib.eval_blocks(length, budget)
    assert blocks.shape == (budget // length, length + 1) and blocks.dtype == torch.int64
    assert torch.equal(blocks, StdlibDataModule().eval_blocks(length, budget))  # same for every model
    val = stdlib.val_stream.long()
    # contiguous copies of the stream, disjoint, the first at its start and spread over all of it (not its start)
    slots = val.numel() // (length + 1)
    starts = []
    for block in blocks:
        start = next(s * (length + 1) for s in range(slots) if torch.equal(block, val[s * (length + 1):(s + 1) * (length + 1)]))
        starts.append(start)
    assert starts[0] == 0 and starts == sorted(set(starts))
    assert starts[-1] >= (slots - slots // blocks.shape[0] - 1) * (length + 1)  # the last block in the last stride
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert max(gaps) - min(gaps) <= length + 1  # even spacing, to one slot
    assert stdlib.eval_counts[length] == {"requested": 8, "blocks": 8, "tokens": 8 * length}
    # the diagnostics cut their own blocks of the same length: the record keeps the evaluation set's count
    diag = stdlib.eval_blocks(length, 2 * length, record=False)
    assert torch.equal(diag[0], blocks[0]) and diag.shape == (2, length + 1)
    assert stdlib.describe()["eval_blocks"][str(length)] == {"requested": 8, "blocks": 8, "tokens": 8 * length}


def test_stdlib_eval_budget_beyond_the_stream_uses_every_block(stdlib):
    n = stdlib.val_stream.numel()
    length = 50_000
    blocks = stdlib.eval_blocks(length, budget_tokens=10 * n)
    assert blocks.shape == (n // (length + 1), length + 1)
    assert stdlib.describe()["eval_blocks"][str(length)]["blocks"] == n // (length + 1)


def test_stdlib_eval_length_beyond_the_stream_is_a_one_line_error(stdlib):
    n = stdlib.val_stream.numel()
    with pytest.raises(DataError) as err:
        stdlib.eval_blocks(n, budget_tokens=n)
    assert one_line(err) == (
        f"evaluation length {n} needs {n + 1} tokens per block but the validation stream has {n}; "
        f"use lengths up to {n - 1} or more validation data"
    )
    assert stdlib.eval_blocks(n - 1, budget_tokens=1).shape == (1, n)


def test_stdlib_describe_is_json(stdlib):
    d = json.loads(json.dumps(stdlib.describe()))
    assert d["source"] == "stdlib" and d["fingerprint"] == stdlib.fingerprint
    assert d["tokenizer"] == {"name": "bytes", "vocab_size": 256} and stdlib.vocab_size == 256
    assert d["splits"]["train"]["files"] == len(stdlib.train_files)
    assert d["splits"]["validation"]["tokens"] == stdlib.val_stream.numel()


# --- a tiny corpus end to end ---------------------------------------------------------------------


def test_tiny_corpus_end_to_end(tmp_path):
    dm = tiny(write_corpus(tmp_path))
    dm.setup("fit")
    assert dm.empty_files == 1 and "empty.py" not in dm.train_files + dm.val_files
    assert all(
        rel.endswith(".py") and not rel.startswith("__pycache__") for rel in dm.train_files + dm.val_files
    )
    assert dm.train_files and dm.val_files and not set(dm.train_files) & set(dm.val_files)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are inputs shifted by one
    assert 0 <= int(x.min()) and int(x.max()) < dm.vocab_size
    vx, vy = next(iter(dm.val_dataloader()))
    assert vx.shape == (4, 16) and vx.dtype == torch.int64
    assert torch.equal(vx[0], dm.val_stream[:16].long()) and torch.equal(vy[0], dm.val_stream[1:17].long())
    assert len(dm.val_dataloader().dataset) == min(8, dm.val_stream.numel() // 17)
    # no token of a validation file in the train stream: every file is distinct text
    train = bytes(dm.train_stream.numpy())
    for rel in dm.val_files:
        assert (tmp_path / rel).read_bytes() not in train
    text = ByteTokenizer().decode(dm.val_stream)
    assert text == "\n\n".join((tmp_path / rel).read_text() for rel in dm.val_files)


def test_training_windows_are_non_overlapping_from_the_seeded_offset(tmp_path):
    dm = tiny(write_corpus(tmp_path), seed=3)
    ds = dm.train_dataset()
    off, w = dm.train_offset, dm.seq_len + 1
    assert 0 <= off <= dm.seq_len and len(ds) == (dm.train_stream.numel() - off) // w
    stream = dm.train_stream.long()
    for i in (0, 1, len(ds) - 1):
        x, y = ds[i]
        assert torch.equal(x, stream[off + i * w : off + i * w + dm.seq_len])
        assert torch.equal(y, stream[off + i * w + 1 : off + (i + 1) * w])


def test_split_ignores_listing_order_and_location(tmp_path):
    a = tiny(write_corpus(tmp_path / "a"))
    b = tiny(write_corpus(tmp_path / "b", order=range(19, -1, -1)))  # created in reverse order, elsewhere
    assert (a.train_files, a.val_files) == (b.train_files, b.val_files)
    assert a.fingerprint == b.fingerprint
    assert tiny(tmp_path / "a", seed=7).val_files == a.val_files  # the seed does not move the split
    (tmp_path / "b" / "mod03.py").write_text("changed\n")
    assert tiny(tmp_path / "b").fingerprint != a.fingerprint


def test_train_order_is_reproducible_per_seed(tmp_path):
    root = write_corpus(tmp_path)

    def first_epochs(seed: int) -> list[torch.Tensor]:
        loader = tiny(root, seed=seed, seq_len=8).train_dataloader()
        return [torch.cat([x for x, _ in loader]) for _ in range(2)]

    e0, e1 = first_epochs(0)
    assert all(torch.equal(a, b) for a, b in zip(first_epochs(0), (e0, e1)))
    assert not torch.equal(e0, e1)  # epochs differ
    assert not torch.equal(first_epochs(1)[0], e0)  # seeds differ


def _consume(loader, k: int) -> list[torch.Tensor]:
    """The first ``k`` batches of successive epochs (a loop broken off mid-epoch, as a kill would)."""
    out: list[torch.Tensor] = []
    while len(out) < k:
        for x, _ in loader:
            out.append(x)
            if len(out) == k:
                break
    return out


def test_train_loader_state_resumes_the_order_mid_epoch(tmp_path):
    """The loader's state (what Lightning checkpoints) continues the same order from any batch: mid-epoch,
    at the epoch's end and in the next epoch."""
    root = write_corpus(tmp_path)
    make = lambda: tiny(root, seq_len=8, batch_size=2).train_dataloader()  # noqa: E731
    n = len(make())
    whole = _consume(make(), 2 * n)
    assert n >= 3 and not torch.equal(torch.cat(whole[:n]), torch.cat(whole[n:]))  # epochs differ
    for cut in (1, n - 1, n, n + 2):
        loader = make()
        assert all(torch.equal(a, b) for a, b in zip(_consume(loader, cut), whole))
        state = loader.state_dict()
        resumed = make()
        resumed.load_state_dict(state)
        rest = _consume(resumed, 2 * n - cut)
        assert all(torch.equal(a, b) for a, b in zip(rest, whole[cut:])), cut


def test_train_loader_shards_by_rank_under_ddp(tmp_path):
    """Under DDP the data module's sampler is a DistributedSampler (so Lightning keeps it) that gives each
    rank a disjoint share of the epoch; the loader can still be rebuilt with another sampler."""
    from types import SimpleNamespace

    from lightning.pytorch.utilities.data import _update_dataloader

    seen = []
    for rank in range(2):
        dm = tiny(write_corpus(tmp_path), seq_len=8, batch_size=2)
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank, state=SimpleNamespace(fn="fit"), current_epoch=0,
                                     fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(
                                         batch_progress=SimpleNamespace(current=SimpleNamespace(processed=0)))))
        loader = dm.train_dataloader()
        assert isinstance(loader.sampler, DistributedSampler) and loader.batch_size == 2 and loader.drop_last
        seen.append(list(iter(loader.sampler)))
        x, y = next(iter(loader))
        assert x.shape == y.shape == (2, 8) and x.dtype == torch.int64
        other = _update_dataloader(loader, DistributedSampler(loader.dataset, num_replicas=2, rank=rank))
        assert next(iter(other))[0].shape == (2, 8)
    assert not set(seen[0]) & set(seen[1]) and len(seen[0]) == len(seen[1])


def test_max_train_tokens_caps_the_train_stream(tmp_path):
    dm = tiny(write_corpus(tmp_path), max_train_tokens=500)
    assert dm.train_stream.numel() == 500
    d = dm.describe()
    assert d["splits"]["train"]["tokens"] == 500 and d["splits"]["train"]["tokens_loaded"] > 500


# --- errors: one line, naming the value and what would be valid -----------------------------------


def test_nonexistent_root(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(DataError) as err:
        StdlibDataModule(root=str(missing))
    assert one_line(err) == f"data root '{missing}' does not exist; pass an existing directory of text files"


def test_no_match_and_empty_files(tmp_path):
    (tmp_path / "a.txt").write_text("hello\n")
    with pytest.raises(DataError, match=r"no files under .* match glob '\*\*/\*\.py'") as err:
        StdlibDataModule(root=str(tmp_path))
    one_line(err)
    (tmp_path / "b.py").write_text("")
    with pytest.raises(DataError, match="all 1 files .* are empty") as err:
        StdlibDataModule(root=str(tmp_path))
    one_line(err)


def test_empty_validation_split_suggests_a_fraction(tmp_path):
    (tmp_path / "only.py").write_text("x = 1\n" * 10)
    (tmp_path / "other.py").write_text("y = 2\n" * 10)
    lowest = min(file_fraction("only.py"), file_fraction("other.py"))
    with pytest.raises(DataError) as err:
        StdlibDataModule(root=str(tmp_path), val_fraction=lowest / 2)
    msg = one_line(err)
    assert "in the validation split; use val_fraction >= " in msg
    suggested = float(msg.split(">= ")[1].split()[0])
    assert len(StdlibDataModule(root=str(tmp_path), val_fraction=suggested).val_files) == 1


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"val_fraction": 0.0}, "val_fraction=0.0 is not valid"),
        ({"val_fraction": 1.5}, "val_fraction=1.5 is not valid"),
        ({"seq_len": 0}, "seq_len=0 is not valid; use an integer >= 2"),
        ({"batch_size": -1}, "batch_size=-1 is not valid"),
        ({"glob": " "}, "glob=' ' is not valid"),
    ],
    ids=["val0", "val1.5", "seq0", "batch-1", "glob-blank"],
)
def test_bad_arguments(tmp_path, kwargs, needle):
    with pytest.raises(DataError) as err:
        tiny(write_corpus(tmp_path), **kwargs)
    assert needle in one_line(err)


def test_seq_len_beyond_the_validation_stream_fails_at_setup(tmp_path):
    dm = tiny(write_corpus(tmp_path), seq_len=100_000, batch_size=1)
    with pytest.raises(DataError, match="seq_len=100000 needs 100001 tokens per validation block") as err:
        dm.setup("validate")
    one_line(err)
    with pytest.raises(DataError, match="fewer than batch_size=1") as err:
        dm.setup("fit")
    one_line(err)


def test_eval_blocks_rejects_bad_arguments(tmp_path):
    dm = tiny(write_corpus(tmp_path))
    for length, budget in ((0, 10), (16, 0)):
        with pytest.raises(DataError) as err:
            dm.eval_blocks(length, budget)
        one_line(err)


# --- pieces ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, pattern, expected",
    [
        ("a.py", "**/*.py", True),
        ("x/y/a.py", "**/*.py", True),
        ("x/a.txt", "**/*.py", False),
        ("a.py", "*.py", True),
        ("x/a.py", "*.py", False),
        ("src/x/a.py", "src/**", True),
        ("src/x/a.py", "src/**/a.py", True),
        ("lib/x/a.py", "src/**/a.py", False),
    ],
)
def test_glob_match(path, pattern, expected):
    assert glob_match(path, pattern) is expected


def test_list_files_prunes_hidden_and_excluded_dirs(tmp_path):
    write_corpus(tmp_path, n=2)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "hook.py").write_text("x\n")
    names = [rel for rel, _ in list_files(tmp_path, "**/*.py", ("__pycache__", "pkg"))]
    assert names == ["empty.py", "mod00.py"]


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    text = "déjà vu → ∞\n"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids)) == text
    assert torch.equal(tok.encode_bytes(text.encode()), torch.tensor(ids, dtype=torch.uint8))
    assert tok.encode_bytes(b"").numel() == 0
    assert tok.decode([0xE2, 0x82]) == "\ufffd"  # a cut multi-byte character does not fail
    with pytest.raises(DataError) as err:
        tok.decode([65, 300])
    assert one_line(err) == "token id 300 is not a byte; the byte tokenizer's ids are 0..255"


def test_windows_dataset_bounds():
    ds = TokenWindows(torch.arange(23, dtype=torch.uint8), seq_len=4)
    assert len(ds) == 4 and len(TokenWindows(ds.stream, 4, limit=2)) == 2
    x, y = ds[3]
    assert x.tolist() == [15, 16, 17, 18] and y.tolist() == [16, 17, 18, 19]
    with pytest.raises(IndexError):
        ds[4]


def test_copied_corpus_keeps_its_fingerprint(tmp_path):
    src = write_corpus(tmp_path / "src")
    shutil.copytree(src, tmp_path / "copy")
    assert tiny(src).fingerprint == tiny(tmp_path / "copy").fingerprint

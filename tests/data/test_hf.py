"""Hugging Face data: every local format packs into the same streams, the stream cache is reused, a hub name
offline fails fast (or loads from the datasets cache), and every bad input is one line naming the value."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from data_modules import DataError, HFDataModule, hf_source
from data_modules.hf_pack import stream_dtype
from data_modules.hf_source import looks_local, split_of
from data_modules.split import document_fraction

WORDS = ["alpha", "beta", "gamma", "délta", "epsilon", "zeta", "eta", "theta"]


def documents(n: int, start: int = 0) -> list[str]:
    """``n`` distinct documents of a few hundred bytes (non-ASCII included)."""
    return [f"doc {start + i}: " + " ".join(WORDS[(start + i + j * j) % len(WORDS)] for j in range(30)) for i in range(n)]


def write_jsonl(path: Path, docs: list[str], key: str = "text") -> Path:
    path.write_text("".join(json.dumps({key: d, "id": i}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    return path


def expected(docs: list[str], val_fraction: float) -> tuple[bytes, bytes]:
    """The streams the carved split must produce: document i is validation iff its fraction < val_fraction."""
    train = [d for i, d in enumerate(docs) if d and document_fraction(i) >= val_fraction]
    val = [d for i, d in enumerate(docs) if d and document_fraction(i) < val_fraction]
    return "\n\n".join(train).encode(), "\n\n".join(val).encode()


def make(path: Path | str, tmp_path: Path, **kw) -> HFDataModule:
    kw = {"seq_len": 16, "batch_size": 4, "val_blocks": 4, "cache_dir": str(tmp_path / "cache"), **kw}
    return HFDataModule(path=str(path), **kw)


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg
    return msg


@pytest.fixture(autouse=True)
def _private_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the default cache_dir, never ~/.cache


DOCS = documents(120)


@pytest.fixture
def sources(tmp_path) -> dict[str, Path]:
    """The same 120 documents as JSONL (with an ``id`` column), Parquet, a folder of .txt files and a glob."""
    root = tmp_path / "data"
    root.mkdir()
    txt = root / "txt"
    txt.mkdir()
    for i, d in enumerate(DOCS):
        (txt / f"doc{i:03d}.txt").write_text(d, encoding="utf-8")
    (txt / "README.md").write_text("not a data file\n")  # other extensions in a folder are ignored
    pq.write_table(pa.table({"text": DOCS, "id": list(range(len(DOCS)))}), root / "corpus.parquet")
    return {
        "jsonl": write_jsonl(root / "corpus.jsonl", DOCS),
        "parquet": root / "corpus.parquet",
        "txt-dir": txt,
        "txt-glob": txt / "*.txt",
    }


# --- formats ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "txt-dir", "txt-glob"])
def test_each_format_packs_the_documents(kind, sources, tmp_path):
    dm = make(sources[kind], tmp_path)
    dm.setup("fit")
    train, val = expected(DOCS, 0.05)
    assert bytes(dm.train_stream.numpy()) == train and bytes(dm.val_stream.numpy()) == val
    assert dm.train_stream.dtype == torch.uint8 and dm.vocab_size == 256
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    vx, _ = next(iter(dm.val_dataloader()))
    assert torch.equal(vx[0], dm.val_stream[:16].long())
    blocks = dm.eval_blocks(32, budget_tokens=256)
    assert blocks.shape == (8, 33) and blocks.dtype == torch.int64
    fit = dm.val_stream.numel() // 33  # blocks spread over the whole split: block i is slot floor(i * fit / 8)
    s1 = fit // 8
    assert fit > 8 and torch.equal(blocks[1], dm.val_stream[33 * s1 : 33 * (s1 + 1)].long())
    d = json.loads(json.dumps(dm.describe()))
    assert d["source"] == "local" and d["column"] == "text" and d["tokenizer"]["name"] == "bytes"
    assert d["format"] == {"jsonl": "json", "parquet": "parquet"}.get(kind, "text")
    assert d["n_files"] == (1 if kind in ("jsonl", "parquet") else 120)
    assert d["splits"]["validation"]["documents"] == len(DOCS) - d["splits"]["train"]["documents"] > 0
    assert d["splits"]["validation"]["tokens"] == len(val)
    assert d["cache"]["file"] == str(dm.cache_file) and Path(d["cache"]["file"]).is_file()
    assert d["validation"].startswith("carved") and len(d["fingerprint"]) == 64


def test_fingerprint_depends_on_content_only(sources, tmp_path):
    prints = {make(p, tmp_path / kind).fingerprint for kind, p in sources.items()}
    assert len(prints) == 1  # same documents, four layouts, four cache folders: one fingerprint
    again = make(sources["jsonl"], tmp_path / "again")
    assert again.fingerprint in prints and again.cache_hit is False
    write_jsonl(sources["jsonl"], documents(120, start=1))
    assert make(sources["jsonl"], tmp_path).fingerprint not in prints


def test_second_construction_reuses_the_cache(sources, tmp_path, monkeypatch):
    first = make(sources["jsonl"], tmp_path)
    fingerprint = first.fingerprint
    assert first.cache_hit is False
    cache_file = first.cache_file
    mtime = cache_file.stat().st_mtime_ns
    assert sorted(p.name for p in cache_file.parent.iterdir()) == sorted([cache_file.name, cache_file.stem + ".json"])

    import datasets

    reads = []
    load_dataset = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: reads.append(a) or load_dataset(*a, **k))
    second = make(sources["jsonl"], tmp_path, seed=3, seq_len=8)  # loader settings are not part of the key
    assert second.fingerprint == fingerprint and second.cache_hit is True and reads == []
    assert second.cache_file == cache_file and cache_file.stat().st_mtime_ns == mtime
    assert second.describe()["cache"] == {"file": str(cache_file), "hit": True}
    assert torch.equal(second.val_stream, first.val_stream)
    other = make(sources["jsonl"], tmp_path, val_fraction=0.5)  # another split is another key
    assert other.fingerprint != fingerprint and other.cache_hit is False and len(reads) == 1 and other.cache_file != cache_file


def test_default_cache_dir_honours_xdg(sources, tmp_path):
    dm = HFDataModule(path=str(sources["parquet"]), seq_len=16, batch_size=4)
    dm.setup("validate")
    assert dm.cache_file.parent == tmp_path / "xdg" / "accrot" / "streams"


def test_files_named_by_split(tmp_path):
    train_docs, val_docs = documents(30), documents(6, start=100)
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "train.jsonl", train_docs)
    write_jsonl(data / "validation.jsonl", val_docs)
    dm = make(data, tmp_path)
    assert bytes(dm.train_stream.numpy()) == "\n\n".join(train_docs).encode()
    assert bytes(dm.val_stream.numpy()) == "\n\n".join(val_docs).encode()
    assert dm.describe()["splits"]["validation"]["from"] == "split 'validation'"
    carved = make(data, tmp_path, val_split=None, val_fraction=0.2)
    assert bytes(carved.train_stream.numpy()) + bytes(carved.val_stream.numpy()) != bytes(dm.train_stream.numpy())
    assert (bytes(carved.train_stream.numpy()), bytes(carved.val_stream.numpy())) == expected(train_docs, 0.2)
    (data / "validation.jsonl").rename(data / "test.jsonl")
    with pytest.raises(DataError) as err:
        make(data, tmp_path).setup()
    assert one_line(err) == (
        f"val_split='validation' is not a split of '{data}'; splits: test, train; pass one of them "
        "or val_split=null to carve val_fraction of the train documents"
    )
    assert make(data, tmp_path, val_split="test").val_stream.numel() == len("\n\n".join(val_docs).encode())


def test_empty_documents_are_skipped_and_counted(tmp_path, caplog):
    docs = [d if i % 3 else "" for i, d in enumerate(documents(60))]
    path = tmp_path / "gappy.jsonl"
    path.write_text("".join(json.dumps({"text": d if d else None}) + "\n" for d in docs))  # nulls count as empty
    with caplog.at_level("WARNING", logger="data_modules.hf"):
        dm = make(path, tmp_path, val_fraction=0.2)
        dm.train_stream  # noqa: B018 - the streams are read (and the rows counted) on first use
    # rows without the text are not silent: one warning line says how many and where the first is
    said = [r.getMessage() for r in caplog.records if r.name == "data_modules.hf"]
    assert said == ["accrot: warning: 20 of 60 rows of 'gappy.jsonl' have no 'text' (row 0 is the first); they are "
                    "skipped as empty documents (run.json counts them)"], said
    assert (bytes(dm.train_stream.numpy()), bytes(dm.val_stream.numpy())) == expected(docs, 0.2)
    splits = dm.describe()["splits"]
    assert splits["train"]["empty_documents"] + splits["validation"]["empty_documents"] == 20


# --- the hub ------------------------------------------------------------------------------------------


def test_hub_name_offline_fails_fast():
    import datasets  # noqa: F401 - imported before timing: the check, not the import, must be fast

    assert os.environ["HF_HUB_OFFLINE"] == "1"  # tests/conftest.py
    start = time.perf_counter()
    with pytest.raises(DataError) as err:
        HFDataModule(path="wikitext", name="wikitext-2-raw-v1")
    assert time.perf_counter() - start < 2.0
    assert one_line(err) == (
        "dataset 'wikitext' is not available offline (HF_HUB_OFFLINE=1) and is not cached; "
        "pass a local path (text/JSONL/Parquet) or run once online"
    )


def test_hub_name_without_network_fails_fast(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var)
    monkeypatch.setattr(hf_source, "network_problem", lambda: "no network: cannot reach huggingface.co:443")
    start = time.perf_counter()
    with pytest.raises(DataError) as err:
        HFDataModule(path="Salesforce/wikitext")
    assert time.perf_counter() - start < 2.0
    assert "(no network: cannot reach huggingface.co:443) and is not cached" in one_line(err)


def test_network_probe_reports_an_unreachable_endpoint(monkeypatch):
    for var in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: closed
    start = time.perf_counter()
    assert hf_source.network_problem(timeout=1.0) == "no network: cannot reach 127.0.0.1:9"
    assert time.perf_counter() - start < 1.5


@pytest.fixture(scope="module")
def cached_hub_dataset(tmp_path_factory) -> str:
    """A dataset in the datasets cache laid out as ``load_dataset`` leaves a hub download: train + validation."""
    import datasets
    from datasets.packaged_modules.json.json import Json

    src = tmp_path_factory.mktemp("hub-src")
    files = {"train": str(write_jsonl(src / "a.jsonl", documents(40))),
             "validation": str(write_jsonl(src / "b.jsonl", documents(8, start=200)))}
    with hf_source.quiet_datasets():
        builder = Json(cache_dir=str(src / "build"), dataset_name="tiny_corpus", config_name="en", data_files=files)
        builder.download_and_prepare()
    dest = Path(datasets.config.HF_DATASETS_CACHE) / "accrot-test___tiny_corpus" / "en" / "0.0.0" / "0123456789abcdef"
    shutil.copytree(builder.cache_dir, dest, ignore=shutil.ignore_patterns("*.lock"))
    return "accrot-test/tiny_corpus"


def test_hub_name_offline_loads_from_the_datasets_cache(cached_hub_dataset, tmp_path):
    dm = make(cached_hub_dataset, tmp_path, name="en")
    assert bytes(dm.val_stream.numpy()) == "\n\n".join(documents(8, start=200)).encode()
    assert bytes(dm.train_stream.numpy()) == "\n\n".join(documents(40)).encode()
    d = dm.describe()
    assert d["source"] == "hub" and d["dataset"] == cached_hub_dataset and d["config"] == "en"
    assert d["available_splits"] == ["train", "validation"] and d["cache"]["hit"] is False
    again = make(cached_hub_dataset, tmp_path, name="en")
    assert again.fingerprint == dm.fingerprint and again.cache_hit is True
    with pytest.raises(DataError) as err:
        make(cached_hub_dataset, tmp_path, name="fr")
    assert one_line(err) == (
        f"dataset '{cached_hub_dataset}' config 'fr' is not available offline (HF_HUB_OFFLINE=1) and is not "
        "cached; cached configs: en; pass name=<one of them> or run once online"
    )
    with pytest.raises(DataError) as err:
        make(cached_hub_dataset, tmp_path, name="en", train_split="training").setup()
    assert "train_split='training' is not a split of 'accrot-test/tiny_corpus'; splits: train, validation" in one_line(err)


# --- a Hugging Face tokenizer (a stand-in: transformers is optional) -----------------------------------


class WordTokenizer:
    """Just enough of a transformers tokenizer: words -> ids 4..299, eos = 3."""

    eos_token_id = 3
    name_or_path = "words"

    def __len__(self) -> int:
        return 300

    def __call__(self, texts, add_special_tokens, return_attention_mask, verbose):
        assert add_special_tokens is False
        return {"input_ids": [[4 + sum(w.encode()) % 296 for w in t.split()] for t in texts]}

    def decode(self, ids):
        return " ".join(map(str, ids))


def fake_transformers(monkeypatch, from_pretrained) -> list[dict]:
    calls: list[dict] = []

    def load(name, **kwargs):
        calls.append({"name": name, **kwargs})
        return from_pretrained(name)

    module = types.ModuleType("transformers")
    module.AutoTokenizer = types.SimpleNamespace(from_pretrained=load)
    monkeypatch.setitem(sys.modules, "transformers", module)
    return calls


def test_hf_tokenizer_separates_documents_by_eos(sources, tmp_path, monkeypatch):
    calls = fake_transformers(monkeypatch, lambda name: WordTokenizer())
    dm = make(sources["jsonl"], tmp_path, tokenizer="words")
    assert calls == [{"name": "words", "local_files_only": True}]
    monkeypatch.delitem(sys.modules, "transformers")  # the stand-in must not meet datasets' own imports
    assert dm.vocab_size == 300 and dm.train_stream.dtype == torch.uint16  # the smallest dtype for 300 ids
    train_docs = [d for i, d in enumerate(DOCS) if document_fraction(i) >= 0.05]
    tok = WordTokenizer()
    ids = []
    for i, doc in enumerate(train_docs):
        ids += ([3] if i else []) + tok([doc], False, False, False)["input_ids"][0]
    assert dm.train_stream.long().tolist() == ids
    d = dm.describe()
    assert d["tokenizer"] == {"name": "words", "vocab_size": 300} and d["separator"] == "eos id 3"
    assert d["stream_dtype"] == "uint16"
    x, _ = next(iter(dm.train_dataloader()))
    assert x.dtype == torch.int64 and int(x.max()) < 300
    bytes_dm = make(sources["jsonl"], tmp_path)
    assert bytes_dm.fingerprint != dm.fingerprint and bytes_dm.cache_file != dm.cache_file


def test_stream_dtype_is_the_smallest_that_fits():
    assert [stream_dtype(v).name for v in (256, 257, 65536, 65537, 200_000)] == [
        "uint8", "uint16", "uint16", "int32", "int32"]


# --- errors: one line, naming the value and what would be valid ---------------------------------------


def test_missing_column(sources, tmp_path):
    with pytest.raises(DataError) as err:
        make(sources["jsonl"], tmp_path, column="txt").setup()
    assert one_line(err) == "column 'txt' is not in 'corpus.jsonl'; columns: text, id; pass column=<one of them>"
    with pytest.raises(DataError) as err:
        make(sources["parquet"], tmp_path, column="id").setup()
    assert one_line(err) == "column 'id' of 'corpus.parquet' holds int64, not text; text columns: text"


def test_empty_inputs(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError) as err:
        make(empty, tmp_path)
    assert one_line(err) == f"data file '{empty}' is empty; pass a file with at least one document"
    folder = tmp_path / "folder"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text("")
    with pytest.raises(DataError) as err:
        make(folder, tmp_path)
    assert one_line(err) == f"all 2 data files of directory '{folder}' are empty; pass files with documents"
    blank = write_jsonl(tmp_path / "blank.jsonl", ["", "", ""])
    with pytest.raises(DataError) as err:
        make(blank, tmp_path).setup()
    assert one_line(err) == (
        "all 3 documents of 'blank.jsonl' are empty (column 'text'); pass data with non-empty documents"
    )
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    (nothing / "notes.md").write_text("x")
    with pytest.raises(DataError) as err:
        make(nothing, tmp_path)
    assert one_line(err).startswith(f"directory '{nothing}' holds no .json, .jsonl, .parquet, .text, .txt files")


def test_non_utf8_text_file(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "good.txt").write_text(documents(1)[0])
    (folder / "latin1.txt").write_bytes("café au lait\n".encode("latin-1"))
    with pytest.raises(DataError) as err:
        make(folder, tmp_path).setup()
    assert one_line(err) == (
        "file 'latin1.txt' is not valid UTF-8 (byte 0xe9 at offset 3); "
        "convert it to UTF-8 (e.g. iconv -t utf-8) or remove it"
    )


def test_unparsable_jsonl(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": oops}\n')
    with pytest.raises(DataError) as err:
        make(bad, tmp_path).setup()
    assert one_line(err).startswith(f"cannot read '{bad}' as json (")


def test_missing_path_and_unsupported_extension(tmp_path):
    missing = tmp_path / "x" / "y.jsonl"
    with pytest.raises(DataError) as err:
        make(missing, tmp_path)
    assert one_line(err).startswith(f"data path '{missing}' does not exist; pass an existing .json, .jsonl")
    with pytest.raises(DataError, match=r"data path glob '.*\*\.jsonl' matches no files") as err:
        make(tmp_path / "*.jsonl", tmp_path)
    one_line(err)
    csv = tmp_path / "table.csv"
    csv.write_text("text\nhello\n")
    with pytest.raises(DataError) as err:
        make(csv, tmp_path)
    assert one_line(err) == (
        f"data file '{csv}' has unsupported extension '.csv'; use one of .json, .jsonl, .parquet, .text, .txt"
    )
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    write_jsonl(mixed / "a.jsonl", documents(3))
    (mixed / "b.txt").write_text("text")
    with pytest.raises(DataError) as err:
        make(mixed, tmp_path)
    assert one_line(err) == f"directory '{mixed}' mixes formats (.jsonl, .txt); point path at files of one format"


def test_unknown_tokenizer(sources, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(DataError) as err:
        make(sources["jsonl"], tmp_path, tokenizer="gpt2")
    assert one_line(err) == (
        "tokenizer 'gpt2' needs the transformers package, which is not installed; "
        "install it (pip install transformers) or use tokenizer='bytes'"
    )

    def not_cached(name):
        raise OSError(f"We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them\n"
                      f"in the cached files. Check your connection or see {name}.")

    calls = fake_transformers(monkeypatch, not_cached)
    with pytest.raises(DataError) as err:
        make(sources["jsonl"], tmp_path, tokenizer="gpt2")
    msg = one_line(err)
    assert msg.startswith("tokenizer 'gpt2' is not cached locally (OSError: We couldn't connect")
    assert msg.endswith("pass tokenizer='bytes', a local tokenizer directory, or load it once online "
                        "(AutoTokenizer.from_pretrained('gpt2'))")
    assert calls[0]["local_files_only"] is True


def test_carved_validation_that_is_empty_suggests_a_fraction(tmp_path):
    docs = documents(5)
    path = write_jsonl(tmp_path / "five.jsonl", docs)
    lowest = min(document_fraction(i) for i in range(5))
    with pytest.raises(DataError) as err:
        make(path, tmp_path, val_fraction=lowest / 2).setup()
    msg = one_line(err)
    assert msg.startswith(f"val_fraction={lowest / 2} puts none of the 5 documents of 'five.jsonl' in the validation")
    suggested = float(msg.split(">= ")[1].split()[0])
    assert make(path, tmp_path, val_fraction=suggested).describe()["splits"]["validation"]["documents"] == 1


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"val_fraction": 0.0}, "val_fraction=0.0 is not valid; use a number strictly between 0 and 1"),
        ({"val_split": "train"}, "val_split='train' is not valid; name a split other than train_split='train'"),
        ({"name": "en"}, "name='en' is a hub dataset config but path"),
        ({"train_split": "dev"}, "train_split='dev' is not a split of"),
        ({"column": ""}, "column='' is not valid"),
        ({"seq_len": 0}, "seq_len=0 is not valid; use an integer >= 2"),
    ],
    ids=["val0", "val-is-train", "name-local", "no-train-split", "column-blank", "seq0"],
)
def test_bad_arguments(sources, tmp_path, kwargs, needle):
    with pytest.raises(DataError) as err:
        make(sources["jsonl"], tmp_path, **kwargs)
    assert needle in one_line(err)


# --- pieces -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, local",
    [("wikitext", False), ("Salesforce/wikitext", False), ("HuggingFaceFW/fineweb-edu", False),
     ("data/train.jsonl", True), ("/abs/corpus", True), ("./corpus", True), ("~/corpus", True),
     ("shards/*.parquet", True), ("notes.csv", True)],
)
def test_looks_local(path, local):
    assert looks_local(path) is local


@pytest.mark.parametrize(
    "relpath, split",
    [("train.jsonl", "train"), ("data/train-00000-of-00002.parquet", "train"), ("wiki.valid.txt", "validation"),
     ("dev/a.txt", "validation"), ("val.jsonl", "validation"), ("test_1.txt", "test"), ("interval.txt", None),
     ("notes.txt", None), ("contest.jsonl", None), ("valid/train.jsonl", "validation"),
     ("data/random-00000-of-00003.jsonl", "random")],
)
def test_split_of(relpath, split):
    assert split_of(relpath) == split


@pytest.mark.parametrize(
    "layout",
    [["train.jsonl", "validation.jsonl"], ["wiki.train.txt", "wiki.valid.txt", "wiki.test.txt"],
     ["dev/a.txt", "train/b.txt", "train/c.txt"], ["valid/train.jsonl", "train/x.jsonl"],
     ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet", "data/test-00000-of-00001.parquet"],
     ["notes.txt", "more.txt"]],
)
def test_split_of_agrees_with_datasets(layout, tmp_path):
    """Each file of a directory is in the split ``datasets`` itself resolves it to (so its rules are the ones used)."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    for rel in layout:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    resolved = DataFilesDict.from_patterns(get_data_patterns(str(tmp_path)), base_path=str(tmp_path))
    theirs = {Path(f).relative_to(tmp_path).as_posix(): split for split, files in resolved.items() for f in files}
    assert theirs == {rel: split_of(rel) or "train" for rel in layout}


def test_document_split_is_deterministic():
    fractions = [document_fraction(i) for i in range(2000)]
    assert fractions == [document_fraction(i) for i in range(2000)]
    assert all(0 <= f < 1 for f in fractions) and 0.03 < sum(f < 0.05 for f in fractions) / 2000 < 0.07


# --- through the command ------------------------------------------------------------------------------


def cli_args(path: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["fit", "--config", "tiny", "--data=data_modules.HFDataModule", f"--data.init_args.path={path}",
            f"--data.init_args.cache_dir={tmp_path / 'cache'}", "--trainer.fast_dev_run=true", "--wandb=disabled",
            "--trainer.enable_progress_bar=false", "--extrapolation.multipliers=[1]",
            "--extrapolation.budget_tokens=256", f"--root={tmp_path / 'runs'}", *extra]


def test_cli_fit_on_a_jsonl_file(sources, tmp_path):
    from accrot.cli import main

    assert main(cli_args(sources["jsonl"], tmp_path)) == 0
    (record,) = (tmp_path / "runs").glob("*/version_*/run.json")
    data = json.loads(record.read_text())["data"]
    assert data["source"] == "local" and data["path"] == str(sources["jsonl"]) and len(data["fingerprint"]) == 64


# a missing column through `accrot fit` (exit 2, one line): a row of tests/test_bad_inputs.py

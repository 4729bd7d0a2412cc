"""The ablation's options for a researcher's corpus and GPU: ``--tune_lr`` (the grid's spec, its choice read from a
real storage, the report's section, a real tuned ablation resumed), ``--corpus``, ``--tokens``, ``--precision`` and
``--set``. The bad inputs of each are rows of tests/test_bad_inputs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from accrot.errors import UsageError
from accrot.study.ablation import build_spec, describe_scope
from accrot.study.options import check_resumable, datasets_of
from accrot.study.report import write_report
from accrot.study.results import Results, Run, collect, theory_dataset
from accrot.study.tuning import (
    TUNE_SEED,
    choose,
    lr_table,
    pending,
    summary,
    tuned,
    tuning_doc,
    with_lrs,
    without_lrs,
)
from accrot.study.variants import SIZES
from accrot.sweep.spec import SweepSpec, load_spec
from accrot.sweep.storage import StorageRef, open_storage

ROOT = Path(__file__).resolve().parents[2]


def _spec(doc: dict) -> SweepSpec:
    return SweepSpec(**yaml.safe_load(yaml.safe_dump(doc, sort_keys=False)))  # as the ablation writes it


def _class_paths(over: dict) -> list[str]:
    return [c["class_path"].rsplit(".", 1)[1] for c in over.get("trainer.callbacks", [])]


# ---------------------------------------------------------------------------------------------------
# --tune_lr
# ---------------------------------------------------------------------------------------------------
def test_the_lr_grid_is_its_own_sweep_of_the_same_runs_at_one_unused_seed():
    doc = build_spec("a", SIZES["study"], 3, ["NoPE", "PaTH"], ["corpus", "local"])
    grid = _spec(tuning_doc(doc))
    assert grid.name == "a-lr" and grid.seeds == [TUNE_SEED] and TUNE_SEED not in doc["seeds"]
    assert grid.space["model.lr"].choices == [0.001, 0.003, 0.009]  # lr/3, lr, 3·lr of the study size's 3e-3
    assert list(grid.studies()) == ["a-lr/corpus", "a-lr/local"] and grid.budget_of("a-lr/corpus") == 2 * 3
    # the ablation's recipe and strata, read at 1× only and without the diagnostics
    assert grid.overrides["extrapolation.multipliers"] == [1]
    assert {k: v for k, v in grid.overrides.items() if k != "extrapolation.multipliers"} == \
        {k: v for k, v in doc["overrides"].items() if k != "extrapolation.multipliers"}
    for st in grid.strata():
        assert _class_paths(st.overrides) == ["ModelCheckpoint"]
        assert {k: v for k, v in st.overrides.items() if k != "trainer.callbacks"} == \
            {k: v for k, v in doc["variants"][st.variant].items() if k != "trainer.callbacks"}
    assert "DiagnosticsCallback" in _class_paths(doc["variants"]["corpus.PaTH"])  # the ablation's own keep them

    lrs = {"corpus.NoPE": 0.009, "corpus.PaTH": 0.001, "local.NoPE": 0.003, "local.PaTH": 0.003}
    main = with_lrs(doc, lrs)
    spec = _spec(main)
    assert spec.space == {} and spec.budget_of("a/corpus") == 2 * 3  # variants × seeds, nothing searched
    assert {st.variant: st.overrides["model.lr"] for st in spec.strata()} == lrs
    assert tuned(main) and not tuned(doc) and without_lrs(main) == without_lrs(doc)


def test_the_grid_point_of_lowest_nll_wins_and_a_diverged_one_never_does():
    assert choose({0.001: 2.0, 0.003: 1.9, 0.009: 2.1}, 0.003) == (0.003, "")
    assert choose({0.001: 2.0, 0.003: 1.9, 0.009: 1.8}, 0.003) == (0.009, "edge")  # the optimum may lie beyond
    assert choose({0.001: 2.0, 0.003: None, 0.009: None}, 0.003) == (0.001, "edge")  # None: the run failed
    assert choose({0.001: 2.0, 0.003: 2.0, 0.009: 2.0}, 0.003) == (0.003, "")  # a tie: the nearer the centre
    assert choose({0.001: None, 0.003: None, 0.009: None}, 0.003) == (0.003, "none complete")


def _grid_trial(label: str, lr: float, nll: float | None):
    dist = {"variant": CategoricalDistribution(["corpus.NoPE", "corpus.RoPE"]),
            "seed": CategoricalDistribution([TUNE_SEED]), "model.lr": CategoricalDistribution([0.001, 0.003, 0.009])}
    return optuna.trial.create_trial(
        state=TrialState.COMPLETE if nll is not None else TrialState.FAIL, value=nll, distributions=dist,
        params={"variant": label, "seed": TUNE_SEED, "model.lr": lr},
        user_attrs={"variant": label, "seed": TUNE_SEED, **({"metrics": {"nll@1x": nll}} if nll else {})})


def test_the_chosen_rates_are_read_from_the_grid_in_the_storage(tmp_path):
    path = tmp_path / "g-lr.yaml"
    path.write_text(yaml.safe_dump(tuning_doc(build_spec("g", SIZES["tiny"], 2, ["NoPE", "RoPE"], ["corpus"]))))
    spec, ref = load_spec(path), StorageRef.parse(None, "g", tmp_path)
    assert pending(spec, ref)  # no storage yet
    (tmp_path / "g").mkdir()
    study = optuna.create_study(study_name="g-lr/corpus", storage=open_storage(ref, create=True))
    grid = {("corpus.NoPE", 0.001): 2.3, ("corpus.NoPE", 0.003): 2.1, ("corpus.NoPE", 0.009): None,
            ("corpus.RoPE", 0.001): 2.4, ("corpus.RoPE", 0.003): 2.2, ("corpus.RoPE", 0.009): 2.0}
    for (label, lr), nll in list(grid.items())[:5]:
        study.add_trial(_grid_trial(label, lr, nll))
    assert pending(spec, ref)  # a point is missing
    study.add_trial(_grid_trial("corpus.RoPE", 0.009, 2.0))
    assert not pending(spec, ref)
    table = lr_table(spec, ref)
    assert table["grid"] == [0.001, 0.003, 0.009] and table["seed"] == TUNE_SEED and table["criterion"] == "nll@1x"
    assert table["cells"] == {
        "corpus.NoPE": {"lr": 0.003, "note": "", "nll": {"0.001": 2.3, "0.003": 2.1, "0.009": None}},
        "corpus.RoPE": {"lr": 0.009, "note": "edge", "nll": {"0.001": 2.4, "0.003": 2.2, "0.009": 2.0}}}
    assert summary(table) == ["learning rates on corpus (lowest nll@1x of the grid): NoPE 0.003, RoPE 0.009 (edge)"]


def _run(variant: str, seed: int, lr: float, params: int, dataset: str = "corpus") -> Run:
    rows = {m: {"multiplier": m, "length": int(128 * m), "nll": 2.0 + 0.1 * m} for m in (1.0, 2.0)}
    return Run(dataset, variant, seed, f"/runs/{variant}/{seed}", rows, 128, params=params, lr=lr)


def test_the_report_names_each_variants_rate_its_grid_and_tokens_per_parameter(tmp_path):
    runs = [_run("NoPE", s, 0.003, 100_000) for s in (0, 1)] + [_run("RoPE", s, 0.009, 120_000) for s in (0, 1)]
    table = {"grid": [0.001, 0.003, 0.009], "seed": TUNE_SEED, "criterion": "nll@1x", "cells": {
        "corpus.NoPE": {"lr": 0.003, "note": "", "nll": {"0.001": 2.3, "0.003": 2.1, "0.009": None}},
        "corpus.RoPE": {"lr": 0.009, "note": "edge", "nll": {"0.001": 2.4, "0.003": 2.2, "0.009": 2.0}}}}
    scope = describe_scope(build_spec("r", SIZES["study"], 2, ["NoPE", "RoPE"], ["corpus"], max_steps=50), "study")
    meta = {"command": "test", "size": "study", "seeds": 2, "scope": scope, "lr": table}
    text = write_report(Results(runs), tmp_path, meta).read_text()
    assert "| corpus | NoPE | 0.003 | 2.300 | **2.100** | failed |" in text
    assert "| corpus | RoPE | 0.009 (edge) | 2.400 | 2.200 | **2.000** |" in text
    # 50 steps × 16 sequences × 128 tokens = 102 400 tokens: 1.02 per parameter of NoPE, 0.853 of RoPE
    assert ("- budget: 102,400 training tokens per run (50 steps × 16 sequences × L); precision 32-true; tokens per "
            "parameter on corpus: 0.853 (RoPE) to 1.02 (NoPE)") in text
    assert text.index("## Learning rates") < text.index("## Claims")
    plain = write_report(Results([_run("NoPE", 0, 0.003, 1)]), tmp_path / "plain", {"command": "t"}).read_text()
    assert "Every variant trained at 0.003 (the size's;" in plain


def test_a_tuned_ablation_refuses_other_options_before_its_grid_runs(tmp_path):
    doc = build_spec("r", SIZES["tiny"], 2, ["NoPE"], ["corpus"])
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(with_lrs(doc, {"corpus.NoPE": 0.009})))
    check_resumable(path, doc)  # the same options: its rates are the grid's, it resumes
    check_resumable(path, build_spec("r", SIZES["tiny"], 3, ["NoPE"], ["corpus"]))  # more seeds: a second batch
    with pytest.raises(UsageError, match=r"other options \(seeds differ\)"):  # fewer: other options
        check_resumable(path, build_spec("r", SIZES["tiny"], 1, ["NoPE"], ["corpus"]))
    path.write_text(yaml.safe_dump(doc))  # an ablation made without --tune_lr
    with pytest.raises(UsageError, match=r"other options \(--tune_lr differs\)"):
        check_resumable(path, doc)


@pytest.mark.slow
def test_a_tuned_ablation_trains_each_variant_at_its_best_grid_rate_and_resumes(tmp_path):
    """A real ``--tune_lr`` ablation (3 grid runs, then the seed), run twice: the second run trains nothing."""
    argv = [sys.executable, "-m", "accrot.cli", "ablation", "--size=tiny", "--variants", "NoPE", "--datasets",
            "corpus", "--seeds=1", "--max_steps=3", "--multipliers", "1", "2", "--tune_lr", "--workers=1",
            "--study=t", "--wandb=disabled", "--quiet", f"--out={tmp_path}"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert first.returncode == 0, first.stderr[-3000:]
    storage = open_storage(StorageRef.parse(None, "t", tmp_path))

    def finished() -> dict[str, list]:
        return {name: sorted((t.number, str(t.datetime_complete), t.state.name) for t in
                             optuna.load_study(study_name=name, storage=storage).get_trials())
                for name in ("t-lr/corpus", "t/corpus")}

    before = finished()
    assert [len(before["t-lr/corpus"]), len(before["t/corpus"])] == [3, 1], before
    grid = optuna.load_study(study_name="t-lr/corpus", storage=storage).get_trials(states=(TrialState.COMPLETE,))
    best = min(grid, key=lambda t: t.value).params["model.lr"]
    (run,) = optuna.load_study(study_name="t/corpus", storage=storage).get_trials(states=(TrialState.COMPLETE,))
    record = json.loads((Path(run.user_attrs["run_dir"]) / "run.json").read_text())
    assert record["hparams"]["lr"] == best and record["seed"] != TUNE_SEED
    report = (tmp_path / "t" / "REPORT.md").read_text()
    assert f"| corpus | NoPE | {best:g}" in report and "## Learning rates" in report
    assert f"learning rates on corpus (lowest nll@1x of the grid): NoPE {best:g}" in first.stderr

    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert finished() == before  # nothing trained again, in the grid or the ablation
    assert "every study has spent its budget" in again.stderr


# ---------------------------------------------------------------------------------------------------
# --corpus, --tokens, --precision, --set
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("corpus, given, datasets, source", [
    ("stdlib", None, ["corpus", "local"], None),
    ("prose", None, ["prose", "local"], None),  # the claims' data set replaces the embedded corpus by default
    ("stdlib", ["passkey"], ["corpus", "passkey"], None),  # and joins --datasets when they leave it out
    ("hf:wikitext", ["corpus", "local"], ["hf", "corpus", "local"], "wikitext"),
    ("stdlib", ["corpus", "hf:./docs"], ["corpus", "hf"], "./docs"),
], ids=["default", "prose", "joins", "hf-corpus", "hf-entry"])
def test_the_corpus_option_names_the_data_set_the_claims_read(corpus, given, datasets, source):
    args = SimpleNamespace(corpus=corpus, datasets=given)
    assert datasets_of(args) == datasets and args.hf_source == source
    assert args.corpus_data == {"stdlib": "corpus", "prose": "prose"}.get(corpus, "hf")


def test_the_claims_and_diagnostics_follow_the_corpus_into_the_spec_and_the_report(tmp_path):
    """``--corpus hf:FILE`` builds an hf data set from local files (checked by the real parser and data module,
    ``--workers 0``), the diagnostics on its runs only, and the results read on it, also for --report_only."""
    from accrot.cli import main

    docs = tmp_path / "docs.jsonl"
    # enough validation text for the study's longest evaluation (64 x 128 tokens): the ablation cuts every data
    # set's evaluation blocks before it creates the study
    docs.write_text("".join(json.dumps({"text": f"document {i} " * 500}) + "\n" for i in range(200)))
    out = tmp_path / "out"
    argv = ["ablation", "--corpus", f"hf:{docs}", "--variants", "NoPE", "--datasets", "local", "--workers=0",
            "--study=c", f"--out={out}", "--wandb=disabled", "--quiet"]
    assert main(argv) == 0
    spec = load_spec(out / "c" / "c.yaml")
    strata = {st.variant: st.overrides for st in spec.strata()}
    assert list(strata) == ["hf.NoPE", "local.NoPE"]
    assert strata["hf.NoPE"]["data"] == "data_modules.HFDataModule" and strata["hf.NoPE"]["data.init_args.path"] == \
        str(docs)
    assert _class_paths(strata["hf.NoPE"]) == ["ModelCheckpoint", "DiagnosticsCallback"]
    # the local task is diagnosed too (the far-mass bound is read there), but the claims stay on the corpus
    assert _class_paths(strata["local.NoPE"]) == ["ModelCheckpoint", "DiagnosticsCallback"]
    assert theory_dataset(spec) == "hf" and collect(spec, StorageRef.parse(None, "c", out)).corpus == "hf"


def test_the_claims_data_set_is_the_diagnosed_one_that_is_not_the_local_task(tmp_path):
    """The local task is diagnosed for the far-mass bound alone: listed first, it must not take the claims."""
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(build_spec("a", SIZES["study"], 2, ["NoPE"], ["local", "corpus"])))
    assert theory_dataset(load_spec(path)) == "corpus"
    path.write_text(yaml.safe_dump(build_spec("a", SIZES["study"], 2, ["NoPE"], ["local"], corpus="local")))
    assert theory_dataset(load_spec(path)) == "local"  # the only one diagnosed


def test_a_token_budget_sets_the_steps_and_scales_the_recipes_cadences():
    """The study size's recipe: 300 steps × 16 × 128, warm-up 30, validation every 100, checkpoints every 100."""
    tokens = 150 * 16 * 128
    doc = build_spec("t", SIZES["study"], 1, ["NoPE", "accum-random"], ["corpus", "needle"], tokens=tokens)
    over = doc["overrides"]
    assert (over["trainer.max_steps"], over["model.warmup_steps"], over["trainer.val_check_interval"],
            over["extrapolation.every_n_steps"]) == (150, 15, 50, 0)
    assert doc["variants"]["corpus.NoPE"]["trainer.callbacks"][0]["init_args"]["every_n_train_steps"] == 50
    needle = doc["variants"]["needle.NoPE"]  # trains at L = 256: half the steps for the same tokens
    assert (needle["trainer.max_steps"], needle["trainer.val_check_interval"]) == (75, 25)
    assert needle["trainer.callbacks"][0]["init_args"]["every_n_train_steps"] == 25
    scope = describe_scope(doc, "study")
    assert scope["tokens"] == {"corpus": tokens, "needle": tokens} and "150 steps of its 300" in scope["below"]
    small = build_spec("s", SIZES["small"], 1, ["NoPE"], ["corpus"], tokens=1000 * 32 * 512)["overrides"]
    assert (small["trainer.max_steps"], small["model.warmup_steps"], small["trainer.val_check_interval"],
            small["extrapolation.every_n_steps"]) == (1000, 40, 100, 200)
    # a batch set with --set counts: 8 sequences a step
    halved = build_spec("h", SIZES["study"], 1, ["NoPE"], ["corpus"], tokens=tokens,
                        settings={"data.init_args.batch_size": 8})["overrides"]
    assert halved["trainer.max_steps"] == 300 and halved["data.init_args.batch_size"] == 8


def test_precision_and_set_reach_every_run_and_are_checked_by_the_fit_parser(tmp_path, capsys):
    from accrot.cli import main
    from accrot.sweep.trials import check_stratum, trial_args

    out = tmp_path / "out"
    argv = ["ablation", "--variants", "NoPE", "RoPE", "--datasets", "corpus", "--workers=0", "--study=p",
            f"--out={out}", "--precision", "bf16-mixed", "--set", "model.weight_decay=0.05", "--set", "model.lr=1e-3",
            "--tokens", str(100 * 16 * 128)]
    assert main(argv) == 0
    spec = load_spec(out / "p" / "p.yaml")
    assert spec.overrides["trainer.precision"] == "bf16-mixed" and spec.overrides["model.weight_decay"] == 0.05
    assert spec.space["model.lr"].choices == [0.001] and spec.overrides["trainer.max_steps"] == 100
    for st in spec.strata():
        args = trial_args(spec, st, out, 0, 0, {"model.lr": 0.001})
        assert "--trainer.precision=bf16-mixed" in args and "--model.weight_decay=0.05" in args
        check_stratum(spec, st)
    # the grid centres on --set model.lr; --workers 0 queues the grid only (the ablation's study waits for it)
    capsys.readouterr()
    assert main([*argv[:6], "--workers=0", "--study=q", f"--out={out}", "--set", "model.lr=1e-3", "--tune_lr"]) == 0
    assert "is made once the grid is done" in capsys.readouterr().err
    assert load_spec(out / "q" / "q-lr.yaml").space["model.lr"].choices == [0.000333, 0.001, 0.003]
    assert not (out / "q" / "q.yaml").exists()


def test_the_claims_are_read_on_the_chosen_corpus(tmp_path):
    """The same runs, two corpora with opposite outcomes: C1 (accum-random below RoPE at 4×–16×) follows the data set
    the results are read on, and REPORT.md says which."""
    from accrot.study.claims import check_claims
    from accrot.study.stats import NOT_SUPPORTED, SUPPORTED

    def run(dataset: str, variant: str, seed: int, far: float) -> Run:
        rows = {m: {"multiplier": m, "length": int(128 * m), "nll": 2.0 if m == 1 else far + 0.01 * seed}
                for m in (1.0, 4.0, 8.0, 16.0)}
        return Run(dataset, variant, seed, f"/runs/{dataset}/{variant}/{seed}", rows, 128)

    runs = [run(d, v, s, far) for s in range(3) for d, v, far in [
        ("prose", "RoPE", 3.0), ("prose", "accum-random", 2.2), ("corpus", "RoPE", 2.2), ("corpus", "accum-random", 3.0)]]
    verdict = {corpus: next(c.verdict for c in check_claims(Results(runs, corpus)) if c.id == "C1")
               for corpus in ("prose", "corpus")}
    assert verdict == {"prose": SUPPORTED, "corpus": NOT_SUPPORTED}
    text = write_report(Results(runs, "prose"), tmp_path, {"command": "t"}).read_text()
    claims = text[text.index("## Claims"):]
    assert "Read on **prose (King James Bible, Debian bible-kjv)** (data set `prose`)" in claims
    assert text.index("## prose") < text.index("## embedded corpus")  # the claims' data set first

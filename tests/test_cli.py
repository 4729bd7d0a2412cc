"""The ``accrot`` command end to end: every shipped config runs, runs record what produced them, bad
input ends with one line and exit status 2 from the shell, ``accrot eval`` reads a checkpoint (the whole
bad-input catalogue is tests/test_bad_inputs.py)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accrot.cli import main, version
from accrot.run.args import CONFIG_DIR

REPO = Path(__file__).resolve().parent.parent

SHIPPED = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
QUICK = ["--trainer.enable_progress_bar=false", "--wandb=disabled", "--extrapolation.budget_tokens=2048"]


@pytest.mark.parametrize("config", SHIPPED)
def test_fast_dev_run_of_every_shipped_config(config, tmp_path):
    rc = main(["fit", "--config", config, "--trainer.fast_dev_run=true", f"--root={tmp_path}",
               "--extrapolation.multipliers=[1,2]", "--trainer.limit_val_batches=1",
               "--data.init_args.batch_size=2", *QUICK])
    assert rc == 0
    # the run is the shipped recipe: one step of its model, recorded, evaluated at both lengths
    recipe = yaml.safe_load((CONFIG_DIR / f"{config}.yaml").read_text())
    (run_dir,) = list(tmp_path.glob("*/version_0"))
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "finished" and record["step"] == 1
    for key in ("d_model", "n_layers", "n_heads", "lr"):
        assert record["hparams"][key] == recipe["model"][key], key
    assert record["data"]["seq_len"] == recipe["data"]["init_args"]["seq_len"]
    final = json.loads((run_dir / "extrapolation.json").read_text())["final"]
    assert final["step"] == 1 and [row["multiplier"] for row in final["lengths"]] == [1, 2]
    assert all(math.isfinite(row["nll"]) and row["blocks"] > 0 for row in final["lengths"])
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_a_gated_interleaved_ssmax_cell_trains_and_records_its_layers(tmp_path):
    """The far-mass designs as one config: the run is named by them and run.json records every layer's scheme."""
    rc = main(["fit", "--config", "tiny", "--trainer.fast_dev_run=true", f"--root={tmp_path}",
               "--model.scheme.rotation=rope", "--model.scheme.far_mass=ssmax",
               "--model.scheme.output_gate=elementwise", "--model.scheme.layer_pattern=[cell, none]", "--extrapolation.multipliers=[1,2]",
               "--trainer.limit_val_batches=1", "--data.init_args.batch_size=2", *QUICK])
    assert rc == 0
    (run_dir,) = list(tmp_path.glob("rope-ssmax-gate-layers_cell_none/version_0"))
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "finished"
    assert record["scheme_layers"] == ["rope/ssmax+gate", "none/ssmax+gate"]
    assert record["scheme"]["layer_pattern"] == ["cell", "none"] and record["scheme"]["cell"] == (
        "rope/ssmax+gate(cell,none)")
    assert record["hparams"]["scheme"]["layer_pattern"] == ["cell", "none"]
    assert len(record["scheme"]["ssmax_s"]) == record["hparams"]["n_heads"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A real (tiny, short) run shared by the tests below."""
    root = tmp_path_factory.mktemp("runs")
    rc = main(["fit", "--config", "tiny", f"--root={root}", "--trainer.max_steps=6",
               "--trainer.val_check_interval=3", "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=2",
               "--model.scheme.rotation=rope", "--extrapolation.multipliers=[1,2,4]",
               "--extrapolation.every_n_steps=3", "--extrapolation.sliding_multipliers=[2]", *QUICK])
    assert rc == 0
    (run_dir,) = list(root.glob("rope-none/version_*"))
    return run_dir


def test_run_directory_records_what_produced_it(trained_run):
    for name in ("config.yaml", "run.json", "metrics.csv", "extrapolation.json", "extrapolation.png",
                 "checkpoints/last.ckpt"):
        assert (trained_run / name).is_file(), name
    record = json.loads((trained_run / "run.json").read_text())
    assert len(record["data"]["fingerprint"]) == 64
    assert record["revision"] and record["versions"]["torch"].startswith("2.13")
    assert record["denormals"] == "IEEE"  # the command leaves torch's float mode alone (the ops flush inside)
    assert record["allocator"] == "tuned"  # the accrot command's default on glibc (runtime.set_allocator)
    assert record["hparams"]["scheme"]["rotation"] == "rope"
    assert "model" in (trained_run / "config.yaml").read_text()


def test_extrapolation_json_schema(trained_run):
    doc = json.loads((trained_run / "extrapolation.json").read_text())
    assert doc["schema"] == "accrot.extrapolation/1"
    assert doc["train_length"] == 128 and doc["budget_tokens"] == 2048
    assert [h["step"] for h in doc["history"]] == [3, 6]  # every 3 steps, and the end (no duplicate)
    final = doc["final"]["lengths"]
    assert [r["length"] for r in final] == [128, 256, 512]
    assert [r["multiplier"] for r in final] == [1.0, 2.0, 4.0]
    for r in final:
        assert r["tokens"] == r["blocks"] * r["length"] and r["blocks"] == max(1, 2048 // r["length"])
        assert 0 < r["nll"] < 6 and abs(r["ppl"] - 2.718281828 ** r["nll"]) < 1e-6 * r["ppl"]
        assert len(r["bucket_nll"]) == -(-r["length"] // r["bucket_width"])
    (sliding,) = doc["final"]["sliding"]
    assert sliding["context"] == 256 and sliding["stride"] == 64 and sliding["tokens"] > 0
    same = doc["final"]["same_targets"]  # the same targets at every length, capped at the blocks' own budget
    assert same["reference_length"] == 128 and same["k"] == 32 and same["anchors"] == max(2, 3 * 2048 // 896)
    assert [r["length"] for r in same["lengths"]] == [128, 256, 512]
    assert same["lengths"][0]["rise"] == 0.0 and all(len(r["anchor_nll"]) == same["anchors"] for r in same["lengths"])
    metrics = (trained_run / "metrics.csv").read_text().splitlines()[0]
    assert "extrap/nll@2x" in metrics and "train/loss" in metrics and "val/ppl" in metrics


def test_eval_command_on_checkpoint(trained_run, tmp_path, capsys):
    out = tmp_path / "eval"
    rc = main(["eval", "--ckpt", str(trained_run / "checkpoints/last.ckpt"), "--multipliers=[1,8]",
               "--budget_tokens=2048", f"--out={out}"])
    assert rc == 0
    doc = json.loads((out / "extrapolation.json").read_text())
    assert [r["length"] for r in doc["final"]["lengths"]] == [128, 1024]
    assert doc["final"]["step"] == 6 and (out / "extrapolation.png").is_file()
    # same blocks, same weights: the 1× number equals the callback's final one
    trained = json.loads((trained_run / "extrapolation.json").read_text())["final"]["lengths"][0]
    assert doc["final"]["lengths"][0]["nll"] == pytest.approx(trained["nll"], rel=1e-6)
    # and the same-target rise: its own anchors (the budget of 2 lengths), the 1× reference their NLL
    same = doc["final"]["same_targets"]
    assert same["anchors"] == max(2, 2 * 2048 // (128 + 1024)) and [r["length"] for r in same["lengths"]] == [128, 1024]
    assert "same-target rise" in capsys.readouterr().out


# the bad-input catalogue (every row through main, exit 2, one line, nothing left): tests/test_bad_inputs.py


def test_bad_input_from_the_shell(tmp_path):
    """The installed console script: exit status 2, one line on stderr, no traceback."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    res = subprocess.run([sys.executable, "-m", "accrot.cli", "fit", "--config", "tiny", "--model.scheme.rotation=x",
                          f"--root={tmp_path}"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines[-1] == ("accrot: error: model.scheme.rotation='x' is not valid; choose one of "
                         "'none', 'rope', 'accum', 'path'")
    assert "Traceback" not in res.stderr


def test_help_lists_scheme_keys(capsys):
    assert main(["fit", "--help"]) == 0
    assert "--model.scheme.rotation" in capsys.readouterr().out


def test_front_door_answers_without_torch():
    """`accrot --help`, `--version` and an unknown command import neither torch nor Lightning (they answer in a
    fraction of a second; `make faults` prints the times): the entry module itself imports none of them."""
    code = ("import sys, contextlib, io\n"
            "from accrot.cli import main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
            "    codes = [main(['--help']), main(['--version']), main(['fitt'])]\n"
            "heavy = [m for m in ('torch', 'lightning', 'jsonargparse') if m in sys.modules]\n"
            "print(codes, heavy)\n"
            "print(out.getvalue())\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    first, _, text = res.stdout.partition("\n")
    assert first == "[0, 0, 2] []", res.stdout + res.stderr
    for name in ("fit", "eval", "sweep", "ablation", "slurm", "report", "demo", "bench", "diagnose"):
        assert f"\n  {name} " in text, text
    assert "accrot: error: unknown command 'fitt'; did you mean fit?" in text
    assert f"accrot {version()}" in text


def test_slurm_help_lists_its_commands(capsys):
    assert main(["slurm", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: accrot slurm {train,sweep}" in out and "  train " in out and "  sweep " in out


def test_shipped_configs_exist():
    assert {"tiny", "small"} <= set(SHIPPED)
    assert Path(CONFIG_DIR / "tiny.yaml").read_text().count("seq_len: 128") == 1


@pytest.mark.parametrize("command", ["validate", "test"])
def test_lightnings_other_subcommands_are_refused_naming_eval(command, tmp_path, capsys):
    """accrot offers fit alone of LightningCLI's subcommands: the others are one line naming accrot eval, and leave
    no run directory (the data modules have no test split; a validation pass alone records no result)."""
    rc = main([command, "--config", "tiny", f"--root={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"accrot: error: accrot {command} is not a command; score a checkpoint with accrot "
                               f"eval --ckpt RUN_DIR ({'the validation' if command == 'validate' else 'the held-out'} "
                               "split at many lengths, written into RUN_DIR/eval)"]
    assert not any(tmp_path.iterdir())
    from accrot.run.lightning import AccrotCLI

    assert set(AccrotCLI.subcommands()) == {"fit"}


@pytest.mark.slow
def test_demo_command_compares_schemes(tmp_path, capsys):
    rc = main(["demo", f"--root={tmp_path}", "--variants=[NoPE,ALiBi]", "--max_steps=4",
               "--multipliers=[1,4]", "--wandb=disabled",
               "--extra=[--extrapolation.budget_tokens=1024,--trainer.enable_progress_bar=false]"])
    assert rc == 0
    doc = json.loads((tmp_path / "demo.json").read_text())
    assert set(doc["curves"]) == {"NoPE", "ALiBi"}
    assert [r["length"] for r in doc["curves"]["ALiBi"]] == [128, 512]
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    captured = capsys.readouterr()
    out = captured.out
    assert "NoPE" in out and "ALiBi" in out and "4×" in out
    # one line per run and the table: Lightning's and wandb's lines went to each run's console.log
    said = out + captured.err
    assert "GPU available" not in said and "Trainable params" not in said and "wandb:" not in said
    assert len(said.strip().splitlines()) < 40, said
    for run in doc["runs"].values():
        assert "GPU available" in (Path(run) / "console.log").read_text()
    assert not list(tmp_path.glob(".*.console.log"))


def test_eval_with_a_rope_extension_is_labelled_and_the_identity_at_the_training_length(trained_run, tmp_path):
    """`accrot eval --rope_scaling yarn` on the RoPE run: with the dynamic factor s = T / L, the 1× NLL is the plain
    evaluation's (s = 1) and the 4× NLL is not; the JSON and its folder say which extension produced them."""
    ckpt = str(trained_run / "checkpoints" / "last.ckpt")
    common = ["eval", "--ckpt", ckpt, "--multipliers=[1,4]", "--budget_tokens=1024"]
    assert main([*common, f"--out={tmp_path / 'plain'}"]) == 0
    assert main([*common, "--rope_scaling=yarn"]) == 0  # default folder: <run>/eval-yarn
    plain = json.loads((tmp_path / "plain" / "extrapolation.json").read_text())["final"]["lengths"]
    doc = json.loads((trained_run / "eval-yarn" / "extrapolation.json").read_text())
    assert doc["rope_scaling"]["kind"] == "yarn" and "eval-time extension" in doc["rope_scaling"]["label"]
    assert doc["rope_scaling"]["definition"] == "yarn-code"  # the field's code form, not the paper's equation
    yarn = doc["final"]["lengths"]
    assert yarn[0]["nll"] == plain[0]["nll"] and yarn[1]["nll"] != plain[1]["nll"]


@pytest.mark.slow
def test_extrapolation_with_a_rope_extension_never_touches_training(tmp_path):
    """`--extrapolation.rope_scaling=yarn`: the periodic evaluations use the extension (1× as trained, s = 1; 2×
    not) and record it, while training (its losses, its final weights) is the plain run's exactly."""
    import torch

    runs = {}
    for name, extra in (("plain", []), ("yarn", ["--extrapolation.rope_scaling=yarn"])):
        assert main(["fit", "--config", "tiny", f"--root={tmp_path}", f"--name={name}", "--trainer.max_steps=4",
                     "--trainer.limit_val_batches=1", "--model.scheme.rotation=rope", "--model.d_model=32",
                     "--extrapolation.multipliers=[1,2]", "--extrapolation.every_n_steps=2",
                     "--trainer.deterministic=true", *QUICK, *extra]) == 0
        runs[name] = tmp_path / name / "version_0"
    plain, yarn = (json.loads((runs[n] / "extrapolation.json").read_text()) for n in ("plain", "yarn"))
    assert all("eval-time extension" in h["rope_scaling"]["label"] and h["rope_scaling"]["definition"] == "yarn-code"
               for h in yarn["history"])
    for p, y in zip(plain["history"], yarn["history"]):
        assert y["lengths"][0]["nll"] == p["lengths"][0]["nll"] and y["lengths"][1]["nll"] != p["lengths"][1]["nll"]
    weights = [torch.load(runs[n] / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"] for n in runs]
    assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_eval_rejects_a_checkpoint_whose_weights_do_not_fit(trained_run, tmp_path, capsys):
    """A checkpoint edited to claim another scheme (PaTH needs w/β projections the weights lack)."""
    import torch

    state = torch.load(trained_run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    state["hyper_parameters"]["scheme"]["rotation"] = "path"
    run = tmp_path / "r" / "checkpoints"
    run.mkdir(parents=True)
    torch.save(state, run / "other.ckpt")
    (run.parent / "config.yaml").write_text((trained_run / "config.yaml").read_text())
    assert main(["eval", "--ckpt", str(run / "other.ckpt")]) == 2
    assert "does not match the model it describes" in capsys.readouterr().err


@pytest.mark.parametrize(
    "scheme",
    [["--model.scheme.rotation=rope", "--model.scheme.far_mass=alibi"],
     ["--model.scheme.rotation=accum", "--model.scheme.increments=learned", "--model.scheme.rotate_values=true",
      "--model.scheme.far_mass=forget"],
     ["--model.scheme.rotation=path", "--model.scheme.far_mass=forget"],
     # every PaTH and learned-increment cell: their projections (w, β, the increments) run float32 under autocast
     ["--model.scheme.rotation=path"],
     ["--model.scheme.rotation=path", "--model.scheme.far_mass=alibi"],
     ["--model.scheme.rotation=accum", "--model.scheme.increments=learned"],
     ["--model.scheme.rotation=accum", "--model.scheme.increments=learned", "--model.scheme.learned_form=plain"],
     ["--model.scheme.rotation=accum", "--model.scheme.increments=learned", "--model.scheme.rotate_values=true"],
     ["--model.scheme.rotation=accum", "--model.scheme.increments=learned", "--model.scheme.rotate_values=true",
      "--model.scheme.far_mass=alibi"]],
    ids=["rope-alibi", "accum-learned-values-forget", "path-forget", "path", "path-alibi", "accum-learned",
         "accum-learned-plain", "accum-learned-values", "accum-learned-values-alibi"],
)
@pytest.mark.filterwarnings("ignore:Precision bf16-mixed is not supported by the model summary")
def test_bf16_mixed_precision_runs_every_kernel(scheme, tmp_path, monkeypatch):
    """The GPU recipe's precision on the CPU: every op must be dtype-agnostic under bf16 autocast (on a CPU without
    hardware bf16 the command refuses it; here the CPU is taken to have it, as correctness does not depend on it)."""
    monkeypatch.setattr("accrot.runtime.cpu_bf16", lambda: "avx512_bf16")
    rc = main(["fit", "--config", "tiny", "--trainer.fast_dev_run=true", "--trainer.precision=bf16-mixed",
               f"--root={tmp_path}", "--extrapolation.multipliers=[1,2]", "--data.init_args.batch_size=2",
               "--trainer.limit_val_batches=1", *QUICK, *scheme])
    assert rc == 0
    (path,) = tmp_path.glob("*/*/extrapolation.json")
    assert all(0 < r["nll"] < 10 for r in json.loads(path.read_text())["final"]["lengths"])


@pytest.mark.slow
def test_wandb_offline_run_gets_the_curves(tmp_path, monkeypatch):
    """A real offline wandb run: the native line plots are logged next to the scalars."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    rc = main(["fit", "--config", "tiny", f"--root={tmp_path}", "--trainer.max_steps=2", "--wandb=offline",
               "--extrapolation.multipliers=[1,2]", "--extrapolation.budget_tokens=1024",
               "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false"])
    assert rc == 0
    (run,) = tmp_path.glob("*/version_0/wandb/offline-run-*")
    media = list(run.rglob("*nll_vs_length*"))
    assert media, sorted(p.name for p in run.rglob("*"))
    # a second run in the same process gets its own wandb run, in its own run directory
    assert main(["fit", "--config", "tiny", f"--root={tmp_path}", "--trainer.max_steps=2", "--wandb=offline",
                 "--extrapolation.multipliers=[1]", "--extrapolation.budget_tokens=1024",
                 "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false"]) == 0
    (second,) = tmp_path.glob("*/version_1/wandb/offline-run-*")
    assert second.name != run.name


@pytest.mark.slow
def test_wandb_run_of_a_sweep_trial_carries_group_job_type_tags_and_config(tmp_path, monkeypatch):
    """What a sweep worker sets for a trial (WANDB_RUN_GROUP = the study, WANDB_JOB_TYPE = the variant) reaches
    wandb.init, with tags for the seed, data and scheme cell and the resolved config; read back from the run."""
    from accrot.run.lightning import run_lightning

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_RUN_GROUP", "ablation-x/corpus.RoPE")
    monkeypatch.setenv("WANDB_JOB_TYPE", "corpus.RoPE")
    monkeypatch.setenv("WANDB_TAGS", "extra")
    cli = run_lightning(["fit", "--config", "tiny", f"--root={tmp_path}", "--trainer.max_steps=1", "--wandb=offline",
                         "--model.scheme.rotation=rope", "--seed_everything=3", "--extrapolation.multipliers=[1]",
                         "--extrapolation.budget_tokens=512", "--trainer.limit_val_batches=1",
                         "--trainer.enable_progress_bar=false"])
    (logger,) = [lg for lg in cli.trainer.loggers if type(lg).__name__ == "WandbLogger"]
    init = logger._wandb_init  # the arguments wandb.init received
    assert init["group"] == "ablation-x/corpus.RoPE" and init["job_type"] == "corpus.RoPE"
    assert set(init["tags"]) == {"seed:3", "data:StdlibDataModule", "scheme:rope/none", "extra"}
    assert init["config"]["model"]["scheme"]["rotation"] == "rope" and init["config"]["seed_everything"] == 3
    (run,) = tmp_path.glob("*/version_0/wandb/offline-run-*")
    assert run.is_dir()


def test_warmup_longer_than_the_run_is_one_warning_line(tmp_path, caplog):
    """A warm-up as long as the run is legitimate (a short run of a long recipe): it trains, and one line says
    the learning rate never reaches model.lr."""
    rc = main(["fit", "--config", "tiny", f"--root={tmp_path}", "--trainer.max_steps=3", "--model.warmup_steps=50",
               "--trainer.limit_val_batches=1", "--extrapolation.multipliers=[1]", *QUICK])
    assert rc == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "accrot.lit"]
    assert lines == ["accrot: warning: model.warmup_steps=50 >= the run's 3 steps: the learning rate rises "
                     "linearly for the whole run and never reaches model.lr=0.003"]


def test_checkpoint_fit_compares_the_seed_only_where_something_is_random():
    """A random-increment checkpoint means its own realisation: another scheme seed is refused, by name. For a
    deterministic scheme the seed is irrelevant, and an unset seed (a model built outside the CLI) is 0."""
    from accrot.lit import LitLM
    from accrot.position import SchemeConfig
    from accrot.resume import check_fits

    def ckpt(model):
        return {"hyper_parameters": dict(model.hparams), "state_dict": model.state_dict()}

    def lit(**scheme):
        return LitLM(d_model=32, n_layers=1, n_heads=4, scheme=SchemeConfig(**scheme))

    random = {"rotation": "accum", "increments": "random_position"}
    reason = check_fits(ckpt(lit(**random, seed=4)), lit(**random, seed=3), "x.ckpt")
    assert reason is not None and "seed=4 (config: 3)" in reason
    assert check_fits(ckpt(lit(**random)), lit(**random, seed=0), "x.ckpt") is None  # None resolves to 0
    assert check_fits(ckpt(lit(rotation="rope", seed=4)), lit(rotation="rope", seed=3), "x.ckpt") is None
    # a checkpoint written before the output gate, ssmax and layer patterns existed means their defaults
    old = ckpt(lit(rotation="rope"))
    for key in ("ssmax_init", "output_gate", "layer_pattern"):
        del old["hyper_parameters"]["scheme"][key]
    assert check_fits(old, lit(rotation="rope"), "x.ckpt") is None
    reason = check_fits(old, lit(rotation="rope", output_gate="elementwise"), "x.ckpt")
    assert reason is not None and "output_gate=None (config: 'elementwise')" in reason


def test_warnings_during_start_up_are_held_then_replayed_or_dropped():
    """A warning raised while the command is being built (Lightning's srun hint, on a machine with SLURM's
    binaries) prints after the input proved good, through the warnings machinery (pytest records it), and is
    dropped when the command fails: the one-line error stays the only line."""
    import warnings

    from accrot.logs import hold_startup_logs

    with pytest.warns(UserWarning, match="replayed once training starts"):
        with hold_startup_logs():
            warnings.warn("replayed once training starts", UserWarning, stacklevel=2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(ValueError), hold_startup_logs():
            warnings.warn("dropped with the failed command", UserWarning, stacklevel=2)
            raise ValueError("bad input")
    assert not [w for w in seen if "dropped" in str(w.message)]
    assert getattr(warnings.showwarning, "__name__", "") != "hold_warning"  # the original is back


# -- what a researcher meets on the second day: where runs go, weights vs resume, reading what ran -------------------
def test_fit_names_its_run_directory_first_and_last_and_keeps_lightnings_lines_in_its_log(tmp_path, capsys):
    """A user's `accrot fit`: stdout opens and ends with the run directory (named after the scheme's cell: the
    increment kind included); the terminal's stderr holds accrot's own lines only, and what Lightning printed (the
    seed, the devices, its hints) is in the run's console.log."""
    import io

    from tests.test_bad_inputs import log_handlers_to

    lightning = io.StringIO()
    with log_handlers_to(lightning):
        rc = main(["fit", "--config", "tiny", f"--root={tmp_path}", "--trainer.max_steps=2", "--model.d_model=32",
                   "--model.scheme.rotation=accum", "--model.scheme.increments=learned",
                   "--trainer.limit_val_batches=1", "--extrapolation.multipliers=[1]", *QUICK])
    assert rc == 0
    out, err = capsys.readouterr()
    run = tmp_path / "accum-learned-none" / "version_0"
    lines = out.strip().splitlines()
    assert lines[0] == f"run directory: {run} (a new run)"
    assert lines[-1] == f"run directory: {run} (finished at step 2)"
    assert all(line.startswith("accrot: ") for line in err.strip().splitlines()), err
    assert lightning.getvalue() == ""  # nothing reached Lightning's own terminal handlers
    log = (run / "console.log").read_text()
    assert "Seed set to 0" in log and "GPU available" in log and "`Trainer.fit` stopped" in log


def test_default_run_names_tell_every_cell_of_the_study_apart():
    """Every variant of the ablation is a different cell: each gets its own folder name (two kinds of increments, the
    drift control, values and far mass included), and the name says the cell's parts in order."""
    from accrot.position import SchemeConfig
    from accrot.run.rundir import default_run_name
    from accrot.study.variants import VARIANTS

    names = {label: default_run_name(SchemeConfig(**over)) for label, over in VARIANTS.items()}
    assert len(set(names.values())) == len(names), names
    assert names["accum-learned+values+forget"] == "accum-learned-forget-values"
    assert names["RoPE+jitter"] == "accum-random_position-none-mean_rope"
    # the reference implementations' settings are the plain name; a departure from them is in it
    assert names["accum-learned"] == "accum-learned-none" and names["PaTH"] == "path-none"
    assert names["accum-learned-plain"] == "accum-learned-none-plain-rank0-conv0-noladder"
    assert names["PaTH-plain"] == "path-none-rank0-conv0-torchinit"
    assert names["accum-learned+values+forget-alibi-init"] == "accum-learned-forget-values-alibi_init"
    assert names["RoPE-base500k"] == "rope-none-base500000" and names["NoPE"] == "none-none"


def test_init_from_starts_a_new_run_from_the_weights_alone(trained_run, tmp_path):
    """`--init_from CKPT`: a new run directory whose first weights are the checkpoint's, with a fresh optimiser,
    schedule and step count (its own step 1, not the source's 7th), the source recorded in run.json; the source run is
    untouched."""
    import torch

    source = trained_run / "checkpoints" / "last.ckpt"
    before = source.read_bytes()
    rc = main(["fit", "--config", str(trained_run / "config.yaml"), f"--root={tmp_path}", f"--init_from={source}",
               "--trainer.max_steps=1", "--model.lr=1e-12", "--model.warmup_steps=0", "--trainer.limit_val_batches=1",
               *QUICK])
    assert rc == 0 and source.read_bytes() == before
    (run,) = tmp_path.glob("rope-none/version_0")
    record = json.loads((run / "run.json").read_text())
    assert record["init_from"] == {"ckpt_path": str(source.resolve()), "step": 6, "run_dir": str(trained_run.resolve())}
    assert record["started_from"] is None and record["resumes"] == 0 and record["step"] == 1
    new, old = (torch.load(p, map_location="cpu", weights_only=False) for p in (run / "checkpoints/last.ckpt", source))
    assert new["global_step"] == 1 and old["global_step"] == 6
    (state,) = new["optimizer_states"]
    assert {int(s["step"]) for s in state["state"].values()} == {1}  # a fresh AdamW: one step of moments
    assert new["lr_schedulers"][0]["last_epoch"] == 1  # the schedule starts over
    moved = max(float((new["state_dict"][k] - v).abs().max()) for k, v in old["state_dict"].items()
                if v.is_floating_point())
    assert moved < 1e-6  # lr 1e-12: the new run's weights are the checkpoint's
    assert "init_from: null" in (run / "config.yaml").read_text()  # config.yaml re-runs a fresh run


def test_resume_at_the_step_limit_trains_nothing_and_changes_nothing(trained_run, capsys):
    """`--resume RUN --trainer.max_steps=N` with N at or below the step reached is refused in one line (exit 2): the
    run's run.json, metrics and checkpoint are as they were, and no resume is counted."""
    files = {p: p.read_bytes() for p in (trained_run / "run.json", trained_run / "metrics.csv",
                                         trained_run / "checkpoints" / "last.ckpt")}
    assert main(["fit", "--resume", str(trained_run), "--trainer.max_steps=6"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is at step 6 and trainer.max_steps=6: nothing left to train" in err[0]
    assert all(p.read_bytes() == data for p, data in files.items())


def test_eval_takes_a_run_directory_words_and_other_data(trained_run, tmp_path, capsys):
    """`accrot eval --ckpt RUN_DIR --multipliers 1 2` (shell words, as diagnose and ablation take them) evaluates the
    run's last checkpoint; `--config` naming other data the model can read (other files, as bytes, at the same training
    length) evaluates the same model on that data; a data module of another vocabulary (the local-dependency task's own
    symbols) is refused, one line, rather than scored."""
    assert main(["eval", "--ckpt", str(trained_run), "--multipliers", "1", "2", "--budget_tokens=1024",
                 f"--out={tmp_path / 'words'}"]) == 0
    doc = json.loads((tmp_path / "words" / "extrapolation.json").read_text())
    assert doc["checkpoint"] == str(trained_run / "checkpoints" / "last.ckpt")
    assert [r["multiplier"] for r in doc["final"]["lengths"]] == [1.0, 2.0]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(20):
        (corpus / f"m{i:02d}.py").write_text("".join(f"w_{i}_{j} = {j} + {i}\n" for j in range(300)))
    other = yaml.safe_load((trained_run / "config.yaml").read_text())
    other["data"] = {"class_path": "data_modules.StdlibDataModule",
                     "init_args": {"seq_len": 128, "root": str(corpus), "val_fraction": 0.3}}
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    assert main(["eval", "--ckpt", str(trained_run), "--config", str(tmp_path / "other.yaml"), "--multipliers=[1]",
                 "--budget_tokens=1024", f"--out={tmp_path / 'other'}"]) == 0
    scored = json.loads((tmp_path / "other" / "extrapolation.json").read_text())
    assert scored["data"] != doc["data"] and scored["final"]["lengths"][0]["nll"] > 0
    other["data"] = {"class_path": "data_modules.LocalDependencyDataModule", "init_args": {"seq_len": 128}}
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(other))
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(trained_run), "--config", str(tmp_path / "local.yaml"), "--multipliers=[1]",
                 "--budget_tokens=1024", f"--out={tmp_path / 'local'}"]) == 2
    assert "data vocabulary 72 tokens (the model reads 256)" in capsys.readouterr().err
    assert not (tmp_path / "local").exists()


@pytest.mark.parametrize("command", ["eval", "diagnose"])
def test_an_unwritable_out_is_refused_before_any_computing(command, trained_run, tmp_path, monkeypatch, capsys):
    """The output folder is made and proven writable before the evaluation (or diagnostics) starts, and the line
    names the command's own option, --out."""
    import accrot.run.diagnose
    import accrot.run.eval

    def never(*args, **kwargs):
        raise AssertionError("computed before checking --out")

    monkeypatch.setattr(accrot.run.eval, "evaluate_lengths", never)
    monkeypatch.setattr(accrot.run.diagnose, "diagnose", never)
    (tmp_path / "a-file").write_text("x")
    assert main([command, "--ckpt", str(trained_run), f"--out={tmp_path / 'a-file' / 'x'}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("accrot: error: --out=") and line.endswith("is a file, not a folder; give an output folder"), line


def test_scheme_options_the_scheme_ignores_are_one_warning_line(tmp_path, caplog):
    """`--model.scheme.window` with RoPE trains (RoPE has no window to set) and says once that it is ignored."""
    rc = main(["fit", "--config", "tiny", f"--root={tmp_path}", "--trainer.max_steps=1", "--model.d_model=32",
               "--model.scheme.rotation=rope", "--model.scheme.window=96", "--model.warmup_steps=0",
               "--trainer.limit_val_batches=1", "--extrapolation.multipliers=[1]", *QUICK])
    assert rc == 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("accrot: warning")]
    assert lines == ["accrot: warning: model.scheme.window=96.0 is ignored by rope/none (only rotation='accum' "
                     "reads it)"]


def test_ignored_scheme_options_follow_who_reads_them():
    """Known truth per option: what a scheme reads is never reported, what it cannot read always is."""
    from accrot.position import SchemeConfig
    from accrot.position import ignored as unread

    def ignored(**kw) -> list[str]:
        return [name for name, _ in unread(SchemeConfig(**kw))]

    assert ignored(rotation="accum", increments="random_position", window=96) == []
    assert ignored(rotation="accum", increments="learned", window=96, max_increment=2.0) == []  # the mixing floor
    assert ignored(rotation="accum", increments="random_position", max_increment=2.0) == ["max_increment"]
    assert ignored(rotation="path", far_mass="forget", chunk_size=16, forget_bias_init=1.0) == []
    assert ignored(rotation="rope", chunk_size=16, beta_max=1.0, forget_bias_init=1.0) == [
        "forget_bias_init", "beta_max", "chunk_size"]
    assert ignored(far_mass="alibi", block_size=64) == [] and ignored(block_size=64) == ["block_size"]
    assert ignored(rotation="path", far_mass="alibi", block_size=64) == ["block_size"]  # PaTH's walk has its own


def test_more_cpu_processes_than_cores_is_one_warning_line():
    """A CPU DDP launch with more ranks than usable cores: one line with the global batch; within the cores none.
    The Trainer is built (no process is launched before fit)."""
    import lightning as L

    from accrot.run.args import usable_cores
    from accrot.run.lightning import start_warnings

    class Data:
        hparams = {"batch_size": 16}

    cores = usable_cores()
    over = L.Trainer(accelerator="cpu", devices=cores + 1, strategy="ddp", logger=False, enable_progress_bar=False)
    (line,) = start_warnings(None, over, Data())
    assert line == (f"accrot: warning: trainer.devices={cores + 1} starts {cores + 1} CPU processes on {cores} core"
                    f"{'s' if cores != 1 else ''}: they share the cores, and the global batch is {cores + 1} x "
                    f"data.batch_size = {16 * (cores + 1)}; use trainer.devices <= {cores} on this machine")
    within = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    assert start_warnings(None, within, Data()) == []


@pytest.mark.parametrize("command", ["eval", "diagnose", "demo", "sweep", "report", "ablation", "bench",
                                     "bench schemes", "bench path", "bench pipeline", "slurm train"])
def test_help_is_plain_text(command, capsys):
    """Every command's --help reads as plain text: no reStructuredText markup (``code``, :mod:`x`, ::)."""
    assert main([*command.split(), "--help"]) == 0
    text = capsys.readouterr().out
    assert text.strip() and "``" not in text and not re.search(r":(mod|func|data|class):`", text), text[:2000]
    assert len(text.splitlines()) < 80  # a summary and the options, not the module's reference


def test_help_agrees_with_the_readme(capsys):
    """The ablation makes one study per data set (the README's words), not one per (data set, variant)."""
    assert main(["ablation", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "one Optuna study per data set" in text and "(data set, variant)" not in text
    readme = (REPO / "README.md").read_text()
    assert "one study per data set" in readme


def test_make_help_piped_has_no_colour_codes_and_no_make_variables():
    """`make help | less`: plain lines, every target listed, no escape codes and no literal $(VAR)."""
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    res = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "\x1b[" not in res.stdout and "$(" not in res.stdout, res.stdout
    targets = re.findall(r"^([a-zA-Z_-]+):.*?## ", (REPO / "Makefile").read_text(), flags=re.M)
    listed = [line.split()[0] for line in res.stdout.splitlines()]
    assert listed == targets


def test_accrot_warnings_are_held_with_lightnings_lines_and_printed_once():
    """accrot's own warnings wait for the input to prove good (a bad input stays the only line), reach a handler
    their logger already had exactly once (the demo's terminal handler printed them twice), and are dropped with a
    failed command."""
    import io
    import logging

    from accrot.logs import hold_startup_logs

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    ours = logging.getLogger("accrot")
    ours.addHandler(handler)
    try:
        with hold_startup_logs():
            logging.getLogger("accrot.lit").warning("accrot: warning: once")
            assert stream.getvalue() == ""
        assert stream.getvalue() == "accrot: warning: once\n"
        with pytest.raises(ValueError), hold_startup_logs():
            logging.getLogger("accrot.lit").warning("accrot: warning: dropped")
            raise ValueError("bad input")
        assert stream.getvalue() == "accrot: warning: once\n" and ours.handlers[-1] is handler and ours.propagate
    finally:
        ours.removeHandler(handler)


def test_loggers_off_the_run_still_gets_its_own_directory(tmp_path, monkeypatch, capsys):
    """``--trainer.logger=false``: no metrics loggers, but the checkpoints and records still land in
    ``<root>/<name>/version_N`` (two such runs never share a folder), and nothing in the current directory."""
    monkeypatch.chdir(tmp_path)
    for n in (0, 1):
        rc = main(["fit", "--config", "tiny", f"--root={tmp_path / 'runs'}", "--trainer.logger=false",
                   "--trainer.max_steps=2", "--model.d_model=32", "--trainer.limit_val_batches=1",
                   "--extrapolation.multipliers=[1]", *QUICK])
        assert rc == 0
        run = tmp_path / "runs" / "none-none" / f"version_{n}"
        assert capsys.readouterr().out.strip().splitlines()[-1] == f"run directory: {run} (finished at step 2)"
        assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "run.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]

"""Nothing passes silently, one test per class of mistake, each written against the mechanism that catches the
class (so a new instance is caught too, not only the catalogue's rows in tests/test_bad_inputs.py):

* every option takes effect or is refused: every environment switch the code reads is checked up front; every YAML
  reader of a config or spec refuses a key given twice; every plain-typed field of every spec section refuses a
  value of another type;
* checked before anything is created: a sweep's strata are built with their set-up (the evaluation blocks cut from
  the data) before the study exists;
* results say what ran and overwrite nothing: ``accrot eval`` and ``accrot diagnose`` written into a run directory
  leave the training's files untouched, and their JSON names the command, revision and checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


# -- every option takes effect or is refused ------------------------------------------------------------------------
def _names_the_code_reads() -> set[str]:
    names: set[str] = set()
    for folder in ("accrot", "callbacks", "data_modules"):
        for path in (REPO / folder).rglob("*.py"):
            names |= set(re.findall(r"\bACCROT_[A-Z][A-Z_]*[A-Z]\b", path.read_text()))
    return names


def test_every_environment_name_the_code_reads_is_a_checked_switch_or_free_form():
    from accrot.run.launch import FREE_FORM, SWITCHES

    unlisted = sorted(_names_the_code_reads() - set(SWITCHES) - set(FREE_FORM))
    assert not unlisted, f"environment names read by the code but neither checked nor free-form: {unlisted}"
    assert set(SWITCHES).isdisjoint(FREE_FORM)


@pytest.mark.parametrize("name", ["ACCROT_CPU_KERNELS", "ACCROT_GPU_KERNELS", "ACCROT_DENORMALS", "ACCROT_MALLOC"])
def test_every_switch_refuses_a_bad_value_before_any_work(name, monkeypatch):
    from accrot.errors import UsageError
    from accrot.run.launch import SWITCHES, check_environment

    assert name in SWITCHES
    monkeypatch.setenv(name, "bogus-value")
    with pytest.raises(UsageError, match=f"{name}='bogus-value' is not valid; choose one of"):
        check_environment()


def test_a_misspelt_switch_is_refused_and_an_unrelated_name_is_not(monkeypatch):
    from accrot.errors import UsageError
    from accrot.run.launch import check_environment

    with pytest.raises(UsageError, match="did you mean ACCROT_MALLOC"):
        check_environment({"ACCROT_MALLOCC": "tuned"})
    check_environment({"ACCROT_TEST_SIGNAL": "1", "ACCROT_SWEEP_STORAGE": "sqlite:///x.db"})


@pytest.mark.parametrize("text, key", [("a: 1\nb: 2\na: 3\n", "a"), ("a:\n  b: 1\n  c: {d: 1, d: 2}\n", "d"),
                                       ("- {x: 1}\n- {y: 1, y: 1}\n", "y")])
def test_a_key_given_twice_at_any_depth_is_refused(text, key):
    import yaml

    from accrot.io import load_yaml

    with pytest.raises(yaml.YAMLError, match=f"key '{key}' is given twice"):
        load_yaml(text)
    assert load_yaml("a: 1\nb: {a: 2}\n") == {"a": 1, "b": {"a": 2}}  # the same key in two mappings is fine


def test_every_config_and_spec_reader_refuses_a_key_given_twice(tmp_path):
    from accrot.errors import UsageError
    from accrot.run.args import check_config_file
    from accrot.sweep.spec import SPEC_DIR, load_spec

    config = tmp_path / "c.yaml"
    config.write_text((REPO / "accrot/configs/tiny.yaml").read_text() + "model:\n  n_layers: 4\n")
    with pytest.raises(UsageError, match="key 'model' is given twice"):
        check_config_file(config)
    spec = tmp_path / "s.yaml"
    spec.write_text((SPEC_DIR / "smoke.yaml").read_text() + "trials: 2\n")
    with pytest.raises(UsageError, match="key 'trials' is given twice"):
        load_spec(spec)


def _spec_sections():
    from accrot.sweep import spec

    return [c for c in vars(spec).values() if isinstance(c, type) and dataclasses.is_dataclass(c)
            and c.__module__ == spec.__name__ and c.__name__ != "Stratum"]


def _plain_fields(cls) -> list[str]:
    """The init fields of a section whose annotation is int, bool, str, None or a union of them."""
    from accrot.sweep.spec import _field_types, _type_problem

    hints = _field_types(cls)
    return [f.name for f in dataclasses.fields(cls) if f.init and _type_problem(hints[f.name], object()) is not None]


def test_the_type_check_covers_the_plain_fields_of_every_section():
    fields = {c.__name__: _plain_fields(c) for c in _spec_sections()}
    assert {"SweepSpec", "PrunerSpec", "SamplerSpec", "HeartbeatSpec", "ParamSpec"} <= set(fields)
    assert "n_startup_trials" in fields["PrunerSpec"] and "trials" in fields["SweepSpec"]
    assert "log" in fields["ParamSpec"] and "interval" in fields["HeartbeatSpec"]


@pytest.mark.parametrize("section", [c.__name__ for c in _spec_sections()])
def test_every_plain_field_of_every_spec_section_refuses_a_value_of_another_type(section):
    from accrot.errors import UsageError
    from accrot.sweep.spec import _strict

    cls = next(c for c in _spec_sections() if c.__name__ == section)
    for name in _plain_fields(cls):
        with pytest.raises(UsageError, match=rf"^where: {name}=\['x'\] is not valid; expected "):
            _strict(cls, {name: ["x"]}, "where")


# -- checked before anything is created -----------------------------------------------------------------------------
def test_a_probe_with_its_set_up_refuses_what_the_run_would_refuse_at_its_start(tmp_path):
    from accrot.errors import DataError
    from accrot.run.probe import probe

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(20):
        (corpus / f"m{i}.py").write_text("x = 1\n" * 200)
    args = ["fit", "--config", "tiny", f"--data.init_args.root={corpus}", "--data.init_args.val_fraction=0.3",
            "--extrapolation.multipliers=[1, 1000]"]
    probe(args)  # parsing and building alone cannot see it ...
    with pytest.raises(DataError, match="evaluation length 128000 needs"):
        probe(args, setup=True)  # ... the run's own set-up does


# -- results say what ran, and overwrite nothing --------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run directory as ``accrot fit`` leaves it (tiny's NoPE model, its config on a small corpus, the training's own
    result files), made without training."""
    import torch

    from accrot.lit import LitLM

    root = tmp_path_factory.mktemp("nothing-silent")
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(20):
        (corpus / f"m{i:02d}.py").write_text("".join(f"v_{i}_{j} = {j} * {i}\n" for j in range(300)))
    run = root / "runs" / "none-none" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    text = (REPO / "accrot/configs/tiny.yaml").read_text()
    (run / "config.yaml").write_text(text.replace("    seq_len: 128", f"    seq_len: 128\n    root: {corpus}\n"
                                                                        "    val_fraction: 0.3"))
    model = LitLM(d_model=64, n_layers=2, n_heads=4)
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams), "global_step": 3},
               run / "checkpoints" / "last.ckpt")
    for name in ("run.json", "extrapolation.json", "extrapolation.png", "metrics.csv", "diagnostics.json"):
        (run / name).write_text(f"the training's own {name}\n")
    return run


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.parent == folder}


@pytest.mark.parametrize("command", ["eval", "diagnose"])
def test_a_command_written_into_a_run_directory_leaves_the_training_files_untouched(command, run_dir, capsys):
    from accrot.cli import main

    before = _digests(run_dir)
    rc = main([command, "--ckpt", str(run_dir), "--out", str(run_dir), "--multipliers", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith(f"accrot: error: --out {str(run_dir)!r} is a run directory"), err
    assert _digests(run_dir) == before


@pytest.mark.parametrize("command, written", [("eval", "eval/extrapolation.json"),
                                              ("diagnose", "diagnostics/diagnostics.json")])
def test_a_result_file_records_the_command_revision_and_checkpoint(command, written, run_dir, capsys):
    import json

    from accrot.cli import main
    from accrot.io import git_revision

    before = _digests(run_dir)
    argv = ["--ckpt", str(run_dir), "--multipliers", "1", "2"]
    argv += ["--budget_tokens", "512"] if command == "eval" else ["--blocks", "2"]
    assert main([command, *argv]) == 0, capsys.readouterr().err
    doc = json.loads((run_dir / written).read_text())
    assert doc["command"] == ["accrot", command, *argv]
    assert doc["revision"] == git_revision() and doc["revision"] != "unknown"
    assert doc["checkpoint"] == str(run_dir / "checkpoints" / "last.ckpt")
    assert _digests(run_dir) == before  # beside the run, under its own folder


@pytest.mark.filterwarnings("ignore:.*AMP with fp16 is not supported on CPU")
def test_a_precision_the_trainer_falls_back_from_is_recorded_as_what_runs(monkeypatch):
    """Lightning trains ``16-mixed`` on a CPU in ``bf16-mixed``: the resolved config (what config.yaml saves) says so
    (on a CPU with hardware bf16; elsewhere the command refuses it: tests/test_cpu_bf16.py)."""
    from accrot.run.probe import probe

    monkeypatch.setattr("accrot.runtime.cpu_bf16", lambda: "amx_bf16")

    flat = probe(["fit", "--config", "tiny", "--trainer.accelerator=cpu", "--trainer.precision=16-mixed"])
    assert flat["trainer.precision"] == "bf16-mixed"
    assert probe(["fit", "--config", "tiny", "--trainer.precision=32"])["trainer.precision"] == 32  # an alias: as asked


# -- a storage the command cannot write: one line naming what to do -----------------------------------------


@pytest.fixture
def read_only_folder(tmp_path):
    """A tmpfs mounted read-only (root ignores file modes, so a chmod proves nothing): yields (folder, writable
    twin) after copying into it what the writable twin holds."""
    import shutil
    import subprocess

    folder, staging = tmp_path / "ro", tmp_path / "staging"
    folder.mkdir(), staging.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield folder, staging, lambda: (shutil.copytree(staging, folder, dirs_exist_ok=True),
                                        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True))
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


def test_report_on_a_read_only_storage_says_so_in_one_line(read_only_folder, tmp_path):
    import subprocess
    import sys

    import optuna

    folder, staging, seal = read_only_folder
    study = optuna.create_study(study_name="x", storage=f"sqlite:///{staging}/study.db")
    study.optimize(lambda t: t.suggest_float("a", 0, 1), n_trials=2)
    seal()
    done = subprocess.run([sys.executable, "-m", "accrot.cli", "report", "--study", "x", "--storage",
                           f"sqlite:///{folder}/study.db", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"accrot: error: storage 'sqlite:///{folder}/study.db' is read-only (Optuna writes to a storage when it "
        "opens one, even to read it); copy the database to a writable folder and pass that as --storage"]
    assert not (tmp_path / "out").exists()


def test_make_dashboard_of_a_missing_study_is_one_line_naming_it():
    """The Makefile checks the study's storage before starting optuna-dashboard (which would print tracebacks):
    one line of its own (make adds its 'Error 2' line), exit status 2, nothing started."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("no make here")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(["make", "-s", "-o", ".venv/.installed", "dashboard", "STUDY=no-such-study-here"],
                          cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    ours = [line for line in done.stderr.splitlines() if not re.match(r"make(\[\d+\])?: \*\*\*", line)]
    assert len(ours) == 1 and ours[0].startswith("make dashboard: no study 'no-such-study-here' here")
    assert "run make sweep SWEEP=no-such-study-here first, or pass STORAGE=url" in ours[0]


# -- standard YAML everywhere; files that are not what they seem ---------------------------------------------------
def test_anchors_and_merge_keys_are_read_by_every_config_and_spec_reader(tmp_path):
    """Standard YAML merge keys (``<<: *anchor``) and aliases: a mapping's own keys override the merged ones; a key
    given twice in one mapping is still refused (a merged key is not given twice)."""
    from accrot.io import load_yaml
    from accrot.run.args import check_config_file
    from accrot.sweep.spec import SPEC_DIR, load_spec

    doc = load_yaml("base: &b {lr: 1, steps: 2}\nrun:\n  <<: *b\n  lr: 3\nalias: *b\n")
    assert doc["run"] == {"lr": 3, "steps": 2} and doc["alias"] == {"lr": 1, "steps": 2}
    config = tmp_path / "c.yaml"
    config.write_text((REPO / "accrot/configs/tiny.yaml").read_text().replace(
        "trainer:", "trainer:\n  <<: {log_every_n_steps: 5}", 1))
    assert check_config_file(config) == config
    spec = tmp_path / "s.yaml"
    text = (SPEC_DIR / "smoke.yaml").read_text()
    assert "  trainer.max_steps: 2\n  trainer.limit_val_batches: 1\n" in text
    spec.write_text(text.replace("  trainer.max_steps: 2\n  trainer.limit_val_batches: 1\n",
                                 "  <<: &short {trainer.max_steps: 2, trainer.limit_val_batches: 1}\n"))
    merged = load_spec(spec)
    assert merged.overrides == load_spec(SPEC_DIR / "smoke.yaml").overrides  # the merge gives the same keys
    import yaml

    with pytest.raises(yaml.YAMLError, match="key 'lr' is given twice"):
        load_yaml("run:\n  <<: {steps: 1}\n  lr: 1\n  lr: 2\n")


@pytest.mark.parametrize("name", ["tiny.yaml", "small.yml", "configs/tiny.yaml", "accrot/configs/small.yaml"])
def test_a_shipped_config_is_found_by_its_file_name_too(name, tmp_path, monkeypatch):
    from accrot.run.args import CONFIG_DIR, config_path

    monkeypatch.chdir(tmp_path)  # no such file here: the shipped one is meant
    assert config_path(name) == CONFIG_DIR / f"{Path(name).stem}.yaml"


def test_a_missing_config_file_that_is_no_shipped_name_is_one_line(tmp_path, monkeypatch):
    from accrot.errors import UsageError
    from accrot.run.args import config_path

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"--config 'nothere.yaml': no such file; .* shipped config: small, tiny"):
        config_path("nothere.yaml")


@pytest.mark.parametrize("text, what", [("", "empty"), ("# only a comment\n", "empty"), ("---\n", "empty"),
                                        ("- a\n- b\n", "a list, not a mapping")])
def test_a_spec_without_keys_is_one_line_naming_the_file(text, what, tmp_path):
    from accrot.errors import UsageError
    from accrot.sweep.spec import load_spec

    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    with pytest.raises(UsageError, match=f"the spec is {what}"):
        load_spec(spec)


def test_a_spec_that_is_a_folder_says_so(tmp_path):
    from accrot.errors import UsageError
    from accrot.sweep.spec import load_spec

    with pytest.raises(UsageError, match="is a folder; give a spec file"):
        load_spec(tmp_path)


# -- no fallback guesses an option ----------------------------------------------------------------------------------
def test_a_write_that_fails_mid_run_names_the_option_of_its_folder_or_none(tmp_path):
    import errno

    from accrot.errors import bad_input_message, declare_write_folder

    declare_write_folder(tmp_path / "runs", "--root")
    declare_write_folder(tmp_path / "runs" / "x" / "eval", "--out")
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "runs" / "x" / "eval" / "a.json"))
    assert bad_input_message(full).endswith("pass a writable --out with free space")
    under_root = OSError(errno.EACCES, "Permission denied", str(tmp_path / "runs" / "x" / "metrics.csv"))
    assert bad_input_message(under_root).endswith("pass a writable --root with free space")
    elsewhere = OSError(errno.EROFS, "Read-only file system", str(tmp_path / "other" / "f"))
    message = bad_input_message(elsewhere)
    assert "--" not in message and message.endswith("free space there or make it writable, then run again")


# -- what a user sees -----------------------------------------------------------------------------------------------
def test_a_band_with_nothing_measured_draws_nothing_and_a_rise_draws_its_anchors_interval():
    from accrot.io import pyplot
    from accrot.study.figures import _band

    plt = pyplot()
    fig, ax = plt.subplots()
    _band(ax, "RoPE", [(1.0, []), (2.0, [])])  # a variant with no measurement at any length
    assert ax.get_legend_handles_labels()[1] == [] and not ax.get_lines()
    _band(ax, "ALiBi", [(1.0, [0.0]), (2.0, [0.01])], intervals=[(1.0, [(0.0, 0.0)]), (2.0, [(-0.002, 0.03)])])
    assert ax.get_legend_handles_labels()[1] == ["ALiBi"]
    (bars,) = [c for c in ax.collections if type(c).__name__ == "LineCollection"]
    segments = bars.get_segments()
    lows, highs = sorted(s[0][1] for s in segments), sorted(s[1][1] for s in segments)
    assert lows[0] == pytest.approx(-0.002) and highs[-1] == pytest.approx(0.03)  # one seed: its anchors' interval
    plt.close(fig)


def test_sample_interrupted_prints_what_it_generated(monkeypatch, capsys, tmp_path):
    """Ctrl-C during a long `accrot sample` keeps the tokens generated so far: printed after the prompt, one line on
    stderr, the shell's code for SIGINT."""
    import torch

    from accrot.run import sample

    class Tok:
        name = "bytes"

        def encode(self, text):
            return list(text.encode())

        def decode(self, ids):
            return bytes(ids).decode(errors="replace")

    class Lit:
        model = type("M", (), {"cfg": type("C", (), {"vocab_size": 256})(), "eval": lambda self: self,
                               "to": lambda self, d: self})()

    def fake_generate(model, prompt, n, temperature, top_k, generator, on_token=None):
        for byte in b"abc":
            on_token(torch.tensor([byte]))
        raise KeyboardInterrupt

    monkeypatch.setattr(sample, "open_checkpoint", lambda ckpt, config: (None, Lit(), None, None, {}))
    monkeypatch.setattr(sample, "load_data_module", lambda config: type("D", (), {"tokenizer": Tok()})())
    monkeypatch.setattr("accrot.run.generate.generate", fake_generate)
    (tmp_path / "last.ckpt").write_bytes(b"x")
    rc = sample.main(["--ckpt", str(tmp_path / "last.ckpt"), "--prompt", "x=", "--max_new_tokens", "10"])
    out, err = capsys.readouterr()
    assert rc == 130 and out == "x=abc\n"
    assert err.strip() == "accrot: interrupted after 3 of 10 tokens (printed above)"

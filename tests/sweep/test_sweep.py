"""Optuna sweeps end to end: shipped specs build valid configs, parallel workers on SQLite / PostgreSQL /
journal storages spend the budget exactly, a SIGKILLed worker's trial is failed with its reason and
retried, a diverged run fails with a message, a pruned run stops cleanly, the dashboard serves the
study, ``accrot report`` writes its table, figures and CSV, and bad input stops before any trial."""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.artifacts import FileSystemArtifactStore, get_all_artifact_meta
from optuna.trial import TrialState
from optuna_dashboard import get_note

from accrot.cli import main
from accrot.sweep.recovery import (
    RetryTrial,
    budget_state,
    fail_stale_attr,
    fail_unowned,
    missing_seeds,
    unowned,
)
from accrot.sweep.spec import SPEC_DIR, HeartbeatSpec, load_spec, quiet_experimental
from accrot.sweep.storage import BudgetLock, StorageRef, open_storage, redact
from accrot.sweep.trials import check_stratum, sample_space, trial_args

SHIPPED = sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))
SMOKE = SPEC_DIR / "smoke.yaml"


def write_spec(folder: Path, name: str, **changes) -> Path:
    """smoke.yaml with some keys replaced (``None`` removes a key)."""
    doc = yaml.safe_load(SMOKE.read_text())
    doc["name"] = name
    for key, value in changes.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def load(url: str, name: str):
    return optuna.load_study(study_name=name, storage=open_storage(StorageRef.parse(url, name, ".")))


def sweep(spec: Path | str, root: Path, *extra: str) -> int:
    return main(["sweep", str(spec), f"--root={root}", *extra])


def check_complete(study, budget: int) -> list:
    """Every trial complete, exactly ``budget`` of them, no duplicates, each with its run directory."""
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * budget, [
        (t.number, t.state.name, t.user_attrs.get("fail_reason")) for t in trials]
    assert sorted(t.number for t in trials) == list(range(budget))
    keys = {(json.dumps(t.params, sort_keys=True), t.user_attrs["seed"]) for t in trials}
    assert len(keys) == budget, "a configuration ran twice with the same seed"
    run_dirs = {t.user_attrs["run_dir"] for t in trials}
    assert len(run_dirs) == budget
    for t in trials:
        run = Path(t.user_attrs["run_dir"])
        assert run.name == "version_0" and run.parent.name == f"trial_{t.number:04d}"
        for name in ("config.yaml", "extrapolation.json", "checkpoints/last.ckpt"):
            assert (run / name).is_file(), (run, name)
        assert set(t.user_attrs["metrics"]) >= {"nll@1x", "nll@2x"}
        assert t.values[0] == t.user_attrs["metrics"]["nll@2x"]
    return trials


def no_locked_database(root: Path, name: str) -> None:
    for log in (root / name / "workers").glob("*.log"):
        text = log.read_text(errors="replace")
        assert "database is locked" not in text, log
        assert "Traceback" not in text, text[-3000:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------
# specs
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_spec_samples_valid_configs(name):
    """Every stratum's config builds through the real CLI parser (no training), and sampled trial configs
    (RandomSampler, in memory) do too: three samples in the first stratum (the others share its space)."""
    spec = load_spec(name)
    assert spec.budget >= 1 and spec.objectives
    for i, stratum in enumerate(spec.strata()):
        info = check_stratum(spec, stratum, n_samples=3 if i == 0 else 0)
        assert info.train_length == 128
        assert all(any(abs(o.multiplier - m) < 1e-9 for m in info.multipliers) for o in spec.objectives)


def test_shipped_specs_cover_the_issue():
    smoke, window, ablation, lr = (load_spec(n) for n in ("smoke", "window", "ablation", "lr"))
    assert smoke.space["model.scheme.increments"].when == {"model.scheme.rotation": ["accum"]}
    assert window.sampler.type == "nsga2" and [o.metric for o in window.objectives] == ["nll@1x", "nll@16x"]
    assert ablation.sampler.type == "grid" and len(ablation.strata()) >= 8
    assert {s.study_name for s in ablation.strata()} >= {"ablation/RoPE", "ablation/PaTH-FoX", "ablation/NoPE"}
    assert len(lr.strata()) >= 8 and set(lr.space) >= {"model.lr"} and lr.space["model.lr"].log


def test_a_shared_study_queues_its_grid_once_with_variant_and_seed(tmp_path):
    """shared_study: one study per group (the part of a variant's name before its first `.`), the whole grid
    queued at creation with the variant and seed; started again (a resumed sweep) it queues nothing twice."""
    spec = write_spec(tmp_path, "shared", space={"model.lr": [1e-3, 3e-3]}, sampler={"type": "grid"},
                      pruner={"type": "none"}, seeds=[0, 1], trials=None, shared_study=True,
                      variants={"a.NoPE": {}, "a.RoPE": {"model.scheme.rotation": "rope"},
                                "b.NoPE": {"data.init_args.seq_len": 64}})
    loaded = load_spec(spec)
    assert {n: [s.variant for s in strata] for n, strata in loaded.studies().items()} == {
        "shared/a": ["a.NoPE", "a.RoPE"], "shared/b": ["b.NoPE"]}
    assert (loaded.budget_of("shared/a"), loaded.budget_of("shared/b")) == (8, 4)
    root = tmp_path / "root"
    for _ in range(2):
        assert sweep(spec, root, "--workers=0") == 0
    study = load(f"sqlite:///{root}/shared/study.db", "shared/a")
    queued = [(t.system_attrs["fixed_params"], t.user_attrs) for t in study.get_trials()]
    assert [t.state for t in study.get_trials()] == [TrialState.WAITING] * 8
    assert [(p["variant"], p["model.lr"], p["seed"]) for p, _ in queued] == [
        (v, lr, s) for v in ("a.NoPE", "a.RoPE") for lr in (1e-3, 3e-3) for s in (0, 1)]
    assert [u["config"] for _, u in queued] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(u["variant"] == p["variant"] and u["seed"] == p["seed"] for p, u in queued)
    assert study.user_attrs["accrot"]["budget"] == 8 and study.user_attrs["accrot"]["variant"] is None
    assert len(load(f"sqlite:///{root}/shared/study.db", "shared/b").get_trials()) == 4


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_spec_sampler_and_pruner_run(name):
    """Each spec's own sampler (TPE, grid, NSGA-II) and pruner drive an in-memory study over its space."""
    spec = load_spec(name)
    study = optuna.create_study(sampler=spec.sampler.build(spec.space), pruner=spec.pruner.build(),
                                directions=spec.directions)

    def objective(trial):  # as the worker drives it: optimize, one trial at a time
        values = sample_space(trial, spec.space, {})
        assert set(values) <= set(spec.space) and values
        return [float(trial.number % 3)] * len(spec.objectives)

    for _ in range(min(spec.trials, 6)):
        study.optimize(objective, n_trials=1)
    assert len(study.trials) == min(spec.trials, 6)
    if spec.sampler.type == "grid":  # the grid hands out distinct points
        assert len({json.dumps(t.params, sort_keys=True) for t in study.trials}) == len(study.trials)


def test_conditional_parameter_and_trial_args():
    spec = load_spec("smoke")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        values = sample_space(trial, spec.space, {})
        assert ("model.scheme.increments" in values) == (values["model.scheme.rotation"] == "accum")
        assert 1e-3 <= values["model.lr"] <= 1e-2
        seen.add(values["model.scheme.rotation"])
        study.tell(trial, 1.0)
    assert seen == {"none", "rope", "accum"}
    args = trial_args(spec, spec.strata()[0], Path("/r"), 7, 3, {"model.lr": 0.002})
    assert args[:3] == ["fit", "--config", str(spec.base_path())]
    assert "--root=/r/smoke/runs" in args and "--name=trial_0007" in args and "--seed_everything=3" in args
    assert "--model.lr=0.002" in args and "--extrapolation.multipliers=[1, 2]" in args
    assert any(a.startswith("--trainer.callbacks+=") and "OptunaPruning" in a for a in args)


def test_a_retried_first_seed_finds_the_seeds_its_dead_worker_never_queued():
    """A worker killed after its trial took seed 0 but before it queued seeds 1 and 2 (make faults once caught this
    window: the retry ran seed 0 alone and the sampler drew a configuration beyond the budget instead)."""
    study = optuna.create_study()
    first = study.ask()
    first.suggest_float("x", 0, 1)
    for key, value in {"seed": 0, "config": first.number}.items():
        study._storage.set_trial_user_attr(first._trial_id, key, value)
    study._storage.set_trial_state_values(first._trial_id, TrialState.FAIL)
    RetryTrial(max_retry=1)(study, study._storage.get_trial(first._trial_id))
    assert missing_seeds(study, first.number, [0, 1, 2]) == [1, 2]  # the retry holds seed 0 only
    study.enqueue_trial(dict(first.params), user_attrs={"seed": 1, "config": first.number})
    assert missing_seeds(study, first.number, [0, 1, 2]) == [2]
    assert missing_seeds(study, first.number + 99, [0, 1, 2]) == [1, 2]  # a fresh configuration: all but the first
    assert missing_seeds(study, first.number, [0]) == []


def test_retried_trial_does_not_count_twice():
    study = optuna.create_study()
    retry = RetryTrial(max_retry=1)
    trial = study.ask()
    trial.suggest_float("x", 0, 1)
    study._storage.set_trial_user_attr(trial._trial_id, "seed", 1)
    study._storage.set_trial_user_attr(trial._trial_id, "worker", "h:1")
    study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    retry(study, study._storage.get_trial(trial._trial_id))
    assert budget_state(study) == (1, 1, 0)  # the failed one is replaced by its WAITING retry
    (waiting,) = study.get_trials(states=(TrialState.WAITING,))
    assert waiting.params == trial.params and waiting.user_attrs == {"seed": 1, "retry_of": 0}
    assert waiting.system_attrs["retry_history"] == [0]
    again = study.ask()  # the retry is what the next worker gets
    assert again.number == waiting.number
    study._storage.set_trial_state_values(again._trial_id, TrialState.FAIL)
    retry(study, study._storage.get_trial(again._trial_id))  # max_retry=1: not again
    assert not study.get_trials(states=(TrialState.WAITING,))


def test_journal_heartbeat_fails_and_retries_a_stale_trial(tmp_path):
    """Optuna 5's JournalStorage has no heartbeat: ours fails a trial whose heartbeat is too old."""
    ref = StorageRef.parse(f"journal://{tmp_path}/j.log", "j", tmp_path)
    storage = open_storage(ref, create=True)
    study = optuna.create_study(study_name="j", storage=storage)
    stale, fresh = study.ask(), study.ask()
    stale.suggest_float("x", 0, 1)
    storage.set_trial_user_attr(stale._trial_id, "heartbeat", time.time() - 1000)
    storage.set_trial_user_attr(fresh._trial_id, "heartbeat", time.time())
    assert fail_stale_attr(study, storage, HeartbeatSpec(interval=5, grace=60), RetryTrial(1)) == 1
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING]
    assert "no heartbeat from worker" in trials[0].user_attrs["fail_reason"]
    assert trials[2].params == trials[0].params and trials[2].user_attrs["retry_of"] == 0


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")
def test_an_unclaimed_running_trial_is_failed_after_the_grace_and_retried(tmp_path):
    """A trial set RUNNING by an ask() that a storage outage interrupted has no worker and no heartbeat, so
    Optuna's heartbeat never fails it: ours does once it is older than the grace period; claimed and
    young trials are left alone."""
    ref = StorageRef.parse(f"sqlite:///{tmp_path}/u.db", "u", tmp_path)
    storage = open_storage(ref, HeartbeatSpec(interval=1, grace=2), create=True)
    study = optuna.create_study(study_name="u", storage=storage)
    study.enqueue_trial({"x": 0.25}, user_attrs={"seed": 0, "config": 0})
    orphan, claimed = study.ask(), study.ask()
    claimed.set_user_attr("worker", "elsewhere")
    heartbeat = HeartbeatSpec(interval=1, grace=2)
    assert [t.number for t in unowned(study)] == [orphan.number]
    assert fail_unowned(study, storage, heartbeat, RetryTrial(1)) == 0  # younger than the grace
    time.sleep(2.5)
    young = study.ask()
    assert fail_unowned(study, storage, heartbeat, RetryTrial(1)) == 1
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING, TrialState.WAITING]
    assert "no worker claimed it" in trials[0].user_attrs["fail_reason"]
    retry = trials[3]
    assert retry.user_attrs["retry_of"] == orphan.number and retry.user_attrs["seed"] == 0
    assert retry.system_attrs["fixed_params"] == {"x": 0.25}
    assert young.number == 2 and [t.number for t in unowned(study)] == [2]


@pytest.mark.slow
def test_a_worker_stays_to_run_the_retry_of_an_unclaimed_trial(tmp_path):
    """The budget is spent on paper by an unclaimed RUNNING trial: the worker does not end the sweep a trial
    short; it waits the grace period out, fails the trial and runs its retry."""
    spec = write_spec(tmp_path, "unclaimed", trials=1, seeds=[0], pruner={"type": "none"},
                      heartbeat={"interval": 1, "grace": 3})
    root = tmp_path / "root"
    assert sweep(spec, root, "--workers=0") == 0
    url = f"sqlite:///{root}/unclaimed/study.db"
    study = load(url, "unclaimed")
    study.enqueue_trial({"model.lr": 3e-3, "model.scheme.rotation": "none"}, user_attrs={"seed": 0, "config": 0})
    study.ask()  # an interrupted worker's ask: RUNNING, no worker attribute, no heartbeat
    assert main(["sweep", str(spec), "--worker", f"--root={root}", f"--storage={url}"]) == 0
    trials = load(url, "unclaimed").get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE], [(t.state, t.user_attrs) for t in trials]
    assert "no worker claimed it" in trials[0].user_attrs["fail_reason"]
    assert trials[1].user_attrs["retry_of"] == 0 and trials[1].params["model.lr"] == 3e-3


def test_a_worker_whose_every_trial_failed_says_so_and_exits_non_zero(tmp_path, capsys):
    """A trial that fails before it trains (here a queued learning rate its log-scale space refuses, past the
    sweep's up-front checks): the worker's last line says so and its exit status is not success, so a scheduler's
    job shows it; a worker whose trial ran is 0 (the test above)."""
    from accrot.sweep.recovery import EVERY_TRIAL_FAILED

    spec = write_spec(tmp_path, "refused", trials=1, seeds=[0], pruner={"type": "none"})
    root = tmp_path / "root"
    assert sweep(spec, root, "--workers=0") == 0
    url = f"sqlite:///{root}/refused/study.db"
    load(url, "refused").enqueue_trial({"model.lr": -1.0, "model.scheme.rotation": "none"},
                                       user_attrs={"seed": 0, "config": 0})
    capsys.readouterr()
    assert main(["sweep", str(spec), "--worker", f"--root={root}", f"--storage={url}"]) == EVERY_TRIAL_FAILED
    out = capsys.readouterr().out
    trials = load(url, "refused").get_trials()  # the trial and its retries
    assert trials and all(t.state == TrialState.FAIL for t in trials)
    assert f"every trial it ran failed ({len(trials)}); first: trial 0 failed before its run started" in out


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")
def test_the_heartbeat_skips_a_beat_the_storage_refuses_and_records_the_next(tmp_path):
    """Optuna's heartbeat thread dies at its first error, so one database restart would silence a running
    trial for good (and another worker would fail it while it trains): our storage skips a beat lost to a
    transient error. A locked SQLite database stands in for the restarting server."""
    import sqlite3

    from optuna.storages import RDBStorage

    from accrot.sweep.storage import _storage_class

    url = f"sqlite:///{tmp_path}/h.db"
    quick = {"connect_args": {"timeout": 0.2}}
    with quiet_experimental():
        ours = _storage_class()(url, engine_kwargs=quick, heartbeat_interval=1, grace_period=2)
        plain = RDBStorage(url, engine_kwargs=quick, heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(study_name="h", storage=ours)
    trial = study.ask()
    with contextlib.closing(sqlite3.connect(f"{tmp_path}/h.db", isolation_level=None)) as lock:
        lock.execute("BEGIN EXCLUSIVE")
        with pytest.raises(optuna.exceptions.StorageInternalError):
            plain.record_heartbeat(trial._trial_id)  # what kills Optuna's heartbeat thread
        ours.record_heartbeat(trial._trial_id)
        lock.execute("ROLLBACK")
    ours.record_heartbeat(trial._trial_id)
    assert ours._get_stale_trial_ids(study._study_id) == []  # recorded, and fresh
    time.sleep(3.5)  # SQLite's clock for heartbeats has whole seconds
    assert ours._get_stale_trial_ids(study._study_id) == [trial._trial_id]


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_budget_lock_is_exclusive(tmp_path, kind):
    url = f"sqlite:///{tmp_path}/s.db" if kind == "sqlite" else f"journal://{tmp_path}/s.log"
    ref = StorageRef.parse(url, "s", tmp_path)
    first, second = BudgetLock(ref, "s"), BudgetLock(ref, "s")
    first.acquire()
    order = []
    waiter = threading.Thread(target=lambda: (second.acquire(), order.append("second"), second.release()))
    waiter.start()
    time.sleep(0.3)
    order.append("first")
    first.release()
    first.release()  # idempotent
    waiter.join(10)
    assert order == ["first", "second"]


def test_storage_urls():
    assert StorageRef.parse(None, "s", "/r").url == "sqlite:////r/s/study.db"
    j = StorageRef.parse("journal:///tmp/x/s.log", "s", "/r")
    assert j.kind == "journal" and j.dashboard == "/tmp/x/s.log"
    # no driver named: the installed one (SQLAlchemy 2.1 would assume psycopg 3)
    assert StorageRef.parse("postgres://u:pw@h/db", "s", "/r").url in ("postgresql+psycopg://u:pw@h/db",
                                                                       "postgresql+psycopg2://u:pw@h/db")
    assert StorageRef.parse("postgresql+pg8000://u@h/db", "s", "/r").url == "postgresql+pg8000://u@h/db"
    assert redact("postgresql://u:secret@h:5432/db") == "postgresql://u:***@h:5432/db"


@pytest.mark.parametrize("doc, expect", [
    ({"samplr": {"type": "tpe"}}, "unknown key 'samplr'; did you mean 'sampler'?"),
    ({"sampler": {"type": "cmaes"}}, "sampler: type='cmaes' is not valid; choose one of 'tpe', 'random', 'grid', 'nsga2'"),
    ({"artifacts": {"type": "ftp"}}, "artifacts: type='ftp' is not valid; choose one of 'filesystem', 's3', 'gcs', 'none'"),
    ({"artifacts": {"type": "s3"}}, "artifacts: an s3 artifact store needs bucket"),
    ({"pruner": {"type": "median", "upper": 1}}, "upper is not an option of the median pruner"),
    ({"space": {"model.lr": {"type": "float", "low": 0, "high": 1, "log": True}}}, "low=0 is not valid with log: true"),
    ({"space": {"model.lr": {"type": "float", "lo": 0, "high": 1}}}, "unknown key 'lo'; did you mean 'low'?"),
    ({"objectives": ["loss"]}, "metric 'loss' is not valid"),
    ({"objectives": ["nll@1x", "nll@2x"]}, "pruner 'median' needs a single objective"),
    ({"seeds": [0, 0]}, "seeds=[0, 0] is not valid"),
    ({"overrides": {"seed_everything": 3}}, "is set by the sweep itself"),
    ({"space": {"model.scheme.increments": {"choices": ["learned"], "when": {"model.scheme.window": 1}},
                "model.scheme.window": [1, 2]}}, "not an earlier search-space key"),
    ({"variants": {"fast": {"model.lr": 0.1}}}, "variants.fast sets 'model.lr', which the space searches"),
], ids=["unknown-key", "sampler", "artifact-store", "artifact-bucket", "pruner-option", "log-low", "param-key", "metric", "multi-objective-pruner",
        "seeds", "reserved", "condition-order", "searched-and-fixed"])
def test_spec_errors_name_the_key(tmp_path, doc, expect):
    path = write_spec(tmp_path, "bad", **doc)
    with pytest.raises(ValueError) as err:
        load_spec(path)
    assert expect in str(err.value) and "\n" not in str(err.value)


# bad input before any trial (unknown spec key, search-space key, unreachable storage, objective never
# evaluated, multi-device trials, a study of another spec): rows of tests/test_bad_inputs.py


# ---------------------------------------------------------------------------------------------------
# storages: smoke.yaml with 2 workers
# ---------------------------------------------------------------------------------------------------
PROGRESS_CALLS: list[int] = []  # the smoke study's on_progress calls (the ablation's study notes hang on it)


@pytest.fixture(scope="module")
def sqlite_study(tmp_path_factory):
    """The smoke spec on SQLite with 2 workers, the parent given a progress hook that always fails (a note store
    that is down) and asked to call it as often as trials finish."""
    import accrot.sweep.parent as parent

    def hook() -> None:
        PROGRESS_CALLS.append(len(PROGRESS_CALLS))
        raise RuntimeError("a note store that is down")  # one yellow line, the sweep goes on

    root = tmp_path_factory.mktemp("sweeps")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parent, "PROGRESS_EVERY", 0.0)
        spec = load_spec(SMOKE)
        assert parent.run_sweep(spec, StorageRef.parse(None, spec.name, root), root, 2, on_progress=hook) == 0
    return root, f"sqlite:///{root}/smoke/study.db"


def test_smoke_two_workers_sqlite(sqlite_study):
    root, url = sqlite_study
    study = load(url, "smoke")
    trials = check_complete(study, load_spec("smoke").budget)
    assert all(t.user_attrs["variant"] in ("none/none", "rope/none") or t.user_attrs["variant"].startswith("accum:")
               for t in trials)
    assert study.user_attrs["accrot"]["budget"] == 4
    # every trial's extrapolation curve is an intermediate value (the dashboard's plot), pruner or not
    for t in trials:
        assert t.intermediate_values == {t.user_attrs["step"]: t.values[0]}, (t.number, t.intermediate_values)
    # every trial's files are its artifacts, byte for byte, in the store beside the study
    store = FileSystemArtifactStore(root / "smoke" / "artifacts")
    for t in trials:
        metas = {m.filename: m for m in get_all_artifact_meta(t, storage=study._storage)}
        run = Path(t.user_attrs["run_dir"])
        assert set(metas) == {"extrapolation.png", "extrapolation.json", "config.yaml", "run.json"}, sorted(metas)
        for name, meta in metas.items():
            with store.open_reader(meta.artifact_id) as fh:
                assert fh.read() == (run / name).read_bytes(), (t.number, name)
        assert "artifact_error" not in t.user_attrs
        note = get_note(optuna.Trial(study, t._trial_id))  # its dashboard page's note
        assert note.startswith(f"### {t.user_attrs['variant']}, seed {t.user_attrs['seed']}")
        assert t.user_attrs["run_dir"] in note and f"| {t.values[0]:.4f} |" in note
    no_locked_database(root, "smoke")


def test_progress_hook_runs_as_trials_finish_and_its_failure_never_stops_the_sweep(sqlite_study):
    """What keeps an ablation's study notes current: run_sweep calls on_progress after trials finished; the
    hook raised every time and the study still completed (test_smoke_two_workers_sqlite checks every trial)."""
    root, url = sqlite_study
    assert PROGRESS_CALLS, "on_progress was never called"
    assert all(t.state == TrialState.COMPLETE for t in load(url, "smoke").get_trials())


def test_an_artifact_store_that_fails_leaves_the_trial_complete_with_the_failure_recorded(tmp_path, capsys):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the store's folder should be")
    spec = write_spec(tmp_path, "blocked", trials=1, artifacts={"path": str(blocked / "artifacts")})
    assert sweep(spec, tmp_path / "root", "--workers=1") == 0
    # stderr is no terminal here: one line per finished run, not the live display
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("[1/1] ")]
    assert line.startswith("[1/1] blocked #0 ") and " seed 0: NLL " in line and " at 1×, " in line and " at 2× (" in line
    (trial,) = load(f"sqlite:///{tmp_path}/root/blocked/study.db", "blocked").get_trials()
    assert trial.state == TrialState.COMPLETE
    # where the time went: the trial's split and the worker's start-up, summed at the end with the load
    assert trial.user_attrs["timing"]["training"] > 0 and trial.user_attrs["timing"]["evaluation"] > 0
    assert trial.user_attrs["worker_start_s"] > 0
    assert "where the time went: 1 trial(s) finished by this run" in err and "% busy" in err
    assert "artifact_error" in trial.user_attrs and "extrapolation.png" in trial.user_attrs["artifact_error"]


@pytest.mark.slow
def test_smoke_two_workers_journal(tmp_path):
    url = f"journal://{tmp_path}/shared/smoke.log"
    assert sweep(SMOKE, tmp_path / "root", "--workers=2", f"--storage={url}") == 0
    check_complete(load(url, "smoke"), 4)
    no_locked_database(tmp_path / "root", "smoke")


@pytest.mark.integration
def test_smoke_two_workers_postgresql(postgres, tmp_path):
    assert sweep(SMOKE, tmp_path, "--workers=2", f"--storage={postgres}") == 0
    check_complete(load(postgres, "smoke"), 4)
    no_locked_database(tmp_path, "smoke")


def _when_a_trial_runs(url: str, name: str, parent: threading.Thread, action) -> int | None:
    """Call ``action(trial)`` once a trial of study ``name`` is RUNNING with its params; its number."""
    study, deadline = None, time.time() + 240
    while parent.is_alive() and time.time() < deadline:
        time.sleep(0.2)
        if study is None:
            with contextlib.suppress(KeyError, ValueError):  # not created yet
                study = load(url, name)
            continue
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if "worker" in t.user_attrs and t.params:
                action(t)
                return t.number
    return None


@pytest.mark.integration
def test_postgresql_restart_mid_sweep_loses_no_trial(postgres, postgres_server, tmp_path):
    """`pg_ctl restart` while trials run: the parent and the workers ride out the outage; the study ends
    with every (configuration, seed) complete and every trial finished, a failure always with its reason."""
    from accrot.sweep.recovery import account

    # a short grace: a trial the restart left unclaimed (an interrupted ask) is retried within seconds
    spec = write_spec(tmp_path, "pgrestart", trials=2, seeds=[0, 1], retries=2, pruner={"type": "none"},
                      heartbeat={"interval": 2, "grace": 15})
    result: dict = {}
    parent = threading.Thread(target=lambda: result.setdefault(
        "rc", sweep(spec, tmp_path / "root", "--workers=2", f"--storage={postgres}")))
    parent.start()
    restarted = _when_a_trial_runs(postgres, "pgrestart", parent, lambda t: postgres_server.restart())
    parent.join(600)
    assert not parent.is_alive() and restarted is not None
    assert result["rc"] == 0
    figures = account(load(postgres, "pgrestart"), load_spec(spec).budget)
    logs = {p.name: p.read_text()[-1500:] for p in (tmp_path / "root" / "pgrestart" / "workers").glob("*.log")}
    assert figures["lost"] == 0 and not figures["unfinished"] and not figures["failed_silently"], (figures, logs)


@pytest.mark.slow
def test_two_sweeps_started_at_once_share_the_study(tmp_path):
    """Two `accrot sweep` parents on the same fresh SQLite storage at the same moment: one creates the schema
    and the study, both run workers, the budget is spent exactly once."""
    spec = write_spec(tmp_path, "twice", trials=2, seeds=[0, 1], pruner={"type": "none"})
    root = tmp_path / "root"
    env = {**os.environ, "WANDB_MODE": "disabled"}
    procs = [subprocess.Popen([sys.executable, "-m", "accrot.cli", "sweep", str(spec), f"--root={root}", "--workers=1"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outs]
    check_complete(load(f"sqlite:///{root}/twice/study.db", "twice"), load_spec(spec).budget)
    no_locked_database(root, "twice")
    # each parent's worker holds its own index (and so its own sampler seed): two worker 0s drew the same
    # configurations, and a configuration then ran twice with the same seed
    assert sorted(p.name for p in (root / "twice" / "workers").glob("worker-*.log")) == ["worker-0.log", "worker-1.log"]


# ---------------------------------------------------------------------------------------------------
# failures: a killed worker, a diverged run, a pruned run
# ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_killed_worker_trial_is_failed_with_reason_and_retried(tmp_path):
    """SIGKILL a worker mid-trial: its trial fails with the reason, is retried with the same params and
    seed, the worker is replaced and the study (a configuration × 2 seeds) completes."""
    # 60 steps (about 4 s here): the poll below (every 0.2 s) kills as soon as the run's directory exists, which
    # is at the start of fit, so even a fast machine is still training then
    overrides = {**yaml.safe_load(SMOKE.read_text())["overrides"], "trainer.max_steps": 60}
    spec = write_spec(tmp_path, "kill", trials=1, seeds=[0, 1], retries=1, pruner={"type": "none"},
                      overrides=overrides)
    root = tmp_path / "root"
    url = f"sqlite:///{root}/kill/study.db"
    result: dict = {}
    parent = threading.Thread(target=lambda: result.setdefault("rc", sweep(spec, root, "--workers=2")))
    parent.start()
    killed, study = None, None
    deadline = time.time() + 180
    while killed is None and parent.is_alive() and time.time() < deadline:
        time.sleep(0.2)
        if study is None:
            # open the storage only once workers exist: the parent has created schema and study by then,
            # and opening it earlier would race the parent creating the schema
            if not (root / "kill" / "workers").exists():
                continue
            with contextlib.suppress(KeyError, ValueError):
                study = load(url, "kill")
            continue
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            # the objective records the worker (so a death is always traced), then the params one by one, then
            # (for a fresh configuration) the seed, and only then starts the run. Kill once the run's directory
            # exists: a kill between the params and the seed was this test's flake (the dead attempt had no
            # seed, or only part of its params, to compare the retry with).
            started = any((root / "kill" / "runs" / f"trial_{t.number:04d}").glob("version_*"))
            if "worker" in t.user_attrs and "seed" in t.user_attrs and started:
                os.kill(int(t.user_attrs["worker"].rsplit(":", 1)[1]), signal.SIGKILL)
                killed = t.number
                break
    parent.join(240)
    assert not parent.is_alive() and killed is not None
    assert result["rc"] == 0
    study = load(url, "kill")
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    dead = trials[killed]
    assert dead.state == TrialState.FAIL
    assert "killed by SIGKILL while running the trial" in dead.user_attrs["fail_reason"]
    (retry,) = [t for t in trials.values() if t.user_attrs.get("retry_of") == killed]
    assert retry.state == TrialState.COMPLETE and retry.params == dead.params
    assert retry.user_attrs["seed"] == dead.user_attrs["seed"] and retry.user_attrs["config"] == dead.user_attrs["config"]
    complete = [t for t in trials.values() if t.state == TrialState.COMPLETE]
    assert len(complete) == 2 and len(trials) == 3
    # the configuration ran once per seed, with the same params (the seed copy was enqueued, not sampled)
    assert sorted(t.user_attrs["seed"] for t in complete) == [0, 1]
    assert {t.user_attrs["config"] for t in complete} == {0}
    assert len({json.dumps(t.params, sort_keys=True) for t in complete}) == 1


@pytest.mark.slow
def test_sigint_to_the_parent_alone_stops_its_workers_at_once_and_says_ctrl_c(tmp_path):
    """`kill -INT PARENT` (a scheduler, a script; the workers, in their own sessions, hear nothing): the parent passes
    Ctrl-C on at once, the worker finishes its step, checkpoints and fails its trial saying Ctrl-C, the trial is
    queued again, no trial completes, and the parent exits 130 long before it would have to kill anyone."""
    from accrot.sweep.parent import STOP_GRACE

    every5 = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",  # a checkpoint says training is under way
              "init_args": {"save_last": True, "every_n_train_steps": 5, "save_top_k": 0}}
    overrides = {**yaml.safe_load(SMOKE.read_text())["overrides"], "trainer.max_steps": 50000,
                 "trainer.callbacks": [every5]}
    spec = write_spec(tmp_path, "sigint", trials=1, seeds=[0], retries=1, pruner={"type": "none"},
                      overrides=overrides)
    root = tmp_path / "root"
    proc = subprocess.Popen([sys.executable, "-m", "accrot.cli", "sweep", str(spec), f"--root={root}", "--workers=1",
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "WANDB_MODE": "disabled"})
    deadline = time.time() + 240
    worker_log = root / "sigint" / "workers" / "worker-0.log"
    while time.time() < deadline and proc.poll() is None:  # training is under way once the step-5 checkpoint is
        # written (or, on a loaded machine where the poll can miss it, once Lightning has printed the model summary)
        if glob.glob(str(root / "sigint" / "runs" / "trial_*" / "version_*" / "checkpoints" / "*.ckpt")) or (
                worker_log.is_file() and "Trainable params" in worker_log.read_text(errors="replace")):
            time.sleep(1.0)
            break
        time.sleep(0.3)
    assert proc.poll() is None, proc.communicate()
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=180)
    finally:  # a parent that hung must not outlive the test (its pipes would fail the next one)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert time.monotonic() - sent < STOP_GRACE, err
    assert proc.returncode == 130, err
    assert "interrupted by Ctrl-C (SIGINT): 1 worker(s) stopped" in err, err
    log = (root / "sigint" / "workers" / "worker-0.log").read_text()
    assert "stopped by Ctrl-C (SIGINT); its trial is failed and queued again" in log, log[-2000:]
    study = load(f"sqlite:///{root}/sigint/study.db", "sigint")
    states = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert [t.state for t in states.values()] == [TrialState.FAIL, TrialState.WAITING]
    assert states[0].user_attrs["fail_reason"].endswith("was stopped by Ctrl-C (SIGINT) during the trial (checkpointed)")
    assert states[1].user_attrs["retry_of"] == 0


def test_a_stop_signal_is_raised_at_a_safe_point_never_inside_a_storage_call():
    """A signal that lands while the parent is busy (a storage call) is only recorded, and raised at its next check
    or sleep: raised inside the database client it could leave a lock held that stopping the workers then waits on.
    One that lands while the parent sleeps between its checks stops it at once. The handlers are restored after."""
    import threading

    from accrot.sweep.parent import Terminated, _stop_signals

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with _stop_signals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):  # busy, not sleeping in stop.sleep: the handler runs and only records it
            sum(range(1000))
        assert stop.pending == signal.SIGTERM
        with pytest.raises(Terminated):
            stop.sleep(30)  # the next safe point raises it before sleeping
    with _stop_signals() as stop:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            stop.sleep(30)
        assert time.monotonic() - started < 5
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_resumed_parent_lists_only_the_trials_it_finishes(tmp_path):
    """Trials that finished before the parent started were shown by the run that finished them."""
    from rich.console import Console

    from accrot.sweep.parent import Parent

    spec = load_spec(write_spec(tmp_path, "again"))
    study = optuna.create_study(study_name="again")
    study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))
    study.add_trial(optuna.trial.create_trial(value=1.0))
    parent = Parent(spec, StorageRef.parse(None, "again", tmp_path), tmp_path, study._storage, [study],
                    Console(file=io.StringIO()))
    assert parent.seen == {("again", 0), ("again", 1)}
    parent.near_far = ("nll@1x", "nll@2x")
    study.add_trial(optuna.trial.create_trial(value=0.5))  # finished by this parent's workers
    _, _, finished = parent._read({})
    assert [f.what for f in finished] == ["again #2"]


@pytest.mark.slow
def test_diverged_run_fails_with_message_and_pruned_run_stops_cleanly(tmp_path, capsys):
    """A huge learning rate makes the evaluation non-finite: the trial fails and says why. A threshold
    pruner under every NLL stops the other variant at its first evaluation: pruned, with a checkpoint. A study
    whose every trial failed makes the sweep exit 1 with a summary line that names it and why."""
    overrides = {**yaml.safe_load(SMOKE.read_text())["overrides"], "trainer.max_steps": 3,
                 "extrapolation.every_n_steps": 1}
    spec = write_spec(tmp_path, "np", overrides=overrides, space={"model.weight_decay": [0.0, 0.1]},
                      variants={"diverged": {"model.lr": 1.0e6, "model.warmup_steps": 1,
                                             "trainer.gradient_clip_val": None, "extrapolation.every_n_steps": 0},
                                "pruned": {}},
                      sampler={"type": "random", "seed": 0}, pruner={"type": "threshold", "upper": 0.0}, trials=1)
    root = tmp_path / "root"
    assert sweep(spec, root, "--workers=1") == 1
    out = " ".join(capsys.readouterr().err.split())  # the sweep's console writes to stderr
    assert "every trial failed in 1 of 2 studies: np/diverged (1 failed; first: the run diverged" in out, out[-2000:]
    url = f"sqlite:///{root}/np/study.db"
    (diverged,) = load(url, "np/diverged").get_trials()
    assert diverged.state == TrialState.FAIL
    reason = diverged.user_attrs["fail_reason"]
    assert reason.startswith("the run diverged: FloatingPointError: ")
    # the training loss (or a gradient) goes non-finite before any evaluation: the step and tensor are named
    assert ("the training loss is" in reason or "the gradient of" in reason) and " at step " in reason
    (pruned,) = load(url, "np/pruned").get_trials()
    assert pruned.state == TrialState.PRUNED and pruned.intermediate_values.keys() == {1}
    assert pruned.user_attrs["pruned_reason"].startswith("pruned: nll@2x=")
    run = Path(pruned.user_attrs["run_dir"])
    assert (run / "checkpoints" / "pruned-step=1.ckpt").is_file() and (run / "extrapolation.json").is_file()
    assert json.loads((run / "extrapolation.json").read_text())["final"]["step"] == 1


# ---------------------------------------------------------------------------------------------------
# dashboard and report
# ---------------------------------------------------------------------------------------------------
def test_dashboard_serves_the_study(sqlite_study):
    from tests.helpers.browser import api, dashboard

    root, url = sqlite_study
    with dashboard(url, root / "smoke" / "artifacts") as base:
        (study,) = [s for s in api(base, "studies")["study_summaries"] if s["study_name"] == "smoke"]
        assert study["directions"] == ["minimize"]
        detail = api(base, f"studies/{study['study_id']}")
        assert len(detail["trials"]) == 4 and all(t["state"] == "Complete" for t in detail["trials"])
        # a trial's page shows its curve: the dashboard serves the artifact the worker uploaded
        trial = detail["trials"][0]
        (png,) = [m for m in trial["artifacts"] if m["filename"] == "extrapolation.png"]
        link = f"{base}/artifacts/{study['study_id']}/{trial['trial_id']}/{png['artifact_id']}"
        with urllib.request.urlopen(link, timeout=30) as resp:
            assert resp.headers["Content-Type"] == "image/png"
            served = resp.read()
        run_dir = [t for t in load(url, "smoke").get_trials() if t.number == trial["number"]][0].user_attrs["run_dir"]
        assert served == (Path(run_dir) / "extrapolation.png").read_bytes()


def test_dashboard_renders_in_a_real_browser(sqlite_study, tmp_path):
    """Headless Chromium (Debian's, through its chromedriver) on optuna-dashboard: the study list names the study,
    a trial's page decodes its uploaded extrapolation curve and renders its note; a screenshot is saved."""
    from tests.helpers.browser import chromium, dashboard, missing_browser, render_trial

    why = missing_browser()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}, and CI=true")
        pytest.skip(why)
    root, url = sqlite_study
    with dashboard(url, root / "smoke" / "artifacts") as base, chromium() as driver:
        rendered = render_trial(driver, base, "smoke", tmp_path / "dashboard.png")
    assert "smoke" in rendered.study_list
    curve = min(t.user_attrs["run_dir"] for t in load(url, "smoke").get_trials())
    from PIL import Image

    with Image.open(Path(curve) / "extrapolation.png") as img:
        assert rendered.image_width == img.width  # the browser decoded the very PNG the run wrote
    assert "seed 0" in rendered.note
    shot = rendered.screenshot.read_bytes()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000


def test_report_writes_table_figures_and_csv(sqlite_study, tmp_path, capsys):
    root, _ = sqlite_study
    out = tmp_path / "results"
    assert main(["report", "--study", "smoke", f"--root={root}", f"--out={out}"]) == 0
    table = (out / "report.md").read_text()
    assert "| variant | trials | best trial | config | seeds | NLL 1× | NLL 2× | params |" in table
    assert "model.lr=" in table and "nll@2x (minimize)" in table
    for png in ("nll_vs_length.png", "importance.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    lines = (out / "trials.csv").read_text().splitlines()
    assert len(lines) == 5 and lines[0].startswith("study,variant,number,state,seed,config")
    assert "param:model.lr" in lines[0] and "nll@2x" in lines[0] and "run_dir" in lines[0]
    assert "report.md" in capsys.readouterr().out


def test_report_unknown_study_is_bad_input(sqlite_study, tmp_path, capsys):
    root, url = sqlite_study
    assert main(["report", "--study", "nope", f"--storage={url}", f"--out={tmp_path / 'o'}"]) == 2
    assert "no study 'nope'" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_report_of_two_objective_study_with_variants(tmp_path):
    """The report of a study with variants and two objectives (no training: trials added directly)."""
    url = f"sqlite:///{tmp_path}/w.db"
    storage = open_storage(StorageRef.parse(url, "w", tmp_path), create=True)
    dist = {"model.scheme.window": optuna.distributions.FloatDistribution(4, 4096, log=True)}
    for variant, offset in (("gauss", 0.0), ("unif", 0.5)):
        study = optuna.create_study(study_name=f"w/{variant}", storage=storage, directions=["minimize"] * 2)
        study.set_user_attr("accrot", {"variant": variant, "objectives": ["nll@1x", "nll@16x"]})
        for config, window in enumerate((8.0, 64.0, 512.0)):
            for seed in (0, 1):
                nll = {1: 2.0 + offset + window / 1000 + seed / 100, 16: 3.0 + offset - window / 1000}
                metrics = {f"nll@{m}x": v for m, v in nll.items()}
                study.add_trial(optuna.trial.create_trial(
                    params={"model.scheme.window": window}, distributions=dist, values=[nll[1], nll[16]],
                    user_attrs={"metrics": metrics, "seed": seed, "config": 2 * config, "variant": variant}))
        study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": "boom"}))
    out = tmp_path / "out"
    assert main(["report", "--study", "w", f"--storage={url}", f"--out={out}"]) == 0
    table = (out / "report.md").read_text()
    assert "| gauss | 6 | #0 2.0080 | #0 | 2 | 2.0130 ± 0.0071 | 2.9920 ± 0.0000 |" in table
    assert "| unif | 6 |" in table and "## Pareto front" in table and "- w/gauss #4:" in table
    assert "- w/unif #6: boom" in table
    for png in ("nll_vs_length.png", "importance-gauss.png", "importance-unif.png"):
        assert (out / png).is_file(), png
    assert len((out / "trials.csv").read_text().splitlines()) == 1 + 2 * 7


def test_grid_sampler_lets_a_seed_copy_finish_while_the_last_grid_point_runs():
    """Optuna's GridSampler raised KeyError('grid_id') in after_trial when an enqueued trial (a seed copy) finished
    while the grid's last point still ran in another worker, killing that worker; ours does not."""
    from accrot.sweep.spec import SamplerSpec, load_spec

    space = load_spec(write_spec(Path(tempfile.mkdtemp()), "g", space={"model.lr": [1.0e-3]}, trials=1,
                                 sampler={"type": "grid"}, pruner={"type": "none"})).space
    for sampler, fails in ((optuna.samplers.GridSampler({"model.lr": [1.0e-3]}), True),
                           (SamplerSpec(type="grid").build(space), False)):
        study = optuna.create_study(sampler=sampler)
        running = study.ask()  # the grid's only point, still running elsewhere
        running.suggest_categorical("model.lr", [1.0e-3])
        study.enqueue_trial({"model.lr": 1.0e-3}, user_attrs={"seed": 1})
        copy = study.ask()
        copy.suggest_categorical("model.lr", [1.0e-3])
        if fails:
            with pytest.raises(KeyError, match="grid_id"):
                study.tell(copy, 1.0)
        else:
            study.tell(copy, 1.0)
            study.tell(running, 2.0)
            assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2


def test_a_failure_the_heartbeat_retried_is_accounted_for_and_a_silent_one_is_not():
    """Optuna's heartbeat fails a stale trial before its retry callback runs, so the failed trial has no
    fail_reason; its retry (retry_of, retry_reason) accounts for it. A failure with neither is lost."""
    from accrot.sweep.recovery import RetryTrial, account

    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    study = optuna.create_study()
    for x in (0.1, 0.2):
        study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, params={"x": x}, distributions=dist,
                                                  user_attrs={"seed": 0}))
    RetryTrial(3, reason="stopped sending heartbeats")(study, study.trials[0])  # what the heartbeat's callback does
    retry = study.trials[2]
    assert retry.user_attrs["retry_of"] == 0 and "heartbeats" in retry.user_attrs["retry_reason"]
    storage = study._storage
    storage.set_trial_state_values(retry._trial_id, state=TrialState.RUNNING)
    storage.set_trial_state_values(retry._trial_id, state=TrialState.COMPLETE, values=[1.0])
    figures = account(study, budget=2)
    assert figures["failed_silently"] == [1]  # trial 0 was retried; trial 1 failed with no reason and no retry
    assert figures["complete"] == 1 and figures["lost"] == 2  # x=0.2 never ran to the end, and its silent failure


def test_a_grid_cell_that_never_completed_is_a_hole_the_sweep_reports():
    """A shared study's (variant, seed) cells: one whose every trial failed is listed with its first failure, a
    cell that completed on a retry is not, and nothing is listed while trials still wait."""
    from accrot.sweep.parent import _grid_holes

    study = optuna.create_study()
    for variant, seed in (("a", 0), ("a", 1), ("b", 0)):
        study.enqueue_trial({}, user_attrs={"variant": variant, "seed": seed, "config": 0})
    assert _grid_holes([study]) == []  # waiting: not yet a hole

    def objective(trial):
        if trial.user_attrs["variant"] == "b" or (trial.user_attrs["seed"] == 1 and trial.number == 1):
            trial.set_user_attr("fail_reason", "diverged at step 3")
            raise RuntimeError("no")
        return 1.0

    study.optimize(objective, n_trials=3, catch=(RuntimeError,))
    study.enqueue_trial({}, user_attrs={"variant": "a", "seed": 1, "config": 0})  # a's seed 1 retried: completes
    study.optimize(objective, n_trials=1, catch=(RuntimeError,))
    holes = _grid_holes([study])
    assert len(holes) == 1 and holes[0].endswith("b seed 0 (first failure: diverged at step 3)"), holes

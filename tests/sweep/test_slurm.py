"""``accrot slurm``: rendering, bad input, the launch check, and (marked ``integration``) a real two-node SLURM.

The integration tests start munged, slurmctld and two slurmd daemons on localhost (:mod:`tests.helpers.slurm_cluster`),
submit the rendered training template on 2 nodes × 1 task, and check that the run trained with DDP over both
ranks; a job requeued mid-run (``scontrol requeue``) checkpoints on SIGTERM, resumes from that checkpoint in the
same run directory and finishes with the same step count. Sweeps run on a real PostgreSQL server (the
``postgres`` fixture), directly and through the storage proxy's own job. Without SLURM's binaries they skip with one line;
under ``CI=true`` a missing binary fails.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from accrot.cli import main
from tests.helpers.slurm_cluster import SlurmCluster, missing_binaries

# a tiny DDP run: 2 layers, width 32, T = 64; checkpoints every 2 steps, a 2-length evaluation at the end
TINY = ["--config", "tiny", "--model.d_model=32", "--data.init_args.seq_len=64", "--data.init_args.batch_size=4",
        "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
        "--extrapolation.multipliers=[1, 2]", "--extrapolation.budget_tokens=512", "--wandb=disabled",
        '--trainer.callbacks=[{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": '
        '{"save_last": true, "every_n_train_steps": 2, "save_top_k": 0}}]']


def _error(capsys) -> str:
    # (Lightning's loggers may also complain about a stream an earlier capsys closed: not accrot's output)
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.startswith("accrot: error: ")]
    assert len(err) == 1, err
    return err[0]


# ---------------------------------------------------------------------------------------------------
# rendering and bad input (no cluster needed)
# ---------------------------------------------------------------------------------------------------
def test_dry_run_prints_the_training_script(capsys, tmp_path):
    assert main(["slurm", "train", "--nodes", "2", "--tasks_per_node", "2", "--partition", "gpu", "--account", "lab",
                 "--time", "02:00:00", "--gpus_per_node", "2", "--master_addr", "127.0.0.1", "--assume_shared", "true",
                 "--dry-run", "--", *TINY, f"--root={tmp_path}"]) == 0
    script = capsys.readouterr().out
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --partition=gpu", "#SBATCH --account=lab",
                 "#SBATCH --time=02:00:00", "#SBATCH --signal=USR1@90", "#SBATCH --requeue", "#SBATCH --gpus-per-node=2",
                 "export MASTER_ADDR=127.0.0.1"):
        assert line in script.splitlines(), line
    srun = next(ln for ln in script.splitlines() if ln.startswith("srun "))
    assert srun.endswith("--trainer.accelerator=gpu --trainer.num_nodes=2 --trainer.devices=2 --trainer.strategy=ddp "
                         "--ckpt_path=last")
    # GPUs: NCCL's ranks fail fast instead of hanging, after the #SBATCH block (sbatch reads no directive later)
    lines = script.splitlines()
    nccl = lines.index('export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"')
    assert 'export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"' in lines
    assert nccl > max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH"))
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def test_without_gpus_the_script_asks_for_none_and_sets_no_nccl(capsys, tmp_path):
    assert main(["slurm", "train", "--nodes", "1", "--tasks_per_node", "2", "--assume_shared", "true", "--dry-run",
                 "--", *TINY, f"--root={tmp_path}"]) == 0
    script = capsys.readouterr().out
    assert "--gpus-per-node" not in script and "NCCL" not in script and "--trainer.accelerator" not in script


def test_gpu_sweep_array_requests_gpus_and_nccl(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCROT_SWEEP_STORAGE", "postgresql://u:secret@db/accrot")
    assert main(["slurm", "sweep", "smoke", "--workers", "2", "--nodes", "2", "--tasks_per_node", "4",
                 "--gpus_per_node", "4", "--root", str(tmp_path), "--assume_shared", "true", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for line in ("#SBATCH --array=0-1", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 'export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"'):
        assert line in lines, line


def test_an_explicit_accelerator_in_the_fit_arguments_is_kept(capsys, tmp_path):
    assert main(["slurm", "train", "--tasks_per_node", "1", "--gpus_per_node", "1", "--assume_shared", "true",
                 "--dry-run", "--", *TINY, "--trainer.accelerator=auto", f"--root={tmp_path}"]) == 0
    srun = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("srun "))
    assert "--trainer.accelerator=auto" in srun and "--trainer.accelerator=gpu" not in srun


def test_dry_run_prints_the_sweep_array(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCROT_SWEEP_STORAGE", "postgresql://u:secret@db/accrot")
    assert main(["slurm", "sweep", "smoke", "--workers", "3", "--nodes", "2", "--root", str(tmp_path),
                 "--assume_shared", "true", "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --array=0-2" in script and "#SBATCH --nodes=2" in script
    assert "--worker --distributed" in script and "secret" not in script  # the URL stays in the environment


def test_dry_run_with_proxy_prints_the_proxy_job_then_the_array(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCROT_SWEEP_STORAGE", "postgresql://u:secret@db/accrot")
    assert main(["slurm", "sweep", "smoke", "--workers", "4", "--nodes", "2", "--root", str(tmp_path), "--proxy",
                 "--proxy_host", "10.0.0.9", "--proxy_time", "2-00:00:00", "--assume_shared", "true", "--dry-run"]) == 0
    proxy, array = capsys.readouterr().out.split("# --- then the workers' array: sbatch --dependency=after:")
    address = str(tmp_path / "smoke" / "proxy.address")
    lines = proxy.splitlines()
    for line in ("#SBATCH --nodes=1", "#SBATCH --ntasks=1", "#SBATCH --time=2-00:00:00", "#SBATCH --requeue"):
        assert line in lines, line
    assert f"--advertise 10.0.0.9 --address_file {address}" in proxy and "--until_done smoke" in proxy
    assert "storage-proxy --host 0.0.0.0 --port 0" in proxy and "gpus" not in proxy
    assert f"address={address}" in array.splitlines() and 'ACCROT_SWEEP_STORAGE="grpc://$(cat "$address")"' in array
    assert "#SBATCH --array=0-3" in array and "secret" not in proxy + array
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


@pytest.mark.parametrize("argv, message", [
    (["slurm"], "accrot slurm needs a command: train or sweep"),
    (["slurm", "launch"], "(got 'launch')"),
    (["slurm", "train", "--nodes", "0", "--", "--config", "tiny"], "--nodes=0 is not valid"),
    (["slurm", "train", "--time", "1:2:3:4", "--", "--config", "tiny"], "--time='1:2:3:4' is not valid"),
    (["slurm", "train", "--nodse", "2", "--", "--config", "tiny"], "unrecognized arguments: --nodse"),
    (["slurm", "train", "--dry-run"], "give the accrot fit arguments after --"),
    (["slurm", "train", "--tasks_per_node", "1", "--gpus_per_node", "4", "--", "--config", "tiny"],
     "--tasks_per_node=1 with --gpus_per_node=4: Lightning runs one rank per GPU; pass --tasks_per_node 4"),
    (["slurm", "train", "--dry-run", "--", "--config", "tiny", "--trainer.devices=2"], "--trainer.devices is set by"),
    (["slurm", "train", "--dry-run", "--", "--config", "tiny", "--model.d_modle=3"], "unknown key 'model.d_modle'"),
    (["slurm", "train", "--nodes", "2", "--dry-run", "--", "--config", "tiny", "--root=/tmp/accrot-local"],
     "is on a node-local filesystem"),
    (["slurm", "train", "--tasks_per_node", "2", "--dry-run", "--", "--config", "CONFIG_WITH_DEVICES_4"],
     "the config asks for trainer.devices=4"),
    (["slurm", "sweep", "smoke", "--storage", "sqlite:///x.db", "--dry-run"], "cannot serve a job array"),
    (["slurm", "sweep", "nope", "--storage", "postgresql://u@h/db", "--dry-run"], "sweep spec 'nope' does not exist"),
    (["slurm", "sweep", "smoke", "--storage", "postgresql://u@h/db", "--proxy", "--proxy_port", "70000",
      "--assume_shared", "true", "--dry-run"], "--proxy_port=70000 is not valid"),
    (["slurm", "sweep", "smoke", "--storage", "postgresql://u@h/db", "--proxy", "--proxy_time", "soon",
      "--assume_shared", "true", "--dry-run"], "--proxy_time='soon' is not valid"),
], ids=["no-command", "unknown-command", "nodes-0", "bad-time", "typo-option", "no-fit-args", "tasks-not-gpus",
        "devices-in-args", "bad-fit-key", "local-root", "config-devices", "sqlite-array", "unknown-spec",
        "proxy-port", "proxy-time"])
def test_bad_input_is_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("ACCROT_SWEEP_STORAGE", raising=False)
    monkeypatch.setattr("accrot.sweep.slurm.cluster_is_this_machine", lambda: False)
    if "CONFIG_WITH_DEVICES_4" in argv:
        cfg = tmp_path / "four.yaml"
        cfg.write_text((Path(__file__).resolve().parents[2] / "accrot/configs/tiny.yaml").read_text()
                       .replace("devices: 1", "devices: 4"))
        argv = [str(cfg) if a == "CONFIG_WITH_DEVICES_4" else a for a in argv]
    assert main(argv) == 2
    assert message in _error(capsys)


def test_srun_with_fewer_tasks_than_devices_is_refused(capsys, tmp_path, monkeypatch):
    """`srun -n1` with trainer.devices=2: Lightning would silently train one rank."""
    for key, value in {"SLURM_NTASKS": "1", "SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                       "SLURM_NODEID": "0", "SLURM_JOB_NAME": "accrot", "SLURM_NNODES": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    assert main(["fit", *TINY, "--trainer.max_steps=1", "--trainer.devices=2", "--trainer.accelerator=cpu",
                 "--trainer.strategy=ddp", f"--root={tmp_path}"]) == 2
    assert "srun started 1 task(s)" in _error(capsys)
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------------
# a real SLURM with two nodes
# ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = missing_binaries()
    if missing:
        message = f"SLURM binaries not found: {', '.join(missing)} (apt-get install slurm-wlm munge)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " and CI=true")
        pytest.skip(message)
    if os.geteuid() != 0:
        pytest.skip("the test cluster runs its daemons as root (SlurmUser=root)")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2, cpus=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _submit(cluster: SlurmCluster, root: Path, *fit: str, capsys) -> str:
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        assert main(["slurm", "train", "--nodes", "2", "--tasks_per_node", "1", "--master_addr", "127.0.0.1",
                     "--time", "10", "--", *TINY, *fit, f"--root={root}", "--name=ddp"]) == 0
    finally:
        os.environ.pop("SLURM_CONF") if old is None else os.environ.__setitem__("SLURM_CONF", old)
    out = capsys.readouterr().out
    return out.split("submitted job ")[1].split()[0]


def _log(root: Path) -> str:
    return "\n".join(p.read_text() for p in sorted((root / "slurm").glob("*.out")))


def _check_signal_checkpoint(record: dict, log: str, exact: bool) -> None:
    """The run resumed from the checkpoint every rank took on the signal (``exact``: the warning signal, sent to
    the tasks alone). On SIGTERM the checkpoint is best effort: SLURM signals ``srun`` too, which may SIGKILL the
    tasks before they finish it ("srun: forcing job termination"); the run then resumes from its last periodic
    checkpoint, as it must."""
    saved = re.search(r"(SIGTERM|SIGUSR1): saved .*last\.ckpt at step (\d+)", log)
    if exact:
        assert saved and saved.group(1) == "SIGUSR1", log
    if saved:
        assert record["resume_history"][0]["step"] == int(saved.group(2)), log


@pytest.mark.integration
def test_two_node_ddp_run_under_slurm(slurm, tmp_path, capsys):
    root = tmp_path / "runs"
    job = _submit(slurm, root, "--trainer.max_steps=6", capsys=capsys)
    info = slurm.wait(job, timeout=480)  # generous: a loaded 2-core machine runs these DDP jobs slowly
    assert info["JobState"] == "COMPLETED", (info, _log(root))
    assert info["NodeList"] in ("n[1-2]", "n1,n2")
    runs = list((root / "ddp").glob("version_*"))
    assert len(runs) == 1, runs  # rank 1 created nothing of its own
    record = json.loads((runs[0] / "run.json").read_text())
    assert record["status"] == "finished" and record["step"] == 6
    assert record["launch"]["world_size"] == 2 and record["launch"]["num_nodes"] == 2
    assert record["launch"]["environment"] == "SLURMEnvironment" and record["launch"]["slurm_job"] == job
    assert "Starting with 2 processes" in (runs[0] / "console.log").read_text()  # Lightning's lines: the run's log
    assert json.loads((runs[0] / "extrapolation.json").read_text())["final"]["step"] == 6


@pytest.mark.integration
@pytest.mark.parametrize("how", ["scontrol-requeue", "warning-signal"])
def test_requeued_job_resumes_from_its_checkpoint(how, slurm, tmp_path, capsys):
    """``scontrol requeue`` (SIGTERM to every rank), or SLURM's warning signal (USR1, as ``--signal=USR1@90`` sends
    it before the time limit: the job requeues itself): every rank checkpoints between the same two steps, the
    requeued job resumes from that checkpoint in the same run directory and ends at the same step."""
    root = tmp_path / "runs"
    steps = 150
    job = _submit(slurm, root, f"--trainer.max_steps={steps}", capsys=capsys)
    ckpt = root / "ddp" / "version_0" / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 120
    while not ckpt.exists():  # training has begun: requeue it mid-run (SIGTERM to every rank)
        assert time.monotonic() < deadline, _log(root)
        assert slurm.job(job).get("JobState") in ("PENDING", "RUNNING", "CONFIGURING"), _log(root)
        time.sleep(0.1)
    if how == "scontrol-requeue":
        slurm.run("scontrol", "requeue", job)
    else:
        slurm.run("scancel", "--signal=USR1", job)  # the job steps' tasks, as --signal=USR1@T does
    info = slurm.wait(job, timeout=480)
    assert info["JobState"] == "COMPLETED", (info, _log(root))
    assert int(info["Restarts"]) >= 1
    runs = list((root / "ddp").glob("version_*"))
    assert len(runs) == 1, runs  # the requeued job continued the same run directory
    record = json.loads((runs[0] / "run.json").read_text())
    assert record["status"] == "finished" and record["step"] == steps
    assert record["resumes"] >= 1
    assert 0 < record["resume_history"][0]["step"] < steps  # it resumed mid-run, from a checkpoint
    # ... the one every rank took together on SIGTERM, between two steps (callbacks.preemption)
    _check_signal_checkpoint(record, _log(root), exact=how == "warning-signal")
    assert record["launch"]["slurm_restarts"] >= 1
    assert json.loads((runs[0] / "extrapolation.json").read_text())["final"]["step"] == steps


SWEEP_SPEC = """\
name: slurm-trial
base: tiny
overrides:
  trainer.max_steps: 150
  trainer.limit_val_batches: 1
  trainer.enable_progress_bar: false
  trainer.log_every_n_steps: 1
  model.d_model: 32
  data.init_args.seq_len: 64
  data.init_args.batch_size: 4
  extrapolation.multipliers: [1, 2]
  extrapolation.budget_tokens: 512
space:
  model.lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}
objectives:
  - {metric: nll@2x, direction: minimize}
sampler: {type: random, seed: 0}
pruner: {type: none}
trials: 1
seeds: [0]
wandb: disabled
"""


@pytest.mark.integration
def test_requeued_sweep_worker_continues_its_trial_under_the_same_number(slurm, postgres, tmp_path, capsys,
                                                                         monkeypatch):
    """`accrot slurm sweep` on PostgreSQL (a cluster's storage): one array task = one 2-node worker; requeued
    mid-trial, it continues trial 0 (its run resumed from the checkpoint it took on SLURM's warning signal) instead
    of starting another, and the study holds exactly one trial."""
    import optuna

    from accrot.sweep.storage import StorageRef, open_storage

    spec = tmp_path / "slurm-trial.yaml"
    spec.write_text(SWEEP_SPEC)
    root = tmp_path / "sweeps"
    storage = postgres
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.delenv("ACCROT_SWEEP_STORAGE", raising=False)
    assert main(["slurm", "sweep", str(spec), "--storage", storage, "--workers", "1", "--nodes", "2",
                 "--master_addr", "127.0.0.1", "--time", "10", "--root", str(root)]) == 0
    job = capsys.readouterr().out.split("submitted job ")[1].split()[0]
    task = f"{job}_0"
    ckpt_dir = root / "slurm-trial" / "runs" / "trial_0000"
    deadline = time.monotonic() + 120
    while not list(ckpt_dir.glob("version_*/checkpoints/last.ckpt")):
        assert time.monotonic() < deadline, _log(root)
        time.sleep(0.1)
    # SLURM's warning signal (what --signal=USR1@90 sends before the time limit or a preemption), to the tasks
    # alone: the run checkpoints between steps and rank 0 requeues the job itself. (`scontrol requeue` from
    # outside is the training test's case; here, with the worker's own requeue racing it, the restarted array
    # task failed once in a full CI run.)
    slurm.run("scancel", "--signal=USR1", task)
    info = slurm.wait(task, timeout=480)
    assert info["JobState"] == "COMPLETED", (info, _log(root))
    assert int(info["Restarts"]) >= 1
    trials = optuna.load_study(study_name="slurm-trial", storage=open_storage(
        StorageRef.parse(postgres, "slurm-trial", root))).get_trials()
    assert [(t.number, t.state.name) for t in trials] == [(0, "COMPLETE")], trials
    assert trials[0].user_attrs["slurm_job"] == task
    (run,) = list(ckpt_dir.glob("version_*"))
    record = json.loads((run / "run.json").read_text())
    assert record["resumes"] >= 1 and record["step"] == 150 and record["launch"]["world_size"] == 2
    assert "continuing trial 0 of slurm-trial" in _log(root)
    _check_signal_checkpoint(record, _log(root), exact=True)


def pg_spec(name: str) -> str:
    """SWEEP_SPEC's tiny DDP trials, three of them, 80 steps with a checkpoint every 20, retried up to twice."""
    import yaml

    doc = yaml.safe_load(SWEEP_SPEC)
    doc.update(name=name, trials=3, retries=2, heartbeat={"interval": 5, "grace": 90})
    doc["overrides"].update({"trainer.max_steps": 80, "trainer.val_check_interval": 40, "trainer.callbacks": [
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
         "init_args": {"save_last": True, "every_n_train_steps": 20, "save_top_k": 0}}]})
    return yaml.safe_dump(doc, sort_keys=False)


def _requeue_mid_trial(slurm: SlurmCluster, url: str, name: str, root: Path) -> tuple[int, str]:
    """Once a trial of study ``name`` has checkpointed (it is mid-run), ``scontrol requeue`` the array task running
    it: SLURM kills that worker's job on both of its nodes and queues it again. (trial number, task)."""
    import optuna

    from accrot.sweep.storage import StorageRef, open_storage

    deadline = time.monotonic() + 300
    study = None
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if study is None:
            study = optuna.load_study(study_name=name, storage=open_storage(StorageRef.parse(url, name, root)))
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            task = t.user_attrs.get("slurm_job")
            if task and list((root / name / "runs" / f"trial_{t.number:04d}").glob("version_*/checkpoints/last.ckpt")):
                slurm.run("scontrol", "requeue", task)
                return t.number, task
    raise AssertionError(f"no trial checkpointed within 300 s:\n{_log(root)[-3000:]}")


def _accounting(study) -> list[dict]:
    """One row per trial: what the study holds after the sweep (printed: the test's record of the requeue)."""
    return [{"trial": t.number, "state": t.state.name, "slurm_job": t.user_attrs.get("slurm_job"),
             "retry_of": t.user_attrs.get("retry_of"), "fail_reason": t.user_attrs.get("fail_reason"),
             "step": t.user_attrs.get("step"), "nll@2x": t.values[0] if t.values else None}
            for t in study.get_trials(deepcopy=False)]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("storage", ["postgresql", "proxy"])
def test_sweep_array_on_postgresql_accounts_for_every_trial_after_a_requeue(storage, slurm, postgres, tmp_path, capsys,
                                                                             monkeypatch):
    """`accrot slurm sweep` on a real PostgreSQL server (directly, or through the storage proxy's own job): two
    array tasks, each a 2-node worker whose trials are DDP runs; one task is killed mid-trial and requeued
    (``scontrol requeue``). Every trial is accounted for in the database (complete, or failed with its reason and
    retried; nothing lost, nothing over the budget), the requeued worker continued its trial, the proxy job stopped
    by itself once the sweep was done, and ``accrot report`` builds its table from the database."""
    import optuna

    from accrot.sweep.recovery import account
    from accrot.sweep.storage import StorageRef, open_storage

    name = "slurm-pg" if storage == "postgresql" else "slurm-pg-proxy"
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(pg_spec(name))
    root = tmp_path / "sweeps"
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.delenv("ACCROT_SWEEP_STORAGE", raising=False)
    proxy = ["--proxy", "--proxy_host", "127.0.0.1"] if storage == "proxy" else []
    assert main(["slurm", "sweep", str(spec), "--storage", postgres, "--workers", "2", "--nodes", "2",
                 "--master_addr", "127.0.0.1", "--time", "20", "--root", str(root), *proxy]) == 0
    out = capsys.readouterr().out
    job = out.split(" and job " if proxy else "submitted job ")[1].split()[0]
    number, task = _requeue_mid_trial(slurm, postgres, name, root)
    for t in (f"{job}_0", f"{job}_1"):
        info = slurm.wait(t, timeout=900)
        assert info["JobState"] == "COMPLETED", (t, info, _log(root)[-4000:])
    assert int(slurm.job(task)["Restarts"]) >= 1
    study = optuna.load_study(study_name=name, storage=open_storage(StorageRef.parse(postgres, name, root)))
    rows, figures = _accounting(study), account(study, 3)
    with capsys.disabled():
        print(f"\n{storage}: requeued {task} during trial {number}; restarts {slurm.job(task)['Restarts']}")
        for row in rows:
            print(f"  {row}")
        print(f"  accounted: {figures}")
    assert figures["lost"] == 0 and not figures["unfinished"] and not figures["failed_silently"], (rows, figures)
    assert figures["complete"] == 3 and sum(r["state"] == "COMPLETE" for r in rows) == 3, rows
    failed = [r for r in rows if r["state"] == "FAIL"]
    assert all(r["fail_reason"] for r in failed) and {r["trial"] for r in failed} <= {r["retry_of"] for r in rows}
    requeued = next(r for r in rows if r["trial"] == number)  # the killed trial: continued, or failed and retried
    assert requeued["state"] == "COMPLETE" or requeued["trial"] in {r["retry_of"] for r in rows}, rows
    if requeued["state"] == "COMPLETE":  # continued under its number, its run resumed from a checkpoint
        assert f"continuing trial {number} of {name}" in _log(root)
        (run,) = list((root / name / "runs" / f"trial_{number:04d}").glob("version_*"))
        record = json.loads((run / "run.json").read_text())
        assert record["resumes"] >= 1 and record["step"] == 80, record
    if proxy:  # the proxy's job stops itself once the sweep is done
        proxy_job = out.split("submitted proxy job ")[1].split()[0]
        assert slurm.wait(proxy_job, timeout=180)["JobState"] == "COMPLETED", _log(root)[-3000:]
        assert "storage proxy at grpc://127.0.0.1:" in _log(root)
    assert main(["report", "--study", name, "--storage", postgres, "--root", str(root),
                 "--out", str(tmp_path / "report")]) == 0
    csv_rows = (tmp_path / "report" / "trials.csv").read_text().strip().splitlines()[1:]
    assert len(csv_rows) == len(rows)

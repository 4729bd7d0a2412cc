"""Fault injection: kill runs and resume them, kill a sweep worker mid-trial, feed every bad input.

    .venv/bin/python tests/helpers/fault_injection.py            # the figures below (a few minutes on 2 cores)
    .venv/bin/python tests/helpers/fault_injection.py --quick    # one scheme, no sweep

prints, for example::

    killed and resumed: NoPE match: yes (killed after the checkpoint of step 10 of 40) ...
    runs killed and resumed: 3, matching the uninterrupted run: 3/3
    Ctrl-C at step 5 of 40 (before the first checkpoint): exit 130, run.json 'interrupted', checkpointed at ...
    copied run directory resumed: checkpoints ['last.ckpt'], last.ckpt at step 20 (the original stays at 10)
    first answer, median of 3 fresh processes: accrot --help 0.1 s, ..., accrot fit --help 3 s, ...
    sweep trials lost: 0 (4 trials, 1 worker killed mid-trial: trial 1 failed with its reason and retried)
    bad inputs tried and rejected cleanly: 33/33

Every kill is a real ``SIGKILL`` sent to a real ``python -m accrot.cli fit`` process as soon as its first
checkpoint exists; the run is resumed with ``accrot fit --resume RUN_DIR`` and its ``metrics.csv``,
``extrapolation.json`` numbers and final weights are compared, for equality, with an uninterrupted run of the
same command. The test suite uses the same functions (tests/callbacks/test_faults.py, tests/test_bad_inputs.py).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script: make `tests` and the packages importable
    sys.path.insert(0, str(REPO))

# a tiny run that still checkpoints, validates and evaluates mid-run: every 10 of 40 steps
RUN = ["fit", "--config", "tiny", "--trainer.max_steps=40", "--model.d_model=32", "--trainer.limit_val_batches=1",
       "--trainer.val_check_interval=10", "--trainer.log_every_n_steps=5", "--extrapolation.multipliers=[1,2]",
       "--extrapolation.budget_tokens=512", "--extrapolation.every_n_steps=10", "--wandb=disabled",
       "--trainer.enable_progress_bar=false", "--trainer.deterministic=true",
       "--trainer.callbacks=[{class_path: lightning.pytorch.callbacks.ModelCheckpoint, "
       "init_args: {save_last: true, every_n_train_steps: 10, save_top_k: 0}}]"]
SCHEMES = {
    "NoPE": [],
    # learned increments with value transport, plus a random mixing floor: the module's own RNG stream
    "accum-learned-values": ["--model.scheme.rotation=accum", "--model.scheme.increments=learned",
                             "--model.scheme.rotate_values=true", "--model.scheme.window=64"],
    "PaTH": ["--model.scheme.rotation=path"],
    # GRAPE's softplus phase: learned ladder and gate (a 1-d parameter, the optimiser's vector group)
    "accum-grape": ["--model.scheme.rotation=accum", "--model.scheme.increments=softplus"],
}


def env() -> dict[str, str]:
    """Offline, wandb off, caches in a temp folder (the test suite's hygiene, for child processes)."""
    cache = Path(tempfile.gettempdir()) / "accrot-fault-cache"
    return {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(cache / "hf"), "WANDB_DIR": str(cache / "wandb"),
            "MPLCONFIGDIR": str(cache / "mpl"), "PYTHONUNBUFFERED": "1"}


def start(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "accrot.cli", *args], cwd=REPO, env=env(),
                                stdout=fh, stderr=subprocess.STDOUT)


def wait(proc: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    if rc != 0:
        raise RuntimeError(f"{proc.args[3:]} exited with {rc}:\n{log.read_text(errors='replace')[-3000:]}")


def kill_after_first_checkpoint(proc: subprocess.Popen, run_dir: Path, timeout: float = 600) -> int:
    """SIGKILL ``proc`` as soon as ``run_dir/checkpoints/last.ckpt`` exists; the step of that checkpoint."""
    import torch

    ckpt = run_dir / "checkpoints" / "last.ckpt"
    deadline = time.time() + timeout
    while not ckpt.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (exit {proc.returncode}) before its first checkpoint")
        if time.time() > deadline:
            proc.kill()
            raise TimeoutError("no checkpoint in time")
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return int(torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"])


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def numbers(path: Path) -> dict:
    """extrapolation.json without its wall-clock timings."""
    doc = json.loads(path.read_text())
    for entry in [doc.get("final", {}), *doc.get("history", [])]:
        entry.pop("seconds", None)
        entry.get("same_targets", {}).pop("seconds", None)
    return doc


def differences(reference: Path, resumed: Path) -> list[str]:
    """What differs between two run directories: metrics rows, evaluation numbers, final weights."""
    import torch

    out = []
    a, b = rows(reference / "metrics.csv"), rows(resumed / "metrics.csv")
    if a != b:
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        out.append(f"metrics.csv: {len(a)} vs {len(b)} rows, first difference at row {first}")
    if numbers(reference / "extrapolation.json") != numbers(resumed / "extrapolation.json"):
        out.append("extrapolation.json numbers differ")
    wa = torch.load(reference / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    wb = torch.load(resumed / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    bad = [k for k in wa if not (isinstance(wa[k], torch.Tensor) and torch.equal(wa[k], wb.get(k)))
           and not (not isinstance(wa[k], torch.Tensor) and wa[k] == wb.get(k))]
    if bad or set(wa) != set(wb):
        out.append(f"final weights differ ({(bad or sorted(set(wa) ^ set(wb)))[0]})")
    return out


@dataclass
class KillResult:
    scheme: str
    killed_at: int  # the step of the checkpoint the run was resumed from
    max_steps: int
    resumes: int
    differences: list[str] = field(default_factory=list)

    @property
    def match(self) -> bool:
        return not self.differences


def reference_run(workdir: Path, scheme: str = "NoPE", extra: list[str] | None = None) -> Path:
    """The uninterrupted run of ``scheme`` (RUN's recipe) that an interrupted one must end up equal to."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{scheme}-reference.log"
    wait(start([*RUN, *SCHEMES[scheme], *(extra or []), f"--root={workdir}", "--name=reference"], log), log)
    return workdir / "reference" / "version_0"


def kill_and_resume(workdir: Path, scheme: str, extra: list[str] | None = None,
                    reference: Path | None = None) -> KillResult:
    """A run SIGKILLed after its first checkpoint, resumed with ``accrot fit --resume`` and compared with the
    uninterrupted run: ``reference`` (a :func:`reference_run` shared by several checks), or one run alongside."""
    args = [*RUN, *SCHEMES[scheme], *(extra or []), f"--root={workdir}"]
    log = workdir / f"{scheme}.log"
    workdir.mkdir(parents=True, exist_ok=True)
    alongside = start([*args, "--name=reference"], log) if reference is None else None
    cut = start([*args, "--name=killed"], log)
    run_dir = workdir / "killed" / "version_0"
    step = kill_after_first_checkpoint(cut, run_dir)
    if alongside is not None:
        wait(alongside, log)
    wait(start(["fit", "--resume", str(run_dir)], log), log)
    record = json.loads((run_dir / "run.json").read_text())
    return KillResult(scheme, step, 40, int(record.get("resumes", 0)),
                      differences(reference or workdir / "reference" / "version_0", run_dir))


def interrupted(workdir: Path, name: str, steps: str, signum: str = "INT") -> tuple[subprocess.CompletedProcess, Path]:
    """A run that sends itself ``signum`` (a terminal's Ctrl-C: INT) at the start of the given steps
    (tests/helpers/signal_probe.py), before its first periodic checkpoint (step 10)."""
    args = [*RUN, *SCHEMES["NoPE"], f"--root={workdir}", f"--name={name}",
            "--trainer.callbacks+=tests.helpers.signal_probe.SignalAt"]
    run_env = {**env(), "ACCROT_TEST_SIGNAL": signum, "ACCROT_TEST_SIGNAL_STEPS": steps}
    done = subprocess.run([sys.executable, "-m", "accrot.cli", *args], cwd=REPO, env=run_env, capture_output=True,
                          text=True, timeout=600)
    return done, workdir / name / "version_0"


def ctrl_c_and_resume(workdir: Path, reference: Path | None = None) -> dict:
    """Ctrl-C at step 5 of 40 (before the first checkpoint), then ``--resume``: the exit status, run.json's
    status, the step checkpointed, and whether the resumed run equals an uninterrupted one (``reference``, or
    one run alongside)."""
    import torch

    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "ctrl-c.log"
    alongside = (start([*RUN, *SCHEMES["NoPE"], f"--root={workdir}", "--name=reference"], log)
                 if reference is None else None)
    done, run_dir = interrupted(workdir, "stopped", "5")
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    result = {"rc": done.returncode, "stderr": done.stderr,
              "status": json.loads((run_dir / "run.json").read_text()).get("status") if run_dir.exists() else None,
              "step": int(torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"])
              if ckpt.is_file() else None}
    if alongside is not None:
        wait(alongside, log)
    if result["step"] is not None:
        wait(start(["fit", "--resume", str(run_dir)], log), log)
    reference = reference or workdir / "reference" / "version_0"
    result["differences"] = differences(reference, run_dir) if result["step"] else ["no checkpoint"]
    return result


def copied_run_resumes(workdir: Path) -> dict:
    """A run of 10 steps (checkpoint at 10), copied with ``cp -a`` and the copy resumed to 20: which checkpoint
    files the copy holds afterwards and the step of its last.ckpt (the original stays at 10)."""
    import shutil

    import torch

    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "copied.log"
    wait(start([*RUN, "--trainer.max_steps=10", f"--root={workdir}", "--name=original"], log), log)
    original, copy = workdir / "original", workdir / "copy"
    shutil.copytree(original, copy, symlinks=True)  # cp -a
    wait(start(["fit", "--resume", str(copy / "version_0"), "--trainer.max_steps=20"], log), log)
    step = lambda run: int(torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu",  # noqa: E731
                                      weights_only=False)["global_step"])
    return {"files": sorted(p.name for p in (copy / "version_0" / "checkpoints").iterdir()),
            "copy_step": step(copy / "version_0"), "original_step": step(original / "version_0")}


def startup_times(repeats: int = 3) -> dict[str, float]:
    """Median wall time (s) to the answer of commands a user types first, each in a fresh process."""
    import statistics

    cases = {"accrot --help": ["--help"], "accrot --version": ["--version"], "accrot fitt (unknown)": ["fitt"],
             "accrot fit --help": ["fit", "--help"],
             "accrot fit (config error)": ["fit", "--config", "tiny", "--model.scheme.rotation=bogus"]}
    out = {}
    for label, argv in cases.items():
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "accrot.cli", *argv], cwd=REPO, env=env(), capture_output=True,
                           timeout=120)
            times.append(time.perf_counter() - t0)
        out[label] = statistics.median(times)
    return out


def sweep_with_a_killed_worker(workdir: Path) -> dict:
    """smoke.yaml (a configuration × 2 seeds, 2 workers): SIGKILL a worker mid-trial; count trials lost."""
    import contextlib
    import threading

    import optuna
    import yaml
    from optuna.trial import TrialState

    from accrot.cli import main
    from accrot.sweep.recovery import account
    from accrot.sweep.spec import SPEC_DIR, load_spec
    from accrot.sweep.storage import StorageRef, open_storage

    doc = yaml.safe_load((SPEC_DIR / "smoke.yaml").read_text())
    doc.update(name="kill", trials=2, seeds=[0, 1], retries=1, pruner={"type": "none"})
    spec = workdir / "kill.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))  # the space's order matters (conditions)
    root = workdir / "root"
    url = f"sqlite:///{root}/kill/study.db"
    result: dict = {}
    parent = threading.Thread(target=lambda: result.setdefault("rc", main(["sweep", str(spec), f"--root={root}",
                                                                            "--workers=2"])))
    parent.start()
    killed, study = None, None
    while killed is None and parent.is_alive():
        time.sleep(0.2)
        if study is None:
            if not any((root / "kill" / "workers").glob("worker-*.log")):
                continue  # the parent is still creating the storage: opening it now would race its schema
            with contextlib.suppress(Exception):  # not created yet
                study = optuna.load_study(study_name="kill", storage=open_storage(StorageRef.parse(url, "kill", ".")))
            continue
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if "worker" in t.user_attrs and t.params:
                os.kill(int(t.user_attrs["worker"].rsplit(":", 1)[1]), signal.SIGKILL)
                killed = t.number
                break
    parent.join()
    if result.get("rc") != 0:
        raise RuntimeError(f"the sweep ended with exit status {result.get('rc')}")
    study = optuna.load_study(study_name="kill", storage=open_storage(StorageRef.parse(url, "kill", ".")))
    return account(study, load_spec(spec).budget) | {"killed": killed, "rc": result.get("rc")}


def bad_inputs(workdir: Path) -> tuple[int, int, list[str]]:
    """Every row of the bad-input catalogue through ``accrot.cli.main``: (clean, tried, problems)."""
    from tests.test_bad_inputs import CATALOGUE, Fixtures, run_row

    fixtures = Fixtures(workdir)
    clean, problems = 0, []
    for row in CATALOGUE:
        problem = run_row(row, fixtures)
        if problem is None:
            clean += 1
        elif problem != "skipped":
            problems.append(f"{row.id}: {problem}")
    tried = len(CATALOGUE) - sum(run_row(r, fixtures, dry=True) == "skipped" for r in CATALOGUE)
    return clean, tried, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one scheme (NoPE), no sweep")
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a temp folder)")
    args = parser.parse_args(argv)
    for key, value in env().items():
        os.environ.setdefault(key, value)
    work = args.out or Path(tempfile.mkdtemp(prefix="accrot-faults-"))
    print(f"work folder: {work}", flush=True)
    results = []
    for scheme in (["NoPE"] if args.quick else SCHEMES):
        r = kill_and_resume(work / "kill" / scheme, scheme)
        results.append(r)
        print(f"killed and resumed: {scheme:22s} match: {'yes' if r.match else 'no'} (killed after the checkpoint "
              f"of step {r.killed_at} of {r.max_steps}; resumes recorded: {r.resumes})"
              + ("" if r.match else f" — {'; '.join(r.differences)}"), flush=True)
    matched = sum(r.match for r in results)
    print(f"runs killed and resumed: {len(results)}, matching the uninterrupted run: {matched}/{len(results)}")
    c = ctrl_c_and_resume(work / "ctrl-c")
    ctrl_ok = c["rc"] == 130 and c["status"] == "interrupted" and c["step"] == 6 and not c["differences"]
    print(f"Ctrl-C at step 5 of 40 (before the first checkpoint): exit {c['rc']}, run.json {c['status']!r}, "
          f"checkpointed at step {c['step']}; resumed {'equals' if not c['differences'] else 'differs from'} the "
          f"uninterrupted run" + ("" if ctrl_ok else f" — NOT AS PROMISED: {'; '.join(c['differences'])} "
                                 f"{c['stderr'][-300:]}"))
    cp = copied_run_resumes(work / "copied")
    copy_ok = cp["files"] == ["last.ckpt"] and cp["copy_step"] == 20 and cp["original_step"] == 10
    print(f"copied run directory resumed: checkpoints {cp['files']}, last.ckpt at step {cp['copy_step']} (the "
          f"original stays at {cp['original_step']})" + ("" if copy_ok else " — NOT AS PROMISED"))
    times = startup_times()
    print("first answer, median of 3 fresh processes: "
          + ", ".join(f"{label} {t:.2f} s" for label, t in times.items()))
    lost = 0
    if not args.quick:
        s = sweep_with_a_killed_worker(work / "sweep")
        lost = s["lost"]
        print(f"sweep trials lost: {lost} ({s['trials']} trials, 1 worker killed mid-trial: trial {s['killed']} "
              f"failed with its reason and retried as {s['retried'] or 'none'}; unfinished {s['unfinished']})")
    clean, tried, problems = bad_inputs(work / "bad")
    print(f"bad inputs tried and rejected cleanly: {clean}/{tried}")
    for p in problems:
        print(f"  not clean: {p}")
    return 0 if matched == len(results) and lost == 0 and clean == tried and ctrl_ok and copy_ok else 1


if __name__ == "__main__":
    sys.exit(main())

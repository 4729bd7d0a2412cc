"""Fault injection (issue #9): kill runs and resume them, kill a sweep worker mid-trial, feed every bad input.

    .venv/bin/python tests/fault_injection.py            # the figures below (a few minutes on 2 cores)
    .venv/bin/python tests/fault_injection.py --quick    # one scheme, no sweep

prints, for example::

    killed and resumed: NoPE match: yes (killed after the checkpoint of step 10 of 40) ...
    runs killed and resumed: 3, matching the uninterrupted run: 3/3
    sweep trials lost: 0 (4 trials, 1 worker killed mid-trial: trial 1 failed with its reason and retried)
    bad inputs tried and rejected cleanly: 33/33

Every kill is a real ``SIGKILL`` sent to a real ``python -m accrot.cli fit`` process as soon as its first
checkpoint exists; the run is resumed with ``accrot fit --resume RUN_DIR`` and its ``metrics.csv``,
``extrapolation.json`` numbers and final weights are compared, for equality, with an uninterrupted run of the
same command. The test suite uses the same functions (tests/test_faults.py, tests/test_bad_inputs.py).
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

REPO = Path(__file__).resolve().parent.parent
# run as a script, sys.path[0] is tests/, whose data_modules/ (the tests' package) would shadow the real one:
# the repository goes first, whatever PYTHONPATH holds
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() not in (REPO, REPO / "tests")]

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


def kill_and_resume(workdir: Path, scheme: str, extra: list[str] | None = None) -> KillResult:
    """An uninterrupted run and a run SIGKILLed after its first checkpoint (both at once), then the killed
    one resumed with ``accrot fit --resume``; compares the two run directories."""
    args = [*RUN, *SCHEMES[scheme], *(extra or []), f"--root={workdir}"]
    log = workdir / f"{scheme}.log"
    workdir.mkdir(parents=True, exist_ok=True)
    reference = start([*args, "--name=reference"], log)
    cut = start([*args, "--name=killed"], log)
    run_dir = workdir / "killed" / "version_0"
    step = kill_after_first_checkpoint(cut, run_dir)
    wait(reference, log)
    wait(start(["fit", "--resume", str(run_dir)], log), log)
    record = json.loads((run_dir / "run.json").read_text())
    return KillResult(scheme, step, 40, int(record.get("resumes", 0)),
                      differences(workdir / "reference" / "version_0", run_dir))


def sweep_with_a_killed_worker(workdir: Path) -> dict:
    """smoke.yaml (a configuration × 2 seeds, 2 workers): SIGKILL a worker mid-trial; count trials lost."""
    import contextlib
    import threading

    import optuna
    import yaml
    from optuna.trial import TrialState

    from accrot.cli import main
    from accrot.sweep import SPEC_DIR, StorageRef, load_spec, open_storage

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
            with contextlib.suppress(KeyError, ValueError):
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


def account(study, budget: int) -> dict:
    """Every trial accounted for: finished (complete, pruned, or failed with a reason), each failure either
    retried or final, and the budget of (configuration, seed) pairs all complete."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    unfinished = [t.number for t in trials if t.state not in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)]
    silent = [t.number for t in trials if t.state == TrialState.FAIL and not t.user_attrs.get("fail_reason")]
    done = {(json.dumps(t.params, sort_keys=True), t.user_attrs.get("seed")) for t in trials
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}
    return {"trials": len(trials), "unfinished": unfinished, "failed_silently": silent,
            "complete": len(done), "lost": budget - len(done) + len(unfinished) + len(silent),
            "retried": [t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs]}


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
    return 0 if matched == len(results) and lost == 0 and clean == tried else 1


if __name__ == "__main__":
    sys.exit(main())

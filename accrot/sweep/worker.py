"""The worker: trials in-process, one after another, on one storage, until the budget of every study is spent."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import upload_artifact
from optuna.trial import TrialState
from optuna_dashboard import save_note

from accrot import phases
from accrot.errors import UsageError, bad_input_message, one_line
from accrot.metrics import metric_value, metrics_of
from accrot.sweep.recovery import (
    EVERY_TRIAL_FAILED,
    AttrHeartbeat,
    RetryTrial,
    budget_state,
    fail_trial,
    missing_seeds,
    recover_stale,
    unowned,
)
from accrot.sweep.spec import Stratum, SweepSpec
from accrot.sweep.storage import (
    BudgetLock,
    StorageRef,
    open_storage,
    quiet_experimental,
    redact,
    retry_storage,
    transient,
)
from accrot.sweep.trials import runs_root, sample_space, trial_args


# ---------------------------------------------------------------------------------------------------
# the worker: trials in-process, one after another
# ---------------------------------------------------------------------------------------------------
class TrialFailed(RuntimeError):
    """A trial that ran but produced no usable objective; its message is the trial's ``fail_reason``."""


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class _Study:
    """One Optuna study of the spec and the strata (variants) whose trials it holds."""

    study: Any
    attrs: dict
    strata: dict[str | None, Stratum]
    shared: bool = False

    @property
    def name(self) -> str:
        return self.study.study_name

    def stratum_of(self, trial) -> Stratum:
        """The trial's variant: the study's only one, or, in a shared study, the one it was queued with."""
        if not self.shared:
            return next(iter(self.strata.values()))
        return self.strata[trial.user_attrs["variant"]]

    def context_of(self, stratum: Stratum) -> dict:
        return self.attrs.get("variants", {}).get(stratum.variant) or self.attrs.get("context", {})


SEED_SPAN = 2**31 - 1  # a shared study's seed axis, when it may grow: one integer range for every stage


def suggest_seed(trial, attrs: dict, seeds) -> int:
    """The trial's seed as a parameter of a shared study. A study that may take more seeds later (its attrs say
    ``seed_param: int``) keeps one integer range, as Optuna needs one distribution per parameter for a study's
    life; a study made before that keeps its categorical choices."""
    if attrs.get("seed_param") == "int":
        return trial.suggest_int("seed", 0, SEED_SPAN)
    return trial.suggest_categorical("seed", list(seeds))


def load_studies(spec: SweepSpec, storage, worker_index: int = 0) -> list[_Study]:
    out = []
    for name, strata in spec.studies().items():
        try:
            with quiet_experimental():
                study = optuna.load_study(study_name=name, storage=storage,
                                          sampler=spec.sampler.build(spec.space, worker_index),
                                          pruner=spec.pruner.build())
        except KeyError:
            raise UsageError(f"study {name!r} is not in the storage; start the sweep once with "
                             f"`accrot sweep {spec.path} --workers 0` (creates it) before adding workers") from None
        attrs = study.user_attrs.get("accrot", {})
        if attrs.get("fingerprint") != spec.fingerprint():
            raise UsageError(f"study {name!r} in the storage was created from a different spec "
                             "(space, objectives, overrides or seeds changed); rename the spec or use a new storage")
        out.append(_Study(study, attrs, {s.variant: s for s in strata}, spec.shared_study))
    return out


def run_worker(spec: SweepSpec, ref: StorageRef, root: Path, worker_index: int = 0,
               deadline: float | None = None, ranks=None) -> int:
    """Run trials until every study's budget is spent (or the deadline passes).

    ``ranks`` (:class:`accrot.sweep.ddp.Ranks`, global rank 0 of a multi-process worker): every trial is a DDP
    run over all ranks; the other ranks follow with :func:`accrot.sweep.ddp.follow`."""
    return Worker(spec, ref, root, worker_index, ranks).loop(deadline)


class Worker:
    """One worker process: its storage, studies and budget lock, and the objective every trial runs."""

    gc_after_trial = True  # a training run leaves cycles (Lightning's modules, callbacks) to collect between trials

    def __init__(self, spec: SweepSpec, ref: StorageRef, root: Path, worker_index: int = 0, ranks=None) -> None:
        self.spec, self.ref, self.root, self.ranks = spec, ref, root, ranks
        self.preload()
        self.storage = open_storage(ref, None if ref.attr_heartbeat else spec.heartbeat, spec.retries)
        self.studies = load_studies(spec, self.storage, worker_index)
        self.lock = BudgetLock(ref, spec.name)
        self.artifacts = spec.artifacts.build(root, spec.name)
        self.me = worker_id()
        spawned = os.environ.get(phases.WORKER_SPAWNED_AT)  # set by the sweep parent (accrot.sweep.parent.Parent.spawn)
        self.spawned_at = float(spawned) if spawned else None
        print(f"worker {self.me}: {spec.name} on {redact(ref.url)}", flush=True)

    def loop(self, deadline: float | None) -> int:
        """Run trials until the budget is spent (or ``deadline``); 0, or :data:`EVERY_TRIAL_FAILED` when every trial
        this worker ran failed (a scheduler's job, or the parent, then shows the worker did no work), or 128 + 15
        when a signal stopped it."""
        ran = 0
        self.failures: list[str] = []
        while deadline is None or time.time() < deadline:
            try:
                self.lock.acquire()
                if self.ranks is not None and self.ranks.continue_requeued(self.studies, self.objective_for):
                    ran += 1  # the trial this SLURM job ran before it was requeued, under its own number
                    continue
                for entry in self.studies:  # orphans of dead workers elsewhere count against the budget until failed
                    recover_stale(entry.study, self.storage, self.ref, self.spec)
                entry = _next_study(self.studies, self.spec)
                if entry is None:
                    if not any(unowned(e.study) for e in self.studies):
                        break
                    # a trial an outage left unclaimed holds budget until recover_stale fails and re-queues it
                    # (after the grace period): stay to run its retry rather than end the sweep a trial short
                    time.sleep(self.spec.heartbeat.interval)
                    continue
                if not self._optimize_one(entry):
                    return 128 + 15
                ran += 1
                reconcile_orphans(self.studies, self.storage, self.me, self.spec.retries)  # an error Optuna swallowed
            except Exception as err:
                if not transient(err):
                    raise
                # the storage went away (a database restart) around a trial's start or end: wait for it, then fail
                # (and retry) what this worker left unfinished; a storage gone for good ends the worker
                print(f"worker {self.me}: storage unavailable ({type(err).__name__}); waiting for it", flush=True)
                retry_storage(lambda: reconcile_orphans(self.studies, self.storage, self.me, self.spec.retries),
                              "reconciling")
            finally:
                with contextlib.suppress(Exception):
                    self.lock.release()
        if self.ranks is not None:
            self.ranks.stop()
        return self._end(ran)

    def _end(self, ran: int) -> int:
        """The worker's last line and exit status (:meth:`loop`)."""
        if ran and len(self.failures) >= ran:
            print(f"worker {self.me}: every trial it ran failed ({ran}); first: {self.failures[0]}", flush=True)
            return EVERY_TRIAL_FAILED
        print(f"worker {self.me}: done after {ran} trial(s)", flush=True)
        return 0

    def _optimize_one(self, entry: _Study) -> bool:
        """One trial of ``entry``'s study; False when this worker was stopped by a signal (its trial re-queued)."""
        try:
            entry.study.optimize(self.objective_for(entry), n_trials=1, catch=(Exception,),
                                 gc_after_trial=self.gc_after_trial, callbacks=[self._outcome])
        except SystemExit as err:
            if type(err).__name__ != "SIGTERMException" or self.ranks is not None:
                raise
            print(f"worker {self.me}: stopped by {_signal_name(err)}; its trial is failed and queued again", flush=True)
            return False
        return True

    def _outcome(self, study, trial) -> None:
        """Optuna's callback after each trial: a failed one's reason, wherever it failed (sampling included)."""
        if trial.state == TrialState.FAIL:
            self.failures.append(trial.user_attrs.get("fail_reason") or f"trial {trial.number} failed before its run "
                                 "started (its traceback is above)")

    def objective_for(self, entry: _Study):
        return functools.partial(self.objective, entry)

    def objective(self, entry: _Study, trial):
        """Sample, train one ``accrot fit`` run in-process, record what it produced, return its objective(s)."""
        attr(trial, "worker", self.me)
        if self.spawned_at is not None:  # this worker's first trial: its process start, imports and storage
            attr(trial, "worker_start_s", round(time.time() - self.spawned_at, 3))
            self.spawned_at = None
        stratum = entry.stratum_of(trial)
        values = self._sample(entry, stratum, trial)
        seed = self._seed(entry, trial)
        self.lock.release()  # the trial (and its seed copies) now count against the budget
        args = trial_args(self.spec, stratum, self.root, trial.number, seed, values)
        if self.ranks is not None:
            args += self.ranks.launch(trial, seed, values)
        os.environ["WANDB_RUN_GROUP"] = entry.name  # a study's runs form one wandb group,
        os.environ["WANDB_JOB_TYPE"] = stratum.variant or self.spec.name  # one job type per variant
        cli = self._train(entry, stratum, trial, args)
        return self.record(entry, stratum, trial, cli)

    def _sample(self, entry: _Study, stratum: Stratum, trial) -> dict[str, Any]:
        context = entry.context_of(stratum)
        if entry.shared:  # the dashboard's axes: slice and parallel-coordinate plots compare variants and seeds
            retry_storage(lambda: (trial.suggest_categorical("variant", list(entry.strata)),
                                   suggest_seed(trial, entry.attrs, self.spec.seeds)), "sampling")
        if self.ranks is not None:  # the other ranks mirror the suggestions (optuna's TorchDistributedTrial)
            return self.ranks.sample(entry, stratum, trial, context)
        return retry_storage(lambda: sample_space(trial, self.spec.space, context), "sampling")

    def _seed(self, entry: _Study, trial) -> int:
        """The trial's seed. A fresh configuration takes the first; the first seed's trial (fresh, or a retry whose
        worker died before it queued them) queues the configuration's missing seeds with its params."""
        seed = trial.user_attrs.get("seed")
        if seed is None:
            seed = self.spec.seeds[0]
            attr(trial, "seed", seed)
            attr(trial, "config", trial.number)
        if seed == self.spec.seeds[0]:
            config = trial.user_attrs.get("config", trial.number)
            for s in retry_storage(lambda: missing_seeds(entry.study, config, self.spec.seeds), "reading the seeds"):
                retry_storage(lambda s=s: entry.study.enqueue_trial(dict(trial.params),
                                                                    user_attrs={"seed": s, "config": config}),
                              "queueing a seed")
        return seed

    def _train(self, entry: _Study, stratum: Stratum, trial, args: list[str]):
        spec = self.spec
        trial_root = runs_root(spec, self.root, stratum) / f"trial_{trial.number:04d}"
        beat = (AttrHeartbeat(self.storage, trial._trial_id, spec.heartbeat.interval) if self.ref.attr_heartbeat
                else contextlib.nullcontext())
        try:
            with beat:
                return self.run(entry.name, trial, args)
        except optuna.TrialPruned as err:
            _record_run_dir(trial, trial_root)
            attr(trial, "pruned_reason", str(err))
            raise
        except SystemExit as err:
            if type(err).__name__ != "SIGTERMException" or self.ranks is not None:
                raise  # a multi-rank SLURM worker is requeued and continues this trial (accrot.sweep.ddp)
            # this worker was told to stop (SIGTERM: the sweep interrupted, a scheduler): the run is
            # checkpointed; fail the trial with the reason and queue its retry, then end the worker. Failed here, not
            # left RUNNING (Optuna does not tell a trial that SystemExit ends), so the parent, failing the running
            # trials of the workers it stopped, finds it finished and queues no second retry
            _record_run_dir(trial, trial_root)
            reason = f"worker {self.me} was stopped by {_signal_name(err)} during the trial (checkpointed)"
            retry_storage(lambda: fail_trial(entry.study, self.storage, trial, reason, RetryTrial(spec.retries)),
                          "failing the stopped trial")
            raise
        except Exception as err:  # noqa: BLE001 - every failure of a run is this trial's result
            _record_run_dir(trial, trial_root)
            reason = bad_input_message(err) or f"{type(err).__name__}: {one_line(str(err))}"
            if isinstance(err, FloatingPointError):
                reason = f"the run diverged: {reason}"
            attr(trial, "fail_reason", reason)
            raise TrialFailed(reason) from err
        finally:
            with contextlib.suppress(Exception):  # where the trial's time went, whatever its end (accrot.phases)
                attr(trial, "timing", phases.clock().snapshot())
            end_run()

    def preload(self) -> None:
        """Import what the trials' runs need (Lightning) before the first trial, so that the time it takes counts
        as the worker's start-up (``worker_start_s``), not as a trial's."""
        import accrot.run.lightning  # noqa: F401
        import callbacks.extrapolation  # noqa: F401

    def run(self, study_name: str, trial, args: list[str]):
        """The trial's training run: ``accrot fit ARGS`` in this process, its pruning callback reporting to
        ``trial``; returns its LightningCLI. (``accrot bench storage`` replaces it with a trivial objective, and
        :meth:`preload` with nothing, to load the storage alone.)"""
        from accrot.run.lightning import run_lightning
        from callbacks.pruning import active_trial

        with active_trial(study_name, trial):
            return run_lightning(args)

    def record(self, entry: _Study, stratum: Stratum, trial, cli):
        """The run's directory, metrics and intermediate values on the trial; its objective value(s)."""
        from callbacks.extrapolation import ExtrapolationCallback

        spec = self.spec
        # trainer.log_dir is a broadcast under DDP, which the other ranks (done with the run) would not join
        run_dir = Path(cli.trainer.loggers[0].log_dir if self.ranks is not None else cli.trainer.log_dir).resolve()
        ext = next(c for c in cli.trainer.callbacks if isinstance(c, ExtrapolationCallback))
        final = ext.history[-1]
        metrics = metrics_of(final["lengths"])
        attr(trial, "run_dir", str(run_dir))
        attr(trial, "metrics", metrics)
        for key, value in metrics.items():  # one attribute per length: a column of the dashboard's trial table
            if key.startswith("nll@"):
                attr(trial, key, value)
        attr(trial, "step", final["step"])
        attr(trial, "train_length", ext.train_length)
        attr(trial, "variant", stratum.variant or cli.model.scheme_config.label())
        self._upload(trial, run_dir)
        self._note(trial, trial_note(trial.user_attrs["variant"], trial.user_attrs.get("seed"), run_dir, final))
        if len(spec.objectives) == 1:  # intermediate values: the pruner's (and the dashboard's) curve
            self._report_history(trial, cli, ext.history)
        out = [metrics[o.metric] for o in spec.objectives]
        bad = [(o.metric, v) for o, v in zip(spec.objectives, out) if not math.isfinite(v)]
        if bad:
            reason = f"objective {bad[0][0]}={bad[0][1]} at step {final['step']} (the run diverged)"
            attr(trial, "fail_reason", reason)
            raise TrialFailed(reason)
        return out[0] if len(out) == 1 else out

    def _upload(self, trial, run_dir: Path) -> None:
        """The run's files as the trial's artifacts (the dashboard shows them on the trial's page). A store that
        still fails after its retries is recorded on the trial (``artifact_error``); it never fails the run."""
        if self.artifacts is None:
            return
        folder = self.spec.artifacts.directory(self.root, self.spec.name)
        for path in artifact_files(run_dir):
            try:
                if folder is not None:
                    folder.mkdir(parents=True, exist_ok=True)
                upload_artifact(artifact_store=self.artifacts, file_path=str(path), study_or_trial=trial)
            except Exception as err:  # noqa: BLE001 - an unreachable store must not fail a finished run
                attr(trial, "artifact_error", f"{path.name}: {type(err).__name__}: {one_line(str(err))[:200]}")
                print(f"worker {self.me}: trial {trial.number}: artifact {path.name} not uploaded ({err})", flush=True)
                return

    def _note(self, trial, body: str) -> None:
        """The trial's note on its dashboard page; like an artifact, a failure is recorded, never fatal."""
        try:
            retry_storage(lambda: save_note(trial, body), "writing the note")
        except Exception as err:  # noqa: BLE001
            attr(trial, "note_error", f"{type(err).__name__}: {one_line(str(err))[:200]}")

    def _report_history(self, trial, cli, history: list[dict]) -> None:
        from callbacks.pruning import OptunaPruning

        pruning = [c for c in cli.trainer.callbacks if isinstance(c, OptunaPruning)]
        done = pruning[0].reported if pruning else set()
        for h in history:
            value = metric_value(h["lengths"], self.spec.objectives[0].metric)
            if h["step"] not in done and math.isfinite(value):
                retry_storage(lambda value=value, h=h: trial.report(value, h["step"]), "reporting")


ARTIFACTS = ("extrapolation.png", "extrapolation.json", "config.yaml", "run.json", "diagnostics/diagnostics.json")


def trial_note(variant: str, seed, run_dir: Path, final: dict) -> str:
    """Markdown: the variant and seed, the run directory, and NLL per length of the final evaluation."""
    lines = [f"### {variant}, seed {seed}", "", f"run directory: `{run_dir}`", "",
             "| length | NLL | NLL of the last L positions |", "|---|---|---|"]
    for row in final["lengths"]:
        last = row.get("last_window_nll")
        lines.append(f"| {row['multiplier']:g}× ({row['length']}) | {row['nll']:.4f} | "
                     f"{'-' if last is None else f'{last:.4f}'} |")
    return "\n".join(lines) + "\n"


def artifact_files(run_dir: Path) -> list[Path]:
    """What a trial uploads: its curve and its JSON, its config and run record, and its diagnostics when present."""
    files = [run_dir / name for name in ARTIFACTS] + sorted((run_dir / "diagnostics").glob("*.png"))
    return [f for f in files if f.is_file()]


def attr(trial, key: str, value) -> None:
    """``trial.set_user_attr`` that rides out a storage restart."""
    retry_storage(lambda: trial.set_user_attr(key, value), f"recording {key}")


def reconcile_orphans(studies: list[_Study], storage, me: str, retries: int) -> int:
    """Trials of this worker that a storage outage left unaccounted for: RUNNING ones (the tell failed) are
    failed with the reason and retried; FAIL ones without a reason (Optuna told FAIL after a storage error
    inside the objective) are retried. Returns how many."""
    reason = "the storage was unavailable when the trial ended (e.g. a database restart)"
    n = 0
    for entry in studies:
        trials = entry.study.get_trials(deepcopy=False)
        retried = {t.user_attrs.get("retry_of") for t in trials}
        for t in trials:
            if t.user_attrs.get("worker") != me or t.number in retried:
                continue
            if t.state == TrialState.RUNNING:
                n += fail_trial(entry.study, storage, t, f"{reason}", RetryTrial(retries))
            elif t.state == TrialState.FAIL and not t.user_attrs.get("fail_reason"):
                RetryTrial(retries, reason="failed while the storage was unavailable")(entry.study, t)
                n += 1
    return n


def end_run() -> None:
    """Between in-process runs: close the wandb run (Lightning leaves it open, so the next trial would log
    into it) and hand cached accelerator memory back."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        with contextlib.suppress(Exception):
            wandb.finish()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _record_run_dir(trial, trial_root: Path) -> None:
    found = sorted(trial_root.glob("version_*"), key=lambda p: p.stat().st_mtime)
    if found:
        trial.set_user_attr("run_dir", str(found[-1].resolve()))


def _next_study(studies: list[_Study], spec: SweepSpec) -> _Study | None:
    """Queued trials (seed copies, retries) first, then the study with the fewest trials. A shared study runs
    only what it queued (its parent queues the whole grid)."""
    best, key = None, None
    for entry in studies:
        counted, waiting, _ = budget_state(entry.study)
        if (counted >= spec.budget_of(entry.name) or entry.shared) and not waiting:
            continue
        k = (not waiting, counted)
        if key is None or k < key:
            best, key = entry, k
    return best


def _signal_name(err: BaseException) -> str:
    """The signal that stopped a run (callbacks.preemption records it on the exception): SIGTERM, ``Ctrl-C
    (SIGINT)`` (a terminal's Ctrl-C, or SIGINT to the sweep, which passes it on), ..."""
    signum = getattr(err, "signum", None)
    if signum == signal.SIGINT:
        return "Ctrl-C (SIGINT)"
    return signal.Signals(signum).name if signum else "SIGTERM"

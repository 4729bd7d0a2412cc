"""``accrot sweep SPEC``: the parent validates the spec, creates the studies, launches and watches the workers,
recovers dead ones, and prints the finished trials and a summary."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState
from rich.markup import escape

from accrot.display import Finished, RunDisplay, Running, plain_help
from accrot.errors import UsageError
from accrot.metrics import metric_key
from accrot.options import FLAG, count, option, parse, write_dir
from accrot.phases import WORKER_SPAWNED_AT
from accrot.sweep.recovery import (
    EVERY_TRIAL_FAILED,
    FINISHED,
    RetryTrial,
    budget_state,
    can_start,
    fail_trial,
    fail_worker_trials,
    recover_stale,
    unowned,
)
from accrot.sweep.spec import SPEC, SweepSpec, load_spec
from accrot.sweep.storage import (
    STORAGE,
    StorageRef,
    creation_lock,
    open_storage,
    quiet_experimental,
    redact,
    retry_storage,
)
from accrot.sweep.timing import LoadMeter, timing_table
from accrot.sweep.trials import StratumInfo, check_stratum

# ---------------------------------------------------------------------------------------------------
# the parent: validate, create, launch, watch, recover
# ---------------------------------------------------------------------------------------------------
_WORKER_BOOT = "import sys; from accrot.cli import main; sys.exit(main(sys.argv[1:]))"


def create_studies(spec: SweepSpec, storage, infos: Mapping[str | None, StratumInfo]) -> list:
    """Create (or re-open) every study of the spec; ``infos``: each stratum's, by variant."""
    out = []
    for name, strata in spec.studies().items():
        with quiet_experimental():
            study = optuna.create_study(storage=storage, study_name=name, directions=spec.directions,
                                        load_if_exists=True)
        attrs = study.user_attrs.get("accrot")
        if attrs is None:
            study.set_user_attr("accrot", _study_attrs(spec, name, strata, infos))
            with quiet_experimental():
                study.set_metric_names([o.metric for o in spec.objectives])
        elif attrs.get("fingerprint") != spec.fingerprint():
            if not _more_seeds(spec, attrs):
                raise UsageError(f"study {name!r} already exists in the storage from a different spec "
                                 "(space, objectives, overrides or seeds changed); rename the spec or use a new "
                                 "storage")
            # staged seeds: the same grid with more seeds; the trials of the first seeds are kept, the rest queued
            study.set_user_attr("accrot", {**attrs, "fingerprint": spec.fingerprint(), "seeds": spec.seeds,
                                           "budget": spec.budget_of(name)})
        if spec.shared_study:
            queue_grid(study, spec, strata)
        out.append(study)
    return out


def _study_attrs(spec: SweepSpec, name: str, strata: list, infos: Mapping[str | None, StratumInfo]) -> dict:
    first = infos[strata[0].variant]
    for stratum in strata[1:]:  # one study's trials are compared on one axis of lengths
        info = infos[stratum.variant]
        if (info.multipliers, info.train_length) != (first.multipliers, first.train_length):
            raise UsageError(f"{spec.path}: variants {strata[0].variant} and {stratum.variant} share study {name!r} "
                             "but not their training length and evaluation lengths; give them their own group")
    attrs = {
        "spec": spec.name, "spec_file": str(spec.path), "variant": None if spec.shared_study else strata[0].variant,
        "fingerprint": spec.fingerprint(), "objectives": [o.metric for o in spec.objectives],
        "directions": spec.directions, "budget": spec.budget_of(name), "trials": spec.trials, "seeds": spec.seeds,
        "context": first.context, "multipliers": first.multipliers, "train_length": first.train_length,
    }
    if spec.shared_study:
        attrs["variants"] = {s.variant: infos[s.variant].context for s in strata}  # each one's `when` context
        attrs["grid_fingerprint"] = spec.fingerprint(seeds=False)
        attrs["seed_param"] = "int"  # one seed distribution whatever seeds a later batch adds (worker.suggest_seed)
    return attrs


def _more_seeds(spec: SweepSpec, attrs: Mapping) -> bool:
    """A shared study's grid asked again with the seeds it has and more after them (a second batch of seeds): the
    same spec but for the seeds, whose list the old one begins."""
    old = list(attrs.get("seeds") or [])
    return (spec.shared_study and attrs.get("seed_param") == "int"
            and attrs.get("grid_fingerprint") == spec.fingerprint(seeds=False)
            and list(spec.seeds[:len(old)]) == old and len(spec.seeds) > len(old))


def queue_grid(study, spec: SweepSpec, strata: list) -> int:
    """A shared study's whole budget as WAITING trials, (variant, grid point, seed) in order, each with its
    variant, seed and configuration; only those not in the study yet (a sweep started again after an
    interruption queues what is missing, nothing twice). Returns how many were queued."""
    have = {(t.user_attrs.get("variant"), t.user_attrs.get("config"), t.user_attrs.get("seed"))
            for t in study.get_trials(deepcopy=False)}
    grid, n = spec.grid()[: spec.trials], 0
    for v, stratum in enumerate(strata):
        for g, point in enumerate(grid):
            config = v * len(grid) + g
            for seed in spec.seeds:
                if (stratum.variant, config, seed) in have:
                    continue
                study.enqueue_trial({"variant": stratum.variant, "seed": seed, **point},
                                    user_attrs={"variant": stratum.variant, "seed": seed, "config": config})
                n += 1
    return n


def _describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen
    log: Path

    @property
    def id(self) -> str:
        return f"{socket.gethostname()}:{self.proc.pid}"


def run_sweep(spec: SweepSpec, ref: StorageRef, root: Path, workers: int, on_progress=None, quiet: bool = False,
              headline: str | None = None) -> int:
    """The parent: validate, create the studies, run ``workers`` worker processes, recover dead ones.
    ``on_progress()`` (the ablation's study notes) is called when trials have finished, at most every
    :data:`PROGRESS_EVERY` seconds; its failure is one yellow line, never the sweep's. On a terminal the
    progress is one live display; ``quiet`` (or a stderr that is not a terminal): a line per finished run.
    ``headline``: what the sweep runs, in its caller's words (the ablation's variants × data sets × seeds)."""
    from rich.console import Console

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the parent prints its own progress
    infos = {}
    with console.status(f"checking {spec.path.name}: building every stratum's config"):
        for stratum in spec.strata():
            infos[stratum.variant] = check_stratum(spec, stratum)
    with creation_lock(ref, spec.name):
        storage = open_storage(ref, None if ref.attr_heartbeat else spec.heartbeat, spec.retries, create=True)
        studies = create_studies(spec, storage, infos)
    console.print(f"[bold]{spec.name}[/]: {escape(headline or _headline(spec))} on {escape(redact(ref.url))}")
    if workers == 0:
        console.print(f"studies ready; add workers with `accrot sweep {spec.path} --worker --storage URL`")
        return 0
    for study in studies:
        recover_stale(study, storage, ref, spec)
    if not any(can_start(s, spec.budget_of(s.study_name)) or unowned(s) for s in studies):  # unclaimed: a worker waits them out
        console.print("every study has spent its budget; nothing to run (raise `trials` to extend it)")
        _print_summary(console, spec, studies, ref, root)
        return 0
    return Parent(spec, ref, root, storage, studies, console, on_progress, quiet).run(workers)


class Terminated(KeyboardInterrupt):
    """The parent was sent SIGTERM or SIGHUP (a scheduler, ``kill``, a closed terminal): stop as on Ctrl-C, the
    workers told with SIGTERM (their runs end ``preempted``)."""


class _stop_signals:
    """While the workers run, Ctrl-C / SIGINT, SIGTERM and SIGHUP stop the parent, which then stops its workers
    before it exits (Ctrl-C raises KeyboardInterrupt, the others :class:`Terminated`).

    The exception is raised at a safe point only: while the parent sleeps between its checks (:meth:`sleep`) or when
    it next calls :meth:`check`. A signal that lands inside a storage call is only recorded, and raised at the next
    of those: raised inside the call, it could leave the database client holding a lock that the stop's own storage calls (failing the
    workers' trials) would then wait on for ever.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.pending: int | None = None
        self._sleeping = False
        self._old: dict = {}

    def __enter__(self) -> _stop_signals:
        if threading.current_thread() is not threading.main_thread():  # a parent run from a thread (tests): Python
            return self  # takes signals in the main thread only
        self._old = {sig: signal.getsignal(sig) for sig in self.SIGNALS}
        for sig in self.SIGNALS:
            signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum, frame) -> None:
        self.pending = signum
        if self._sleeping:
            self.check()

    def check(self) -> None:
        """Raise the stop a signal asked for, if one came."""
        if self.pending is not None:
            raise KeyboardInterrupt if self.pending == signal.SIGINT else Terminated

    def sleep(self, seconds: float) -> None:
        self.check()
        self._sleeping = True
        try:
            time.sleep(seconds)
        finally:
            self._sleeping = False

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class Parent:
    """Worker processes on one machine: started, watched, their dead replaced and their trials failed and re-queued."""

    def __init__(self, spec: SweepSpec, ref: StorageRef, root: Path, storage, studies: list, console,
                 on_progress=None, quiet: bool = False) -> None:
        self.spec, self.ref, self.root, self.storage, self.studies, self.console = spec, ref, root, storage, studies, console
        self.on_progress, self.progress_at, self.progress_seen = on_progress, time.monotonic(), 0
        self.deadline = time.time() + spec.timeout if spec.timeout else None
        self.logs = Path(root) / spec.name / "workers"
        self.retry = RetryTrial(spec.retries)
        self.claims: list[int] = []  # open, flock'ed claim files: this parent's worker indices
        self.next_index = 0
        self.gpus = _gpu_ids()
        self.failed_workers = 0
        # trials that finished before this parent started were shown by the run that finished them (a resumed sweep
        # lists only what it finishes itself)
        self.seen: set[tuple[str, int]] = {(s.study_name, t.number) for s in studies
                                           for t in s.get_trials(deepcopy=False, states=FINISHED)}
        self.quiet = quiet

    def run(self, workers: int) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", ACCROT_SWEEP_STORAGE=self.ref.url,
                        ACCROT_SWEEP_DEADLINE="" if self.deadline is None else repr(self.deadline))
        self.env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
        self.load, self.started_at = LoadMeter.start(), datetime.datetime.now()  # for the time split at the end
        live = [self.spawn() for _ in range(workers)]
        folder = self.spec.artifacts.directory(self.root, self.spec.name)
        artifacts = f" ARTIFACTS='{folder}'" if folder is not None else ""
        self.console.print(f"{workers} worker(s); logs in {self.logs}; watch: make dashboard "
                           f"STORAGE='{self.ref.dashboard}'{artifacts}")
        self.display = self.make_display()
        try:
            with _stop_signals() as self.signals, self.display:
                self.watch(live, max_respawns=workers * max(1, self.spec.retries))
                self.refresh(live)
                self.signals.check()
        except KeyboardInterrupt as err:
            with _stop_signals():  # a second signal while the workers stop must not cut the parent short
                self.interrupt(live, signalled=isinstance(err, Terminated))
            raise
        finally:
            for fd in self.claims:
                os.close(fd)
        return self.finish()

    def make_display(self) -> RunDisplay:
        """Runs done of the whole budget, the runs in progress, the last finished with NLL at 1× and the longest."""
        attrs = self.studies[0].user_attrs.get("accrot", {})
        longest = max(attrs.get("multipliers") or [1])
        self.near_far = (metric_key("nll", 1), metric_key("nll", longest))
        total = sum(self.spec.budget_of(s.study_name) for s in self.studies)
        done = retry_storage(lambda: sum(_done(s) for s in self.studies), "reading the trials", self.console)
        return RunDisplay(self.spec.name, total, self.console, near="1×", far=f"{longest:g}×", quiet=self.quiet,
                          done=done)

    def claim_index(self) -> int:
        """The lowest worker index no live parent of this sweep holds. The index offsets the sampler seed, so two
        parents started at once (on one machine or on nodes sharing the root) must not both run worker 0: their
        samplers would draw the same configurations. flock is released when a parent dies, so a crash leaves
        no stale claim behind."""
        import fcntl

        while True:
            i, self.next_index = self.next_index, self.next_index + 1
            fd = os.open(self.logs / f".worker-{i}.claim", os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held by another parent
                os.close(fd)
                continue
            self.claims.append(fd)
            return i

    def spawn(self) -> _Worker:
        i = self.claim_index()
        wenv = dict(self.env)
        if len(self.gpus) > 1:  # one GPU per worker, round robin
            wenv["CUDA_VISIBLE_DEVICES"] = self.gpus[i % len(self.gpus)]
        log = self.logs / f"worker-{i}.log"
        wenv[WORKER_SPAWNED_AT] = repr(time.time())  # the worker's first trial records its start-up time
        cmd = [sys.executable, "-c", _WORKER_BOOT, "sweep", str(self.spec.path), "--worker",
               f"--root={self.root}", f"--worker_index={i}"]
        with open(log, "ab") as fh:
            # its own session: a terminal's Ctrl-C reaches the parent alone, which tells every worker once
            # (Parent.interrupt); a worker that got it twice would stop mid-step without its checkpoint
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=wenv, start_new_session=True)
        return _Worker(i, proc, log)

    def work_left(self) -> bool:
        return (self.deadline is None or time.time() < self.deadline) and retry_storage(
            lambda: any(can_start(s, self.spec.budget_of(s.study_name)) for s in self.studies), "checking the budget", self.console)

    def watch(self, live: list[_Worker], max_respawns: int) -> None:
        respawns = 0
        next_report = time.monotonic()
        while live:
            self.signals.sleep(0.5)  # a stop signal is raised here, never inside a storage call
            for w in list(live):
                rc = w.proc.poll()
                if rc is None:
                    continue
                live.remove(w)
                if rc in (0, EVERY_TRIAL_FAILED):  # finished; failed trials are in the summary, with their reasons
                    continue
                self.reap(w, rc)
                if self.work_left() and respawns < max_respawns:
                    respawns += 1
                    live.append(self.spawn())
            # reading every study's trials costs the parent a good part of a core with many studies (the
            # ablation has 22): report finished trials every few seconds, not at every liveness check
            if time.monotonic() >= next_report:
                self.refresh(live)
                next_report = time.monotonic() + REPORT_EVERY

    def reap(self, w: _Worker, rc: int) -> None:
        """A worker died: fail (and re-queue) the trial it was running."""
        self.failed_workers += 1
        reason = f"worker {w.id} {_describe_exit(rc)} while running the trial"
        n = retry_storage(lambda: fail_worker_trials(self.studies, self.storage, w.id, reason, self.retry),
                          "failing the dead worker's trial", self.console)
        self.console.print(f"[red]worker {w.index} ({w.id}) {_describe_exit(rc)}[/]: {n} running trial(s) "
                           f"failed{' and re-queued' if self.spec.retries else ''}; log: {w.log}")

    def interrupt(self, live: list[_Worker], signalled: bool = False) -> None:
        """The parent was stopped: Ctrl-C or SIGINT (``signalled`` False), SIGTERM or SIGHUP (True). The workers, in
        their own sessions, heard nothing: each is sent the same stop at once (SIGINT, or SIGTERM), finishes the step
        it is in, checkpoints and fails its trial with the reason (re-queued); one still running after
        :data:`STOP_GRACE` seconds is killed, and what it ran is failed and re-queued here."""
        sig = signal.SIGTERM if signalled else signal.SIGINT
        for w in live:
            if w.proc.poll() is None:
                w.proc.send_signal(sig)
        deadline = time.monotonic() + STOP_GRACE
        for w in live:
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        why = "Ctrl-C (SIGINT)" if sig == signal.SIGINT else "SIGTERM"
        self._requeue({w.id for w in live}, f"the sweep was interrupted ({why})")
        self.console.print(f"interrupted by {why}: {len(live)} worker(s) stopped, their trials checkpointed where they "
                           "could be, failed and queued again; run the same command to continue", markup=False)

    def _requeue(self, workers: set[str], reason: str) -> None:
        """Fail and re-queue what ``workers`` left: a RUNNING trial (a killed worker), or one Optuna failed without a
        reason or a retry (the stop reached the worker outside its run: sampling, recording)."""
        for s in self.studies:
            trials = s.get_trials(deepcopy=False)
            retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
            for t in trials:
                if t.user_attrs.get("worker") not in workers:
                    continue
                if t.state == TrialState.RUNNING:
                    fail_trial(s, self.storage, t, reason, self.retry)
                elif t.state == TrialState.FAIL and "fail_reason" not in t.user_attrs and t.number not in retried:
                    self.storage.set_trial_user_attr(t._trial_id, "fail_reason", reason)
                    self.retry(s, self.storage.get_trial(t._trial_id))

    def refresh(self, live: list[_Worker]) -> None:
        """One read of every study for the display (runs done, in progress, newly finished), then the progress hook."""
        ours = {w.id: w.index for w in live}
        done, running, finished = retry_storage(lambda: self._read(ours), "reading the trials", self.console)
        self.display.update(done, running, finished)
        if (self.on_progress is not None and len(self.seen) > self.progress_seen
                and time.monotonic() - self.progress_at >= PROGRESS_EVERY):
            self.progress_seen, self.progress_at = len(self.seen), time.monotonic()
            try:
                self.on_progress()
            except Exception as err:  # noqa: BLE001 - a note that cannot be written never stops the sweep
                self.console.print(f"[yellow]progress hook failed: {type(err).__name__}: {err}[/]")

    def _read(self, ours: dict[str, int]) -> tuple[int, list[Running], list[Finished]]:
        done, running, finished = 0, [], []
        for s in self.studies:
            trials = s.get_trials(deepcopy=False)
            done += _done(s, trials)
            for t in trials:
                if t.state == TrialState.RUNNING and t.datetime_start is not None:
                    worker = t.user_attrs.get("worker", "?")
                    who = f"worker {ours[worker]}" if worker in ours else worker
                    running.append(Running(who, _describe(s, t), t.datetime_start.timestamp()))
                elif t.state in FINISHED and (s.study_name, t.number) not in self.seen:
                    self.seen.add((s.study_name, t.number))
                    finished.append(self._finished(s, t))
        return done, running, finished

    def _finished(self, s, t) -> Finished:
        metrics = t.user_attrs.get("metrics") or {}
        near, far = (metrics.get(k) for k in self.near_far)
        detail = "" if t.state == TrialState.COMPLETE else (
            t.user_attrs.get("fail_reason") or t.user_attrs.get("pruned_reason") or "no reason recorded")
        return Finished(_describe(s, t), t.state.name.lower().replace("fail", "failed"), near, far, detail,
                        t.duration.total_seconds() if t.duration else None)

    def finish(self) -> int:
        """The summary; 1 when work is left (workers died) or every trial of a study failed."""
        console, studies, spec = self.console, self.studies, self.spec
        left = retry_storage(lambda: [s.study_name for s in studies if can_start(s, spec.budget_of(s.study_name))], "the budget",
                             console)
        retry_storage(lambda: _print_summary(console, spec, studies, self.ref, self.root), "the summary", console)
        self._print_timing()
        if left and (self.deadline is None or time.time() < self.deadline):
            console.print(f"[red]unfinished: {', '.join(left)} ({self.failed_workers} worker(s) died)[/]")
            return 1
        dead = retry_storage(lambda: _all_failed(studies), "the failed studies", console)
        if dead:
            console.print(f"[red]every trial failed in {len(dead)} of {len(studies)} "
                          f"stud{'y' if len(studies) == 1 else 'ies'}: "
                          + "; ".join(f"{name} ({n} failed; first: {why})" for name, n, why in dead[:3]) + "[/]")
            return 1
        holes = retry_storage(lambda: _grid_holes(studies) if spec.shared_study else [], "the grid", console)
        if holes:  # a shared study compares its grid's cells side by side: one never completed is a gap, not done
            console.print(f"[red]{len(holes)} of the grid's runs never completed (their trials failed; run the same "
                          f"command again to retry them): " + "; ".join(holes[:4]) + "[/]")
            return 1
        return 0


    def _print_timing(self) -> None:
        """Where this run's time went, over the trials it finished, and how busy the workers kept the cores."""
        since = getattr(self, "started_at", None)
        if since is None:
            return
        ours = retry_storage(lambda: [t for s in self.studies for t in s.get_trials(deepcopy=False, states=FINISHED)
                                      if t.datetime_complete is not None and t.datetime_complete >= since],
                             "reading the trials", self.console)
        table = timing_table(ours, self.load.read())
        if table is not None:
            self.console.print(table)


def _all_failed(studies) -> list[tuple[str, int, str]]:
    """``(study, failed trials, first reason)`` of every study whose finished trials all failed."""
    out = []
    for s in studies:
        finished = s.get_trials(deepcopy=False, states=FINISHED)
        failed = [t for t in finished if t.state == TrialState.FAIL]
        if finished and len(failed) == len(finished):
            why = next((t.user_attrs.get("fail_reason") for t in failed if t.user_attrs.get("fail_reason")), "?")
            out.append((s.study_name, len(failed), " ".join(str(why).split())[:200]))
    return out


def _grid_holes(studies) -> list[str]:
    """The queued (variant, seed) cells of shared studies with no complete trial, once none is waiting or running:
    ``"study: variant seed s (first failure: why)"`` each."""
    out = []
    for s in studies:
        trials = s.get_trials(deepcopy=False)
        if any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in trials):
            continue
        cells: dict[tuple, list] = {}
        for t in trials:
            if "variant" in t.user_attrs and "seed" in t.user_attrs:
                cells.setdefault((t.user_attrs["variant"], t.user_attrs.get("config"), t.user_attrs["seed"]), []).append(t)
        for (variant, _, seed), ts in cells.items():
            if not any(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in ts):
                why = next((t.user_attrs.get("fail_reason") for t in ts if t.user_attrs.get("fail_reason")), "?")
                out.append(f"{s.study_name}: {variant} seed {seed} (first failure: {' '.join(str(why).split())[:120]})")
    return out


REPORT_EVERY = 2.0  # seconds between the parent's reads of the trials (the live display, the progress hook)
STOP_GRACE = 30.0  # seconds a stopped worker has to finish its step and checkpoint before it is killed
PROGRESS_EVERY = 60.0  # seconds between two calls of run_sweep's on_progress (the ablation's claims notes)


def _gpu_ids() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001
        return []


def _done(study, trials=None) -> int:
    """Runs of ``study`` that are done: those that count against the budget and are neither waiting nor running."""
    counted, waiting, running = budget_state(study, trials)
    return counted - waiting - running


def _describe(study, t) -> str:
    """``ablation/corpus #3 corpus.RoPE seed 1``: the study, the trial, its variant (in a shared study) and seed."""
    variant = t.user_attrs.get("variant") if study.user_attrs.get("accrot", {}).get("variant") is None else None
    parts = [f"{study.study_name} #{t.number}", variant,
             f"seed {t.user_attrs['seed']}" if "seed" in t.user_attrs else None]
    return " ".join(p for p in parts if p)


def _headline(spec: SweepSpec) -> str:
    """``4 runs (1 study × 4 configurations × 1 seed)``: the budget the sweep queues, and what it is made of."""
    studies = spec.studies()
    total = sum(spec.budget_of(name) for name in studies)
    per_study = {len(strata) for strata in studies.values()}
    parts = [f"{len(studies)} stud{'y' if len(studies) == 1 else 'ies'}"]
    if spec.shared_study and per_study != {1}:
        parts.append(f"{max(per_study)} variants" if len(per_study) == 1 else "their variants")
    parts += [f"{spec.trials} configuration{'s' if spec.trials != 1 else ''}",
              f"{len(spec.seeds)} seed{'s' if len(spec.seeds) != 1 else ''}"]
    return f"{total} run{'s' if total != 1 else ''} ({' × '.join(parts)})"


def _print_summary(console, spec: SweepSpec, studies, ref: StorageRef, root: Path) -> None:
    for s in studies:
        trials = s.get_trials(deepcopy=False)
        counts = {st.name.lower(): sum(t.state == st for t in trials) for st in FINISHED}
        line = f"{s.study_name}: " + ", ".join(f"{v} {k}" for k, v in counts.items())
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        # a shared study is a fixed grid of variants × seeds compared side by side (the ablation): no "best"
        if done and len(spec.objectives) == 1 and not spec.shared_study:
            best = s.best_trial
            line += f"; best #{best.number} {spec.objectives[0].metric}={best.value:.4f} {best.params}"
        console.print(line, markup=False)
    default = StorageRef.parse(None, spec.name, "runs/sweeps").url == ref.url
    where = "" if default else f" --storage '{redact(ref.url)}'"
    console.print(f"report: accrot report --study {spec.name}{where}", markup=False)


# ---------------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    """``accrot sweep SPEC [--workers N] [--storage URL]``: run an Optuna study spec."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog="accrot sweep", exit_on_error=False, description=plain_help(main.__doc__))
    option(parser, "spec", kind=SPEC, type=str, help="a spec file (sweeps/smoke.yaml) or a shipped spec's name (smoke)")
    option(parser, "--workers", kind=count(0, 256), type=int, default=1,
                        help="worker processes on this machine (0: validate and create the study only)")
    option(parser, "--storage", kind=STORAGE, type=str | None, default=None,
                        help="sqlite:///PATH, postgresql://USER@HOST/DB, grpc://HOST:PORT (accrot storage-proxy) or "
                             "journal:///ABS/PATH.log "
                             "(default: the spec's, else <root>/<name>/study.db)")
    option(parser, "--root", kind=write_dir("a run root"), type=str | None, default=None, help="run root (default: the spec's root)")
    option(parser, "--worker", kind=FLAG, action="store_true",
                        help="run as a worker on an existing study (other nodes; the driver starts these itself)")
    option(parser, "--worker_index", kind=count(0), type=int, default=0, help="offsets the sampler seed of a worker")
    option(parser, "--quiet", kind=FLAG, action="store_true",
                        help="one line per finished run instead of the live display (also when stderr is no terminal)")
    option(parser, "--distributed", kind=FLAG, action="store_true",
                        help="with --worker, under srun/torchrun: this process is one rank; every trial is a DDP run "
                             "over all ranks (rank 0 talks to Optuna; accrot.sweep.ddp)")
    option(parser, "--nodes", kind=count(1, 100000), type=int | None, default=None, help="--distributed: nodes (default: SLURM_NNODES)")
    option(parser, "--tasks_per_node", kind=count(1, 1024), type=int | None, default=None,
                        help="--distributed: ranks per node (default: SLURM_NTASKS_PER_NODE or LOCAL_WORLD_SIZE)")
    args = parse(parser, argv)
    if args.distributed and not args.worker:
        raise UsageError("--distributed is an option of a worker: accrot sweep SPEC --worker --distributed --storage URL")
    if args.workers < 0:
        raise UsageError(f"worker count {args.workers} is not valid; use 0 (create the study only) or more")
    spec = load_spec(args.spec)
    root = Path(args.root or spec.root).resolve()
    url = args.storage or (os.environ.get("ACCROT_SWEEP_STORAGE") if args.worker else None) or spec.storage
    ref = StorageRef.parse(url, spec.name, root)
    if args.worker:
        deadline = os.environ.get("ACCROT_SWEEP_DEADLINE")
        deadline = float(deadline) if deadline else (time.time() + spec.timeout if spec.timeout else None)
        if args.distributed:
            from accrot.sweep.ddp import run_distributed_worker

            return run_distributed_worker(spec, ref, root, args.worker_index, deadline, args.nodes, args.tasks_per_node)
        from accrot.sweep.worker import run_worker  # imports Lightning: not at `accrot sweep --help`

        return run_worker(spec, ref, root, args.worker_index, deadline)
    return run_sweep(spec, ref, root, args.workers, quiet=args.quiet)

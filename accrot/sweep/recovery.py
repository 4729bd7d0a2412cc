"""Dead workers: a running trial whose worker died is failed with the reason and retried with the same params and
seed; storages without Optuna's heartbeat (a journal file, the storage proxy's client) get one of their own; the
budget a study has left."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import optuna
from optuna.trial import TrialState

from accrot.sweep.spec import HeartbeatSpec, SweepSpec, quiet_experimental

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
# user attributes that describe one attempt (a retry starts without them)
_ATTEMPT_ATTRS = ("worker", "run_dir", "metrics", "fail_reason", "pruned_reason", "heartbeat", "step", "train_length",
                  "retry_of", "retry_reason")


# ---------------------------------------------------------------------------------------------------
# dead workers: fail with the reason, retry with the same params and seed
# ---------------------------------------------------------------------------------------------------
class RetryTrial:
    """Re-queue a failed trial as a WAITING one with the same params, seed and configuration, at most
    ``max_retry`` times per original trial. Keeps Optuna's ``failed_trial`` / ``retry_history`` system
    attributes (so ``RetryHeartbeatStaleTrialCallback.retried_trial_number`` still works), drops the
    attempt's own user attributes (worker, run_dir, fail_reason, ...) and records ``retry_of``."""

    def __init__(self, max_retry: int, reason: str = "") -> None:
        self.max_retry = max_retry
        self.reason = reason

    def __call__(self, study, trial) -> None:
        history = [*trial.system_attrs.get("retry_history", []), trial.number]
        if len(history) > self.max_retry:
            return
        user = {k: v for k, v in trial.user_attrs.items() if k not in _ATTEMPT_ATTRS}
        user["retry_of"] = trial.number
        if self.reason and "fail_reason" not in trial.user_attrs:
            user["retry_reason"] = f"trial {trial.number} {self.reason}"
        system = {**trial.system_attrs, "failed_trial": history[0], "retry_history": history}
        study.add_trial(optuna.trial.create_trial(state=TrialState.WAITING, params=trial.params,
                                                  distributions=trial.distributions, user_attrs=user,
                                                  system_attrs=system))


def fail_trial(study, storage, trial, reason: str, retry: RetryTrial | None) -> bool:
    """Fail a RUNNING trial with ``reason`` (a user attribute) and retry it; False if it had finished."""
    try:
        storage.set_trial_user_attr(trial._trial_id, "fail_reason", reason)
        if not storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
            return False
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    if retry is not None:
        retry(study, storage.get_trial(trial._trial_id))
    return True


def fail_worker_trials(studies, storage, worker: str, reason: str, retry: RetryTrial | None) -> int:
    """Fail (and retry) the RUNNING trials of ``worker`` (its ``host:pid``), which died: how many."""
    return sum(fail_trial(s, storage, t, reason, retry) for s in studies
               for t in s.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if t.user_attrs.get("worker") == worker)


def fail_stale_attr(study, storage, heartbeat: HeartbeatSpec, retry: RetryTrial) -> int:
    """Storages without Optuna's heartbeat (journal, proxy): fail RUNNING trials whose ``heartbeat`` attribute
    (or start) is older than the grace period."""
    now, n = time.time(), 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        last = t.user_attrs.get("heartbeat") or (t.datetime_start.timestamp() if t.datetime_start else now)
        if now - last > heartbeat.grace:
            reason = (f"no heartbeat from worker {t.user_attrs.get('worker', '?')} for {now - last:.0f} s "
                      f"(grace {heartbeat.grace} s): worker presumed dead")
            n += fail_trial(study, storage, t, reason, retry)
    return n


def unowned(study) -> list:
    """RUNNING trials no worker has claimed (no ``worker`` attribute): a worker's ``study.ask()`` that a storage
    outage interrupted after the trial was set RUNNING (a seed copy popped from the queue, a new trial created)
    but before the objective began. No heartbeat was ever recorded for them, so Optuna's heartbeat never
    fails them, and they count against the budget."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if "worker" not in t.user_attrs]


def fail_unowned(study, storage, heartbeat: HeartbeatSpec, retry: RetryTrial) -> int:
    """Fail (and re-queue) the :func:`unowned` trials that began more than the heartbeat's grace period ago:
    a live worker claims its trial within milliseconds of asking for it."""
    now, n = time.time(), 0
    for t in unowned(study):
        started = t.datetime_start.timestamp() if t.datetime_start else now
        if now - started > heartbeat.grace:
            reason = (f"no worker claimed it within {heartbeat.grace} s of its start: the storage failed while a "
                      f"worker was starting it (e.g. a database restart)")
            n += fail_trial(study, storage, t, reason, retry)
    return n


def recover_stale(study, storage, ref, spec: SweepSpec) -> None:
    """Fail (and re-queue) running trials whose worker stopped sending heartbeats, or that no worker ever
    claimed, on any storage (``ref``: the :class:`~accrot.sweep.storage.StorageRef` it is opened from)."""
    retry = RetryTrial(spec.retries)
    if ref.attr_heartbeat:
        fail_stale_attr(study, storage, spec.heartbeat, retry)  # counts an unclaimed trial from its start
    else:
        with quiet_experimental():
            optuna.storages.fail_stale_trials(study)  # Optuna's heartbeat; its callback re-queues
        fail_unowned(study, storage, spec.heartbeat, retry)


class AttrHeartbeat:
    """Writes the trial's ``heartbeat`` user attribute every ``interval`` seconds (storages without Optuna's
    heartbeat: journal, proxy)."""

    def __init__(self, storage, trial_id: int, interval: int) -> None:
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a trial that just finished refuses the write
                self.storage.set_trial_user_attr(self.trial_id, "heartbeat", time.time())
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> AttrHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def budget_state(study, trials=None) -> tuple[int, int, int]:
    """(trials that count against the budget, waiting, running); a failed trial that was retried does
    not count (its retry does). ``trials``: the study's, when the caller has read them already."""
    trials = study.get_trials(deepcopy=False) if trials is None else trials
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    live = [t for t in trials if not (t.state == TrialState.FAIL and t.number in retried)]
    return (len(live), sum(t.state == TrialState.WAITING for t in live),
            sum(t.state == TrialState.RUNNING for t in live))


def can_start(study, budget: int) -> bool:
    counted, waiting, _ = budget_state(study)
    return counted < budget or waiting > 0


def missing_seeds(study, config: int, seeds: list[int]) -> list[int]:
    """The seeds of configuration ``config`` (after its first) that no trial of ``study`` holds yet."""
    have = {t.user_attrs.get("seed") for t in study.get_trials(deepcopy=False) if t.user_attrs.get("config") == config}
    return [s for s in seeds[1:] if s not in have]


def account(study, budget: int) -> dict:
    """Every trial accounted for: finished (complete, pruned, or failed with a reason), each failure either
    retried or final, and the budget of (configuration, seed) pairs all complete. ``lost``: pairs of the budget
    with no finished run, plus trials left unfinished or failed without a reason; 0 when nothing was lost."""
    trials = study.get_trials(deepcopy=False)
    unfinished = [t.number for t in trials if t.state not in FINISHED]
    # a trial Optuna's heartbeat failed carries no fail_reason (the trial is finished before its callback runs): its
    # retry says why (retry_reason), so a retried failure is accounted for; silent = no reason and no retry
    retried_from = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
    silent = [t.number for t in trials if t.state == TrialState.FAIL and not t.user_attrs.get("fail_reason")
              and t.number not in retried_from]
    done = {(json.dumps(t.params, sort_keys=True), t.user_attrs.get("seed")) for t in trials
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}
    return {"trials": len(trials), "unfinished": unfinished, "failed_silently": silent,
            "complete": len(done), "lost": budget - len(done) + len(unfinished) + len(silent),
            "retried": [t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs]}


# a worker's exit status when every trial it ran failed (at set-up, or diverged): not a crash (the parent neither
# re-queues nor respawns for it), but not a success a scheduler should report either
EVERY_TRIAL_FAILED = 3

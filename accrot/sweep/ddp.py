"""Optuna trials that are multi-process (multi-node) DDP runs: ``accrot sweep SPEC --worker --distributed``.

Every rank of the launch (``srun`` tasks of a SLURM job, ``torchrun`` processes) runs this worker. The ranks
join one process group before the first trial (Lightning's DDP strategy then reuses it); per trial:

* global rank 0 takes the budget lock and asks Optuna (``run_worker``, as a one-process worker does); it
  broadcasts the study and its context, and the ranks sample the search space together through optuna's
  ``TorchDistributedTrial`` (rank 0 holds the trial, the others mirror its suggestions); rank 0 then
  broadcasts the trial number, seed and its exact values (the mirror sends floats as float32, and ranks
  training with learning rates one float32 rounding apart would drift apart);
* every rank runs the same ``accrot fit`` arguments with ``trainer.num_nodes`` × ``trainer.devices`` = the
  launch's ranks and ``strategy=ddp``; rank 0 writes the run directory;
* rank 0 reports: :class:`callbacks.pruning.OptunaPruning` reports from rank 0 and broadcasts the pruner's
  decision through the strategy, so every rank raises ``TrialPruned`` at the same step; rank 0 tells Optuna
  the final objective.

Preemption: the trial records its SLURM job (``slurm_job``); :class:`callbacks.preemption.Preemption`
checkpoints and requeues the job, the trial stays RUNNING, and the requeued job's rank 0 continues that
trial under its own number (``--ckpt_path last`` resumes its run directory) before asking for a new one.
Keep the spec's ``heartbeat.grace`` above the time a requeued job waits to start again.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from accrot.errors import UsageError


def launch_layout(nodes: int | None = None, tasks_per_node: int | None = None) -> tuple[int, int, int, int, int]:
    """``(rank, world size, local rank, nodes, tasks per node)`` of this process: SLURM's variables under
    ``srun``, else torchrun's (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    if SLURMEnvironment.detect():
        env = SLURMEnvironment()
        rank, world, local = env.global_rank(), env.world_size(), env.local_rank()
        nodes = nodes or int(os.environ.get("SLURM_NNODES", 1))
        tasks_per_node = tasks_per_node or int(os.environ.get("SLURM_NTASKS_PER_NODE", world // max(nodes, 1)))
    else:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        local = int(os.environ.get("LOCAL_RANK", 0))
        tasks_per_node = tasks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", world // max(nodes or 1, 1)))
        nodes = nodes or max(1, world // tasks_per_node)
    if nodes * tasks_per_node != world:
        raise UsageError(f"{nodes} node(s) × {tasks_per_node} task(s) per node = {nodes * tasks_per_node} ranks, but this "
                         f"launch has {world} processes; start one process per device (srun --ntasks-per-node)")
    return rank, world, local, nodes, tasks_per_node


def init_distributed(rank: int, world: int, local: int) -> None:
    """Join the launch's process group (NCCL with GPUs, else gloo); Lightning's DDP strategy reuses it."""
    import torch
    import torch.distributed as dist
    from lightning.fabric.plugins.environments import SLURMEnvironment

    if dist.is_initialized():
        return
    if SLURMEnvironment.detect():  # MASTER_ADDR (when exported) or the first node; MASTER_PORT from the job id
        env = SLURMEnvironment()
        addr, port = env.main_address, env.main_port
    else:
        addr, port = os.environ.setdefault("MASTER_ADDR", "127.0.0.1"), int(os.environ.setdefault("MASTER_PORT", "29500"))
    backend = "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(local % torch.cuda.device_count())
        backend = "nccl"
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)


def _send(obj: Any = None) -> Any:
    """Broadcast a picklable object from global rank 0 (CPU, gloo side group under NCCL)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_cpu_group())
    return box[0]


_GROUP = None


def _cpu_group():
    global _GROUP
    import torch.distributed as dist

    if _GROUP is None:
        _GROUP = dist.new_group(backend="gloo") if dist.get_backend() == "nccl" else dist.group.WORLD
    return _GROUP


class Ranks:
    """Global rank 0's side of a multi-process worker (the hooks :func:`accrot.sweep.worker.run_worker` calls)."""

    def __init__(self, spec, nodes: int, tasks_per_node: int) -> None:
        from callbacks.preemption import slurm_job_id

        self.spec = spec
        # every rank trains the trial over all ranks; `last` continues the trial's own run after a requeue
        self.extra = [f"--trainer.num_nodes={nodes}", f"--trainer.devices={tasks_per_node}",
                      "--trainer.strategy=ddp", "--ckpt_path=last"]
        self.job = slurm_job_id()

    def sample(self, entry, stratum, trial, context: dict) -> dict:
        from optuna_integration import TorchDistributedTrial

        from accrot.sweep.spec import quiet_experimental
        from accrot.sweep.trials import sample_space

        _send({"study": entry.name, "variant": stratum.variant, "context": context})
        with quiet_experimental():
            mirror = TorchDistributedTrial(trial, group=_cpu_group())
        mirrored = sample_space(mirror, self.spec.space, context)
        return {k: trial.params.get(k, v) for k, v in mirrored.items()}  # the stored (float64) values

    def launch(self, trial, seed: int, values: dict) -> list[str]:
        from accrot.sweep.worker import attr

        if self.job:
            attr(trial, "slurm_job", self.job)
        # TorchDistributedTrial sends floats as float32: the exact values travel with the launch message
        _send({"number": trial.number, "seed": seed, "values": values})
        return list(self.extra)

    def continue_requeued(self, studies, objective_for) -> bool:
        """Finish the trial this SLURM job was running when it was requeued; False if there is none."""
        if not self.job:
            return False
        for entry in studies:
            for t in entry.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                if t.user_attrs.get("slurm_job") != self.job:
                    continue
                print(f"continuing trial {t.number} of {entry.name} (SLURM job {self.job} was requeued)",
                      flush=True)
                trial = optuna.trial.Trial(entry.study, t._trial_id)
                with _heartbeat(entry.study, t._trial_id):
                    try:
                        value = objective_for(entry)(trial)
                    except optuna.TrialPruned:
                        entry.study.tell(trial, state=TrialState.PRUNED)
                    except Exception:  # noqa: BLE001 - the objective recorded the reason
                        entry.study.tell(trial, state=TrialState.FAIL)
                    else:
                        entry.study.tell(trial, value)
                return True
        return False

    def stop(self) -> None:
        _send(None)


@contextlib.contextmanager
def _heartbeat(study, trial_id: int):
    """Optuna's RDB heartbeat for a trial run outside ``study.optimize`` (journal and proxy workers beat themselves)."""
    storage = study._storage
    interval = storage.get_heartbeat_interval() if hasattr(storage, "record_heartbeat") else None  # RDB storages
    if not interval:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):
                storage.record_heartbeat(trial_id)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def follow(spec, root: Path, extra: list[str], rank: int) -> int:
    """Ranks other than 0: mirror rank 0's suggestions, then train each trial with it until it says stop."""
    from optuna_integration import TorchDistributedTrial

    from accrot.run.lightning import run_lightning
    from accrot.sweep.spec import quiet_experimental
    from accrot.sweep.trials import sample_space, trial_args
    from accrot.sweep.worker import end_run

    strata = {s.variant: s for s in spec.strata()}
    pending = None
    while True:
        msg = _send()
        if msg is None:
            return 0
        if "study" in msg:  # a new trial: sample with rank 0
            with quiet_experimental():
                mirror = TorchDistributedTrial(None, group=_cpu_group())
            values = sample_space(mirror, spec.space, msg["context"])
            pending = (strata[msg["variant"]], values)
            continue
        stratum, mirrored = pending
        values = msg.get("values", mirrored)  # rank 0's exact floats (the mirror rounds them to float32)
        args = trial_args(spec, stratum, root, msg["number"], msg["seed"], values) + extra
        outcome = "finished"
        try:
            run_lightning(args)
        except Exception as err:  # noqa: BLE001 - pruned or failed: rank 0 records the trial's result
            outcome = f"{type(err).__name__}: {err}"
        finally:
            end_run()
        print(f"rank {rank}: trial {msg['number']} of {stratum.variant or spec.name} {json.dumps(values, sort_keys=True)}: "
              f"{outcome}", flush=True)


def run_distributed_worker(spec, ref, root: Path, worker_index: int, deadline: float | None,
                           nodes: int | None = None, tasks_per_node: int | None = None) -> int:
    from accrot.sweep.worker import run_worker

    rank, world, local, nodes, tasks_per_node = launch_layout(nodes, tasks_per_node)
    init_distributed(rank, world, local)
    ranks = Ranks(spec, nodes, tasks_per_node)
    if rank == 0:
        try:
            code = run_worker(spec, ref, root, worker_index, deadline, ranks=ranks)
        except Exception:
            with contextlib.suppress(Exception):
                ranks.stop()
            _leave_group(together=False)
            raise
    else:
        code = follow(spec, root, ranks.extra, rank)
    _leave_group(together=True)
    return code


def _leave_group(together: bool) -> None:
    """Destroy the process group before the interpreter exits. Left to the exit's static destructors, gloo's
    threads were torn down in arbitrary order and a rank now and then died with "terminate called without an
    active exception" (SIGABRT) after its sweep had finished, which failed the SLURM job. ``together``: every
    rank gets here (a barrier first, so none leaves while another still talks to it)."""
    global _GROUP
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if together:
        with contextlib.suppress(Exception):
            dist.barrier(group=_cpu_group())
    if _GROUP is not None and _GROUP is not dist.group.WORLD:
        with contextlib.suppress(Exception):
            dist.destroy_process_group(_GROUP)
    _GROUP = None
    with contextlib.suppress(Exception):
        dist.destroy_process_group()

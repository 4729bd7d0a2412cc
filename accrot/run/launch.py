"""Checks of a launch before any work: the ranks ``srun`` started must match the trainer's devices × nodes, and
environment switches must be valid."""

from __future__ import annotations

import os
import re
from typing import Any

from accrot import runtime
from accrot.errors import UsageError
from accrot.ops import cpu_kernels, gpu_kernels


def device_count(devices: Any) -> int | None:
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        return devices if devices > 0 else None
    if isinstance(devices, (list, tuple)):
        return len(devices)
    text = str(devices).strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    if "," in text:
        return len([d for d in text.split(",") if d.strip()])
    return None  # "auto", -1: Lightning takes what the launch gives


def check_launch(trainer_cfg) -> None:
    """Under ``srun``, ``trainer.devices × trainer.num_nodes`` must equal the job step's task count; Lightning
    only compares ``--ntasks-per-node`` and ``--nodes`` when SLURM sets them (``srun -n1`` does not)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment  # (imports torch: not at module load)

    tasks = os.environ.get("SLURM_NTASKS")
    if tasks is None or not tasks.isdigit() or not SLURMEnvironment.detect():
        return
    devices, nodes = device_count(trainer_cfg.get("devices")), device_count(trainer_cfg.get("num_nodes") or 1)
    if devices is None or nodes is None:
        return
    if devices * nodes != int(tasks):
        raise UsageError(
            f"trainer.devices={devices} x trainer.num_nodes={nodes} = {devices * nodes} ranks, but srun started "
            f"{tasks} task(s) (SLURM_NTASKS={tasks}); launch srun with --nodes={nodes} --ntasks-per-node={devices}, "
            f"or set --trainer.devices and --trainer.num_nodes to the job's layout")


# every environment switch that takes one of a few choices, and the function that reads (and checks) it: all are
# checked before any work, like a bad option; a switch the code gains gets its row here (a test reads the code's
# ACCROT_ names and finds each here or in FREE_FORM)
SWITCHES = {"ACCROT_CPU_KERNELS": cpu_kernels.mode, "ACCROT_GPU_KERNELS": gpu_kernels.mode,
            "ACCROT_DENORMALS": runtime.denormal_mode, "ACCROT_MALLOC": runtime.allocator_mode}
# the names that take a path, a URL or what a sweep hands its workers: read as given
FREE_FORM = ("ACCROT_KERNEL_DIR", "ACCROT_PEER_DIR", "ACCROT_SWEEP_STORAGE", "ACCROT_SWEEP_DEADLINE",
             "ACCROT_WORKER_SPAWNED_AT")


def check_environment(environ: dict[str, str] | None = None) -> None:
    """Every environment switch (:data:`SWITCHES`) fails before any work, like a bad option; so does a name that
    is a misspelling of one (a switch name missing its last letter would otherwise change nothing, silently)."""
    import difflib

    environ = os.environ if environ is None else environ
    for read in SWITCHES.values():
        try:
            read()
        except ValueError as err:
            raise UsageError(str(err)) from None
    known = [*SWITCHES, *FREE_FORM]
    for name in sorted(n for n in environ if n.startswith("ACCROT_") and n not in known):
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
        if close:
            raise UsageError(f"{name}={environ[name]!r} is not a switch accrot reads; did you mean {close[0]}? "
                             f"(switches: {', '.join(SWITCHES)})")

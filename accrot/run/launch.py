"""Checks of a launch before any work: the ranks ``srun`` started must match the trainer's devices × nodes, and
environment switches must be valid."""

from __future__ import annotations

import os
import re
from typing import Any

from accrot import runtime
from accrot.errors import UsageError
from accrot.ops import cpu_kernels


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


def check_environment() -> None:
    """Environment switches (``ACCROT_CPU_KERNELS``, ``ACCROT_DENORMALS``, ``ACCROT_MALLOC``) fail before any
    work, like a bad option."""
    try:
        cpu_kernels.mode()
        runtime.denormal_mode()
        runtime.allocator_mode()
    except ValueError as err:
        raise UsageError(str(err)) from None

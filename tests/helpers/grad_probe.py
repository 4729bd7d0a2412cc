"""A callback for the DDP tests: saves every parameter's gradient, as the optimiser will see it, at one step.

Used as ``--trainer.callbacks+=tests.helpers.grad_probe.SaveGradients`` with ``ACCROT_TEST_GRADS=<dir>`` and
``ACCROT_TEST_GRAD_STEP=<step>``: after DDP's all-reduce and before clipping, rank r writes ``<dir>/rank<r>.pt``.
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import torch


class SaveGradients(L.Callback):
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if trainer.global_step != int(os.environ["ACCROT_TEST_GRAD_STEP"]):
            return
        grads = {n: p.grad.detach().clone() for n, p in pl_module.named_parameters() if p.grad is not None}
        out = Path(os.environ["ACCROT_TEST_GRADS"])
        out.mkdir(parents=True, exist_ok=True)
        torch.save(grads, out / f"rank{trainer.global_rank}.pt")

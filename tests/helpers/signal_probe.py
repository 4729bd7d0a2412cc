"""A callback for the interrupt tests: the run sends itself a signal, as a terminal's Ctrl-C would, at a known step.

Used as ``--trainer.callbacks+=tests.helpers.signal_probe.SignalAt`` with ``ACCROT_TEST_SIGNAL=INT`` (or ``TERM``) and
``ACCROT_TEST_SIGNAL_STEPS=5`` (``5,5`` sends it twice at that step: a user who presses Ctrl-C again). Sent from
inside a step, it lands exactly where a user's would: between two Python bytecodes of the training loop.
"""

from __future__ import annotations

import os
import signal

import lightning as L


class SignalAt(L.Callback):
    def __init__(self) -> None:
        # without the variables (the run resumed from its saved config.yaml, which names this callback): inert
        steps = os.environ.get("ACCROT_TEST_SIGNAL_STEPS", "")
        self.steps = [int(s) for s in steps.split(",") if s.strip()]
        self.signum = signal.Signals[f"SIG{os.environ.get('ACCROT_TEST_SIGNAL', 'INT')}"]

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx) -> None:
        for step in self.steps:
            if trainer.global_step == step:
                os.kill(os.getpid(), self.signum)

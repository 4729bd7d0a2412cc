"""Theory diagnostics while training (T1–T5 of accrot/study/CLAIMS.md): at the end of training and every N steps.

Runs :func:`accrot.diagnostics.diagnose` on the data module's fixed evaluation blocks, writes
``diagnostics/diagnostics.json`` and its PNGs into the run directory (rank 0) and logs per-layer scalars
(means over heads) to every logger: ``diag/window@layer{i}`` (the measured mixing window at the training length;
inf when the coherence never fell below ε) and ``diag/far_mass@{m}x@layer{i}``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import lightning as L
import torch

from accrot.diagnostics import FRESH_DRAWS, diagnose, plot_diagnostics, summary
from accrot.io import atomic_write_text
from callbacks.cadence import Periodic


class DiagnosticsCallback(Periodic):
    """Coherence, mixing windows, far mass and value far norms of the model being trained.

    Args:
        every_n_steps: diagnose every N optimiser steps (0: only at the end of training).
        multipliers: lengths as multiples of the training length ``datamodule.seq_len``.
        blocks: blocks per length, spread over the validation split: the replicates of the model's own transport
            (its windows' jackknife error bars) and of the far mass (queries are subsampled inside each block).
        eps: ε of the mixing window.
        far_window: far = keys more than this many tokens back (None: training length / 4).
        dirname: folder inside the run directory.
        draws: fresh increment draws per block for the coherence of random increments (the error bars are across
            blocks × draws; fewer draws are cheaper and wider).
    """

    setup_stages = ("fit",)  # the blocks are cut for training only (the extrapolation callback's for any stage)
    phase = "diagnostics"

    def __init__(
        self,
        every_n_steps: int = 0,
        multipliers: list[float] = [1, 8, 32],  # noqa: B006 - jsonargparse shows the default
        blocks: int = 16,
        eps: float = 0.05,
        far_window: int | None = None,
        dirname: str = "diagnostics",
        draws: int = FRESH_DRAWS,
    ) -> None:
        super().__init__(every_n_steps)
        if isinstance(draws, bool) or not isinstance(draws, int) or draws < 2:
            raise ValueError(f"draws={draws!r} is not valid; at least 2 fresh draws (an error bar needs a spread)")
        self.draws = draws
        if not multipliers or any(not m > 0 for m in multipliers):
            raise ValueError(f"multipliers={multipliers!r} is not valid; give positive multiples of the training length")
        if blocks < 1:
            raise ValueError(f"blocks={blocks!r} is not valid; it must be a positive integer")
        if not 0.0 < eps < 1.0:
            raise ValueError(f"eps={eps!r} is not valid; it must lie in (0, 1)")
        self.multipliers = sorted(float(m) for m in multipliers)
        self.blocks = blocks
        self.eps = eps
        self.far_window = far_window
        self.dirname = dirname
        self.last_result: dict | None = None
        self._blocks: dict[int, torch.Tensor] | None = None


    def cut(self, dm) -> None:
        """``blocks`` blocks of every length."""
        lengths = sorted({max(2, round(m * self.train_length)) for m in self.multipliers})
        # spread over the whole validation split, as the evaluation's own blocks are
        self._blocks = {n: dm.eval_blocks(n, self.blocks * n, record=False)[:, :n] for n in lengths}  # [N, n] each

    def run(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        """Diagnose on every rank (same blocks, same weights: no collective needed), write on rank 0."""
        self.prepare(trainer.datamodule)
        self._last_step = trainer.global_step
        t0 = time.perf_counter()
        model = getattr(pl_module, "model", pl_module)
        result = diagnose(model, self._blocks, self.train_length, eps=self.eps, far_window=self.far_window,
                          draws=self.draws)
        result.update(step=trainer.global_step, seconds=round(time.perf_counter() - t0, 3))
        self.last_result = result
        metrics = {}
        first = result["layers"][0]["coherence"][0]["length"]  # the training length when multipliers hold 1
        for row in summary(result):
            i = row["layer"]
            metrics[f"diag/window@layer{i}"] = row[f"window@{first}"]
            for n in result["lengths"]:
                metrics[f"diag/far_mass@{n / self.train_length:g}x@layer{i}"] = row[f"far_mass@{n}"]
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        out = Path(trainer.log_dir or trainer.default_root_dir) / self.dirname  # a broadcast under DDP: every rank
        if trainer.is_global_zero:
            out.mkdir(parents=True, exist_ok=True)
            plot_diagnostics(result, out)
            atomic_write_text(out / "diagnostics.json", json.dumps(result, indent=1))
        return result

    def state_dict(self) -> dict:
        return {"last_step": self._last_step}

    def load_state_dict(self, state_dict: dict) -> None:
        self._last_step = state_dict.get("last_step", -1)

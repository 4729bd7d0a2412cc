"""Evaluate at many lengths while training: every N steps and at the end.

Writes ``extrapolation.json`` (schema in callbacks/README.md) and ``extrapolation.png`` into the run directory
and logs ``extrap/nll@{m}x`` (plus last-window NLL) to every active logger.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import lightning as L

from accrot.evaluation import (
    SAME_TARGET_ANCHORS,
    SCHEMA,
    EvalSets,
    LengthResult,
    eval_sets,
    evaluate_lengths,
    evaluate_same_targets,
    evaluate_sliding,
    nll_table,
    plot_curves,
    rise_table,
    same_target_budget,
)
from accrot.io import atomic_write_text
from accrot.position import SchemeConfig
from accrot.position.rope_scaling import SCALINGS, RopeScaling, apply_rope_scaling
from callbacks.cadence import Periodic


def _check_output(max_batch_tokens, filename) -> None:
    """What the evaluation writes and how it batches, refused before training rather than after it."""
    if isinstance(max_batch_tokens, bool) or not isinstance(max_batch_tokens, int) or max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens={max_batch_tokens!r} is not valid; give a positive number of tokens")
    if not str(filename).strip() or "/" in str(filename) or not str(filename).endswith(".json"):
        # written into the run directory itself, once training is done
        raise ValueError(f"filename={filename!r} is not valid; give a file name ending in .json (no folder)")


class ExtrapolationCallback(Periodic):
    """Multi-length evaluation on the data module's fixed evaluation blocks.

    Args:
        multipliers: evaluation lengths as multiples of the training length ``datamodule.seq_len``.
        budget_tokens: scored tokens per length (the same for every length and every model).
        min_blocks: at least this many blocks per length (the longest lengths then score more than the budget:
            their per-block NLLs are the text's replicates in the study's intervals).
        every_n_steps: evaluate every N optimiser steps (0: only at the end of training).
        max_batch_tokens: tokens per forward pass during evaluation (memory knob, not a result knob).
        filename: JSON written into the run directory (the PNG takes the same stem).
        sliding_multipliers: lengths (multiples of L) at which to add sliding-window NLL (analysis; [] = none).
        sliding_stride: stride of the sliding windows (default: L / 2).
        rope_scaling: evaluate a RoPE model with an evaluation-time length extension (pi, ntk, yarn, yarn-paper,
            llama3: accrot.position.rope_scaling); training is never scaled. None: as trained.
        rope_factor: the extension's factor s (None: s = T / L at each evaluation length T).
        same_target_anchors: windows per length of the same-target rise (0 = none): on a corpus (a data module
            that scores every token), every length also scores the same targets, the last L/4 tokens of windows
            ending at anchors spread over the validation stream, each with m·L tokens of context; the rise
            NLL(m) − NLL(1×) is paired per anchor (accrot.evaluation.evaluate_same_targets).
    """

    def __init__(
        self,
        multipliers: list[float] = [1, 2, 4, 8, 16, 32],  # noqa: B006 - jsonargparse shows the default
        budget_tokens: int = 32768,
        min_blocks: int = 1,
        every_n_steps: int = 0,
        max_batch_tokens: int = 16384,
        filename: str = "extrapolation.json",
        sliding_multipliers: list[float] = [],  # noqa: B006
        sliding_stride: int | None = None,
        rope_scaling: str | None = None,
        rope_factor: float | None = None,
        same_target_anchors: int = SAME_TARGET_ANCHORS,
    ) -> None:
        super().__init__(every_n_steps)
        if not isinstance(same_target_anchors, int) or same_target_anchors < 0:
            raise ValueError(f"same_target_anchors={same_target_anchors!r} is not valid; give 0 (none) or more windows")
        self.same_target_anchors = same_target_anchors
        if rope_scaling is not None:  # checked here: a typo fails before any training
            RopeScaling(rope_scaling, 1, rope_factor)
        elif rope_factor is not None:
            raise ValueError(f"rope_factor is set without rope_scaling; add rope_scaling: {', '.join(SCALINGS)}")
        self.rope_scaling, self.rope_factor = rope_scaling, rope_factor
        if not multipliers or any(not (m > 0 and math.isfinite(m)) for m in multipliers):
            raise ValueError(f"multipliers={multipliers!r} is not valid; give positive multiples of the training length")
        if len(set(multipliers)) != len(multipliers):  # any order is fine (the ladder is sorted); twice is a typo
            twice = sorted({m for m in multipliers if list(multipliers).count(m) > 1})
            raise ValueError(f"multipliers={multipliers!r} is not valid; {', '.join(f'{m:g}' for m in twice)} "
                             "given twice (each length is evaluated once)")
        self.multipliers = sorted(float(m) for m in multipliers)
        if min_blocks < 1:
            raise ValueError(f"min_blocks={min_blocks!r} is not valid; at least 1 block per length")
        self.budget_tokens, self.min_blocks = budget_tokens, min_blocks
        _check_output(max_batch_tokens, filename)
        self.max_batch_tokens = max_batch_tokens
        self.filename = filename
        self.sliding_multipliers = sorted(float(m) for m in sliding_multipliers)
        if sliding_stride is not None and not self.sliding_multipliers:  # it would change nothing
            raise ValueError(f"sliding_stride={sliding_stride!r} has no effect without sliding_multipliers; add "
                             "sliding_multipliers (e.g. [1, 4]) or drop sliding_stride")
        if sliding_stride is not None and (not isinstance(sliding_stride, int) or sliding_stride < 1):
            raise ValueError(f"sliding_stride={sliding_stride!r} is not valid; give a positive number of tokens")
        self.sliding_stride = sliding_stride
        self.history: list[dict] = []
        self._sets: EvalSets | None = None

    # -- set-up: cut the evaluation blocks once, failing before any training if the stream is too short --
    def lengths_for(self, train_length: int) -> list[int]:
        return sorted({max(1, int(round(m * train_length))) for m in self.multipliers})

    def cut(self, dm) -> None:
        self._sets = eval_sets(dm, self.lengths_for(self.train_length), self.budget_tokens, self.min_blocks)

    # -- the evaluation ---------------------------------------------------------------------------------
    def run(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[LengthResult]:
        self._last_step = trainer.global_step
        was_training = pl_module.training
        pl_module.eval()
        t0 = time.perf_counter()
        scaling = None if self.rope_scaling is None else RopeScaling(self.rope_scaling, self.train_length,
                                                                    self.rope_factor)
        apply_rope_scaling(pl_module, scaling)
        try:
            with trainer.strategy.precision_plugin.forward_context():
                results = evaluate_lengths(
                    pl_module, self._sets.blocks, self.train_length, self.max_batch_tokens, device=pl_module.device,
                    masks=self._sets.masks, depths=self._sets.depths, targets=self._sets.targets,
                    shard=(trainer.global_rank, trainer.world_size),  # blocks split over ranks
                )
                sliding = self._sliding(trainer.datamodule, pl_module)
                same = self._same_targets(trainer.datamodule, pl_module)
        finally:
            if scaling is not None:
                apply_rope_scaling(pl_module, None)  # training goes on as trained
            pl_module.train(was_training)
        entry = {
            "step": trainer.global_step,
            "seconds": round(time.perf_counter() - t0, 3),
            "lengths": [r.to_dict() for r in results],
        }
        if scaling is not None:
            entry["rope_scaling"] = scaling.record()  # what ran: kind, factor and definition
        if sliding:
            entry["sliding"] = sliding
        if same is not None:
            entry["same_targets"] = same
        self.history.append(entry)
        metrics = {}
        for r in results:
            m = f"{r.multiplier:g}x"
            metrics[f"extrap/nll@{m}"] = r.nll
            metrics[f"extrap/last_window_nll@{m}"] = r.last_window_nll
            metrics[f"extrap/accuracy@{m}"] = r.accuracy
        for row in (same or {}).get("lengths", []):
            metrics[f"extrap/rise@{row['multiplier']:g}x"] = row["rise"]
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
            if type(logger).__name__ == "WandbLogger":
                self._log_wandb_curves(logger, results, trainer.global_step)
        out = self.run_dir(trainer)  # every rank asks: under DDP trainer.log_dir is a broadcast from rank 0
        if trainer.is_global_zero:
            self.write(trainer, pl_module, out)
        return results

    def _log_wandb_curves(self, logger, results: list[LengthResult], step: int) -> None:
        """wandb gets the same two curves as the PNG, as native line plots."""
        import wandb

        by_length = wandb.Table(columns=["length", "nll", "last_window_nll"],
                                data=[[r.length, r.nll, r.last_window_nll] for r in results])
        longest = results[-1]
        by_position = wandb.Table(columns=["position", "nll"],
                                  data=[[(i + 0.5) * longest.bucket_width, v] for i, v in enumerate(longest.bucket_nll)
                                        if v is not None])
        logger.experiment.log({
            "extrap/nll_vs_length": wandb.plot.line(by_length, "length", "nll", title=f"NLL vs length (step {step})"),
            "extrap/nll_vs_position": wandb.plot.line(
                by_position, "position", "nll", title=f"per-position NLL at {longest.length} (step {step})"
            ),
            "trainer/global_step": step,
        })

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The final curve as a table in the terminal (after the progress bar has closed)."""
        if trainer.is_global_zero and self.history:
            from rich.console import Console

            scheme = SchemeConfig.of(pl_module.hparams.get("scheme"))
            label = scheme.label() if scheme is not None else "?"
            step, rows = self.history[-1]["step"], {label: self.history[-1]["lengths"]}
            Console().print(nll_table(rows, self.train_length,
                                      title=f"NLL (nats/token) per evaluation length at step {step}"))
            same = self.history[-1].get("same_targets")
            if same is not None:
                Console().print(rise_table({label: same}, self.train_length))
            if self._sets is not None and self._sets.masks is not None:  # a task: its answers' accuracy too
                Console().print(nll_table(rows, self.train_length, field_="accuracy",
                                          title=f"answer accuracy per evaluation length at step {step}"))

    def _sliding(self, dm, pl_module) -> list[dict]:
        if not self.sliding_multipliers or not hasattr(dm, "val_stream"):
            return []
        stride = self.sliding_stride or max(1, self.train_length // 2)
        out = []
        for m in self.sliding_multipliers:
            context = max(1, int(round(m * self.train_length)))
            row = evaluate_sliding(pl_module, dm.val_stream, context, min(stride, context), self.budget_tokens,
                                   self.max_batch_tokens, device=pl_module.device)
            out.append({"multiplier": m, **row})
        return out

    def _same_targets(self, dm, pl_module) -> dict | None:
        """The same-target rise on a corpus (every token scored); None for a task that scores answers only, whose
        targets are its answers, or with ``same_target_anchors=0``."""
        # answers first: a task's data module may have no token stream at all (hasattr would raise its error)
        if not self.same_target_anchors or self._sets.masks is not None or not hasattr(dm, "val_stream"):
            return None
        t0 = time.perf_counter()
        lengths = self.lengths_for(self.train_length)
        same = evaluate_same_targets(pl_module, dm.val_stream, lengths, self.train_length,
                                     anchors=same_target_budget(self.same_target_anchors, lengths, self.budget_tokens),
                                     max_batch_tokens=self.max_batch_tokens, device=pl_module.device)
        return {**same, "seconds": round(time.perf_counter() - t0, 3)}

    def run_dir(self, trainer: L.Trainer) -> Path:
        return Path(trainer.log_dir or trainer.default_root_dir)

    def write(self, trainer: L.Trainer, pl_module: L.LightningModule, out: Path | None = None) -> None:
        out = self.run_dir(trainer) if out is None else out
        out.mkdir(parents=True, exist_ok=True)
        dm = trainer.datamodule
        doc = {
            "schema": SCHEMA,
            "train_length": self.train_length,
            "budget_tokens": self.budget_tokens,
            "min_blocks": self.min_blocks,
            "scheme": pl_module.hparams.get("scheme"),
            "data": dm.describe() if hasattr(dm, "describe") else {},
            "final": self.history[-1],
            "history": self.history,
        }
        atomic_write_text(out / self.filename, json.dumps(doc, indent=1))
        curves = {f"step {h['step']}": h["lengths"] for h in self.history[-4:]}
        plot_curves(curves, self.train_length, out / Path(self.filename).with_suffix(".png"),
                    title=f"{pl_module.hparams.get('scheme', {}).get('rotation', '')} / "
                    f"{pl_module.hparams.get('scheme', {}).get('far_mass', '')}")

    # -- resumable history --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"history": self.history, "last_step": self._last_step}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = list(state_dict.get("history", []))
        self._last_step = state_dict.get("last_step", -1)

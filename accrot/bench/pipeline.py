"""``accrot bench pipeline``: what the Lightning training loop costs over a bare PyTorch loop.

Both loops train the *same* model (:class:`~accrot.lit.LitLM` at the tiny and the small recipe's shape, same
initial weights) on the same batches, with the same optimiser and schedule (``LitLM.configure_optimizers``) and
gradient clipping:

* bare: ``logits = model(x)``; cross-entropy; ``backward``; ``clip_grad_norm_``; ``optimizer.step``;
  ``scheduler.step``; ``zero_grad`` — nothing else;
* Lightning: ``Trainer.fit`` with accrot's LitLM as trained by ``accrot fit`` (the logged loss, perplexity and
  learning rate, the finite-loss and finite-gradient checks), no progress bar, logger or checkpoints (those are
  I/O, not loop overhead; ``--with_logger`` adds the CSV logger).

Paired steps: a callback runs bare step i (on its own copy of the model) at the start of Lightning's step i, so
every Lightning step has a bare twin measured moments before it; Lightning's step is the time from the end of
the bare step to the start of the next batch. On a shared machine, bursts of load seconds long hit both halves of
a pair alike, which alternating whole loops could not promise. Reported per size after ``warmup`` pairs: the
median over pairs of the per-pair ratio (``×``), the ratio of the minima (``×min``) and the median step times.
Targets: ≤ 1.05× at tiny, ≤ 1.02× at small (where the step is long enough to hide the loop).
"""

from __future__ import annotations

import copy
import logging
import statistics
import time
import warnings
from typing import Any

import torch
import torch.nn.functional as F

TARGETS = {"tiny": 1.05, "small": 1.02}
# the shipped recipes' shapes; the small batch is cut from 32 to 4 to keep the run short (the loop's cost per
# step does not depend on the batch, so this is the harder case for the target)
SHAPES = {"tiny": {"d_model": 64, "n_layers": 2, "n_heads": 4, "batch": 16, "seq_len": 128},
          "small": {"d_model": 256, "n_layers": 6, "n_heads": 8, "batch": 4, "seq_len": 512}}


def fixed_batches(vocab: int, batch: int, seq_len: int, n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(0, vocab, (batch, seq_len + 1), generator=g)  # [B, T + 1]
        out.append((x[:, :-1].contiguous(), x[:, 1:].contiguous()))
    return out


class BareLoop:
    """The bare PyTorch training step of ``module`` (its own optimiser and schedule, built as Lightning builds them)."""

    def __init__(self, module, clip: float, max_steps: int) -> None:
        from types import SimpleNamespace

        self.model, self.clip = module.model, clip
        module._trainer = SimpleNamespace(max_steps=max_steps)  # the schedule's length, as a Trainer would give it
        opt_cfg = module.configure_optimizers()
        module._trainer = None
        self.optimizer = opt_cfg["optimizer"]
        self.scheduler = opt_cfg["lr_scheduler"]["scheduler"]
        self.model.train()

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        t0 = time.perf_counter()
        logits = self.model(x)  # [B, T, V]
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t0


def bare(module, batches, clip: float, max_steps: int) -> list[float]:
    """Seconds per step of the bare loop over ``batches``."""
    loop = BareLoop(module, clip, max_steps)
    return [loop.step(x, y) for x, y in batches]


def lightning_loop(module, batches, clip: float, max_steps: int, with_logger: bool, root: str,
                   paired: BareLoop | None = None) -> list[float] | tuple[list[float], list[float]]:
    """Seconds per Lightning step over ``batches``; with ``paired``, also its bare twin's, step by step
    (``(lightning, bare)``)."""
    import lightning as L
    from torch.utils.data import DataLoader

    light: list[float] = []
    twins: list[float] = []
    state: dict[str, float] = {}

    class Pairs(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            now = time.perf_counter()
            if "started" in state:
                light.append(now - state["started"])
            if paired is not None:
                twins.append(paired.step(*batches[batch_idx]))
            state["started"] = time.perf_counter()

        def on_train_end(self, trainer, pl_module):
            light.append(time.perf_counter() - state["started"])

    logger: Any = False
    if with_logger:
        from lightning.pytorch.loggers import CSVLogger

        logger = CSVLogger(root, name="bench_pipeline")
    loader = DataLoader(batches, batch_size=None, shuffle=False)  # the same pre-built batches, in order
    quiet = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric", "accrot.lit")]
    levels = [lg.level for lg in quiet]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's hints (srun, no val loader, few workers) are not results
        for lg in quiet:
            lg.setLevel(logging.ERROR)  # nor its "GPU available" banners, nor a short run's warm-up warning
        try:
            trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=logger,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                gradient_clip_val=clip, num_sanity_val_steps=0, limit_val_batches=0,
                                callbacks=[Pairs()], default_root_dir=root)
            trainer.fit(module, train_dataloaders=loader)
        finally:
            for lg, level in zip(quiet, levels):
                lg.setLevel(level)
    return light if paired is None else (light, twins)


def measure_size(size: str, steps: int, warmup: int, rounds: int, with_logger: bool, seed: int, log) -> dict[str, Any]:
    """Paired Lightning and bare steps of one size (``rounds`` fits of ``steps`` steps each)."""
    import tempfile

    import lightning as L

    from accrot.lit import LitLM

    shape = SHAPES[size]
    if size == "small":  # ~1 s per step on 2 cores: half the steps (at least 10), a shorter warm-up
        steps, warmup = max(10, steps // 2), min(warmup, 3)
    L.seed_everything(seed, verbose=False)
    base = LitLM(d_model=shape["d_model"], n_layers=shape["n_layers"], n_heads=shape["n_heads"], vocab_size=256,
                 lr=3e-3, warmup_steps=max(1, min(30, steps // 3)))  # the schedule leaves its warm-up
    batches = fixed_batches(256, shape["batch"], shape["seq_len"], steps, seed)
    log(f"pipeline {size}: d_model {shape['d_model']}, {shape['n_layers']} layers, B {shape['batch']}, "
        f"T {shape['seq_len']}: {rounds} round(s) × {steps} paired steps, {warmup} warm-up pairs dropped")
    light_all, bare_all = [], []
    with tempfile.TemporaryDirectory() as root:
        for r in range(rounds):
            light, twins = lightning_loop(copy.deepcopy(base), batches, 1.0, steps, with_logger, root,
                                          paired=BareLoop(copy.deepcopy(base), 1.0, steps))
            light_all += light[warmup:]
            bare_all += twins[warmup:]
            log(f"round {r + 1}: lightning {statistics.median(light[warmup:]) * 1e3:.1f} ms, "
                f"bare {statistics.median(twins[warmup:]) * 1e3:.1f} ms")
    ratios = [a / b for a, b in zip(light_all, bare_all)]
    ratio = statistics.median(ratios)
    return {"bare_ms": statistics.median(bare_all) * 1e3, "lightning_ms": statistics.median(light_all) * 1e3,
            "ratio": ratio, "ratio_of_min": min(light_all) / min(bare_all), "pairs": len(ratios),
            "target": TARGETS[size], "meets_target": ratio <= TARGETS[size], "shape": shape}


def run_pipeline(steps: int = 30, warmup: int = 5, rounds: int = 3, sizes=("tiny", "small"),
                 with_logger: bool = False, seed: int = 0, log=print) -> dict[str, Any]:
    """The pipeline report: per size, the paired step times and their ratios."""
    return {"sizes": {size: measure_size(size, steps, warmup, rounds, with_logger, seed, log) for size in sizes},
            "with_logger": with_logger, "settings": {"steps": steps, "warmup": warmup, "rounds": rounds}}


def pipeline_table(res: dict[str, Any]):
    from rich.table import Table

    table = Table(title="training loop: Lightning (accrot fit's LitLM) vs a bare PyTorch loop, same model and batches, "
                        "paired steps")
    for col in ("size", "bare ms/step", "Lightning ms/step", "×", "×min", "pairs", "target"):
        table.add_column(col, justify="right")
    for size, r in res["sizes"].items():
        mark = "✓" if r["meets_target"] else "✗"
        table.add_row(size, f"{r['bare_ms']:.1f}", f"{r['lightning_ms']:.1f}", f"{r['ratio']:.3f}×",
                      f"{r['ratio_of_min']:.3f}×", str(r["pairs"]), f"{mark} ≤ {r['target']:.2f}×")
    return table

"""``accrot bench pipeline``: what the Lightning training loop costs over a bare PyTorch loop.

Both loops train the *same* model (the tiny recipe's :class:`~accrot.lit.LitLM`, same initial weights) on the
same batches, with the same optimiser and schedule (``LitLM.configure_optimizers``) and gradient clipping:

* bare: ``logits = model(x)``; cross-entropy; ``backward``; ``clip_grad_norm_``; ``optimizer.step``;
  ``scheduler.step``; ``zero_grad`` — nothing else;
* Lightning: ``Trainer.fit`` with accrot's LitLM as trained by ``accrot fit`` (per-step logging of loss, perplexity
  and learning rate, the finite-loss and finite-gradient checks), no progress bar, logger or checkpoints (those
  are I/O, not loop overhead; ``--with_logger`` adds the CSV logger).

The step time of each is measured between consecutive ``on_train_batch_start`` hooks (Lightning) and around
each bare step, after ``--warmup`` steps; rounds alternate the two loops ``--rounds`` times in one process (this
machine is shared and noisy) and the report gives the median of the per-round ratios of median step times and
the ratio of the minima. Target: ≤ 1.10×.
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

TARGET = 1.10


def fixed_batches(vocab: int, batch: int, seq_len: int, n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(0, vocab, (batch, seq_len + 1), generator=g)  # [B, T + 1]
        out.append((x[:, :-1].contiguous(), x[:, 1:].contiguous()))
    return out


def bare(module, batches, clip: float, max_steps: int) -> list[float]:
    from types import SimpleNamespace

    model = module.model
    module._trainer = SimpleNamespace(max_steps=max_steps)  # the schedule's length, as a Trainer would give it
    opt_cfg = module.configure_optimizers()
    module._trainer = None
    optimizer = opt_cfg["optimizer"]
    scheduler = opt_cfg["lr_scheduler"]["scheduler"]
    times = []
    model.train()
    for x, y in batches:
        t0 = time.perf_counter()
        logits = model(x)  # [B, T, V]
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times


def lightning_loop(module, batches, clip: float, max_steps: int, with_logger: bool, root: str) -> list[float]:
    import lightning as L
    from torch.utils.data import DataLoader

    stamps: list[float] = []

    class Stamp(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            stamps.append(time.perf_counter())

        def on_train_end(self, trainer, pl_module):
            stamps.append(time.perf_counter())

    logger: Any = False
    if with_logger:
        from lightning.pytorch.loggers import CSVLogger

        logger = CSVLogger(root, name="bench_pipeline")
    loader = DataLoader(batches, batch_size=None, shuffle=False)  # the same pre-built batches, in order
    quiet = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in quiet]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's hints (srun, no val loader, few workers) are not results
        for lg in quiet:
            lg.setLevel(logging.WARNING)  # nor its "GPU available" banners, three per round
        try:
            trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=logger,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                gradient_clip_val=clip, num_sanity_val_steps=0, limit_val_batches=0,
                                callbacks=[Stamp()], default_root_dir=root)
            trainer.fit(module, train_dataloaders=loader)
        finally:
            for lg, level in zip(quiet, levels):
                lg.setLevel(level)
    return [b - a for a, b in zip(stamps, stamps[1:])]


def run_pipeline(steps: int = 30, warmup: int = 5, rounds: int = 3, batch: int = 16, seq_len: int = 128,
                 with_logger: bool = False, seed: int = 0, log=print) -> dict[str, Any]:
    import tempfile

    import lightning as L

    from accrot.lit import LitLM

    L.seed_everything(seed, verbose=False)
    base = LitLM(d_model=64, n_layers=2, n_heads=4, vocab_size=256, lr=3e-3, warmup_steps=30)
    batches = fixed_batches(256, batch, seq_len, steps, seed)
    clip = 1.0
    per_round = []
    bare_all, light_all = [], []
    log(f"pipeline: tiny model, B {batch}, T {seq_len}, {steps} steps × {rounds} round(s) per loop, "
        f"{warmup} warm-up steps dropped")
    with tempfile.TemporaryDirectory() as root:
        for r in range(rounds):
            order = ("bare", "lightning") if r % 2 == 0 else ("lightning", "bare")
            got = {}
            for which in order:
                module = copy.deepcopy(base)
                if which == "bare":
                    t = bare(module, batches, clip, steps)
                else:
                    t = lightning_loop(module, batches, clip, steps, with_logger, root)
                got[which] = t[warmup:]
            bare_all += got["bare"]
            light_all += got["lightning"]
            per_round.append(statistics.median(got["lightning"]) / statistics.median(got["bare"]))
            log(f"round {r + 1}: lightning {statistics.median(got['lightning']) * 1e3:.1f} ms, "
                f"bare {statistics.median(got['bare']) * 1e3:.1f} ms")
    ratio = statistics.median(per_round)
    return {
        "bare_ms": statistics.median(bare_all) * 1e3, "lightning_ms": statistics.median(light_all) * 1e3,
        "ratio": ratio, "ratio_of_min": min(light_all) / min(bare_all), "rounds": per_round,
        "target": TARGET, "meets_target": ratio <= TARGET, "with_logger": with_logger,
        "settings": {"steps": steps, "warmup": warmup, "rounds": rounds, "batch": batch, "seq_len": seq_len},
    }


def pipeline_table(res: dict[str, Any]):
    from rich.table import Table

    table = Table(title="training loop: Lightning (accrot fit's LitLM) vs a bare PyTorch loop, same model and batches")
    for col in ("bare ms/step", "Lightning ms/step", "×", "×min", "target"):
        table.add_column(col, justify="right")
    mark = "✓" if res["meets_target"] else "✗"
    table.add_row(f"{res['bare_ms']:.1f}", f"{res['lightning_ms']:.1f}", f"{res['ratio']:.3f}×",
                  f"{res['ratio_of_min']:.3f}×", f"{mark} ≤ {res['target']:.2f}×")
    return table

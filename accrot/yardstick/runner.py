"""Training and scoring one yardstick run, and the order the runs go in.

A run is ``(protocol, cell, lr, seed)``. The runs of one (protocol, cell) go in two stages: every learning rate of
the protocol's grid on seed 0, then seeds 1.. at the rate whose seed-0 run scored best *at the training lengths*
(never at the test lengths: the grid must not see what it is judged on). Each finished run is one JSON file
(``runs/<protocol>/<cell>/lr<lr>-seed<k>.json``), written atomically, holding its settings, what actually ran (torch,
threads, the revision, the data's fingerprint, the parameter count) and its accuracies; a rerun skips every run
whose file exists with the same settings, so an interrupted yardstick continues where it stopped.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from accrot.errors import UsageError
from accrot.io import atomic_write_text
from accrot.study.variants import WINDOW_FRACTION  # accum-token's window: the study's fraction of L
from accrot.yardstick.cells import CELLS, Cell
from accrot.yardstick.controls import pin
from accrot.yardstick.protocols import PROTOCOLS, Protocol, applies, headline, score


@dataclass(frozen=True)
class Job:
    protocol: str
    cell: str
    lr: float
    seed: int
    steps: int

    @property
    def path(self) -> str:
        return f"runs/{self.protocol}/{self.cell}/lr{self.lr:g}-seed{self.seed}.json"

    def settings(self) -> dict:
        return asdict(self)


def scheme_of(cell: Cell, seq_len: int) -> dict:
    over = dict(cell.scheme)
    if cell.windowed:
        over["window"] = WINDOW_FRACTION * seq_len
    return over


def _count(shape: dict, scheme: dict, mlp_hidden: int | None, control: str = "",
           clock: str | None = None) -> tuple[int, int]:
    """``(parameters, the SwiGLU width the model has)`` of the protocol's shape under ``scheme`` (a control pinned:
    its fixed transport has no parameters)."""
    from accrot.model import ModelConfig, Transformer

    cfg = ModelConfig(vocab_size=256, scheme=scheme, mlp_hidden=mlp_hidden, **shape)
    model = Transformer(cfg)
    if control:
        pin(model, control, clock)
    return sum(p.numel() for p in model.parameters()), cfg.hidden


def matched_hidden(protocol: Protocol, cell: Cell, seq_len: int) -> tuple[int, int, int]:
    """``(mlp_hidden, parameters, NoPE's parameters)``: the SwiGLU width whose total is nearest NoPE's at the default
    width (a hidden unit costs 3·d_model per layer)."""
    shape = protocol.shape
    target, base = _count(shape, {}, None)
    scheme = scheme_of(cell, seq_len)
    n, _ = _count(shape, scheme, base, cell.control, protocol.clock)
    per_unit = 3 * shape["d_model"] * shape["n_layers"]
    hidden = max(1, base - round((n - target) / per_unit))
    n, _ = _count(shape, scheme, hidden, cell.control, protocol.clock)
    return hidden, n, target


def run_job(job: Job, out: str) -> dict:
    """Train and score one run in this process; write its JSON; return the record."""
    import dataclasses

    import lightning as L
    import torch

    from accrot.io import git_revision
    from accrot.lit import LitLM

    # the protocol at this run's steps: a curriculum given in fractions of the steps follows --steps
    protocol, cell = dataclasses.replace(PROTOCOLS[job.protocol], steps=job.steps), CELLS[job.cell]
    start = time.perf_counter()
    L.seed_everything(job.seed, workers=True, verbose=False)
    dm = protocol.data_module(job.seed)
    scheme = scheme_of(cell, dm.seq_len)
    hidden, params, nope = matched_hidden(protocol, cell, dm.seq_len)
    L.seed_everything(job.seed, workers=True, verbose=False)  # the init draws the same whatever matching built
    model = LitLM(lr=job.lr, warmup_steps=protocol.warmup_steps, vocab_size=256, mlp_hidden=hidden, scheme=scheme,
                  **protocol.shape)
    if cell.control:
        pin(model.model, cell.control, protocol.clock)
    trainer = L.Trainer(max_steps=job.steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, deterministic=False)
    trainer.fit(model, datamodule=dm)
    model.eval()
    accuracy = score(model.model, protocol)
    clock = read_clock_of(model.model, protocol)
    loss = model.last_train_loss
    record = {
        "settings": job.settings(),
        "accuracy": accuracy,
        "train": headline(protocol, accuracy, "train"),
        "test": headline(protocol, accuracy, "test"),
        "final_train_loss": float(loss) if loss is not None else None,
        "clock": clock,
        "ran": {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": "cpu",
                "revision": git_revision(Path(__file__).parent), "seconds": round(time.perf_counter() - start, 1),
                "steps": int(trainer.global_step)},
        "model": {"parameters": params, "nope_parameters": nope, "mlp_hidden": hidden, "scheme": scheme,
                  **protocol.shape},
        "data": dm.describe(),
    }
    path = Path(out) / job.path
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def read_clock_of(model, protocol: Protocol) -> dict | None:
    """The learned clock of an SO(2) cell (:func:`accrot.yardstick.angles.read_clock`) on 64 evaluation problems
    at the longest training size; None without an exact clock for the task or an SO(2) layer."""
    import torch

    from accrot.yardstick.angles import read_clock
    from accrot.yardstick.controls import CLOCKS
    from accrot.yardstick.protocols import EVAL_DATA_SEED

    if protocol.clock is None:
        return None
    dm = protocol.data_module(EVAL_DATA_SEED)
    inputs, _, _ = dm.eval_examples(max(protocol.train_sizes), 64)
    modulus, counts = CLOCKS[protocol.clock]
    with torch.no_grad():
        return read_clock(model, inputs, counts, modulus)


def load(out: Path, job: Job) -> dict | None:
    """A finished run's record, or None; a record made with other settings is an error (one line)."""
    path = out / job.path
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        settings = record["settings"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UsageError(f"{path} is not a yardstick run's record ({type(err).__name__}); move it away and rerun") from None
    if settings != job.settings():
        raise UsageError(f"{path} was made with other settings ({settings}); use another --out or the same settings")
    return record


def grid_jobs(protocol: Protocol, cell: str, steps: int) -> list[Job]:
    """Seed 0 at every rate of the grid; none where the cell is a control the protocol has no fixed form of."""
    if not applies(protocol, CELLS[cell]):
        return []
    return [Job(protocol.name, cell, lr, 0, steps) for lr in protocol.lrs]


def choose_lr(protocol: Protocol, grid: list[dict]) -> float:
    """The grid's rate whose seed-0 run scored best at the training lengths (ties: the earlier in the grid)."""
    best = max(range(len(grid)), key=lambda i: (_finite(grid[i]["train"], protocol), -i))
    return grid[best]["settings"]["lr"]


def _finite(value: float, protocol: Protocol) -> float:
    if not math.isfinite(value):
        return -math.inf
    return -value if protocol.kind == "flipflop" else value  # an error rate: lower is better


def seed_jobs(protocol: Protocol, cell: str, lr: float, seeds: int, steps: int) -> list[Job]:
    if not applies(protocol, CELLS[cell]):
        return []
    return [Job(protocol.name, cell, lr, s, steps) for s in range(1, seeds)]


def worker_init() -> None:
    """One thread per worker process (2 workers on 2 cores), the process settings every accrot command makes."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from accrot.runtime import configure_process

    configure_process()
    torch.set_num_threads(1)
    import logging
    import warnings

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")

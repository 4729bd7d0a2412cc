"""DDP correctness on CPU (gloo): the same global batch gives the same model, sharding neither repeats nor drops
a sample, two simulated nodes train and evaluate, and only global rank 0 writes files.

The per-rank batch: ``data.init_args.batch_size`` is per process, so the global batch is ``batch_size ×
trainer.devices × trainer.num_nodes``; one process with batch 8 and two with batch 4 train on the same 8 windows
per step (:class:`data_modules.streams.ResumableSampler`: rank r takes every 2nd index of the epoch's order), and
DDP averages the two ranks' mean gradients, which is the mean over all 8.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data_modules.streams import ResumableSampler

STEPS = 4
TINY = ["--config", "tiny", "--model.d_model=32", "--data.init_args.seq_len=64", "--trainer.accelerator=cpu",
        f"--trainer.max_steps={STEPS}", "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false", "--extrapolation.multipliers=[1, 2]",
        "--extrapolation.budget_tokens=512", "--wandb=disabled", "--name=ddp"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                                   "NODE_RANK", "MASTER_", "PL_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parent.parent), **extra)
    return env


def _fit(root: Path, *args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "accrot.cli", "fit", *TINY, f"--root={root}", *args],
                            env=env or _env(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait(*procs: subprocess.Popen, timeout: float = 240) -> None:
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]


def _weights(root: Path) -> dict[str, torch.Tensor]:
    (run,) = list((root / "ddp").glob("version_*"))
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("world, n", [(2, 100), (2, 7), (3, 50), (4, 9)], ids=lambda v: str(v))
def test_sharding_neither_repeats_nor_drops(world, n):
    """Every rank gets the same count; together they cover the epoch's order once, minus a tail < world."""
    ranks = [list(ResumableSampler(range(n), batch_size=1, seed=3, num_replicas=world, rank=r)) for r in range(world)]
    assert len({len(r) for r in ranks}) == 1
    seen = [i for r in ranks for i in r]
    assert len(seen) == len(set(seen)) == n - n % world


@pytest.mark.distributed
def test_two_gloo_processes_equal_one_process_with_the_same_global_batch(tmp_path):
    """1 process × batch 8 and 2 DDP processes × batch 4 (Lightning's launcher, ``devices=2``) end with the same
    weights; so do 2 simulated nodes × 1 process × batch 4 (MASTER_ADDR/NODE_RANK on one machine), which also
    evaluate (blocks sharded over the ranks) and leave only rank 0's files."""
    single = _fit(tmp_path / "one", "--data.init_args.batch_size=8")
    _wait(single)
    ddp = _fit(tmp_path / "two", "--data.init_args.batch_size=4", "--trainer.devices=2", "--trainer.strategy=ddp",
               env=_env(MASTER_PORT=str(_free_port())))
    _wait(ddp)
    port = str(_free_port())
    cwd = [tmp_path / f"cwd{r}" for r in range(2)]
    nodes = []
    for rank in range(2):
        cwd[rank].mkdir()
        nodes.append(_fit(tmp_path / "nodes", "--data.init_args.batch_size=4", "--trainer.devices=1",
                          "--trainer.num_nodes=2", "--trainer.strategy=ddp", cwd=cwd[rank],
                          env=_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(rank), RANK=str(rank),
                                   LOCAL_RANK="0", WORLD_SIZE="2")))
    _wait(*nodes)

    ref = _weights(tmp_path / "one")
    for name in ("two", "nodes"):
        got = _weights(tmp_path / name)
        assert got.keys() == ref.keys()
        for key in ref:
            if ref[key].is_floating_point():
                err = float((ref[key] - got[key]).norm() / ref[key].norm().clamp_min(1e-12))
                assert err < 1e-4, (name, key, err)

    # the simulated nodes: one run directory with the files of a one-process run, nothing from rank 1
    assert not list(cwd[1].iterdir()) and not list(cwd[0].iterdir())
    assert _files(tmp_path / "nodes") == _files(tmp_path / "one")
    (run,) = list((tmp_path / "nodes" / "ddp").glob("version_*"))
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "finished" and record["step"] == STEPS
    assert record["launch"]["world_size"] == 2 and record["launch"]["num_nodes"] == 2
    evaluated = json.loads((run / "extrapolation.json").read_text())["final"]
    single_eval = json.loads((next((tmp_path / "one" / "ddp").glob("version_*")) / "extrapolation.json")
                             .read_text())["final"]
    assert evaluated["step"] == STEPS
    for a, b in zip(single_eval["lengths"], evaluated["lengths"]):  # same blocks, same model: same NLL
        assert a["blocks"] == b["blocks"] and a["nll"] == pytest.approx(b["nll"], rel=1e-4)

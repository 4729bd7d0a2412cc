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
from tests.helpers.tolerance import assert_close

STEPS, WARMUP, GRAD_STEP = 6, 2, 4  # the gradients compared are those of step 4, past the 2-step warm-up
TINY = ["--config", "tiny", "--model.d_model=32", "--data.init_args.seq_len=64", "--trainer.accelerator=cpu",
        f"--trainer.max_steps={STEPS}", f"--model.warmup_steps={WARMUP}", "--trainer.limit_val_batches=2",
        "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false", "--extrapolation.multipliers=[1, 2]",
        "--extrapolation.budget_tokens=512", "--wandb=disabled", "--name=ddp",
        "--trainer.callbacks+=tests.helpers.grad_probe.SaveGradients"]
SCHEMES = {
    "NoPE": [],
    "accum-random": ["--model.scheme.rotation=accum", "--model.scheme.increments=random_position"],
    "PaTH": ["--model.scheme.rotation=path"],
}


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
    env = dict(env or _env(), ACCROT_TEST_GRADS=str(root / "grads"), ACCROT_TEST_GRAD_STEP=str(GRAD_STEP))
    return subprocess.Popen([sys.executable, "-m", "accrot.cli", "fit", *TINY, f"--root={root}", *args],
                            env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait(*procs: subprocess.Popen, timeout: float = 240) -> None:
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]


def _weights(root: Path) -> dict[str, torch.Tensor]:
    (run,) = list((root / "ddp").glob("version_*"))
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


def _grads(root: Path, rank: int = 0) -> dict[str, torch.Tensor]:
    return torch.load(root / "grads" / f"rank{rank}.pt", map_location="cpu")


def _assert_same_model(ref_root: Path, root: Path, what: str) -> None:
    """The gradient of step GRAD_STEP (past the warm-up) and the final weights equal the single process's. A
    gradient summed over the ranks instead of averaged would be 2× (AdamW alone would hide it in the weights)."""
    ref, got = _grads(ref_root), _grads(root)
    assert got.keys() == ref.keys() and ref
    for key in ref:
        assert_close(ref[key], got[key], 1e-4, f"{what}: grad {key}")
    ref_w, got_w = _weights(ref_root), _weights(root)
    assert got_w.keys() == ref_w.keys()
    for key in ref_w:
        if isinstance(ref_w[key], torch.Tensor) and ref_w[key].is_floating_point():
            assert_close(ref_w[key], got_w[key], 1e-4, f"{what}: weight {key}")
        elif not isinstance(ref_w[key], torch.Tensor):  # extra state: the random increments' draw count
            assert ref_w[key] == got_w[key], (what, key)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "grads" not in p.parts}


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
    # independent runs, started together: their start-ups (imports, gloo) overlap
    single = _fit(tmp_path / "one", "--data.init_args.batch_size=8")
    ddp = _fit(tmp_path / "two", "--data.init_args.batch_size=4", "--trainer.devices=2", "--trainer.strategy=ddp",
               env=_env(MASTER_PORT=str(_free_port())))
    _wait(single, ddp)
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

    for name in ("two", "nodes"):
        _assert_same_model(tmp_path / "one", tmp_path / name, name)
        rank0, rank1 = _grads(tmp_path / name, 0), _grads(tmp_path / name, 1)
        assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)  # after the all-reduce every rank has the mean

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


@pytest.mark.distributed
@pytest.mark.parametrize("scheme", ["accum-random", "PaTH"])
def test_ddp_gradient_is_the_single_process_gradient(scheme, tmp_path):
    """Random increments (redrawn every step: each rank keeps its rows of the global batch's draw) and PaTH
    (data-dependent transforms, chunked kernel): 2 DDP ranks × batch 4 give one process's batch-8 gradient."""
    single = _fit(tmp_path / "one", "--data.init_args.batch_size=8", *SCHEMES[scheme])  # both at once
    ddp = _fit(tmp_path / "two", "--data.init_args.batch_size=4", "--trainer.devices=2", "--trainer.strategy=ddp",
               *SCHEMES[scheme], env=_env(MASTER_PORT=str(_free_port())))
    _wait(single, ddp)
    _assert_same_model(tmp_path / "one", tmp_path / "two", scheme)


def test_random_increments_shard_the_global_draw():
    """Rank r of W draws the rows r, r + W, … of what one process draws for the whole global batch."""
    from accrot.model import ModelConfig, Transformer
    from accrot.position import SchemeConfig
    from accrot.position.accum import RandomPositionIncrements

    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4,
                      scheme=SchemeConfig(rotation="accum", increments="random_position"))
    tokens = torch.randint(0, 256, (6, 16))
    whole = Transformer(cfg).train()
    parts = [Transformer(cfg).train() for _ in range(3)]
    for rank, part in enumerate(parts):
        part.set_data_shard(rank, 3)
    def draws(model: Transformer, rows: torch.Tensor) -> list[torch.Tensor]:  # one [B, H, T, P] per layer
        incs = [m for m in model.modules() if isinstance(m, RandomPositionIncrements)]
        return [inc(torch.zeros(*rows.shape, 32), rows) for inc in incs]

    full = draws(whole, tokens)
    assert len(full) == 2
    for rank, part in enumerate(parts):
        for layer, got in enumerate(draws(part, tokens[rank::3])):
            assert torch.equal(got, full[layer][rank::3])
    assert not torch.equal(full[0], full[1])  # layers draw independently

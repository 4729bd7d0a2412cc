"""Sharded evaluation under a real 2-process gloo group equals the single-process numbers."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from accrot.evaluation import evaluate_lengths
from tests.conftest import tiny_model


def _sets():
    gen = torch.Generator().manual_seed(1)
    blocks = {16: torch.randint(0, 256, (7, 17), generator=gen), 64: torch.randint(0, 256, (3, 65), generator=gen),
              128: torch.randint(0, 256, (1, 129), generator=gen)}  # 1 block < 2 ranks: scored whole on each
    masks = {ln: torch.rand(b.shape[0], ln, generator=gen) < 0.7 for ln, b in blocks.items()}
    return blocks, masks


def _worker(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        blocks, masks = _sets()
        results = evaluate_lengths(tiny_model(rotation="rope").eval(), blocks, 16, max_batch_tokens=64, masks=masks, shard=(rank, world))
        with open(f"{out}.{rank}", "w") as f:
            json.dump([r.to_dict() for r in results], f)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.distributed
def test_two_rank_sharded_evaluation_equals_single_process(tmp_path):
    out = str(tmp_path / "res")
    mp.start_processes(_worker, args=(2, _free_port(), out), nprocs=2, start_method="spawn", join=True)
    blocks, masks = _sets()
    single = [r.to_dict() for r in evaluate_lengths(tiny_model(rotation="rope").eval(), blocks, 16, masks=masks)]
    for rank in range(2):
        sharded = json.loads((tmp_path / f"res.{rank}").read_text())
        assert len(sharded) == len(single)
        for a, b in zip(single, sharded):
            assert a.keys() == b.keys()
            for key in a:
                want, got = a[key], b[key]
                if isinstance(want, list) and None in want:  # buckets that scored nothing: None on both sides
                    assert [v is None for v in got] == [v is None for v in want], (a["length"], key)
                    want, got = [v for v in want if v is not None], [v for v in got if v is not None]
                expected = want if want is None else pytest.approx(want, rel=1e-9, abs=1e-12)
                assert got == expected, (a["length"], key)

"""The GPU path end to end: every shipped config × every scheme cell trains two steps and evaluates on
CUDA in bf16-mixed, and a run killed on CUDA and resumed continues the uninterrupted one. Every test here is
gpu-marked and skips without CUDA (the kernels' own CUDA cases are parameters of the twin tests in tests/ops and
tests/position); ``make gpu-check`` runs them all and writes results/gpu-check/REPORT.md.

Tolerance of a resumed CUDA run: the random increments' draws continue bit for bit (the counter-based stream is a
function of the saved draw count) and the draw counts equal; losses and evaluation NLLs agree to 1e-5 relative
(float32, no deterministic mode: CUDA's attention and embedding backward accumulate with atomics, so float sums
may be reordered between two runs — the CPU suite asserts equality, CUDA allows this much).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from accrot.bench.grid import Cell, grid
from accrot.cli import main
from accrot.run.args import CONFIG_DIR
from tests.helpers.fault_injection import numbers, rows
from tests.helpers.fla import needs_fla

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SHIPPED = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
CELLS = [*grid(), Cell("accum", "none", False, "random_token"), Cell("accum", "forget", True, "random_token")]
GPU = ["--trainer.accelerator=gpu", "--trainer.devices=1"]
QUICK = ["--trainer.enable_progress_bar=false", "--wandb=disabled", "--extrapolation.budget_tokens=2048",
         "--trainer.limit_val_batches=1"]
RESUME_RTOL = 1e-5


def cell_args(cell: Cell) -> list[str]:
    args = [f"--model.scheme.rotation={cell.rotation}", f"--model.scheme.far_mass={cell.far_mass}",
            f"--model.scheme.rotate_values={str(cell.rotate_values).lower()}"]
    args += [f"--model.scheme.output_gate={cell.output_gate}"]
    args += [f"--model.scheme.layer_pattern={json.dumps(list(cell.layer_pattern))}"] if cell.layer_pattern else []
    return args + ([f"--model.scheme.increments={cell.increments}"] if cell.increments else [])


def _checkpoint_every(n: int) -> str:
    return ("--trainer.callbacks=[{class_path: lightning.pytorch.callbacks.ModelCheckpoint, "
            f"init_args: {{save_last: true, every_n_train_steps: {n}, save_top_k: 0}}}}]")


def _close(a: str, b: str) -> bool:
    try:
        x, y = float(a), float(b)
    except ValueError:
        return a == b
    return math.isclose(x, y, rel_tol=RESUME_RTOL, abs_tol=1e-7) or (math.isnan(x) and math.isnan(y))


@pytest.mark.parametrize("scheme", [["--model.scheme.rotation=accum", "--model.scheme.increments=random_position"],
                                    ["--model.scheme.rotation=path", "--model.scheme.far_mass=forget"]],
                         ids=["accum-random", "path-forget"])
def test_resumed_run_on_cuda_continues_the_uninterrupted_one(scheme, tmp_path):
    """A run that dies at step 10 after its checkpoint at step 8, resumed with ``--ckpt_path last``, ends with the
    uninterrupted run's metrics to :data:`RESUME_RTOL` and the same random-increment draw counts."""
    from tests.callbacks.test_faults import CrashOnce

    args = ["fit", "--config", "tiny", f"--root={tmp_path}", "--trainer.max_steps=14", "--model.d_model=32", *GPU,
            "--trainer.precision=32-true", *QUICK, "--extrapolation.multipliers=[1,2]", "--trainer.val_check_interval=5",
            "--trainer.log_every_n_steps=1", "--extrapolation.every_n_steps=5", _checkpoint_every(4), *scheme]
    assert main([*args, "--name=reference"]) == 0
    crash = [f"--trainer.callbacks+={json.dumps({'class_path': 'tests.callbacks.test_faults.CrashOnce', 'init_args': {'step': 10}})}"]
    CrashOnce.fired = False
    with pytest.raises(RuntimeError, match="crash at step 10"):
        main([*args, *crash, "--name=crashed"])
    assert main([*args, *crash, "--name=crashed", "--ckpt_path=last"]) == 0
    reference, resumed = tmp_path / "reference" / "version_0", tmp_path / "crashed" / "version_0"
    a, b = rows(reference / "metrics.csv"), rows(resumed / "metrics.csv")
    assert len(a) == len(b) and len(a) >= 14
    bad = [(i, k, x[k], y[k]) for i, (x, y) in enumerate(zip(a, b)) for k in x if not _close(x[k], y.get(k, ""))]
    assert not bad, bad[:5]
    na, nb = numbers(reference / "extrapolation.json"), numbers(resumed / "extrapolation.json")
    for ra, rb in zip(na["final"]["lengths"], nb["final"]["lengths"]):
        assert math.isclose(ra["nll"], rb["nll"], rel_tol=RESUME_RTOL), (ra, rb)
    wa = torch.load(reference / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    wb = torch.load(resumed / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    draws = [k for k in wa if k.endswith("_extra_state")]
    assert all(wa[k] == wb[k] for k in draws)  # the random streams continued exactly where they stopped
    for k in wa:
        if isinstance(wa[k], torch.Tensor) and wa[k].is_floating_point():
            assert torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-6), k


def test_training_draws_on_cuda_never_touch_the_host():
    """A CUDA training step of the random-increment scheme makes no host-to-device copy (its draws are computed on
    the device) — measured with the profiler's memcpy events."""
    from accrot.model import ModelConfig, Transformer
    from accrot.position import SchemeConfig

    model = Transformer(ModelConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=2,
                                    scheme=SchemeConfig(rotation="accum", increments="random_position"))).cuda().train()
    tokens = torch.randint(0, 256, (2, 64), device="cuda")
    model(tokens).sum().backward()  # warm-up: caches, allocator
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        model(tokens).sum().backward()
        torch.cuda.synchronize()
    copies = [e.name for e in prof.events() if "HtoD" in e.name]  # "Memcpy HtoD (Pageable -> Device)"
    assert not copies, copies


@needs_fla  # an fla that is installed and broken fails here: only a missing one skips
@pytest.mark.parametrize("far_mass", ["none", "forget"], ids=["PaTH", "PaTH-FoX"])
@pytest.mark.parametrize("config", SHIPPED)
@pytest.mark.filterwarnings("ignore:Precision bf16-mixed is not supported by the model summary")
def test_fla_path_kernel_trains_every_shipped_config(config, far_mass, tmp_path):
    """``path_kernel=fla`` (the gpu extra's fla) in a real run: 2 bf16-mixed steps and the evaluation."""
    rc = main(["fit", "--config", config, "--trainer.fast_dev_run=2", "--trainer.precision=bf16-mixed", *GPU,
               f"--root={tmp_path}", "--extrapolation.multipliers=[1,2]", "--data.init_args.batch_size=2", *QUICK,
               "--model.scheme.rotation=path", f"--model.scheme.far_mass={far_mass}", "--model.scheme.path_kernel=fla"])
    assert rc == 0
    (run_dir,) = list(tmp_path.glob("*/version_0"))
    final = json.loads((run_dir / "extrapolation.json").read_text())["final"]
    assert all(math.isfinite(row["nll"]) and 0 < row["nll"] < 10 for row in final["lengths"])


# last: the longest (every shipped config × every cell), so a time-boxed `make gpu-check` runs the others first
@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.name)
@pytest.mark.parametrize("config", SHIPPED)
@pytest.mark.filterwarnings("ignore:Precision bf16-mixed is not supported by the model summary")
def test_two_step_fast_dev_run_on_cuda_in_bf16(config, cell, tmp_path):
    rc = main(["fit", "--config", config, "--trainer.fast_dev_run=2", "--trainer.precision=bf16-mixed", *GPU,
               f"--root={tmp_path}", "--extrapolation.multipliers=[1,2]", "--data.init_args.batch_size=2", *QUICK,
               *cell_args(cell)])
    assert rc == 0
    recipe = yaml.safe_load((CONFIG_DIR / f"{config}.yaml").read_text())
    (run_dir,) = list(tmp_path.glob("*/version_0"))
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "finished" and record["step"] == 2
    assert record["hparams"]["d_model"] == recipe["model"]["d_model"]
    assert record["rotation_kernels"] in ("compiled", "eager")
    final = json.loads((run_dir / "extrapolation.json").read_text())["final"]
    assert [row["multiplier"] for row in final["lengths"]] == [1, 2]
    assert all(math.isfinite(row["nll"]) and 0 < row["nll"] < 10 for row in final["lengths"])

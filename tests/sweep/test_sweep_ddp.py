"""A distributed Optuna trial (``accrot sweep SPEC --worker --distributed``) under plain ``ddp`` on 2 gloo ranks:
rank 0 asks Optuna and the ranks sample together (TorchDistributedTrial), both train, rank 0 reports, and a
pruning decision stops every rank at the same step."""

from __future__ import annotations

import json
import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

from accrot.cli import main
from tests.test_ddp import _env, _free_port

SPEC = """\
name: ddp-prune
base: tiny
overrides:
  trainer.max_steps: 40
  trainer.limit_val_batches: 1
  trainer.enable_progress_bar: false
  model.d_model: 32
  data.init_args.seq_len: 64
  data.init_args.batch_size: 4
  extrapolation.multipliers: [1, 2]
  extrapolation.budget_tokens: 512
  extrapolation.every_n_steps: 2
space:
  model.lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}
  model.scheme.rotation: [none, rope]
objectives:
  - {metric: nll@2x, direction: minimize}
sampler: {type: random, seed: 0}
pruner: {type: threshold, upper: 0.5}
trials: 2
seeds: [0]
wandb: disabled
"""


@pytest.mark.distributed
def test_distributed_trial_is_pruned_on_every_rank(tmp_path, capsys):
    spec = tmp_path / "ddp-prune.yaml"
    spec.write_text(SPEC)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    root = tmp_path / "root"
    assert main(["sweep", str(spec), "--workers", "0", "--storage", storage, "--root", str(root)]) == 0
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "accrot.cli", "sweep", str(spec), "--worker", "--distributed",
                               "--storage", storage, "--root", str(root)],
                              env=_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r), LOCAL_RANK=str(r),
                                       WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", NODE_RANK="0"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]

    trials = optuna.load_study(study_name="ddp-prune", storage=storage).get_trials()
    assert len(trials) == 2 and all(t.state == TrialState.PRUNED for t in trials), [t.state for t in trials]
    for t in trials:
        assert t.user_attrs["pruned_reason"].startswith("pruned: nll@2x=")
        assert list(t.intermediate_values) == [2]  # rank 0 reported the step-2 evaluation, then all stopped
        run = next((root / "ddp-prune" / "runs" / f"trial_{t.number:04d}").glob("version_*"))
        record = json.loads((run / "run.json").read_text())
        assert record["launch"]["world_size"] == 2 and record["launch"]["strategy"] == "DDPStrategy"
        assert record["step"] == 2 and (run / "checkpoints" / "pruned-step=2.ckpt").is_file()
        # rank 1 trained the same parameters (rank 0's exact floats) and stopped with rank 0
        mirrored = json.dumps(t.params, sort_keys=True)
        assert f"rank 1: trial {t.number} of ddp-prune {mirrored}: TrialPruned: pruned: nll@2x=" in outs[1]
    assert len(list((root / "ddp-prune" / "runs").glob("trial_*/version_*"))) == 2  # rank 1 wrote no run of its own

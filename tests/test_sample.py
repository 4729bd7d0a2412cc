"""Generation: cached decoding gives the tokens recomputing the prefix gives, retrieval answers are scored exactly by
what is generated, and ``accrot sample`` / ``accrot eval --generate`` on real runs."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from accrot.run.generate import exact_by_depth, generate, generated_exact, next_token
from data_modules import PasskeyDataModule
from tests.conftest import tiny_model


@pytest.mark.parametrize("cell", [dict(rotation="rope", far_mass="forget"), dict(rotation="path"),
                                  dict(rotation="accum", increments="learned", rotate_values=True)])
def test_cached_generation_is_recomputed_generation(cell):
    model = tiny_model(**cell).double().eval()
    prompt = torch.randint(0, 256, (2, 5))
    for temperature, top_k in ((0.0, None), (0.9, 7)):
        fast = generate(model, prompt, 12, temperature, top_k, torch.Generator().manual_seed(4))
        slow = generate(model, prompt, 12, temperature, top_k, torch.Generator().manual_seed(4), cached=False)
        assert torch.equal(fast, slow)


def test_top_k_draws_only_the_likeliest():
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]]).expand(500, -1)
    drawn = next_token(logits, 1.0, 2, torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == {1, 2}
    assert torch.equal(next_token(logits, 0.0), torch.ones(500, dtype=torch.long))


class Oracle:
    """A model that knows every block and predicts its next byte, wrong at one answer position of block ``miss``."""

    def __init__(self, blocks: torch.Tensor, miss: int | None = None, at: int | None = None) -> None:
        self.blocks, self.miss, self.at = blocks, miss, at

    def _logits(self, rows: list[int], position: int) -> torch.Tensor:
        nxt = self.blocks[rows, position + 1].clone()
        if self.miss in rows and position == self.at:
            nxt[rows.index(self.miss)] = (nxt[rows.index(self.miss)] + 1) % 256
        return torch.nn.functional.one_hot(nxt, 256).double()  # [b, 256]

    def prefill(self, prompt):
        rows = [next(i for i in range(len(self.blocks)) if torch.equal(self.blocks[i, :prompt.shape[1]], p))
                for p in prompt]
        cache = {"rows": rows, "t": prompt.shape[1] - 1}
        return self._logits(rows, cache["t"])[:, None].expand(-1, prompt.shape[1], -1), cache

    def step(self, token, cache):
        cache["t"] += 1
        return self._logits(cache["rows"], cache["t"])


def test_generated_answers_are_scored_exactly_per_depth():
    dm = PasskeyDataModule(seq_len=128, depths=[0.0, 1.0])
    length, budget = 128, 4 * 128
    blocks, mask, targets = dm.eval_blocks(length, budget), dm.eval_mask(length, budget), dm.eval_targets(length, budget)
    depths = dm.eval_depths(length, budget)
    assert generated_exact(Oracle(blocks), blocks, mask, targets) == [True] * 4
    last = int(mask[1].nonzero()[-1])
    exact = generated_exact(Oracle(blocks, miss=1, at=last), blocks, mask, targets)  # block 1's last digit wrong
    assert exact == [True, False, True, True]
    assert exact_by_depth(exact, depths) == (0.75, {"0": 1.0, "1": 0.5})


def _quiet(argv: list[str]) -> tuple[int, str]:
    from accrot.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = main(argv)
    return rc, out.getvalue()


def test_sample_and_eval_generate_on_a_passkey_run(tmp_path):
    """A one-step passkey run: ``accrot sample`` prints prompt + continuation, ``accrot eval --generate`` writes the
    generated exact accuracy beside the teacher-forced one per length and depth."""
    rc, _ = _quiet(["fit", "--config", "tiny", "--data=data_modules.PasskeyDataModule", "--trainer.max_steps=1",
                    "--trainer.enable_progress_bar=false", "--wandb=disabled", "--extrapolation.budget_tokens=1024",
                    "--extrapolation.multipliers=[1, 2]", "--trainer.limit_val_batches=1", f"--root={tmp_path}", "--name=passkey"])
    run = tmp_path / "passkey" / "version_0"
    assert rc == 0
    rc, out = _quiet(["sample", "--ckpt", str(run), "--prompt", "The pass key is", "--max_new_tokens=8",
                      "--seed=3"])
    assert rc == 0 and out.startswith("The pass key is") and len(out) > len("The pass key is")
    rc, _ = _quiet(["eval", "--ckpt", str(run), "--generate=true", "--multipliers", "1", "2",
                    "--budget_tokens=640", "--same_target_anchors=0", f"--out={tmp_path / 'eval'}"])
    assert rc == 0
    rows = json.loads((tmp_path / "eval" / "extrapolation.json").read_text())["final"]["lengths"]
    assert [r["length"] for r in rows] == [128, 256]
    for r in rows:
        assert 0.0 <= r["generated_exact"] <= 1.0 and set(r["generated_by_depth"]) == set(r["accuracy_by_depth"])

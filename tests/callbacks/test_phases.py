"""Where a run's time goes (accrot.phases, accrot.sweep.timing): the accounting on a fake clock whose answer is
known, and a real run's run.json and a real sweep's trials and summary."""

from __future__ import annotations

import datetime
import json
from types import SimpleNamespace

import pytest

from accrot.cli import main
from accrot.phases import PHASES, PhaseClock
from accrot.sweep.timing import split, timing_table


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def test_nested_phases_are_charged_exclusively_and_add_up_to_the_wall_time():
    now = FakeTime()
    clock = PhaseClock(now)
    clock.enter("setup")
    now.advance(2)
    clock.exit("setup")
    clock.enter("training")
    now.advance(5)
    with clock.timed("evaluation"):
        now.advance(3)
        with clock.timed("checkpoint"):
            now.advance(1)
    now.advance(4)
    clock.enter("diagnostics")  # still open at the snapshot: counted up to now
    now.advance(0.5)
    snap = clock.snapshot()
    assert snap["setup"] == 2 and snap["training"] == 9 and snap["evaluation"] == 3 and snap["checkpoint"] == 1
    assert snap["diagnostics"] == 0.5 and snap["validation"] == 0 and snap["total"] == 15.5
    assert sum(snap[name] for name in PHASES) == snap["total"]
    clock.exit("training")  # closes the open diagnostics with it
    now.advance(1)
    snap = clock.snapshot()
    assert snap["training"] == 9 and snap["diagnostics"] == 0.5 and snap["total"] == 16.5
    clock.exit("never-entered")  # ignored
    assert clock.snapshot() == snap


def test_the_split_sums_trials_and_says_how_evaluation_compares_with_training():
    def trial(timing, seconds, **attrs):
        return SimpleNamespace(user_attrs={"timing": timing, **attrs}, duration=datetime.timedelta(seconds=seconds))

    trials = [trial({"setup": 1, "training": 10, "evaluation": 4, "diagnostics": 2, "total": 17}, 18,
                    worker_start_s=5),
              trial({"setup": 1, "training": 10, "evaluation": 4, "diagnostics": 2, "total": 17}, 17.5),
              SimpleNamespace(user_attrs={}, duration=None)]  # a trial from before the split existed
    parts = split(trials)
    assert parts["trials"] == 2 and parts["trial_seconds"] == 35.5
    s = parts["seconds"]
    assert s["training"] == 20 and s["evaluation"] == 8 and s["worker_start"] == 5 and s["other"] == 1.5
    table = timing_table(trials, {"wall_s": 40.0, "cpu_s": 60.0, "cores": 2, "busy": 0.75})
    assert "evaluation + diagnostics = 0.60× training" in table.caption and "75% busy" in table.caption
    assert timing_table([SimpleNamespace(user_attrs={}, duration=None)]) is None


def test_a_run_records_where_its_time_went(tmp_path):
    assert main(["fit", "--config", "tiny", f"--root={tmp_path}", "--trainer.max_steps=4", "--wandb=disabled",
                 "--trainer.enable_progress_bar=false", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
                 "--extrapolation.multipliers=[1,2]", "--extrapolation.budget_tokens=1024"]) == 0
    (run_dir,) = tmp_path.glob("*/version_0")
    timing = json.loads((run_dir / "run.json").read_text())["timing"]
    for name in ("setup", "training", "validation", "evaluation", "checkpoint"):
        assert timing[name] > 0, name
    assert timing["diagnostics"] == 0  # no diagnostics callback in this run
    assert sum(timing[name] for name in PHASES) == pytest.approx(timing["total"], abs=1e-3)

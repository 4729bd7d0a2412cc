"""The live display of commands that train many runs (accrot.display), on a recorded terminal and in line mode."""

from __future__ import annotations

import io
import re
import time

import pytest
from rich.console import Console

from accrot.display import Finished, RunDisplay, Running, clock


def terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=120, record=True)


def test_clock():
    assert [clock(s) for s in (None, float("nan"), -1, 0, 59.6, 61, 3725)] == ["-", "-", "-", "0:00", "1:00", "1:01",
                                                                                 "1:02:05"]


def test_live_display_shows_counts_workers_eta_and_the_last_runs():
    console = terminal()
    display = RunDisplay("ablation-t", 8, console, near="1×", far="32×", done=2, keep=2)
    assert display.live
    display.started = time.time() - 60  # this command ran 2 runs in a minute: 4 left take 2 more
    display.update(done=4, running=[Running("worker 0", "ablation-t/corpus #4 corpus.RoPE seed 0", time.time() - 75)],
                   finished=[Finished("#1", near=5.0, far=6.0, seconds=30),
                             Finished("#2", state="failed", detail="the run diverged", seconds=3),
                             Finished("#3 corpus.NoPE seed 1", near=5.1234, far=7.5, seconds=31)])
    console.print(display)
    text = console.export_text()
    assert "ablation-t  4/8 runs done, 1 failed" in text
    assert "elapsed 1:00" in text and "ETA 2:00" in text
    assert "worker 0" in text and "corpus.RoPE seed 0" in text and "1:15" in text
    assert "NLL 1×" in text and "NLL 32×" in text and "5.123" in text and "7.500" in text
    assert "#2: failed the run diverged" in text
    assert re.search(r"^#1\s", text, re.M) is None and re.search(r"^#3 corpus.NoPE", text, re.M)  # the last `keep`
    assert console.file.getvalue().count("\n") > 3 and not console.export_text().count("[4/8]")


def test_line_mode_prints_one_line_per_finished_run():
    out = io.StringIO()
    console = Console(file=out, width=200)  # not a terminal: a log file, CI, a SLURM job
    with RunDisplay("demo", 2, console, near="1×", far="4×") as display:
        assert not display.live
        display.update(running=[Running("training", "NoPE", time.time())])
        assert out.getvalue() == ""
        display.update(done=1, running=[], finished=[Finished("NoPE → runs/x", near=5.0, far=6.25, seconds=12)])
        display.update(done=2, finished=[Finished("RoPE", state="pruned", detail="at step 4", seconds=2)])
    assert out.getvalue().splitlines() == ["[1/2] NoPE → runs/x: NLL 5.000 at 1×, 6.250 at 4× (0:12)",
                                           "[2/2] RoPE: pruned: at step 4 (0:02)"]


def test_line_mode_never_wraps_a_line():
    """A log file has no width: at rich's default 80 columns a long run name split `NLL` from its number."""
    out = io.StringIO()
    console = Console(file=out)  # not a terminal: rich assumes 80 columns
    what = "accum-learned+values → runs/demo/accum-learned_values/version_0 " * 2
    RunDisplay("demo", 1, console, near="1×", far="32×").update(
        done=1, finished=[Finished(what, near=2.218, far=2.5, seconds=9)])
    (line,) = out.getvalue().splitlines()
    assert len(line) > 80 and line.endswith("NLL 2.218 at 1×, 2.500 at 32× (0:09)")


def test_line_mode_numbers_each_place_once_and_a_failed_run_takes_none():
    """A failed trial is re-queued, so it is not a run done: `[-/N]`; the runs done keep their own places, even when
    a failure and completions arrive in one update (a resumed sweep printed `[4/4]` twice)."""
    out = io.StringIO()
    display = RunDisplay("sweep", 4, Console(file=out, width=200))
    display.update(done=1, finished=[Finished("#0", near=5.0, far=6.0)])
    display.update(done=3, finished=[Finished("#1", state="failed", detail="stopped by Ctrl-C (SIGINT)"),
                                     Finished("#2", near=5.0, far=6.0), Finished("#3", near=5.0, far=6.0)])
    display.update(done=4, finished=[Finished("#4", near=5.0, far=6.0)])
    places = [line.split("]")[0] + "]" for line in out.getvalue().splitlines()]
    assert places == ["[1/4]", "[-/4]", "[2/4]", "[3/4]", "[4/4]"]


def test_quiet_is_line_mode_on_a_terminal_too():
    assert not RunDisplay("x", 1, terminal(), quiet=True).live


@pytest.mark.parametrize("max_epochs, label", [(-1, "Epoch 3"), (None, "Epoch 3"), (5, "Epoch 3/4")],
                         ids=["step-limited", "no-limit", "epoch-limited"])
def test_training_bar_names_the_epoch_without_a_negative_limit(max_epochs, label):
    """A step-limited run (max_epochs = −1) is labelled ``Epoch 3``, never Lightning's ``Epoch 3/-2``."""
    from types import SimpleNamespace

    from callbacks.progress import ProgressBar

    bar = ProgressBar()
    bar._trainer = SimpleNamespace(max_epochs=max_epochs)
    assert bar._get_train_description(3).rstrip() == label


@pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning")  # no val loader etc.
def test_training_bar_shows_every_steps_loss_while_loggers_get_their_steps(tmp_path):
    """The bar's train/loss is the loss of the step just done, every step; the loggers receive train/loss only
    on the steps they keep (log_every_n_steps), as LitLM logs it only then."""
    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader

    from accrot.lit import LitLM
    from callbacks.progress import ProgressBar

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    batches = [(x[:, :-1].contiguous(), x[:, 1:].contiguous())
               for x in torch.randint(0, 32, (6, 2, 17), generator=g)]
    seen: list[tuple[float, float]] = []

    class Watch(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            shown = bar.get_metrics(trainer, pl_module)["train/loss"]
            seen.append((shown, float(outputs["loss"])))

    bar = ProgressBar()
    model = LitLM(d_model=16, n_layers=1, n_heads=2, vocab_size=32, warmup_steps=1)
    trainer = L.Trainer(max_steps=6, accelerator="cpu", logger=CSVLogger(tmp_path, name="run"),
                        log_every_n_steps=3, callbacks=[bar, Watch()], enable_checkpointing=False,
                        limit_val_batches=0, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(model, train_dataloaders=DataLoader(batches, batch_size=None))
    assert len(seen) == 6 and all(shown == loss for shown, loss in seen)
    assert len({loss for _, loss in seen}) == 6  # a new value every step
    rows = (tmp_path / "run" / "version_0" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    steps = [int(r.split(",")[header.index("step")]) for r in rows[1:]
             if r.split(",")[header.index("train/loss")]]
    assert steps == [2, 5]  # steps 3 and 6 (0-based 2 and 5)

"""One writer per folder: a second command that would write a folder another one holds is refused in one line, a
lock whose holder died is taken over, and two resumes of one run never both train."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accrot.errors import UsageError
from accrot.run.rundir import LOCK_NAME, FolderLock, RunDirs, holding

REPO = Path(__file__).resolve().parents[2]

HOLD = """
import sys, time
from pathlib import Path
from accrot.run.rundir import FolderLock
lock = FolderLock(Path(sys.argv[1]), "--out", "the folder", beside=sys.argv[2] == "beside")
print("held", flush=True)
time.sleep(60)
"""


def holder(folder: Path, beside: bool = False) -> subprocess.Popen:
    """Another process holding ``folder``'s lock (it prints once it holds it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), "beside" if beside else "in"],
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("beside", [False, True], ids=["in-folder", "beside"])
def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path, beside):
    folder = tmp_path / "out"
    folder.mkdir()
    proc = holder(folder, beside)
    try:
        with pytest.raises(UsageError) as err:
            FolderLock(folder, "--out", "the output folder", beside=beside)
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"--out {str(folder.absolute())!r}: the output folder is "
                                                          "being written by another accrot command")
        assert f"pid {proc.pid} on " in message and "pass another --out" in message
    finally:
        proc.send_signal(signal.SIGKILL)  # dies without releasing: the kernel drops its flock
        proc.wait()
        proc.stdout.close()
    lock = FolderLock(folder, "--out", "the output folder", beside=beside)  # taken over
    assert str(os.getpid()) in lock.path.read_text()
    lock.release()
    assert not lock.path.exists()  # released: the lock file goes with it
    assert list(folder.iterdir()) == []


def test_a_run_directory_stays_empty_for_its_logger_and_a_resume_is_not_offered_another_place(tmp_path):
    dirs = RunDirs()
    run = tmp_path / "runs" / "x" / "version_0"
    dirs.make(run, option="--resume", what="the run directory")
    assert list(run.iterdir()) == []  # Lightning's logger warns about a run directory with files in it
    with pytest.raises(UsageError, match="wait for it to finish\\)?$") as err:
        RunDirs().make(run, option="--resume", what="the run directory")
    assert "pass another" not in str(err.value)
    dirs.release()
    RunDirs().make(run)  # free again


def test_holding_makes_and_locks_a_folder_for_its_body_only(tmp_path):
    folder = tmp_path / "results" / "study"
    with holding(folder, "--out", "the ablation's folder"):
        assert (folder / LOCK_NAME).is_file()
        with pytest.raises(UsageError, match="the ablation's folder is being written by another accrot command"):
            with holding(folder, "--out", "the ablation's folder"):
                pass
    assert not (folder / LOCK_NAME).exists()
    with holding(folder, "--out", "the ablation's folder"):
        pass


@pytest.mark.slow
def test_two_resumes_of_one_run_never_both_train(tmp_path):
    """Two ``accrot fit --resume RUN`` started together (a requeue submitted twice): one trains, the other is refused
    in one line before it writes anything, and the metrics hold each step once."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    base = [sys.executable, "-m", "accrot.cli"]
    first = subprocess.run([*base, "fit", "--config", "tiny", f"--root={tmp_path}", "--name=run",
                            "--trainer.max_steps=10", "--trainer.limit_val_batches=1",
                            "--extrapolation.multipliers=[1]", "--extrapolation.budget_tokens=256"],
                           capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert first.returncode == 0, first.stderr
    run = tmp_path / "run" / "version_0"
    resume = [*base, "fit", "--resume", str(run), "--trainer.max_steps=100000"]  # still training when b starts
    a = subprocess.Popen(resume, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    try:
        lock = tmp_path / "run" / f".version_0{LOCK_NAME}"
        deadline = time.time() + 120
        while not lock.exists() and a.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert a.poll() is None, "the first resume ended before the second started"
        b = subprocess.run(resume, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
        assert a.poll() is None  # the first one is still the run's writer
    finally:
        a.kill()
        a.wait()
    assert b.returncode == 2, b.stderr
    lines = b.stderr.strip().splitlines()
    assert len(lines) == 1 and "is being written by another accrot command" in lines[0], lines
    assert lines[0].startswith(f"accrot: error: --resume {str(run.resolve())!r}") and "pass another" not in lines[0]
    assert not b.stdout.strip()  # refused before its run directory line: it trained and wrote nothing


def test_a_symlink_to_a_held_folder_is_the_same_folder(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    link = tmp_path / "link"
    link.symlink_to(folder)
    held = FolderLock(folder, "--out", "the output folder")
    try:
        with pytest.raises(UsageError, match="is being written by another accrot command"):
            FolderLock(link, "--out", "the output folder")
    finally:
        held.release()

"""The fused CPU kernels' build: what a process killed while loading them leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from accrot.ops import cpu_kernels


def test_a_build_lock_left_by_a_killed_process_does_not_hang_the_next_one(tmp_path):
    """torch's build lock is a file its holder deletes; a run SIGKILLed while loading the kernels left it behind and
    every later process waited for it forever (a sweep test hung on it). The next process now clears it."""
    if cpu_kernels.ops() is None:
        pytest.skip("the fused CPU kernels are not built here")
    stale = cpu_kernels.build_directory() / "lock"
    stale.write_text("")  # what a process killed inside torch's loader leaves
    probe = "from accrot.ops import cpu_kernels; assert cpu_kernels.ops() is not None; print('loaded')"
    env = {**os.environ, "ACCROT_CPU_KERNELS": "on"}
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    finally:
        stale.unlink(missing_ok=True)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr[-2000:]

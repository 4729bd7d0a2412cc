"""How the accrot command sets up its process before any tensor (accrot/runtime.py): glibc's malloc tuned to keep a
step's memory mapped (set_allocator) and, when asked, subnormal floats flushed to zero in every intra-op thread
(set_denormals; IEEE by default, as the ops flush inside their own kernels), both by configure_process.

A far-mass bias drives far keys' softmax weights below float32's normal range, and x86 computes on subnormals
about a hundred times slower; the probe below multiplies subnormals across torch's threads and reads the result.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from accrot import runtime

# a subnormal float32 broadcast to 2^20 elements (no parallel region before set_denormals: the pool is created
# after it and inherits the mode), then one product split across 2 threads
PROBE = """
import torch
torch.set_num_threads(2)
x = torch.tensor([1e-39]).expand(1 << 20)
from accrot import runtime
print(runtime.set_denormals(), runtime.denormals())
y = x * 1.5
print(int((y == 0).sum()), y.numel(), float(y[0]), float(y[-1]))
"""


def _probe(mode: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "ACCROT_DENORMALS"}
    if mode is not None:
        env["ACCROT_DENORMALS"] = mode
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_flushed_in_every_thread():
    applied, recorded, zeros, n, first, last = _probe("flush")
    assert applied == recorded == "flushed"
    assert int(zeros) == int(n) == 1 << 20 and float(first) == float(last) == 0.0


@pytest.mark.parametrize("mode", [None, "keep"])
def test_keep_leaves_ieee_subnormals(mode):
    applied, recorded, zeros, n, first, last = _probe(mode)
    assert applied == recorded == "IEEE"
    assert int(zeros) == 0 and float(first) == float(last) == pytest.approx(1.5e-39, rel=1e-6)


def test_a_bad_switch_is_a_value_error(monkeypatch):
    monkeypatch.setenv("ACCROT_DENORMALS", "sometimes")
    with pytest.raises(ValueError, match="ACCROT_DENORMALS='sometimes' is not valid; choose one of keep, flush"):
        runtime.denormal_mode()


# 64 MiB in blocks of 8 MiB (below the tuned mmap threshold, above glibc's default 128 KiB): allocated, freed, and
# the resident set read before and after the free
ALLOCATOR_PROBE = """
import torch
from accrot import runtime
print(runtime.set_allocator(), runtime.allocator())
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
blocks = [torch.ones(2 * 2**20) for _ in range(8)]
held = rss()
del blocks
print(held - rss())
"""


def _allocator_probe(mode: str | None) -> tuple[str, str, int]:
    env = {k: v for k, v in os.environ.items() if k != "ACCROT_MALLOC"}
    if mode is not None:
        env["ACCROT_MALLOC"] = mode
    done = subprocess.run([sys.executable, "-c", ALLOCATOR_PROBE], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    applied, recorded, released = done.stdout.split()
    return applied, recorded, int(released)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc are Linux's")
def test_tuned_allocator_keeps_freed_blocks_mapped():
    applied, recorded, released = _allocator_probe(None)
    assert applied == recorded == "tuned"
    assert released < 8 * 2**20  # the 64 MiB stay in the heap for the next step


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc are Linux's")
def test_default_allocator_returns_freed_blocks():
    applied, recorded, released = _allocator_probe("default")
    assert applied == recorded == "default"
    assert released > 48 * 2**20  # glibc unmapped (most of) them at once


def test_a_bad_allocator_switch_is_a_value_error(monkeypatch):
    monkeypatch.setenv("ACCROT_MALLOC", "fast")
    with pytest.raises(ValueError, match="ACCROT_MALLOC='fast' is not valid; choose one of tuned, default"):
        runtime.allocator_mode()


CONFIGURE_PROBE = """
from accrot import runtime
first = runtime.configure_process()
print(first == runtime.configure_process() == {"denormals": runtime.denormals(), "allocator": runtime.allocator()})
print(first["denormals"], first["allocator"])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux's")
def test_configure_process_makes_both_settings_and_is_idempotent():
    env = {k: v for k, v in os.environ.items() if k not in ("ACCROT_DENORMALS", "ACCROT_MALLOC")}
    done = subprocess.run([sys.executable, "-c", CONFIGURE_PROBE], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "IEEE", "tuned"]  # the float mode only when asked


# -- the torch range: one statement (runtime.TORCH_SUPPORTED), pyproject's dependency held to it ---------------------
@pytest.mark.parametrize("version, ok", [
    ("2.13.0+cpu", True), ("2.11.0+cu130", True), ("2.12.1", True), ("2.13.0a0+git1234", True),
    ("2.10.2+cu128", False), ("2.14.0", False), ("2.14.0.dev20270101", False), ("3.0.0", False), ("weird", False),
])
def test_torch_outside_the_supported_range_is_one_line(version, ok):
    problem = runtime.torch_problem(version)
    assert (problem is None) == ok
    if not ok:
        assert "\n" not in problem and f"torch {version} is not supported" in problem
        assert "torch>=2.11,<2.14" in problem


def test_pyproject_asks_for_the_supported_range_and_constraints_pin_one_inside_it():
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    assert re.findall(r'^\s*"torch([<>=!~][^"]*)",', (repo / "pyproject.toml").read_text(), flags=re.M) == [
        runtime.supported_torch()]
    pin, = [line for line in (repo / "constraints.txt").read_text().splitlines() if line.startswith("torch==")]
    assert runtime.torch_problem(pin.removeprefix("torch==")) is None


def test_the_command_refuses_an_unsupported_torch_with_exit_2():
    """Through the accrot command, as a node's own torch would be found: torch.__version__ patched before it starts."""
    code = ("import sys, torch; torch.__version__ = '2.10.0+cu128'\n"
            "from accrot.cli import main; sys.exit(main(['fit', '--help']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "accrot: error: " + runtime.torch_problem("2.10.0+cu128")]
    assert done.stdout == ""

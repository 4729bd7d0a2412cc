"""The compiled CPU kernels, built once per install and source: the SO(2) path's fused passes
(``csrc/rotary_cpu.cpp``), PaTH's chunk core and the chunk loop of its key walk (``csrc/path_cpu.cpp``), and the
block loop of the far-mass kernel (``csrc/attention_cpu.cpp``).

:func:`ops` returns ``torch.ops.accrot_cpu`` (``rotate_many``, ``rotate_many_backward``, ``accumulate_wrap``,
``accumulate_drawn``, ``suffix_sum``, ``accumulate_bounded``, ``accumulate_bounded_backward``,
``path_walk_forward``, ``path_walk_backward``, ``path_core_forward``, ``path_core_backward``,
``key_bias_forward``, ``key_bias_backward``) or None, in which case :mod:`accrot.ops.rotary`,
:mod:`accrot.ops.path` and :mod:`accrot.ops.attention` run their eager twins: the same math in more passes or in
a Python loop (the kernels are tested against them).
``ACCROT_CPU_KERNELS`` chooses:

* ``auto`` (default): build with torch's C++ extension tooling (a C++ compiler and ninja) on first use; if that
  fails, say so once on stderr and stay eager;
* ``off``: always eager (e.g. to compare, or on a machine without a compiler);
* ``on``: build or raise.

The library lands in ``<venv>/accrot-kernels/<torch version>-<source hash>`` (``ACCROT_KERNEL_DIR``
overrides), so every process of the install shares one build (torch's build lock serialises concurrent ones),
an edited source builds anew, and ``make install`` builds it up front (``python -m accrot.ops.cpu_kernels``).
Compiled for the baseline ISA (no ``-march=native``): one build may serve every node of a cluster.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
from pathlib import Path

import torch

SOURCES = tuple(Path(__file__).with_name("csrc") / name for name in ("rotary_cpu.cpp", "path_cpu.cpp",
                                                                   "attention_cpu.cpp"))
# the headers the sources include: part of the build's hash, not compiled on their own
HEADERS = (Path(__file__).with_name("csrc") / "subnormals.h",)
# -fopenmp: at::parallel_for is inline OpenMP code (without it, one thread); -ffp-contract=off: no fused
# multiply-adds, so every machine computes the same bits (the baseline ISA has none, but a distro's default may)
CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")
_lock = threading.Lock()
_state: dict[str, object] = {}


def _switch(name: str, choices: tuple[str, ...]) -> str:
    """The environment switch ``name`` (case and spaces ignored; unset or empty: the first choice), or a
    ValueError naming the choices."""
    value = os.environ.get(name, "").strip().lower() or choices[0]
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {', '.join(choices)}")
    return value


def mode() -> str:
    """``ACCROT_CPU_KERNELS``: ``auto`` (default), ``on`` or ``off`` (module docstring)."""
    return _switch("ACCROT_CPU_KERNELS", ("auto", "on", "off"))


def build_directory() -> Path:
    digest = hashlib.sha256(b"".join(src.read_bytes() for src in SOURCES + HEADERS) + " ".join(CFLAGS).encode()).hexdigest()[:12]
    root = os.environ.get("ACCROT_KERNEL_DIR") or str(Path(sys.prefix) / "accrot-kernels")
    return Path(root) / f"torch{torch.__version__.replace('+', '_')}-{digest}"


def _ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; the pinned one lives in the ``ninja`` package, whose folder is not on PATH
    when the venv's python is called directly (as make does)."""
    try:
        import ninja
    except ImportError:
        return  # a system ninja may still be on PATH
    folder = str(ninja.BIN_DIR)
    if folder not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")


def _build(verbose: bool = False) -> object:
    from torch.utils import cpp_extension

    _ninja_on_path()
    directory = build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "accrot_cpu.so").exists():
        print("accrot: compiling the CPU kernels (once per install, about a minute)", file=sys.stderr)
    # always through torch's loader: it takes the build lock, so a process never loads a library another one
    # is still linking, and ninja finds an up-to-date build in milliseconds
    with _held_build_lock(directory):
        cpp_extension.load(
            name="accrot_cpu",
            sources=[str(src) for src in SOURCES],
            extra_cflags=list(CFLAGS),
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            is_python_module=False,
            verbose=verbose,  # the compiler's own output, for `ACCROT_CPU_KERNELS=on python -m accrot.ops.cpu_kernels`
        )
    return torch.ops.accrot_cpu


@contextlib.contextmanager
def _held_build_lock(directory: Path):
    """torch's build lock is a file (``FileBaton``: ``lock`` in the build folder) that its holder deletes when done;
    a process killed while holding it (SIGKILL of a starting run or sweep worker) leaves it behind, and every later
    process then waits for it forever. An flock on our own file is dropped by the OS when its holder dies: under
    it no live process can be inside torch's loader, so a ``lock`` file found then is a dead process's, removed."""
    import fcntl

    with open(directory / "accrot-build.flock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            (directory / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ops(verbose: bool = False) -> object | None:
    """``torch.ops.accrot_cpu`` once built and loaded, else None (``ACCROT_CPU_KERNELS=off`` or a failed
    ``auto`` build). With ``on``, a failed build raises RuntimeError."""
    chosen = mode()
    if chosen == "off":
        return None
    if "ops" not in _state:
        with _lock:
            if "ops" not in _state:
                try:
                    _state["ops"], _state["error"] = _build(verbose=verbose), None
                except Exception as exc:  # noqa: BLE001 - a missing compiler must not stop training
                    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    _state["ops"] = None
                    _state["error"] = text if len(text) <= 160 else text[:157] + "..."
                    if chosen == "auto":
                        print(f"accrot: the fused CPU kernels did not build ({_state['error']}); using the eager "
                              "rotation path (same math, slower). The compiler's output: "
                              "ACCROT_CPU_KERNELS=on python -m accrot.ops.cpu_kernels", file=sys.stderr)
    if _state["ops"] is None and chosen == "on":
        raise RuntimeError(f"ACCROT_CPU_KERNELS=on but the CPU kernels did not build: {_state['error']}")
    return _state["ops"]


def describe(device: torch.device | str) -> str:
    """Which SO(2) rotation path runs on ``device`` (recorded in run.json and the benchmark's report): the two
    paths agree to float32 rounding, not bit for bit. Accelerators: :func:`accrot.ops.gpu_kernels.describe`."""
    if torch.device(device).type != "cpu":
        from accrot.ops import gpu_kernels

        return gpu_kernels.describe(device) if torch.device(device).type == "cuda" else "eager"
    return "compiled" if ops() is not None else "eager"


if __name__ == "__main__":  # make install: build up front, so no run pays for it
    built = ops(verbose=mode() == "on")
    print(f"accrot: fused CPU kernels {'ready in ' + str(build_directory()) if built else 'not built (eager path)'}")

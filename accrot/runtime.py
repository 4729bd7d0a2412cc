"""The process-wide settings the accrot commands make before any tensor work: glibc's malloc kept from handing a
step's memory back to the OS (:func:`set_allocator`) and, only when asked (``ACCROT_DENORMALS=flush``), float32
subnormals flushed to zero in every intra-op thread (:func:`set_denormals`). :func:`configure_process` makes both as
their switches say; the ``accrot`` command calls it first thing, and so do the benchmark's helper interpreters, which
are not started through it. Each setting is recorded in run.json and the benchmark's report.

They live here, not in :mod:`accrot.ops`, because they change the whole process (every thread's float mode, the C
allocator) while the ops are pure tensor functions; an import contract keeps the ops from reaching them. The ops
need neither: the compiled kernels flush subnormals inside their own threads and restore the caller's mode on exit
(``accrot/ops/csrc/subnormals.h``), and the eager steps never exponentiate to a subnormal
(:mod:`accrot.ops.underflow`), so a Python caller who never heard of this module gets the command's speed. The
float mode stays a switch for comparison (``accrot bench schemes`` measures the far-mass ops under both); the
allocator is process-wide by nature and stays the command's default.

:data:`TORCH_SUPPORTED` is the one statement of the torch versions accrot runs on (pyproject.toml's dependency says
the same, and a test holds the two together): a GPU node's own torch is used as it is (``make wheelhouse``), so the
command refuses one outside the range in one line (:func:`torch_problem`) before it does anything else.
"""

from __future__ import annotations

import ctypes
import os
import re

import torch

_state: dict[str, str] = {}

# torch releases accrot supports: from 2.11 (a GPU node's torch 2.11 + CUDA 13 + Triton 3.6) to 2.13 (the CPU
# install's exact pin, constraints.txt); (first, first not supported) as (major, minor)
TORCH_SUPPORTED = ((2, 11), (2, 14))


def supported_torch() -> str:
    """:data:`TORCH_SUPPORTED` as a requirement: ``>=2.11,<2.14``."""
    (a, b), (c, d) = TORCH_SUPPORTED
    return f">={a}.{b},<{c}.{d}"


def torch_problem(version: str | None = None) -> str | None:
    """Why this torch (``version``, default ``torch.__version__``) is not one accrot supports, as one line; None
    when it is. Local and pre-release parts are ignored (``2.11.0+cu130`` and ``2.13.0a0+git`` are 2.11, 2.13)."""
    version = torch.__version__ if version is None else str(version)
    m = re.match(r"(\d+)\.(\d+)", version)
    low, high = TORCH_SUPPORTED
    if m and low <= (int(m[1]), int(m[2])) < high:
        return None
    return (f"torch {version} is not supported: accrot needs torch{supported_torch()} (pip install "
            f"'torch{supported_torch()}', or make install for the pinned CPU build)")


def _switch(name: str, choices: tuple[str, ...]) -> str:
    """The environment switch ``name`` (case and spaces ignored; unset or empty: the first choice), or a
    ValueError naming the choices."""
    value = os.environ.get(name, "").strip().lower() or choices[0]
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {', '.join(choices)}")
    return value


def denormal_mode() -> str:
    """``ACCROT_DENORMALS``: ``keep`` (default: IEEE subnormals, torch's own mode) or ``flush`` (process-wide, e.g.
    to compare: the ops do not need it)."""
    return _switch("ACCROT_DENORMALS", ("keep", "flush"))


def set_denormals() -> str:
    """Apply :func:`denormal_mode` to this thread and return what holds: ``"flushed"`` or ``"IEEE"``.

    Why it exists: a far-mass bias (ALiBi, FoX, PaTH-FoX) drives the softmax weights of far keys into float32's
    subnormal range (below 1.2e-38), and PaTH's transports shrink far keys geometrically (β < 2 contracts); x86
    runs each operation on a subnormal some hundred times slower. The ops keep that cost out on their own (module
    docstring), so the default leaves torch's IEEE mode alone; ``flush`` (FTZ/DAZ, the default of TensorFlow's and
    XLA's CPU runtimes, changing no value above 1.2e-38) is there to compare against, and for code of the caller's
    own that meets subnormals outside accrot's ops.

    The mode is per thread and new threads copy their creator's: called before torch's first parallel region, the
    intra-op pool inherits it. Called later, it reaches only the calling thread.
    """
    flushed = denormal_mode() == "flush" and torch.set_flush_denormal(True)
    if not flushed:
        torch.set_flush_denormal(False)
    _state["denormals"] = "flushed" if flushed else "IEEE"
    return _state["denormals"]


def denormals() -> str:
    """What :func:`set_denormals` applied in this process (recorded in run.json and the benchmark's report), or
    ``"IEEE"`` (torch's default) when it was not called."""
    return _state.get("denormals", "IEEE")


MMAP_THRESHOLD = 32 * 2**20  # glibc's largest: blocks below it come from the heap
TRIM_THRESHOLD = 2**30  # free heap kept before returning any of it to the OS


def allocator_mode() -> str:
    """``ACCROT_MALLOC``: ``tuned`` (default) or ``default`` (glibc's own dynamic thresholds)."""
    return _switch("ACCROT_MALLOC", ("tuned", "default"))


def set_allocator() -> str:
    """Apply :func:`allocator_mode` to glibc's malloc and return what holds (``"tuned"`` or ``"default"``).

    Why: by default glibc serves a block of ≥ 128 KiB (a threshold it raises after frees, up to 32 MiB) by a fresh
    ``mmap`` and gives it back on ``free``, and trims the heap top; every training step then touches fresh pages
    for its activations, and the page faults cost more the more temporaries a kernel allocates. Fixing the mmap
    threshold at 32 MiB and trimming only above 1 GiB of free heap keeps a step's memory mapped for the next one.
    The cost: freed memory stays resident (up to the process's peak). Blocks of ≥ 32 MiB (long evaluations) are
    still mapped and unmapped one by one. Applies to allocations made after it, so it comes before the first tensor.
    """
    tuned = False
    if allocator_mode() == "tuned":
        try:
            libc = ctypes.CDLL("libc.so.6")
            # M_MMAP_THRESHOLD = -3, M_TRIM_THRESHOLD = -1; each returns 1 on success
            tuned = libc.mallopt(-3, MMAP_THRESHOLD) == 1 and libc.mallopt(-1, TRIM_THRESHOLD) == 1
        except (OSError, AttributeError):  # not glibc: its allocator is left as it is
            tuned = False
    _state["allocator"] = "tuned" if tuned else "default"
    return _state["allocator"]


def allocator() -> str:
    """What :func:`set_allocator` applied in this process (run.json, the benchmark's report), else ``"default"``."""
    return _state.get("allocator", "default")


def configure_process() -> dict[str, str]:
    """Both settings, :func:`set_denormals` (IEEE unless ``ACCROT_DENORMALS=flush``) then :func:`set_allocator`, as
    the switches ask; returns what holds
    (``{"denormals": ..., "allocator": ...}``).

    Idempotent: a second call reads the same switches and applies the same settings again, so an entry point may
    call it without knowing whether another did. Call it before torch's first parallel region and first tensor
    (the reasons are in the two functions' docstrings)."""
    set_denormals()
    set_allocator()
    return {"denormals": denormals(), "allocator": allocator()}


# -- bfloat16 on the CPU -------------------------------------------------------------------------------------------
# The x86 features that run bfloat16 dot products in hardware (AVX-512 BF16's VDPBF16PS, AMX's tile multiply;
# oneDNN picks them for torch's bf16 matmuls), and aarch64's BF16 extension (BFDOT, BFMMLA). Without one of them a
# bf16 matmul is emulated through float32 conversions and runs several to tens of times slower than float32.
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags as Linux lists them (x86 ``flags``, aarch64 ``Features``); empty where the file is
    missing (not Linux) or unreadable."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return set()
    m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, flags=re.M)
    return set(m[1].split()) if m else set()


def cpu_bf16(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The feature that gives this CPU hardware bfloat16 (``amx_bf16``, ``avx512_bf16``, aarch64's ``bf16``), or None.

    Read from /proc/cpuinfo rather than asked of torch: torch 2.13 exposes only its vector ISA level
    (``torch.backends.cpu.get_cpu_capability()`` says ``AVX512`` on CPUs with and without BF16). Where the flags
    cannot be read (not Linux) the answer is None, and bf16 on the CPU is refused rather than risked."""
    flags = cpu_flags(cpuinfo)
    return next((f for f in CPU_BF16_FLAGS if f in flags), None)


def cpu_bf16_problem(precision: str) -> str | None:
    """Why ``precision`` (Lightning's unified name: ``bf16-mixed``, ``bf16-true``, ...) should not train on this CPU,
    as the tail of a one-line refusal; None where it is not a bf16 precision or the CPU has hardware bf16."""
    if not precision.startswith("bf16") or cpu_bf16() is not None:
        return None
    return ("this CPU has no hardware bfloat16 (no avx512_bf16 or amx_bf16 flag in /proc/cpuinfo), where bf16 "
            "matmuls run several times slower than float32; use trainer.precision=32-true (the default) here, or "
            "bf16-mixed on a GPU or a CPU with AVX-512 BF16 or AMX")

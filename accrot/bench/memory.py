"""Evaluation time and peak memory per scheme and length, each measured in a fresh child process (a zygote forked
per probe) so one measurement's allocations never inflate the next one's peak."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from accrot.bench.grid import (
    LONG_EVAL,
    MIB,
    PROBE_FORWARDS,
    PROBE_SECONDS,
    Cell,
    build_model,
    interleaved_rounds,
    size_shape,
    sync,
)


# -- evaluation time and peak memory ----------------------------------------------------------------------
def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _pin_allocator() -> None:
    """glibc only: return free heap to the OS, and serve every block of ≥ 64 KiB by its own ``mmap`` (a fixed
    threshold: glibc's default raises it after each free, up to 32 MiB, so where a tensor lands — and how much of
    the heap stays resident after it is freed — depends on the history; measured peaks then jump between runs
    by an order of magnitude). With it, resident growth follows the live tensors."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (fixing it also disables the dynamic adjustment)
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the baseline then includes free heap pages
        pass


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null: the profiler's C++ side prints two trace lines per session there."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _live_tensor_peak(fn: Callable[[], object]) -> int | None:
    """Peak bytes of live tensors during ``fn()``, from the profiler's allocation events (allocator-independent);
    None if this torch's profiler does not expose them."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:
        events = prof.profiler.kineto_results.events()
        allocations = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    except AttributeError:  # pragma: no cover - profiler internals moved
        return None
    live = peak = 0
    for _, nbytes in allocations:
        live += nbytes
        peak = max(peak, live)
    return peak


def _eval_tokens(vocab_size: int, T: int, seed: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + T)
    return torch.randint(0, vocab_size, (1, T), generator=g).to(device)  # [1, T], the same for every variant


def _forward(cell: Cell, shape: dict[str, int], seed: int, T: int, target: str, device: torch.device):
    """``run(n)``: a no-grad-ready forward of the first ``n`` of ``T`` positions: the whole tiny model on ``[1, T]``
    tokens (``target="model"``), or one layer's attention op on batch 1 (``"op"``, :mod:`accrot.bench.ops`)."""
    if target == "model":
        model = build_model(cell, shape, seed, device).eval()
        tokens = _eval_tokens(shape["vocab_size"], T, seed, device)
        return lambda n=T: model(tokens[:, :n])
    from accrot.bench.ops import build_op, op_forward, op_inputs

    scheme = build_op(cell, shape["H"], shape["D"], seed, device).eval()
    qkv, x, tokens = op_inputs(1, shape["H"], T, shape["D"], seed, device, grad=False)
    return lambda n=T: op_forward(scheme, qkv, x, tokens, n)


def eval_probe(cell: dict[str, Any], shape: dict[str, int], seed: int, T: int, mode: str,
               target: str = "model") -> dict[str, Any]:
    """In a freshly forked child: build the model (or the op, ``target="op"``) and run no-grad forwards of T tokens.

    ``mode="time"``: one untimed forward (starts the OpenMP team and the BLAS/oneDNN kernels, grows the heap,
    fills the caches), then the median of up to :data:`PROBE_FORWARDS` timed forwards, as many as fit in
    :data:`PROBE_SECONDS` (one at long lengths), so a short forward is not judged by one disturbed sample.
    ``mode="memory"``: the allocator is pinned first (:func:`_pin_allocator`; it makes every large allocation a
    fresh ``mmap``, which costs allocation-heavy kernels up to ~40% time, hence a child of its own), one untimed
    forward on a short prefix, then the resident-memory growth (KiB) of one forward.
    """
    from accrot import runtime

    run = _forward(Cell(**cell), shape, seed, T, target, torch.device("cpu"))
    with torch.no_grad():
        if mode == "time":
            run()
            times: list[float] = []
            while not times or (len(times) < PROBE_FORWARDS and sum(times) < PROBE_SECONDS):
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
            return {"seconds": statistics.median(times), "forwards": len(times), "denormals": runtime.denormals(),
                    "allocator": runtime.allocator()}
        _pin_allocator()
        run(min(T, 128))
        gc.collect()
        _pin_allocator()  # trim again
        try:  # restart ru_maxrss at the current RSS: building the model must not hide part of the peak
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        base = _rss_kib()
        out = run()  # the logits [1, T, vocab] or the op's output [1, H, T, D]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        del out
    return {"peak_kib": peak - base, "base_kib": base, "maxrss_before_kib": before}


def zygote_loop() -> None:
    """The helper interpreter: one JSON request per stdin line → fork a child that runs :func:`eval_probe` →
    one JSON result per stdout line. It never runs a tensor op itself, so each child starts OpenMP afresh (and its
    threads inherit the subnormal mode the benchmark process runs under, set here first, as is its allocator)."""
    from accrot import runtime

    runtime.configure_process()  # the time probes allocate as the benchmark process does (memory probes re-pin)
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    for line in sys.stdin:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(read_fd)
            try:
                result = eval_probe(**json.loads(line))
            except BaseException as err:  # noqa: BLE001 - reported to the benchmark process, which raises
                result = {"error": f"{type(err).__name__}: {err}"}
            with os.fdopen(write_fd, "w") as f:
                f.write(json.dumps(result))
            os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd) as f:
            reply = f.read()
        _, status = os.waitpid(pid, 0)
        if not reply:
            reply = json.dumps({"error": f"the child died without a result (wait status {status}; out of memory?)"})
        out.write(reply + "\n")
        out.flush()


class Zygote:
    """Forks the CPU evaluation probes from a clean helper interpreter (torch and accrot imported, no tensor op
    run). Forking the benchmark process itself is not an option: GNU OpenMP keeps a thread pool that a forked
    child inherits without its threads, so the child's first parallel op deadlocks; and ``multiprocessing``'s
    forkserver re-imports the caller's ``__main__`` in every child."""

    def __init__(self) -> None:
        import subprocess

        code = "from accrot.bench.memory import zygote_loop; zygote_loop()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)

    def measure(self, cell: Cell, shape: dict[str, int], seed: int, T: int, mode: str,
                target: str = "model") -> dict[str, Any]:
        """One :func:`eval_probe` in a fresh child: ``{"seconds", "forwards"}`` (time) or ``{"peak_bytes",
        "base_mib", "maxrss_before_mib"}`` (memory)."""
        request = {"cell": dataclasses.asdict(cell), "shape": shape, "seed": seed, "T": T, "mode": mode,
                   "target": target}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        result = json.loads(line) if line else {"error": "the helper interpreter exited"}
        if "error" in result:
            raise RuntimeError(f"evaluation ({mode}) of {cell.name} at T={T} failed: {result['error']}")
        if mode == "time":
            return result
        return {"peak_bytes": result["peak_kib"] * 1024, "base_mib": result["base_kib"] / 1024,
                "maxrss_before_mib": result["maxrss_before_kib"] / 1024}

    def close(self) -> None:
        self.proc.stdin.close()  # the helper's loop ends at EOF
        self.proc.wait()
        self.proc.stdout.close()


def _eval_cuda(run, device: torch.device) -> dict[str, float]:
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        run()
    sync(device)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_bytes": torch.cuda.max_memory_allocated(device) - base}


def eval_plan(cells: Sequence[Cell], lengths: Sequence[int], eval_all: bool) -> dict[int, list[Cell]]:
    """Cells evaluated at each length. Up to :data:`LONG_EVAL` tokens: all of them. Beyond it (unless
    ``eval_all``) one cell per attention kernel and the rotation kinds on the plain kernel: NoPE, ALiBi, FoX,
    ssmax, the gates on NoPE, PaTH (with each far mass) and rope/accum without far mass or value rotation. The
    combined cells run their far-mass anchor's kernel plus O(T·D) rotations (and a gated or interleaved cell its
    rotation's kernel plus a projection)."""
    plan = {}
    for T in lengths:
        if T <= LONG_EVAL or eval_all:
            plan[T] = list(cells)
        else:
            plan[T] = [c for c in cells if not c.facts.rotates or (c.plain and (
                not c.facts.commutes or (c.far_mass_free and not c.facts.rotates_values)))]
    return plan


def measure_eval(plan: dict[int, list[Cell]], repeats: int, device: torch.device, seed: int, log,
                 target: str = "model", shape: dict[str, int] | None = None) -> dict[int, dict[str, dict[str, Any]]]:
    """Per length and variant: evaluation time (see :func:`interleaved_rounds`) and peak memory of the tiny
    model, batch 1 (or of one layer's op, ``target="op"`` with ``shape = {H, D}``)."""
    shape = size_shape("tiny") if target == "model" else shape
    zygote = Zygote() if device.type == "cpu" else None
    try:
        return {T: _measure_length(T, cells, repeats, device, seed, shape, zygote, log, target)
                for T, cells in plan.items()}
    finally:
        if zygote is not None:
            zygote.close()


def _measure_length(T: int, cells: Sequence[Cell], repeats: int, device: torch.device, seed: int,
                    shape: dict[str, int], zygote: Zygote | None, log, target: str) -> dict[str, dict[str, Any]]:
    nope = cells[0].name
    by_name = {c.name: c for c in cells}
    what = "eval tiny" if target == "model" else f"op eval: H {shape['H']} × D {shape['D']}"
    log(f"{what}: T {T}, batch 1, {repeats} round(s) × {len(cells)} variants, NoPE between each"
        + (", one forked child per measurement" if device.type == "cpu" else ""))
    if device.type == "cuda":  # kernels, handles and caches are built on first use: one warm-up forward each
        runs = {c.name: _forward(c, shape, seed, T, target, device) for c in cells}
        for run in runs.values():
            with torch.no_grad():
                run()

    def probe(name: str, mode: str) -> dict[str, Any]:
        if device.type == "cuda":
            return _eval_cuda(runs[name], device)
        return zygote.measure(by_name[name], shape, seed, T, mode, target)

    timed = interleaved_rounds(list(by_name), nope, repeats, seed + T,
                               lambda name: {"ms": probe(name, "time")["seconds"] * 1e3})
    memory = {name: probe(name, "memory") for name in by_name}  # deterministic: once each
    nope_peak = memory[nope]["peak_bytes"]
    if nope_peak <= 0:
        raise RuntimeError(f"NoPE's measured peak at T={T} is {nope_peak} bytes; no memory ratio possible")
    out = {}
    for name, r in timed.items():
        mem = memory[name]
        out[name] = {"ms": r["ms"]["median"], "ratio": r["ms"]["ratio"], "ratio_of_min": r["ms"]["ratio_of_min"],
                     "peak_mib": mem["peak_bytes"] / MIB, "mem_ratio": mem["peak_bytes"] / nope_peak,
                     "ms_samples": r["ms"]["samples"], "ratio_samples": r["ms"]["ratio_samples"],
                     "memory_probe": {k: v for k, v in mem.items() if k not in ("peak_bytes", "seconds")}}
    return out

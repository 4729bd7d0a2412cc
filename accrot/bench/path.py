"""CPU benchmarks of the PaTH kernels (``accrot bench path``).

* :func:`bench_kernels`: wall time of the chunked UT/WY kernel against its recurrence twin, forward (no grad) and
  forward + backward, timed side by side in one process: the two kernels alternate within every repeat and each
  keeps the median of its repeats, so slow phases of a shared machine hit both alike. At long lengths the
  recurrence (T Python steps) is timed from fewer repeats (``long_repeats``).
* :func:`eval_memory`: peak memory of one evaluation forward (``torch.no_grad``) per length, each in a fresh
  subprocess, measured two ways. (1) ``peak_mib``: the peak of live tensor bytes, replayed from the profiler's
  allocation events (``profile_memory=True``): exactly what the algorithm holds, independent of the C allocator.
  (2) ``rss_peak_mib``: Linux's VmHWM after resetting it (``echo 5 > /proc/self/clear_refs``) minus the resident
  size just before the call (imports, inputs, warm-up excluded; ``ru_maxrss`` growth where /proc is not
  writable). RSS also counts glibc's retained and fragmented heap, which does not scale cleanly with T, so the
  linear-memory check (≤ 4.5× from T = 4096 to 16384, no ``[T, T]`` tensor) is made on (1); (2) is reported.

Both return plain ``list[dict]`` rows (JSON-ready) for the CLI to print or save.

On CUDA (``accrot bench path --device cuda``, :func:`bench_kernels_cuda`, :func:`eval_memory_cuda`) the chunked
kernel is timed against fla's Triton PaTH (``kernel="fla"``, where :func:`~accrot.ops.path.fla_problem` finds
nothing missing; otherwise the row says why) and, at short lengths, the recurrence, all on the inputs a bf16-mixed
model hands them (q, k, v in bf16; w, β float32), timed with CUDA events after a warm-up; peak memory is
``torch.cuda.max_memory_allocated`` above the allocation before the call, in-process.
"""

from __future__ import annotations

import functools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from accrot.bench.grid import SCHEMA, parse_device
from accrot.bench.memory import _live_tensor_peak
from accrot.ops.path import fla_problem, path_attention


def _run_kernel(kernel: str, ins: list[torch.Tensor], grad_out: torch.Tensor, backward: bool, chunk: int) -> None:
    """One timed call of ``path_attention`` with ``kernel``: forward only, or forward and backward."""
    if backward:
        out = path_attention(*ins, chunk_size=chunk, kernel=kernel)
        torch.autograd.grad(out, ins, grad_out)
    else:
        with torch.no_grad():
            path_attention(*ins, chunk_size=chunk, kernel=kernel)


def _inputs(B: int, H: int, T: int, D: int, seed: int, requires_grad: bool = False) -> list[torch.Tensor]:
    """q, k, v, w (unit rows), β ∈ (0, 2): the ranges the model produces."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))  # [B, H, T, D]
    w = F.normalize(torch.randn(B, H, T, D, generator=g), dim=-1)  # [B, H, T, D]
    beta = 2 * torch.rand(B, H, T, generator=g)  # [B, H, T]
    return [x.requires_grad_(requires_grad) for x in (q, k, v, w, beta)]


def _timer(fn: Callable[..., object], *args: object) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def bench_kernels(
    lengths: Sequence[int] = (512, 2048, 8192),
    B: int = 1,
    H: int = 4,
    D: int = 32,
    chunk: int = 32,
    backward_lengths: Sequence[int] = (512, 2048),
    repeats: int = 3,
    long_repeats: int = 1,
    long_from: int = 4096,
    threads: int | None = None,
    seed: int = 0,
) -> list[dict]:
    """Time chunked vs recurrence PaTH attention; one row per (T, mode).

    Args:
        lengths: T for forward-only timing (``torch.no_grad``, the evaluation path).
        backward_lengths: T for forward + backward timing (gradients of q, k, v, w, β).
        repeats: timed repeats per kernel (after one untimed warm-up of each).
        long_repeats: repeats of the recurrence from ``long_from`` tokens on (it takes T Python steps).
        threads: torch intra-op threads for the run (None: leave as is); restored afterwards.
    Returns:
        rows ``{"T", "mode", "B", "H", "D", "chunk", "threads", "chunked_s", "recurrent_s", "speedup",
        "repeats_chunked", "repeats_recurrent"}``; ``speedup`` = recurrent_s / chunked_s (medians).
    """
    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        rows = []
        jobs = [(T, "fwd") for T in lengths] + [(T, "fwd+bwd") for T in backward_lengths]
        for T, mode in jobs:
            backward = mode == "fwd+bwd"
            ins = _inputs(B, H, T, D, seed, requires_grad=backward)
            grad_out = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(seed + 1))

            run = functools.partial(_run_kernel, ins=ins, grad_out=grad_out, backward=backward, chunk=chunk)

            n_rec = long_repeats if T >= long_from else repeats
            run("chunked")  # warm-up (allocator, BLAS and LAPACK initialisation)
            if T < long_from:
                run("recurrent")
            times: dict[str, list[float]] = {"chunked": [], "recurrent": []}
            for i in range(max(repeats, n_rec)):  # alternate, so load changes hit both kernels
                if i < repeats:
                    times["chunked"].append(_timer(run, "chunked"))
                if i < n_rec:
                    times["recurrent"].append(_timer(run, "recurrent"))
            chunked, recurrent = (statistics.median(times[k]) for k in ("chunked", "recurrent"))
            rows.append(
                {
                    "T": T,
                    "mode": mode,
                    "B": B,
                    "H": H,
                    "D": D,
                    "chunk": chunk,
                    "threads": torch.get_num_threads(),
                    "chunked_s": chunked,
                    "recurrent_s": recurrent,
                    "speedup": recurrent / chunked,
                    "repeats_chunked": repeats,
                    "repeats_recurrent": n_rec,
                }
            )
        return rows
    finally:
        torch.set_num_threads(saved_threads)


# -- memory -----------------------------------------------------------------------------------------
def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def memory_child(T: int, B: int, H: int, D: int, chunk: int, kernel: str, seed: int) -> None:
    """Run in a fresh interpreter: print one JSON row with the peak memory of one no-grad forward."""
    import gc
    import resource

    from accrot import runtime

    # as the benchmark process runs, before the first parallel op; the subnormal mode alone: this child's peak
    # memory is read under glibc's own allocator
    runtime.set_denormals()
    ins = _inputs(B, H, T, D, seed)
    with torch.no_grad():
        path_attention(*_inputs(B, H, min(T, 4 * chunk), D, seed), chunk_size=chunk, kernel=kernel)  # warm-up
        gc.collect()
        before = _status_kib("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            rss_method = "VmHWM"
        except OSError:
            rss_method, before = "ru_maxrss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = path_attention(*ins, chunk_size=chunk, kernel=kernel)
        if rss_method == "VmHWM":
            peak = _status_kib("VmHWM")
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        del out
        tensors = _live_tensor_peak(lambda: path_attention(*ins, chunk_size=chunk, kernel=kernel))
    print(
        json.dumps(
            {
                "T": T,
                "kernel": kernel,
                "peak_mib": None if tensors is None else tensors / 2**20,
                "rss_peak_mib": (peak - before) / 1024,
                "rss_method": rss_method,
                "inputs_mib": sum(x.numel() * x.element_size() for x in ins) / 2**20,
            }
        )
    )


def eval_memory(
    lengths: Sequence[int] = (4096, 16384),
    B: int = 1,
    H: int = 4,
    D: int = 32,
    chunk: int = 32,
    kernel: str = "chunked",
    seed: int = 0,
) -> list[dict]:
    """Peak extra memory of one evaluation forward per length, each measured in a fresh subprocess.

    Returns rows ``{"T", "kernel", "peak_mib", "rss_peak_mib", "rss_method", "inputs_mib", "growth",
    "rss_growth", "length_ratio"}``: ``peak_mib`` is the peak of live tensors allocated by the call (profiler
    allocation events; what the algorithm holds), ``rss_peak_mib`` the resident-set peak above the pre-call RSS
    (adds the C allocator's retention and fragmentation). ``growth`` = peak_mib relative to the first length;
    linear memory means growth ≈ length_ratio.
    """
    rows = []
    for T in lengths:
        code = (
            "from accrot.bench.path import memory_child; "
            f"memory_child({int(T)}, {int(B)}, {int(H)}, {int(D)}, {int(chunk)}, {kernel!r}, {int(seed)})"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"memory probe at T={T} failed: {done.stderr.strip().splitlines()[-1:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for row in rows:  # growth against the shortest length; None where that base measured nothing (a 0 peak)
        row["growth"] = _growth(row["peak_mib"], rows[0]["peak_mib"])
        row["rss_growth"] = _growth(row["rss_peak_mib"], rows[0]["rss_peak_mib"])
        row["length_ratio"] = row["T"] / rows[0]["T"]
    return rows


def _growth(value: float | None, base: float | None) -> float | None:
    """``value / base``, or None when either is missing or the base is not positive (no ratio to report)."""
    return None if value is None or base is None or base <= 0 else value / base


# -- CUDA: chunked vs fla ---------------------------------------------------------------------------
def _cuda_inputs(B: int, H: int, T: int, D: int, seed: int, requires_grad: bool) -> list[torch.Tensor]:
    """What a bf16-mixed PaTH layer passes the kernel: q, k, v in bf16, w and β float32, on the GPU."""
    q, k, v, w, beta = (x.detach() for x in _inputs(B, H, T, D, seed))
    out = [*(x.to("cuda", torch.bfloat16) for x in (q, k, v)), w.cuda(), beta.cuda()]
    return [x.requires_grad_(requires_grad) for x in out]


def _cuda_time(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``fn()`` by CUDA events, after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def bench_kernels_cuda(
    lengths: Sequence[int] = (4096, 16384, 65536),
    backward_lengths: Sequence[int] = (4096, 16384),
    B: int = 1,
    H: int = 4,
    D: int = 32,
    chunk: int = 32,
    repeats: int = 3,
    recurrent_up_to: int = 2048,
    seed: int = 0,
) -> list[dict]:
    """Chunked vs fla (vs the recurrence up to ``recurrent_up_to``) PaTH on CUDA; one row per (T, mode):
    ``{"T", "mode", "device", "B", "H", "D", "chunk", "chunked_s", "fla_s", "recurrent_s", "fla_speedup", "fla"}``
    with ``fla_speedup`` = chunked_s / fla_s and ``fla`` "ok" or the one-line reason it did not run."""
    problem = fla_problem("cuda")
    kernels = ["chunked"] + (["fla"] if problem is None else [])
    rows = []
    jobs = [(T, "fwd") for T in lengths] + [(T, "fwd+bwd") for T in backward_lengths]
    for T, mode in jobs:
        backward = mode == "fwd+bwd"
        ins = _cuda_inputs(B, H, T, D, seed, backward)
        grad_out = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)

        run = functools.partial(_run_kernel, ins=ins, grad_out=grad_out, backward=backward, chunk=chunk)

        row: dict[str, Any] = {"T": T, "mode": mode, "device": torch.cuda.get_device_name(), "B": B, "H": H, "D": D,
                               "chunk": chunk, "chunked_s": None, "fla_s": None, "recurrent_s": None,
                               "fla_speedup": None, "fla": problem or "ok"}
        for kernel in kernels + (["recurrent"] if T <= recurrent_up_to else []):
            try:
                row[f"{kernel}_s"] = _cuda_time(functools.partial(run, kernel), repeats)
            except torch.OutOfMemoryError:  # reported as a missing time, named
                row.setdefault("out_of_memory", []).append(kernel)
                torch.cuda.empty_cache()
            except Exception as err:  # noqa: BLE001 - a broken fla is a result to report, not a crash
                if kernel != "fla":
                    raise
                row["fla"] = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:160]}"
                row["fla_failed"] = True  # the command reports it and exits 1 (a table cell alone would hide it)
        if row["chunked_s"] and row["fla_s"]:
            row["fla_speedup"] = row["chunked_s"] / row["fla_s"]
        rows.append(row)
        del ins, grad_out
        torch.cuda.empty_cache()
    return rows


def eval_memory_cuda(lengths: Sequence[int] = (4096, 16384, 65536), B: int = 1, H: int = 4, D: int = 32,
                     chunk: int = 32, seed: int = 0) -> list[dict]:
    """Peak CUDA memory of one evaluation forward (``torch.no_grad``) per length and kernel (chunked, and fla where
    it runs): ``{"T", "kernel", "peak_mib", "inputs_mib", "growth", "length_ratio"}``."""
    kernels = ["chunked"] + (["fla"] if fla_problem("cuda") is None else [])
    rows = []
    for kernel in kernels:
        first = None
        for T in lengths:
            ins = _cuda_inputs(B, H, T, D, seed, False)
            row: dict[str, Any] = {"T": T, "kernel": kernel, "peak_mib": None,
                                   "inputs_mib": sum(x.numel() * x.element_size() for x in ins) / 2**20}
            try:
                with torch.no_grad():
                    path_attention(*ins, chunk_size=chunk, kernel=kernel)  # warm-up
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    before = torch.cuda.memory_allocated()
                    path_attention(*ins, chunk_size=chunk, kernel=kernel)
                    torch.cuda.synchronize()
                    row["peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
            except torch.OutOfMemoryError:
                row["peak_mib"] = "out of memory"
            first = first if first is not None else row["peak_mib"]
            row["growth"] = _growth(row["peak_mib"] if isinstance(row["peak_mib"], float) else None,
                                    first if isinstance(first, float) else None)
            row["length_ratio"] = T / lengths[0]
            rows.append(row)
            del ins
            torch.cuda.empty_cache()
    return rows


def run_path(lengths: Sequence[int], B: int, H: int, D: int, chunk: int, log=print, device: str = "cpu",
             memory_lengths: Sequence[int] | None = None, peer: str = "fla",
             peer_lengths: Sequence[int] = (512, 2048, 8192),
             peer_backward_lengths: Sequence[int] = (512, 2048),
             backward_lengths: Sequence[int] | None = None) -> dict[str, Any]:
    """The PaTH kernels' report: the kernels timed at each length and the evaluation's peak memory (CPU: chunked vs
    the recurrence, memory in fresh subprocesses, and against fla's CPU reference, :mod:`accrot.bench.peer`, unless
    ``peer="none"``; CUDA: chunked vs fla's Triton kernel, memory in-process, forward + backward at
    ``backward_lengths``, by default the first two ``lengths``)."""
    dev = parse_device(device)
    started = time.perf_counter()
    log(f"path: kernels at T = {', '.join(map(str, lengths))} (B {B}, H {H}, D {D}, chunk {chunk}) on {dev}")
    doc: dict[str, Any] = {"schema": SCHEMA, "bench": "path", "device": str(dev), "torch": torch.__version__,
                           "threads": torch.get_num_threads()}
    if dev.type == "cuda":
        with torch.cuda.device(dev):
            doc["fla"] = fla_problem(dev) or "ok"
            doc["kernels"] = bench_kernels_cuda(lengths=tuple(lengths), backward_lengths=tuple(
                lengths[:2] if backward_lengths is None else backward_lengths), B=B,
                                                H=H, D=D, chunk=chunk)
            log("path: evaluation peak memory")
            doc["memory"] = eval_memory_cuda(tuple(memory_lengths or (4096, 16384)), B=B, H=H, D=D, chunk=chunk)
    else:
        doc["kernels"] = bench_kernels(lengths=tuple(lengths), B=B, H=H, D=D, chunk=chunk)
        log("path: evaluation peak memory")
        doc["memory"] = eval_memory(tuple(memory_lengths or (4096, 16384)), B=B, H=H, D=D, chunk=chunk)
        if peer == "fla":
            from accrot.bench.peer import bench_peer

            doc["peer"] = bench_peer(peer_lengths, peer_backward_lengths, B, H, D, chunk, log=log)
        else:
            doc["peer"] = {"peer": "peer skipped: --peer none", "rows": []}
    doc["wall_s"] = time.perf_counter() - started
    return doc


if __name__ == "__main__":  # python -m accrot.bench.path [threads]
    for row in bench_kernels(threads=int(sys.argv[1]) if len(sys.argv) > 1 else None):
        print(json.dumps(row))
    for row in eval_memory():
        print(json.dumps(row))

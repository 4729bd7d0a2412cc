"""``accrot bench``: side-by-side cost of every position scheme, as ratios to NoPE measured in one process.

Subcommands::

    accrot bench schemes [--sizes tiny small] [--T 512] [--eval_lengths 4096 16384] [--repeats 6]
                         [--eval_repeats 3] [--batch '{small: 2}'] [--eval_all] [--device cpu] [--quick]
                         [--out bench_schemes.json]
    accrot bench path    [--lengths 512 2048 8192] [--B 1] [--H 4] [--D 32] [--chunk 64] [--out bench_path.json]
    accrot bench pipeline [--pipeline_steps 30] [--pipeline_rounds 3] [--with_logger] [--out bench_pipeline.json]
    accrot bench all     (all three; one table each, one JSON report, default bench.json)

``pipeline`` times the Lightning training loop against a bare PyTorch loop on the same model and batches
(:mod:`accrot.bench_pipeline`).

``schemes`` builds the full :class:`~accrot.model.Transformer` once per built cell of the grid
rotation × far_mass × rotate_values (DESIGN §2; ``accum`` with ``random_position`` and ``learned`` increments as
separate rows, rotate_values for rope/accum only, path cells when ``path`` is registered) and measures

* **training step** (forward + next-token cross-entropy + ``loss.backward()``, no optimiser) at ``T`` for each
  model size. Shapes (d_model, n_layers, n_heads) come from the shipped ``tiny.yaml`` / ``small.yaml``; the
  batches are cut from 16 and 32 to 8 and 2 (:data:`BENCH_BATCH`, ``--batch``) to keep the run short — the
  ratios are per-token costs, which the batch barely moves. After one untimed warm-up round, ``--repeats``
  rounds visit every variant once each, in a freshly shuffled order, all models alive in one process, with a
  NoPE step between every two (:func:`interleaved_rounds`). Reported: the median time per variant, the median
  over rounds of its ratio to the mean of the two NoPE steps right beside it (``×``), and the ratio of the
  minima over equally many samples (``×min``). On a shared machine single steps are now and then slowed 5–30× (another process takes a
  core and the OpenMP team waits on it); the neighbouring NoPE steps usually share the slowdown, and where a
  burst still hits most of one variant's samples the minima compare like with like.
* **evaluation forward** (``model.eval()``, ``torch.no_grad``, batch 1) of the tiny model at each of
  ``--eval_lengths``: time ratios from the same interleaved rounds (``--eval_repeats``), one forked child per
  measurement, and the peak-memory ratio from one more child per variant (memory is deterministic; see
  :func:`_eval_probe`). Beyond :data:`LONG_EVAL` tokens the default measures one cell per attention kernel and
  the rotation kinds on the plain kernel (:func:`eval_plan`: NoPE, ALiBi, FoX, rope, accum); ``--eval_all``
  measures every cell (combined cells and PaTH: several minutes more).

Peak memory on CPU: torch's CPU allocations are invisible to :mod:`tracemalloc`, so every (variant, length, round)
runs in its own forked child (:func:`_eval_probe`). After its untimed and timed forwards, the child returns free
heap to the OS and pins glibc's mmap threshold at 64 KiB (glibc otherwise raises it after every free, so how much
freed memory stays resident depends on the allocation history: peaks then jump between runs by an order of
magnitude), restarts ``ru_maxrss`` at the current RSS (``echo 5 > /proc/self/clear_refs``), reads the resident
set from ``/proc/self/statm`` as the baseline, runs one more forward and reads
``getrusage(RUSAGE_SELF).ru_maxrss``; the peak is ``ru_maxrss − baseline``. The children are forked from a clean
helper interpreter (:class:`_Zygote`), not from the benchmark process: GNU OpenMP's thread pool does not survive
``fork`` (a child of a process that already ran parallel ops deadlocks on its first one), and
``multiprocessing``'s forkserver re-imports the caller's ``__main__`` in every child. Limits: this is resident
memory (page granularity; small allocations come from the heap), not allocator bookkeeping; the logits and the
eval-mode caches built by the earlier forwards are in the baseline, not the peak.
On CUDA (``--device cuda``) everything runs in-process: ``torch.cuda.max_memory_allocated`` after
``reset_peak_memory_stats`` minus the allocation before the forward, after one warm-up forward per variant.

Targets (from the issue; ✓/✗ per row, ``–`` where the issue sets none): rope/none and accum/none (q/k only)
training steps ≤ 1.10× NoPE at every size; the same cells with rotate_values ≤ 1.15×; none/alibi and
none/forget evaluation at 16384 tokens (or the longest length measured) ≤ 2× NoPE's time and ≤ 1.5× NoPE's
peak memory. Combined cells (e.g. accum/forget) are reported without a target.

Seeds are fixed (every variant starts from the same backbone weights and sees the same tokens); the torch
thread count is left as it is. The default run takes about 6 minutes on 2 idle cores and several times that
while the cores are shared. ``--quick`` is a smoke run (~30 s idle): tiny only, batch 4, T = 256, every cell
evaluated at 1024, one round.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from accrot.ops import cpu_kernels

SCHEMA = "accrot.bench/1"
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
SIZES = ("tiny", "small")
# training-step batch per size (the recipes train at 16 and 32), cut to keep the default run near 5 minutes
BENCH_BATCH = {"tiny": 8, "small": 2}
FULL = {"sizes": ["tiny", "small"], "T": 512, "eval_lengths": [4096, 16384], "repeats": 6, "eval_repeats": 3}
QUICK = {"sizes": ["tiny"], "T": 256, "eval_lengths": [1024], "repeats": 1, "eval_repeats": 1}
QUICK_BATCH = {"tiny": 4, "small": 1}
TARGET_EVAL_LENGTH = 16384
PROBE_FORWARDS, PROBE_SECONDS = 3, 0.5  # timed forwards per evaluation child (see _eval_probe)
LONG_EVAL = 4096  # beyond this length the default evaluation measures only the anchors (see eval_plan)
ROTATION_LIMIT, ROTATION_VALUES_LIMIT = 1.10, 1.15  # training step / NoPE
FAR_MASS_TIME_LIMIT, FAR_MASS_MEMORY_LIMIT = 2.0, 1.5  # evaluation forward / NoPE
MIB = 2.0**20


# -- the grid -----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Cell:
    """One built cell of the ablation grid."""

    rotation: str
    far_mass: str = "none"
    rotate_values: bool = False
    increments: str | None = None

    @property
    def name(self) -> str:
        rot = self.rotation if self.increments is None else f"{self.rotation}:{self.increments}"
        return f"{rot}/{self.far_mass}" + ("+v" if self.rotate_values else "")

    def scheme(self):
        from accrot.position import SchemeConfig

        return SchemeConfig(rotation=self.rotation, far_mass=self.far_mass, rotate_values=self.rotate_values,
                            increments=self.increments)


def grid() -> tuple[list[Cell], list[str]]:
    """Every built cell, NoPE first, and a note per family of DESIGN §2 that is not registered yet."""
    from accrot.position import FAR_MASS, ROTATIONS

    rotations = [r for r in ("none", "rope", "accum", "path") if r in ROTATIONS]
    far_masses = ["none"] + [f for f in ("alibi", "forget") if f in FAR_MASS]
    notes = [f"rotation {r!r} is not built yet" for r in ("rope", "accum", "path") if r not in ROTATIONS]
    notes += [f"far_mass {f!r} is not built yet" for f in ("alibi", "forget") if f not in FAR_MASS]
    cells = []
    for rotation in rotations:
        kinds: list[str | None] = ["random_position", "learned"] if rotation == "accum" else [None]
        for increments in kinds:
            for far_mass in far_masses:
                for values in (False, True) if rotation in ("rope", "accum") else (False,):
                    cells.append(Cell(rotation, far_mass, values, increments))
    return cells, notes


def size_shape(size: str) -> dict[str, int]:
    """d_model, n_layers, n_heads, vocab_size and the recipe's batch of a shipped config."""
    import yaml

    doc = yaml.safe_load((CONFIG_DIR / f"{size}.yaml").read_text())
    model = doc["model"]
    return {"d_model": model["d_model"], "n_layers": model["n_layers"], "n_heads": model["n_heads"],
            "vocab_size": model.get("vocab_size", 256), "recipe_batch": doc["data"]["init_args"]["batch_size"]}


def build_model(cell: Cell, shape: dict[str, int], seed: int, device: torch.device):
    from accrot.model import ModelConfig, Transformer

    torch.manual_seed(seed)  # same backbone weights for every variant
    cfg = ModelConfig(vocab_size=shape["vocab_size"], d_model=shape["d_model"], n_layers=shape["n_layers"],
                      n_heads=shape["n_heads"], scheme=cell.scheme())
    return Transformer(cfg).to(device)


# -- timing -------------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _train_step(model, tokens: torch.Tensor) -> float:
    """Seconds of forward + next-token loss + backward on ``tokens [B, T+1]``."""
    model.zero_grad(set_to_none=True)
    _sync(tokens.device)
    t0 = time.perf_counter()
    logits = model(tokens[:, :-1])  # [B, T, vocab]
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    _sync(tokens.device)
    seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)  # every model stays alive for the rounds; its gradients need not
    return seconds


def interleaved_rounds(names: Sequence[str], nope: str, repeats: int, seed: int,
                       measure: Callable[[str], dict[str, float]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Measure every variant ``repeats`` times, NoPE interleaved as the reference.

    Each round visits the other variants once in a freshly shuffled order, with a NoPE measurement before the
    first and after each one, so every sample has two NoPE neighbours taken moments apart: a burst of load from
    another process (seconds long, here) hits a sample and its reference alike far more often than it would with
    one NoPE sample per round. ``measure(name)`` returns ``{metric: value}``. Returns, per variant and metric:
    ``median`` of the samples, ``ratio`` = median over rounds of sample / mean of its two NoPE neighbours (1 for
    NoPE), ``ratio_of_min`` = min(samples) / min(the NoPE samples measured right before them), and the samples.

    Both statistics compare equal numbers of draws. The minimum of two NoPE neighbours (as a per-sample
    reference), or the minimum over every NoPE sample of the run (~25 per variant sample), is systematically
    lower than one draw of the same noisy distribution: it inflated both ratios by about the noise's spread, a few
    percent on a shared machine, against every variant alike.
    """
    others = [n for n in names if n != nope]
    values: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    refs: dict[str, dict[str, list[float]]] = {n: {} for n in others}  # mean of the two neighbours
    befores: dict[str, dict[str, list[float]]] = {n: {} for n in others}  # the NoPE sample right before

    def add(store: dict[str, dict[str, list[float]]], name: str, res: dict[str, float]) -> None:
        for key, value in res.items():
            store[name].setdefault(key, []).append(value)

    for r in range(repeats):
        order = list(others)
        random.Random(seed + r).shuffle(order)
        before = measure(nope)
        add(values, nope, before)
        for name in order:
            res, after = measure(name), measure(nope)
            add(values, name, res)
            add(values, nope, after)
            add(refs, name, {key: 0.5 * (before[key] + after[key]) for key in res})
            add(befores, name, {key: before[key] for key in res})
            before = after
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in names:
        out[name] = {}
        for key, samples in values[name].items():
            if name == nope:
                ratios, of_min = [1.0] * len(samples), 1.0
            else:
                ratios = [v / ref for v, ref in zip(samples, refs[name][key])]
                of_min = min(samples) / min(befores[name][key])
            out[name][key] = {"median": statistics.median(samples), "ratio": statistics.median(ratios),
                              "ratio_of_min": of_min, "samples": samples, "ratio_samples": ratios}
    return out


def time_training(cells: Sequence[Cell], size: str, T: int, batch: int, repeats: int, device: torch.device,
                  seed: int, log) -> dict[str, dict[str, Any]]:
    """Training-step ms per variant (see :func:`interleaved_rounds`), after one untimed step of each."""
    shape = size_shape(size)
    models = {c.name: build_model(c, shape, seed, device).train() for c in cells}
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, shape["vocab_size"], (batch, T + 1), generator=g).to(device)  # [B, T+1]
    log(f"train {size}: d_model {shape['d_model']}, {shape['n_layers']} layers, {shape['n_heads']} heads, "
        f"B {batch}, T {T}: warm-up + {repeats} round(s) × {len(models)} variants, NoPE between each")
    for name in models:  # warm-up: allocator, thread pools, lazy caches
        _train_step(models[name], tokens)
    res = interleaved_rounds(list(models), cells[0].name, repeats, seed,
                             lambda name: {"ms": _train_step(models[name], tokens) * 1e3})
    return {name: r["ms"] for name, r in res.items()}


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


def _eval_tokens(vocab_size: int, T: int, seed: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + T)
    return torch.randint(0, vocab_size, (1, T), generator=g).to(device)  # [1, T], the same for every variant


def _eval_probe(cell: dict[str, Any], shape: dict[str, int], seed: int, T: int, mode: str) -> dict[str, Any]:
    """In a freshly forked child: build the model and run no-grad forwards of ``[1, T]`` tokens.

    ``mode="time"``: one untimed forward (starts the OpenMP team and the BLAS/oneDNN kernels, grows the heap,
    fills the caches), then the median of up to :data:`PROBE_FORWARDS` timed forwards, as many as fit in
    :data:`PROBE_SECONDS` (one at long lengths), so a short forward is not judged by one disturbed sample.
    ``mode="memory"``: the allocator is pinned first (:func:`_pin_allocator`; it makes every large allocation a
    fresh ``mmap``, which costs allocation-heavy kernels up to ~40% time, hence a child of its own), one untimed
    forward on a short prefix, then the resident-memory growth (KiB) of one forward.
    """
    model = build_model(Cell(**cell), shape, seed, torch.device("cpu")).eval()
    tokens = _eval_tokens(shape["vocab_size"], T, seed, torch.device("cpu"))
    with torch.no_grad():
        if mode == "time":
            model(tokens)
            times: list[float] = []
            while not times or (len(times) < PROBE_FORWARDS and sum(times) < PROBE_SECONDS):
                t0 = time.perf_counter()
                model(tokens)
                times.append(time.perf_counter() - t0)
            return {"seconds": statistics.median(times), "forwards": len(times)}
        _pin_allocator()
        model(tokens[:, : min(T, 128)])
        gc.collect()
        _pin_allocator()  # trim again
        try:  # restart ru_maxrss at the current RSS: building the model must not hide part of the peak
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        base = _rss_kib()
        logits = model(tokens)  # [1, T, vocab]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        del logits
    return {"peak_kib": peak - base, "base_kib": base, "maxrss_before_kib": before}


def _zygote_loop() -> None:
    """The helper interpreter: one JSON request per stdin line → fork a child that runs :func:`_eval_probe` →
    one JSON result per stdout line. It never runs a tensor op itself, so each child starts OpenMP afresh."""
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    for line in sys.stdin:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(read_fd)
            try:
                result = _eval_probe(**json.loads(line))
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


class _Zygote:
    """Forks the CPU evaluation probes from a clean helper interpreter (torch and accrot imported, no tensor op
    run). Forking the benchmark process itself is not an option: GNU OpenMP keeps a thread pool that a forked
    child inherits without its threads, so the child's first parallel op deadlocks; and ``multiprocessing``'s
    forkserver re-imports the caller's ``__main__`` in every child."""

    def __init__(self) -> None:
        import subprocess

        code = "from accrot.bench import _zygote_loop; _zygote_loop()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)

    def measure(self, cell: Cell, shape: dict[str, int], seed: int, T: int, mode: str) -> dict[str, Any]:
        """One :func:`_eval_probe` in a fresh child: ``{"seconds", "forwards"}`` (time) or ``{"peak_bytes",
        "base_mib", "maxrss_before_mib"}`` (memory)."""
        request = {"cell": dataclasses.asdict(cell), "shape": shape, "seed": seed, "T": T, "mode": mode}
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


def _eval_cuda(model, tokens: torch.Tensor) -> dict[str, float]:
    _sync(tokens.device)
    torch.cuda.reset_peak_memory_stats(tokens.device)
    base = torch.cuda.memory_allocated(tokens.device)
    t0 = time.perf_counter()
    with torch.no_grad():
        model(tokens)
    _sync(tokens.device)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_bytes": torch.cuda.max_memory_allocated(tokens.device) - base}


def eval_plan(cells: Sequence[Cell], lengths: Sequence[int], eval_all: bool) -> dict[int, list[Cell]]:
    """Cells evaluated at each length. Up to :data:`LONG_EVAL` tokens: all of them. Beyond it (unless
    ``eval_all``) one cell per attention kernel and the rotation kinds on the plain kernel: NoPE, ALiBi, FoX and
    rope/accum without far mass or value rotation. The combined cells run their far-mass anchor's kernel plus
    O(T·D) rotations, and PaTH's O(T²·D) chunk walk takes most of a minute per forward at 16k on 2 cores
    (``accrot bench path`` times that kernel)."""
    plan = {}
    for T in lengths:
        if T <= LONG_EVAL or eval_all:
            plan[T] = list(cells)
        else:
            plan[T] = [c for c in cells if c.rotation == "none"
                       or (c.rotation != "path" and c.far_mass == "none" and not c.rotate_values)]
    return plan


def measure_eval(plan: dict[int, list[Cell]], repeats: int, device: torch.device, seed: int,
                 log) -> dict[int, dict[str, dict[str, Any]]]:
    """Per length and variant: evaluation time (see :func:`interleaved_rounds`) and peak memory of the tiny
    model, batch 1."""
    shape = size_shape("tiny")
    zygote = _Zygote() if device.type == "cpu" else None
    try:
        return {T: _measure_length(T, cells, repeats, device, seed, shape, zygote, log) for T, cells in plan.items()}
    finally:
        if zygote is not None:
            zygote.close()


def _measure_length(T: int, cells: Sequence[Cell], repeats: int, device: torch.device, seed: int,
                    shape: dict[str, int], zygote: _Zygote | None, log) -> dict[str, dict[str, Any]]:
    nope = cells[0].name
    by_name = {c.name: c for c in cells}
    log(f"eval tiny: T {T}, {repeats} round(s) × {len(cells)} variants, NoPE between each"
        + (", one forked child per measurement" if device.type == "cpu" else ""))
    if device.type == "cuda":  # kernels, handles and caches are built on first use: one warm-up forward each
        tokens = _eval_tokens(shape["vocab_size"], T, seed, device)
        models = {c.name: build_model(c, shape, seed, device).eval() for c in cells}
        for model in models.values():
            with torch.no_grad():
                model(tokens)

    def probe(name: str, mode: str) -> dict[str, Any]:
        if device.type == "cuda":
            return _eval_cuda(models[name], tokens)
        return zygote.measure(by_name[name], shape, seed, T, mode)

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


# -- targets ------------------------------------------------------------------------------------------------
def targets(cell: Cell, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets that apply to ``cell``, each ``{what, value, limit, ok}``."""
    checks = []
    if cell.far_mass == "none" and cell.rotation in ("rope", "accum"):
        limit = ROTATION_VALUES_LIMIT if cell.rotate_values else ROTATION_LIMIT
        for size, res in row["train"].items():
            checks.append({"what": f"train {size}", "value": res["ratio"], "value_of_min": res["ratio_of_min"],
                           "limit": limit})
    if cell.rotation == "none" and cell.far_mass != "none" and row["eval"]:
        lengths = [int(k) for k in row["eval"]]  # the anchors are measured at every length
        T = TARGET_EVAL_LENGTH if TARGET_EVAL_LENGTH in lengths else max(lengths)
        res = row["eval"][str(T)]
        checks.append({"what": f"eval {T} time", "value": res["ratio"], "value_of_min": res["ratio_of_min"],
                       "limit": FAR_MASS_TIME_LIMIT})
        checks.append({"what": f"eval {T} memory", "value": res["mem_ratio"], "value_of_min": res["mem_ratio"],
                       "limit": FAR_MASS_MEMORY_LIMIT})
    for check in checks:  # judged on the median ratio; ok_of_min says whether the minima agree
        check["ok"] = bool(check["value"] <= check["limit"])
        check["ok_of_min"] = bool(check["value_of_min"] <= check["limit"])
    return checks


# -- the schemes benchmark --------------------------------------------------------------------------------
def _device(name: str) -> torch.device:
    from accrot.cli import UsageError

    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise UsageError(f"device={name!r} is not a torch device (cpu, cuda, cuda:1, ...)") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device={name!r} but CUDA is not available here; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"device={name!r} is not supported by the benchmark; use cpu or cuda")
    return device


def run_schemes(sizes: Sequence[str], T: int, eval_lengths: Sequence[int], repeats: int, eval_repeats: int,
                batch: dict[str, int], eval_all: bool = False, device: str = "cpu", seed: int = 0,
                log=print) -> dict[str, Any]:
    """Measure every built cell; returns the JSON-ready report (``rows`` in grid order, NoPE first)."""
    from accrot.cli import UsageError

    for name, value in {"T": T, "repeats": repeats, "eval_repeats": eval_repeats}.items():
        if value < 1:
            raise UsageError(f"{name}={value} is not valid; it must be a positive integer")
    if any(ln < 1 for ln in eval_lengths):
        raise UsageError(f"eval_lengths={list(eval_lengths)} is not valid; lengths must be positive")
    bad = [k for k, v in batch.items() if k not in SIZES or not isinstance(v, int) or v < 1]
    if bad:
        raise UsageError(f"batch has a bad entry {bad[0]!r}; give sizes {', '.join(SIZES)} positive integers")
    dev = _device(device)
    started = time.perf_counter()
    cells, notes = grid()
    for note in notes:
        log(f"note: {note}; its cells are skipped")
    train = {size: time_training(cells, size, T, batch[size], repeats, dev, seed, log) for size in sizes}
    plan = eval_plan(cells, list(eval_lengths), eval_all)
    evals = measure_eval(plan, eval_repeats, dev, seed, log)
    rows = []
    for cell in cells:
        row: dict[str, Any] = {
            "variant": cell.name, "rotation": cell.rotation, "far_mass": cell.far_mass,
            "rotate_values": cell.rotate_values, "increments": cell.increments,
            "train": {size: {"batch": batch[size], "T": T, "ms": res[cell.name]["median"],
                             "ratio": res[cell.name]["ratio"], "ratio_of_min": res[cell.name]["ratio_of_min"],
                             "ms_samples": res[cell.name]["samples"],
                             "ratio_samples": res[cell.name]["ratio_samples"]} for size, res in train.items()},
            "eval": {str(ln): res[cell.name] for ln, res in evals.items() if cell.name in res},
        }
        row["targets"] = targets(cell, row)
        row["ok"] = all(c["ok"] for c in row["targets"]) if row["targets"] else None
        rows.append(row)
    return {
        "schema": SCHEMA, "bench": "schemes", "device": str(dev), "torch": torch.__version__,
        "python": platform.python_version(), "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "rotation_kernels": cpu_kernels.describe(dev),  # compiled CPU kernels or eager torch ops
        "settings": {"sizes": {s: {**size_shape(s), "batch": batch[s]} for s in sizes}, "T": T,
                     "eval_lengths": list(eval_lengths), "eval_model": "tiny", "eval_batch": 1, "repeats": repeats,
                     "eval_repeats": eval_repeats, "eval_all": eval_all, "seed": seed,
                     "eval_skipped": {str(ln): [c.name for c in cells if c not in plan[ln]] for ln in plan},
                     "memory_method": "cuda max_memory_allocated" if dev.type == "cuda"
                     else "forked child: ru_maxrss after − /proc/self/statm RSS before"},
        "notes": notes, "rows": rows, "wall_s": time.perf_counter() - started,
    }


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}×"


def _mark(row: dict[str, Any]) -> str:
    """✓/✗ on the median ratios; where the ratio of minima disagrees, what it says in brackets."""
    if not row["targets"]:
        return "–"
    failed = [f"{c['what']} {c['value']:.3f}>{c['limit']:.2f}" for c in row["targets"] if not c["ok"]]
    mark = "✓" if not failed else "✗ " + "; ".join(failed)
    differ = [c for c in row["targets"] if c["ok"] != c["ok_of_min"]]
    if differ:
        mark += " [×min: " + "; ".join(f"{c['what']} {c['value_of_min']:.3f} {'✓' if c['ok_of_min'] else '✗'}"
                                       for c in differ) + "]"
    return mark


def schemes_table(doc: dict[str, Any]):
    from rich.table import Table

    sizes = list(doc["settings"]["sizes"])
    lengths = doc["settings"]["eval_lengths"]
    nope = doc["rows"][0]
    absolute = [f"{s} train {nope['train'][s]['ms']:.0f} ms" for s in sizes]
    absolute += [f"eval {ln} {nope['eval'][str(ln)]['ms']:.0f} ms / {nope['eval'][str(ln)]['peak_mib']:.0f} MiB"
                 for ln in lengths]
    kernels = f", rotation kernels: {doc['rotation_kernels']}" if "rotation_kernels" in doc else ""
    table = Table(title=f"position schemes vs NoPE ({doc['device']}, {doc['threads']} threads, T = "
                        f"{doc['settings']['T']}; eval: tiny, batch 1{kernels})",
                  caption="NoPE: " + ", ".join(absolute) + ". ×: median of ratios to the two NoPE neighbours; ×min: "
                          "ratio of the minima; ms: median; n/m: not measured (see --eval_all).")
    table.add_column("variant")
    for s in sizes:
        table.add_column(f"{s} ms", justify="right")
        table.add_column(f"{s} ×", justify="right")
        table.add_column(f"{s} ×min", justify="right")
    for ln in lengths:
        table.add_column(f"eval {ln} ×t", justify="right")
        table.add_column(f"{ln} ×mem", justify="right")
    table.add_column("target")
    for row in doc["rows"]:
        cells = [row["variant"]]
        for s in sizes:
            res = row["train"][s]
            cells += [f"{res['ms']:.0f}", _fmt_ratio(res["ratio"]), _fmt_ratio(res["ratio_of_min"])]
        for ln in lengths:
            res = row["eval"].get(str(ln))
            cells += ["n/m", "n/m"] if res is None else [_fmt_ratio(res["ratio"]), _fmt_ratio(res["mem_ratio"])]
        cells.append(_mark(row))
        table.add_row(*cells)
    return table


# -- the PaTH kernel benchmark (accrot.bench_path) ----------------------------------------------------------
def run_path(lengths: Sequence[int], B: int, H: int, D: int, chunk: int, log=print) -> dict[str, Any] | None:
    """``accrot.bench_path.bench_kernels`` (and ``eval_memory`` where it exists); None while it is not written."""
    try:
        import accrot.bench_path as bench_path
    except ModuleNotFoundError as err:
        if err.name != "accrot.bench_path":
            raise
        log("note: accrot.bench_path is not written yet; no PaTH kernel benchmark")
        return None
    started = time.perf_counter()
    log(f"path: kernels at T = {', '.join(map(str, lengths))} (B {B}, H {H}, D {D}, chunk {chunk})")
    doc: dict[str, Any] = {"schema": SCHEMA, "bench": "path", "torch": torch.__version__,
                           "threads": torch.get_num_threads(),
                           "kernels": bench_path.bench_kernels(lengths=tuple(lengths), B=B, H=H, D=D, chunk=chunk)}
    if hasattr(bench_path, "eval_memory"):
        log("path: evaluation peak memory")
        doc["memory"] = bench_path.eval_memory(B=B, H=H, D=D, chunk=chunk)
    doc["wall_s"] = time.perf_counter() - started
    return doc


def rows_table(rows: Sequence[dict[str, Any]], title: str):
    """A rich table of plain dict rows (columns: the union of their keys, in first-seen order)."""
    from rich.table import Table

    columns = list(dict.fromkeys(k for row in rows for k in row))
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(*(f"{v:.4g}" if isinstance(v, float) else str(v) for v in (row.get(c, "-") for c in columns)))
    return table


# -- command line -------------------------------------------------------------------------------------------
def _schemes_args(parser) -> None:
    parser.add_argument("--sizes", nargs="+", type=Literal["tiny", "small"], default=None,
                        help=f"model sizes for the training step (default {' '.join(FULL['sizes'])})")
    parser.add_argument("--T", type=int, default=None, help=f"training-step length (default {FULL['T']})")
    parser.add_argument("--eval_lengths", nargs="*", type=int, default=None,
                        help="evaluation lengths, tiny model, batch 1 (default 4096 16384)")
    parser.add_argument("--repeats", type=int, default=None, help=f"timed rounds (default {FULL['repeats']})")
    parser.add_argument("--eval_repeats", type=int, default=None,
                        help=f"evaluation rounds, one forward each (default {FULL['eval_repeats']})")
    parser.add_argument("--batch", type=dict[str, int], default={},
                        help=f"training batch per size, overriding {BENCH_BATCH} (e.g. '{{small: 4}}')")
    parser.add_argument("--device", type=str, default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval_all", action="store_true",
                        help=f"evaluate every cell beyond {LONG_EVAL} tokens too (several minutes more)")
    parser.add_argument("--quick", action="store_true", help="~30 s smoke run: tiny, batch 4, T 256, eval 1024")


def _path_args(parser) -> None:
    parser.add_argument("--lengths", nargs="+", type=int, default=[512, 2048, 8192], help="PaTH kernel lengths")
    parser.add_argument("--B", type=int, default=1)
    parser.add_argument("--H", type=int, default=4)
    parser.add_argument("--D", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=64)


def _schemes_settings(args) -> dict[str, Any]:
    base = QUICK if args.quick else FULL
    settings = {k: base[k] if getattr(args, k) is None else getattr(args, k) for k in base}
    settings["batch"] = {**BENCH_BATCH, **(QUICK_BATCH if args.quick else {}), **args.batch}
    settings["eval_all"] = bool(args.eval_all or args.quick)
    return settings


def main(argv: list[str]) -> int:
    from jsonargparse import ArgumentParser
    from rich.console import Console

    from accrot.cli import UsageError
    from accrot.report import atomic_write_text

    commands = ("schemes", "path", "pipeline", "all")
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in commands:
        raise UsageError(f"unknown bench {command!r}; choose one of {', '.join(commands)}")
    default_out = {"schemes": "bench_schemes.json", "path": "bench_path.json", "pipeline": "bench_pipeline.json",
                   "all": "bench.json"}[command]
    parser = ArgumentParser(prog=f"accrot bench {command}", exit_on_error=False, description=__doc__)
    if command in ("schemes", "all"):
        _schemes_args(parser)
    if command in ("path", "all"):
        _path_args(parser)
    if command in ("pipeline", "all"):
        parser.add_argument("--pipeline_steps", type=int, default=30, help="training steps per loop and round")
        parser.add_argument("--pipeline_rounds", type=int, default=3, help="alternating rounds of the two loops")
        parser.add_argument("--with_logger", action="store_true", help="the Lightning loop also writes metrics.csv")
    parser.add_argument("--out", type=str, default=default_out, help="JSON report (written atomically)")
    args = parser.parse_args(rest)
    out = Path(args.out)
    if not out.parent.is_dir():
        raise UsageError(f"out={args.out!r}: folder {str(out.parent)!r} does not exist")

    console, progress = Console(), Console(stderr=True, soft_wrap=True)
    if not console.is_terminal:  # a pipe or a file: rich would wrap the table at 80 columns
        console = Console(width=240)

    def log(message: str) -> None:
        progress.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {message}", highlight=False)

    report: dict[str, Any] = {}
    if command in ("schemes", "all"):
        report["schemes"] = run_schemes(**_schemes_settings(args), device=args.device, seed=args.seed, log=log)
        console.print(schemes_table(report["schemes"]))
    if command in ("path", "all"):
        report["path"] = run_path(args.lengths, args.B, args.H, args.D, args.chunk, log=log)
        if report["path"] is not None:
            console.print(rows_table(report["path"]["kernels"], "PaTH kernels: chunked vs recurrence"))
            if "memory" in report["path"]:
                console.print(rows_table(report["path"]["memory"], "PaTH evaluation peak memory"))
        elif command == "path":
            return 0
    if command in ("pipeline", "all"):
        from accrot.bench_pipeline import pipeline_table, run_pipeline

        if args.pipeline_steps < 10 or args.pipeline_rounds < 1:
            raise UsageError("--pipeline_steps must be at least 10 (5 are warm-up) and --pipeline_rounds at least 1")
        report["pipeline"] = run_pipeline(steps=args.pipeline_steps, rounds=args.pipeline_rounds,
                                          with_logger=args.with_logger, log=log)
        console.print(pipeline_table(report["pipeline"]))
    doc = report[command] if command != "all" else {"schema": SCHEMA, "bench": "all", **report}
    atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

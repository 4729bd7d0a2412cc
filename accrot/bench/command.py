"""``accrot bench``: side-by-side cost of every position scheme, as ratios to NoPE measured in one process.

Subcommands::

    accrot bench schemes [--sizes tiny small] [--T 512] [--eval_lengths 4096 16384] [--repeats 8]
                         [--eval_repeats 3] [--batch '{small: 2}'] [--op_T 1024] [--op_eval_length 16384]
                         [--eval_all] [--device cpu] [--quick] [--out bench_schemes.json]
    accrot bench path    [--lengths 512 2048 8192] [--B 1] [--H 4] [--D 32] [--chunk 32] [--device cpu]
                         [--memory_lengths 4096 16384] [--out bench_path.json]
    accrot bench pipeline [--pipeline_steps 30] [--pipeline_rounds 3] [--pipeline_sizes tiny small] [--with_logger]
                          [--out bench_pipeline.json]
    accrot bench precision [--precision_size small] [--precision_T 512] [--precision_batch 2]
                           [--precision_repeats 5] [--device cpu] [--out bench_precision.json]
    accrot bench all     (all four; one table each, one JSON report, default bench.json)
    accrot bench storage [--workers 8 32 64] [--trials 150] [--storages postgresql proxy] [--deadline 300]
                         [--quick] [--out bench_storage.json]

``storage`` (not part of ``all``: it starts its own PostgreSQL server from the installed binaries) loads a sweep's
storage with accrot's workers running a trivial objective, directly on PostgreSQL and through the storage proxy,
a worker and the proxy killed mid-run: trials per second, database connections held, trials lost
(:mod:`accrot.bench.storage`).

``path --device cuda`` times the chunked kernel against fla's Triton PaTH (and the recurrence at short lengths)
and measures their peak memory, e.g. ``--lengths 4096 16384 65536 --memory_lengths 4096 16384 65536``.

``precision`` times one training step of the small preset's model (RoPE and PaTH) in float32 against bf16
autocast, side by side, and prints float32 / bf16 per cell; on a CPU without hardware bf16 only float32 is
measured (:mod:`accrot.bench.precision`).

``pipeline`` times the Lightning training loop against a bare PyTorch loop on the same model and batches, step by
step in pairs, at the tiny and the small shape (:mod:`accrot.bench.pipeline`).

``schemes`` builds the full :class:`~accrot.model.Transformer` once per built cell of the grid
rotation × far_mass × rotate_values (``accum`` with ``random_position`` and ``learned`` increments as
separate rows, rotate_values for rope/accum only, path cells when ``path`` is registered; far_mass none, alibi,
forget and ssmax), plus the output gate once per rotation kind (``+gate``; ``+headgate`` on NoPE) and NoPE/RoPE
interleaving (``rope/none(cell,none)``), and measures

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
  :func:`eval_probe`). Beyond :data:`LONG_EVAL` tokens the default measures one cell per attention kernel and
  the rotation kinds on the plain kernel (:func:`eval_plan`: NoPE, ALiBi, FoX, PaTH and PaTH-FoX, rope, accum);
  ``--eval_all`` measures every cell (the combined cells: a few minutes more).

* **the attention op** (:mod:`accrot.bench.ops`): one layer's position scheme alone, forward + backward at
  ``B 4 × H 4 × T --op_T (1024) × D 32``, and its evaluation forward (batch 1, ``--op_eval_length`` = 16384) with
  peak memory for one cell per kernel and increment kind: at tiny the whole step hides attention behind the MLP,
  so the kernels' targets are judged here, over twice ``--repeats`` rounds (an op call is ~20× cheaper than a
  small step, and its ratios are read to 0.05). A second table beside the schemes table.

Peak memory on CPU: torch's CPU allocations are invisible to :mod:`tracemalloc`, so every (variant, length, round)
runs in its own forked child (:func:`eval_probe`). After its untimed and timed forwards, the child returns free
heap to the OS and pins glibc's mmap threshold at 64 KiB (glibc otherwise raises it after every free, so how much
freed memory stays resident depends on the allocation history: peaks then jump between runs by an order of
magnitude), restarts ``ru_maxrss`` at the current RSS (``echo 5 > /proc/self/clear_refs``), reads the resident
set from ``/proc/self/statm`` as the baseline, runs one more forward and reads
``getrusage(RUSAGE_SELF).ru_maxrss``; the peak is ``ru_maxrss − baseline``. The children are forked from a clean
helper interpreter (:class:`Zygote`), not from the benchmark process: GNU OpenMP's thread pool does not survive
``fork`` (a child of a process that already ran parallel ops deadlocks on its first one), and
``multiprocessing``'s forkserver re-imports the caller's ``__main__`` in every child. Limits: this is resident
memory (page granularity; small allocations come from the heap), not allocator bookkeeping; the logits and the
eval-mode caches built by the earlier forwards are in the baseline, not the peak.
On CUDA (``--device cuda``) everything runs in-process: ``torch.cuda.max_memory_allocated`` after
``reset_peak_memory_stats`` minus the allocation before the forward, after one warm-up forward per variant.

Targets (from the issues; ✓/✗ per row, ``–`` where none is set): rope/none and accum/none with random
increments ≤ 1.10× NoPE's training step at every size, ≤ 1.15× with rotate_values; accum with learned increments
≤ 1.05× and ≤ 1.08×; PaTH ≤ 2× at tiny and ≤ 1.5× at small; none/alibi, none/forget and none/ssmax evaluation at
16384 tokens (or the longest length measured) ≤ 2× NoPE's time and ≤ 1.5× its peak memory, and their op ≤ 1.5×
NoPE's op; PaTH-FoX's op ≤ 1.2× PaTH's; PaTH's and PaTH-FoX's op evaluation ≤ 4× NoPE's. Combined cells (e.g.
accum/forget), gated and interleaved cells are reported without a target.

Seeds are fixed (every variant starts from the same backbone weights and sees the same tokens); the torch
thread count is left as it is. The default schemes run takes about 13 minutes on 2 cores (``all``: about 20, the
peer's and the small pipeline's included) and longer while the cores are shared. ``--quick`` (every bench) is a
first look in a minute or two each: schemes at tiny only, batch 4, T = 256, every cell evaluated at 1024, the op
at T = 256 and evaluated at 1024, one round; path at 512 and 2048 (memory at 2048, the peer at 512 and 2048); the
pipeline at tiny for 10 paired steps, one round. Every report starts with the machine it measured (CPU, cores, threads, torch,
kernel path; the GPU on CUDA): ratios from two machines are not comparable.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from jsonargparse import ArgumentParser
from rich.console import Console
from rich.table import Table

from accrot.bench.grid import BENCH_BATCH, FULL, LONG_EVAL, QUICK, QUICK_BATCH, SCHEMA, machine, machine_line
from accrot.bench.path import run_path
from accrot.bench.pipeline import pipeline_table, run_pipeline
from accrot.bench.precision import precision_lines, run_precision
from accrot.bench.schemes import ops_table, run_schemes, schemes_table
from accrot.bench.subnormals import subnormals_table
from accrot.errors import UsageError
from accrot.io import atomic_write_text
from accrot.options import FLAG, Kind, choice, count, number, numbers, option, parse, write_file
from accrot.run.args import DEVICE, check_device


def _check_batch(flag: str, value) -> None:
    for size, batch in dict(value).items():
        if size not in ("tiny", "small") or not isinstance(batch, int) or batch < 1:
            raise UsageError(f"{flag}={dict(value)!r} is not valid; give a batch >= 1 per size, e.g. '{{small: 4}}'")


BATCH = Kind("batch", _check_batch, ("{huge: 4}", "{small: 0}"), "a batch per size")


# -- command line -------------------------------------------------------------------------------------------
def _schemes_args(parser) -> None:
    option(parser, "--sizes", kind=choice("tiny", "small"), nargs="+", type=Literal["tiny", "small"], default=None,
                        help=f"model sizes for the training step (default {' '.join(FULL['sizes'])})")
    option(parser, "--T", kind=count(2, 1 << 20), type=int, default=None, help=f"training-step length (default {FULL['T']})")
    option(parser, "--eval_lengths", kind=numbers(what="lengths in tokens", whole=True), nargs="*", type=int, default=None,
                        help="evaluation lengths, tiny model, batch 1 (default 4096 16384)")
    option(parser, "--repeats", kind=count(1, 1000), type=int, default=None, help=f"timed rounds (default {FULL['repeats']})")
    option(parser, "--eval_repeats", kind=count(1, 1000), type=int, default=None,
                        help=f"evaluation rounds, one forward each (default {FULL['eval_repeats']})")
    option(parser, "--batch", kind=BATCH, type=dict[str, int], default={},
                        help=f"training batch per size, overriding {BENCH_BATCH} (e.g. '{{small: 4}}')")
    option(parser, "--seed", kind=count(0, 2**63 - 1), type=int, default=0)
    option(parser, "--op_T", kind=count(2, 1 << 20), type=int, default=None,
                        help=f"the attention op's training length, B 4 × H 4 × D 32 (default {FULL['op_T']})")
    option(parser, "--op_eval_length", kind=count(2, 1 << 24), type=int, default=None,
                        help=f"the attention op's evaluation length, batch 1 (default {FULL['op_eval_length']})")
    option(parser, "--eval_all", kind=FLAG, action="store_true",
                        help=f"evaluate every cell beyond {LONG_EVAL} tokens too (several minutes more)")


def _path_args(parser) -> None:
    option(parser, "--lengths", kind=numbers(what="lengths in tokens", whole=True), nargs="+", type=int, default=[512, 2048, 8192], help="PaTH kernel lengths")
    option(parser, "--B", kind=count(1, 4096), type=int, default=1)
    option(parser, "--H", kind=count(1, 4096), type=int, default=4)
    option(parser, "--D", kind=count(2, 4096), type=int, default=32)
    option(parser, "--chunk", kind=count(1, 1 << 16), type=int, default=32)
    option(parser, "--memory_lengths", kind=numbers(what="lengths in tokens", whole=True), nargs="+", type=int, default=[4096, 16384],
                        help="evaluation peak-memory lengths (CUDA: also fla's)")
    option(parser, "--backward_lengths", kind=numbers(what="lengths in tokens", whole=True), nargs="*", type=int,
           default=None, help="CUDA: the lengths also timed forward + backward (default: the first two --lengths)")
    option(parser, "--peer", kind=choice("fla", "none"), type=Literal["fla", "none"], default="fla",
                        help="CPU: time accrot's PaTH against fla's naive_path_attn (installed on first use)")
    option(parser, "--peer_lengths", kind=numbers(what="lengths in tokens", whole=True), nargs="+", type=int, default=[512, 2048, 8192],
                        help="lengths of the peer comparison, forward (no grad)")
    option(parser, "--peer_backward_lengths", kind=numbers(what="lengths in tokens", whole=True), nargs="*", type=int, default=[512, 2048],
                        help="lengths of the peer comparison, forward + backward (the peer's dense [T, T] "
                             "autograd graph: ~16x the 2048 run's time and memory at 8192)")


def _schemes_settings(args) -> dict[str, Any]:
    base = QUICK if args.quick else FULL
    settings = {k: base[k] if getattr(args, k) is None else getattr(args, k) for k in base}
    settings["batch"] = {**BENCH_BATCH, **(QUICK_BATCH if args.quick else {}), **args.batch}
    settings["eval_all"] = bool(args.eval_all or args.quick)
    return settings


COMMANDS = ("schemes", "path", "pipeline", "precision", "all", "storage", "decode")
# what `--help` says: plain text (the module docstring above is the reference, with its method and targets)
HELP = {
    "schemes": "Every cell of the scheme grid (rotation x far_mass x rotate_values, accum with random and learned "
               "increments) against NoPE, measured interleaved in one process: the training step at tiny and small, "
               "the tiny model's evaluation at 4k and 16k tokens (time and peak memory), and one layer's attention op "
               "alone; ratios to NoPE with the targets (pass/fail per row); --quick: a first look in a minute or "
               "two.",
    "path": "PaTH's chunked kernel against its recurrence twin (on CUDA: against fla's Triton kernel), its "
            "evaluation peak memory (linear in T), and on the CPU its public peer, fla's naive_path_attn "
            "(pip-installed on first use into .venv/accrot-peers/; --peer none skips it).",
    "pipeline": "The Lightning training loop against a bare PyTorch loop on the same model and batches, step by step "
                "in pairs, at the tiny and the small shape (targets 1.05x and 1.02x).",
    "precision": "One training step of the small preset's model (RoPE, PaTH) in float32 against bf16-mixed (bf16 "
                 "autocast), side by side in one process: float32 / bf16 per cell (above 1: bf16 is faster). On a "
                 "CPU without hardware bf16 (AVX-512 BF16, AMX) only float32 is measured.",
    "all": "schemes, path, pipeline and precision in one run (one table each, one JSON report; make bench): 7 to 15 minutes on "
           "2 cores, by CPU; --quick: a few minutes. Every report starts with the machine it measured.",
    "storage": "Optuna storages under load: many lightweight sweep workers (a trivial objective, no training) on a "
               "throwaway PostgreSQL server directly and through accrot's gRPC storage proxy, a worker and the proxy "
               "killed and restarted mid-run; trials per second, database connections held and trials lost "
               "(make bench-storage; not part of all).",
    "decode": "Generation per cell of the grid: tokens per second of cached decoding against recomputing the prefix "
              "for every token, after prompts of 1x and 16x the training length, measured side by side in rounds "
              "(not part of all).",
}
OVERVIEW = ("usage: accrot bench {schemes,path,pipeline,precision,all,storage,decode} [options]   (accrot bench COMMAND --help for its "
            "options)\n\nSide-by-side benchmarks: every number is a ratio measured in one process on this machine "
            "(ratios from two machines do not compare).\n\n" + "\n".join(f"  {c:<10} {HELP[c]}" for c in HELP))
DEFAULT_OUT = {"schemes": "bench_schemes.json", "path": "bench_path.json", "pipeline": "bench_pipeline.json",
               "precision": "bench_precision.json",
               "all": "bench.json", "storage": "bench_storage.json", "decode": "bench_decode.json"}
QUICK_STORAGE = {"workers": [4, 8], "trials": 60}


def _storage_args(parser) -> None:
    from accrot.bench.storage import STORAGES

    option(parser, "--workers", kind=numbers(what="worker counts", whole=True), nargs="+", type=int, default=None,
                        help="worker counts, one row per count and storage (default 8 32 64)")
    option(parser, "--trials", kind=count(1, 100000), type=int, default=None, help="trials per row (default 150)")
    option(parser, "--storages", kind=choice(*STORAGES), nargs="+", type=Literal[STORAGES], default=list(STORAGES),
                        help="postgresql (workers on the database) and proxy (through accrot storage-proxy)")
    option(parser, "--deadline", kind=number(what="seconds"), type=float, default=300.0, help="seconds a row may take before it is stopped")


def _parser(command: str) -> ArgumentParser:
    parser = ArgumentParser(prog=f"accrot bench {command}", exit_on_error=False, description=HELP[command])
    if command in ("schemes", "path", "all", "decode", "precision"):
        option(parser, "--device", kind=DEVICE, type=str, default="cpu", help="cpu, cuda, cuda:1, ...")
    if command == "decode":
        _decode_args(parser)
    if command in ("schemes", "all"):
        _schemes_args(parser)
    if command in ("path", "all"):
        _path_args(parser)
    if command == "storage":
        _storage_args(parser)
    if command in ("precision", "all"):
        _precision_args(parser)
    if command in ("pipeline", "all"):
        option(parser, "--pipeline_steps", kind=count(1, 100000), type=int, default=30, help="training steps per loop and round")
        option(parser, "--pipeline_rounds", kind=count(1, 1000), type=int, default=3, help="fits of paired steps per size")
        option(parser, "--pipeline_sizes", kind=choice("tiny", "small"), nargs="+", type=Literal["tiny", "small"], default=["tiny", "small"],
                            help="model shapes of the loop comparison")
        option(parser, "--with_logger", kind=FLAG, action="store_true", help="the Lightning loop also writes metrics.csv")
    option(parser, "--quick", kind=FLAG, action="store_true",
                        help="a first look in about a minute per bench: " + "; ".join(QUICK_HELP[c] for c in QUICK_HELP
                                                                                     if command in (c, "all")))
    option(parser, "--out", kind=write_file("a JSON report file"), type=str, default=DEFAULT_OUT[command], help="JSON report (written atomically)")
    return parser


# --quick: what each bench measures then (the flags given explicitly still win)
QUICK_PATH = {"lengths": [512, 2048], "memory_lengths": [2048], "peer_lengths": [512, 2048],
              "peer_backward_lengths": [512]}
QUICK_PIPELINE = {"pipeline_steps": 10, "pipeline_rounds": 1, "pipeline_sizes": ["tiny"]}
QUICK_PRECISION = {"precision_size": "tiny", "precision_T": 256, "precision_repeats": 1}
QUICK_HELP = {"schemes": "schemes: tiny, batch 4, T 256, every cell evaluated at 1024, one round",
              "path": "path: lengths 512 2048, memory at 2048, the peer at 512 and 2048 (backward at 512)", "pipeline": "pipeline: tiny, 10 paired steps, one round",
              "storage": "storage: 4 and 8 workers, 60 trials per row",
              "precision": "precision: tiny, T 256, one round",
              "decode": "decode: 4 new tokens, one round"}


def _quick(args, argv: Sequence[str]) -> None:
    """Apply --quick's path and pipeline settings to the flags the command line did not give."""
    if not getattr(args, "quick", False):
        return
    given = {a.split("=", 1)[0].lstrip("-") for a in argv if a.startswith("--")}
    for key, value in {**QUICK_PATH, **QUICK_PIPELINE, **QUICK_PRECISION}.items():
        if hasattr(args, key) and key not in given:
            setattr(args, key, value)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(OVERVIEW)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        raise UsageError(f"unknown bench {command!r}; choose one of {', '.join(COMMANDS)}")
    args = _checked_args(command, rest)
    out = Path(args.out)
    console, progress = Console(), Console(stderr=True, soft_wrap=True)
    if not console.is_terminal:  # a pipe or a file: rich would wrap the table at 80 columns
        console = Console(width=240)

    device = getattr(args, "device", "cpu")
    info: dict[str, Any] = {}
    log = _progress(progress, device, info)

    report: dict[str, Any] = {}
    if command in ("storage", "decode"):  # benches of their own, with their own report
        return {"storage": _storage, "decode": _decode}[command](args, console, log, out)
    if command in ("schemes", "all"):
        report["schemes"] = _schemes(args, console, log)
    if command in ("path", "all"):
        report["path"] = run_path(args.lengths, args.B, args.H, args.D, args.chunk, log=log, device=args.device,
                                  memory_lengths=args.memory_lengths, peer=args.peer, peer_lengths=args.peer_lengths,
                                  peer_backward_lengths=args.peer_backward_lengths,
                                  backward_lengths=args.backward_lengths)
        _print_path(console, report["path"])
    if command in ("pipeline", "all"):
        report["pipeline"] = run_pipeline(steps=args.pipeline_steps, rounds=args.pipeline_rounds,
                                          sizes=args.pipeline_sizes, with_logger=args.with_logger, log=log)
        console.print(pipeline_table(report["pipeline"]))
    if command in ("precision", "all"):
        report["precision"] = _precision(args, console, log)
    info = info or machine(device)
    for part in report.values():
        part["machine"] = info
    doc = report[command] if command != "all" else {"schema": SCHEMA, "bench": "all", "machine": info, **report}
    console.print(machine_line(info), highlight=False)  # beside the tables, whatever stream they go to
    atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    console.print(f"wrote {out}")
    return _failed_cells(report, progress)


def _failed_cells(report: dict[str, Any], console) -> int:
    """1 (with one line naming the first) when an installed fla raised in a PaTH cell, else 0: the report keeps
    the error in its cell, and the exit status says the run did not measure what it set out to."""
    failed = [r for r in (report.get("path") or {}).get("kernels", []) if r.get("fla_failed")]
    if not failed:
        return 0
    first = failed[0]
    console.print(f"accrot bench path: fla failed in {len(failed)} cell(s); first at T {first['T']} "
                  f"{first['mode']}: {first['fla']}", highlight=False)
    return 1


def _progress(progress, device: str, info: dict[str, Any]):
    """The progress printer: a timestamped line, the machine line (filled into ``info``) before the first one."""

    def log(message: str) -> None:
        if not info:  # the first progress line: the options are checked by now (a bad one prints only its error)
            info.update(machine(device))
            progress.print(machine_line(info), highlight=False)
        progress.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {message}", highlight=False)

    return log


def _storage(args, console, log, out: Path) -> int:
    import tempfile

    from accrot.bench.storage import run_storage, storage_table

    settings = {k: getattr(args, k) if getattr(args, k) is not None else
                (QUICK_STORAGE[k] if args.quick else {"workers": [8, 32, 64], "trials": 150}[k])
                for k in ("workers", "trials")}
    with tempfile.TemporaryDirectory(prefix="accrot-bench-storage-") as work:
        doc = run_storage(settings["workers"], settings["trials"], args.storages, Path(work), log, args.deadline)
    doc["machine"] = machine("cpu")
    console.print(storage_table(doc))
    console.print(machine_line(doc["machine"]), highlight=False)
    atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    console.print(f"wrote {out}")
    return 0


def _precision_args(parser) -> None:
    """The precision bench's options (``--precision_*`` so that ``all`` keeps the schemes bench's ``--T``)."""
    option(parser, "--precision_size", kind=choice("tiny", "small"), type=Literal["tiny", "small"], default="small",
           help="the preset whose model shape is timed (default small: d 256, 6 layers)")
    option(parser, "--precision_T", kind=count(2, 1 << 20), type=int, default=512,
           help="training-step length (default 512, small's L)")
    option(parser, "--precision_batch", kind=count(1, 4096), type=int, default=None,
           help="batch (default: the bench's, small 2)")
    option(parser, "--precision_repeats", kind=count(1, 1000), type=int, default=5,
           help="rounds, both precisions each (default 5)")


def _schemes(args, console, log) -> dict[str, Any]:
    doc = run_schemes(**_schemes_settings(args), device=args.device, seed=args.seed, log=log)
    console.print(schemes_table(doc))
    console.print(ops_table(doc))
    if doc["subnormals"] is not None:
        console.print(subnormals_table(doc["subnormals"]))
    return doc


def _check_precision(args) -> None:
    for name in ("precision_T", "precision_batch", "precision_repeats"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name}={value} is not valid; it must be positive")


def _precision(args, console, log) -> dict[str, Any]:
    doc = run_precision(args.precision_size, args.precision_T, args.precision_batch, args.precision_repeats,
                        device=args.device, log=log)
    for line in precision_lines(doc):
        console.print(line, highlight=False)
    return doc


def _decode_args(parser) -> None:
    option(parser, "--size", kind=choice("tiny", "small"), type=Literal["tiny", "small"], default="tiny", help="the model shape")
    option(parser, "--train_length", kind=count(2, 1 << 20), type=int, default=128, help="L: the prompts are multiples of it")
    option(parser, "--multipliers", kind=numbers(what="prompt lengths in L", whole=True), nargs="+", type=int, default=[1, 16], help="prompt lengths in L")
    option(parser, "--new_tokens", kind=count(1, 1 << 20), type=int, default=None, help="tokens generated per timing (default 16)")
    option(parser, "--repeats", kind=count(1, 1000), type=int, default=None, help="rounds (default 3)")
    option(parser, "--seed", kind=count(0, 2**63 - 1), type=int, default=0)


def _check_decode(args) -> None:
    for name in ("train_length", "multipliers", "new_tokens", "repeats"):
        values = getattr(args, name)
        if values is not None and any(v < 1 for v in (values if isinstance(values, list) else [values])):
            raise UsageError(f"--{name} {values} is not valid; it must be positive")


def _decode(args, console, log, out: Path) -> int:
    from accrot.bench.decode import decode_table, run_decode

    quick = {"new_tokens": 4, "repeats": 1} if args.quick else {"new_tokens": 16, "repeats": 3}
    doc = run_decode(size=args.size, train_length=args.train_length, multipliers=args.multipliers,
                     new_tokens=args.new_tokens or quick["new_tokens"], repeats=args.repeats or quick["repeats"],
                     device=args.device, seed=args.seed, log=log)
    doc["machine"] = machine(args.device)
    console.print(decode_table(doc))
    console.print(machine_line(doc["machine"]), highlight=False)
    atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    console.print(f"wrote {out}")
    return 0


def _print_path(console, doc: dict[str, Any]) -> None:
    """The PaTH report's tables: the kernels, the evaluation memory and, on the CPU, the peer (or why it is skipped)."""
    versus = "fla" if doc["device"].startswith("cuda") else "recurrence"
    console.print(rows_table(doc["kernels"], f"PaTH kernels: chunked vs {versus}"))
    console.print(rows_table(doc["memory"], "PaTH evaluation peak memory"))
    peer = doc.get("peer")
    if peer and peer["rows"]:
        console.print(rows_table(peer["rows"], f"PaTH vs its public peer, {peer['peer']}: seconds (median), "
                                               "speed-up = fla/accrot, peak live-tensor MiB; nope_s: the floor"))
    elif peer:
        console.print(peer["peer"], highlight=False)


def _checked_args(command: str, rest: list[str]):
    """The parsed options of ``accrot bench <command>``, --quick applied; a one-line UsageError otherwise."""
    args = parse(_parser(command), rest)
    out = Path(args.out)
    if not out.parent.is_dir():
        raise UsageError(f"out={args.out!r}: folder {str(out.parent)!r} does not exist")
    _quick(args, rest)
    if command in ("storage", "decode"):
        {"storage": _check_storage, "decode": _check_decode}[command](args)
    if hasattr(args, "device"):
        args.device = check_device(args.device)
    if command in ("precision", "all"):
        _check_precision(args)
    if command in ("pipeline", "all") and (args.pipeline_steps < 10 or args.pipeline_rounds < 1):
        raise UsageError("--pipeline_steps must be at least 10 (5 are warm-up) and --pipeline_rounds at least 1")
    if command in ("path", "all"):  # shapes and lengths of the PaTH kernels: a 0 would crash (or divide) deep inside
        for name in ("B", "H", "D", "chunk", "lengths", "memory_lengths", "peer_lengths", "peer_backward_lengths"):
            values = getattr(args, name)
            if any(v < 1 for v in (values if isinstance(values, list) else [values])):
                raise UsageError(f"--{name} {getattr(args, name)} is not valid; it must be positive")
    return args


def _check_storage(args) -> None:
    from accrot.bench.postgres import missing

    if args.workers is not None and any(w < 1 for w in args.workers):
        raise UsageError(f"--workers {' '.join(map(str, args.workers))} is not valid; every count must be >= 1")
    if args.trials is not None and args.trials < 10:
        raise UsageError(f"--trials={args.trials} is not valid; use 10 or more (a worker and the proxy are killed "
                         "a third and two thirds of the way)")
    if args.deadline <= 0:
        raise UsageError(f"--deadline={args.deadline} is not valid; seconds > 0")
    why = missing()
    if why is not None:
        raise UsageError(f"accrot bench storage starts its own PostgreSQL server: {why}")


def rows_table(rows: Sequence[dict[str, Any]], title: str):
    """A rich table of plain dict rows (columns: the union of their keys, in first-seen order)."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(*(f"{v:.4g}" if isinstance(v, float) else str(v) for v in (row.get(c, "-") for c in columns)))
    return table


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

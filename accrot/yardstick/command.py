"""``accrot yardstick``: the field's length-generalisation protocols on accrot's cells, beside the published rows.

Trains every (protocol, cell) on 2 worker processes of one thread each: the learning-rate grid on seed 0, then
seeds 1.. at the rate that scored best at the training lengths. Every finished run is kept in ``--out``
(``runs/…/*.json``); the same command again continues an interrupted yardstick, and ``--report_only`` rewrites the
report from what is there. Writes ``report.md`` (one table per protocol, the published rows beside accrot's, the
predictions stated before the results), ``yardstick.json`` and ``yardstick.png``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from accrot.errors import UsageError
from accrot.options import FLAG, choice, count, numbers, option, parse, write_dir
from accrot.run.rundir import holding

# A preset is a declared selection, fixed before its run: ``decide-s1`` reads S1 on parity under the learnable
# protocol with the controls first. 4 seeds: the exact rank test's most extreme outcome is then p = 1/70, under the
# study's one-sided α = 0.025 (3 seeds reach only 1/20); the grid's two rates are the default protocols' own.
PRESETS = {
    "decide-s1": {"protocols": ["parity-dense"], "steps": 3000, "seeds": 4, "lrs": [3e-3, 1e-3],
                  "cells": ["clock", "reflection", "NoPE", "RoPE", "accum-learned-plain", "PaTH", "PaTH-reflect"]},
}

HELP = {
    "protocols": "which protocols (default: every one but the curriculum ones)",
    "cells": "which cells (default: all)",
    "seeds": "seeds per cell (the grid runs on seed 0)",
    "steps": "override every protocol's training steps (a quick look; the report says so)",
    "workers": "worker processes, one thread each",
    "out": "folder for the runs, the report and the figure",
}


def _parser():
    from jsonargparse import ArgumentParser

    from accrot.display import plain_help
    from accrot.yardstick.cells import CELLS
    from accrot.yardstick.protocols import PROTOCOLS

    parser = ArgumentParser(prog="accrot yardstick", exit_on_error=False, description=plain_help(__doc__))
    option(parser, "--protocols", kind=choice(*PROTOCOLS), type=str, nargs="+", default=None,
                        help=f"{HELP['protocols']}: {', '.join(PROTOCOLS)}")
    option(parser, "--cells", kind=choice(*CELLS), type=str, nargs="+", default=None,
           help=f"{HELP['cells']}: {', '.join(CELLS)}")
    option(parser, "--preset", kind=choice(*PRESETS), type=str | None, default=None,
           help=f"a declared selection ({', '.join(PRESETS)}); options given beside it override it")
    option(parser, "--seeds", kind=count(1, 1000), type=int | None, default=None, help=HELP["seeds"] + " (default 3)")
    option(parser, "--steps", kind=count(1), type=int | None, default=None, help=HELP["steps"])
    option(parser, "--lrs", kind=numbers(what="learning rates"), type=float, nargs="+", default=None,
                        help="the learning-rate grid tried on seed 0 (default: each protocol's own)")
    option(parser, "--workers", kind=count(1, 256), type=int, default=2, help=HELP["workers"])
    option(parser, "--out", kind=write_dir("a results folder"), type=str, default="results/yardstick", help=HELP["out"])
    option(parser, "--report_only", kind=FLAG, action="store_true", help="rewrite the report from the finished runs")
    option(parser, "--quiet", kind=FLAG, action="store_true", help="no progress bar: one line per finished run")
    return parser


def _apply_preset(args) -> None:
    """Fill the options left unset from ``--preset`` (an option given beside it wins); seeds default to 3."""
    if args.preset is not None:
        if args.preset not in PRESETS:
            raise UsageError(f"unknown --preset {args.preset!r}; choose from {', '.join(PRESETS)}")
        for key, value in PRESETS[args.preset].items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    if args.seeds is None:
        args.seeds = 3


def _check(args) -> tuple[list[str], list[str]]:
    from accrot.yardstick.cells import CELLS
    from accrot.yardstick.protocols import DEFAULT_PROTOCOLS, PROTOCOLS

    _apply_preset(args)
    protocols = args.protocols or list(DEFAULT_PROTOCOLS)
    cells = args.cells or list(CELLS)
    for kind, names, known in (("protocol", protocols, PROTOCOLS), ("cell", cells, CELLS)):
        for name in names:
            if name not in known:
                raise UsageError(f"unknown {kind} {name!r}; choose from {', '.join(known)}")
        if len(set(names)) != len(names):
            raise UsageError(f"a {kind} is named twice in {names}")
    if args.seeds < 1:
        raise UsageError(f"--seeds={args.seeds} is not valid; use an integer >= 1")
    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps={args.steps} is not valid; use an integer >= 1")
    if args.lrs is not None and (not args.lrs or any(not 0 < lr < 1 for lr in args.lrs)
                                 or len(set(args.lrs)) != len(args.lrs)):
        raise UsageError(f"--lrs={args.lrs} is not valid; use distinct learning rates in (0, 1)")
    if args.workers < 1:
        raise UsageError(f"--workers={args.workers} is not valid; use an integer >= 1")
    return protocols, cells


def main(argv: list[str]) -> int:
    args = parse(_parser(), argv)
    names, cells = _check(args)
    protocols = _effective(args, names)
    out = Path(args.out)  # checked writable by its kind; made and held here
    with holding(out, "--out", "the yardstick's folder"):
        if not args.report_only:
            code = _train(args, protocols, cells, out)
            if code:
                return code
        return _report(args, protocols, cells, out)


def _effective(args, names: list[str]) -> list:
    """The protocols as this command runs them: ``--steps`` and ``--lrs`` replace their budget and grid."""
    import dataclasses

    from accrot.yardstick.protocols import PROTOCOLS

    return [dataclasses.replace(PROTOCOLS[n], steps=args.steps or PROTOCOLS[n].steps,
                                lrs=tuple(args.lrs) if args.lrs else PROTOCOLS[n].lrs) for n in names]


def _jobs_for(args, protocols, cells, out):
    """Every job whose prerequisites are met, and the count of jobs the plan has in all."""
    from accrot.yardstick.runner import choose_lr, grid_jobs, load, seed_jobs

    ready, total, done = [], 0, []
    for protocol in protocols:
        steps = protocol.steps
        for c in cells:
            grid = grid_jobs(protocol, c, steps)
            if not grid:  # a control this protocol has no fixed form of
                continue
            total += len(grid) + args.seeds - 1
            records = [load(out, j) for j in grid]
            ready += [j for j, r in zip(grid, records, strict=True) if r is None]
            done += [r for r in records if r is not None]
            if all(r is not None for r in records):
                for j in seed_jobs(protocol, c, choose_lr(protocol, records), args.seeds, steps):
                    r = load(out, j)
                    (ready.append(j) if r is None else done.append(r))
    return ready, total, done


def _train(args, protocols, cells, out) -> int:
    import concurrent.futures as cf
    import multiprocessing as mp

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from accrot.yardstick.runner import worker_init

    console = Console(file=sys.stdout)
    ready, total, done = _jobs_for(args, protocols, cells, out)
    if done:
        console.print(f"accrot yardstick: {len(done)} of {total} runs already in {out}; continuing")
    failed: dict[str, str] = {}
    running: dict = {}
    start = time.time()
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, disable=args.quiet or not console.is_terminal)
    executor = cf.ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn"),
                                      initializer=worker_init)
    try:
        with progress:
            bar = progress.add_task("yardstick runs", total=total, completed=len(done))
            while True:
                _submit(executor, ready, running, failed, out)
                if not running:
                    break
                finished, _ = cf.wait(list(running), return_when=cf.FIRST_COMPLETED)
                for f in finished:
                    _finished(f, running.pop(f), console, failed)
                    progress.advance(bar)
                ready, total, _ = _jobs_for(args, protocols, cells, out)
                progress.update(bar, total=total)
    except KeyboardInterrupt:
        workers = list((getattr(executor, "_processes", None) or {}).values())  # gone once shut down
        for proc in workers:
            proc.kill()  # a run in progress is lost either way (its record is written only when it ends)
        executor.shutdown(wait=False, cancel_futures=True)
        print(f"accrot yardstick: interrupted; the finished runs are kept in {out}; the same command continues",
              file=sys.stderr)
        return 130
    executor.shutdown(wait=True)
    console.print(f"accrot yardstick: training done in {(time.time() - start) / 60:.1f} min")
    if failed:
        for path, why in failed.items():
            print(f"accrot yardstick: {path} failed: {why}", file=sys.stderr)
        return 1
    return 0


def _submit(executor, ready, running: dict, failed: dict, out: Path) -> None:
    from accrot.yardstick.runner import run_job

    for job in ready:
        if job.path not in running.values() and job.path not in failed:
            running[executor.submit(run_job, job, str(out))] = job.path


def _finished(future, path: str, console, failed: dict[str, str]) -> None:
    """One line per finished run; a failed run's one-line reason kept for the end (the others go on)."""
    try:
        r = future.result()
    except Exception as err:  # noqa: BLE001 (one run's failure is reported, the others go on)
        failed[path] = f"{type(err).__name__}: {err}".splitlines()[0]
        console.print(f"[red]{path} failed: {failed[path]}[/red]")
        return
    s = r["settings"]
    console.print(f"{s['protocol']} / {s['cell']} lr {s['lr']:g} seed {s['seed']}: train {r['train']:.3f}, "
                  f"test {r['test']:.3f} ({r['ran']['seconds']:.0f} s)")


def _report(args, protocols, cells, out) -> int:
    from rich.console import Console

    from accrot.io import atomic_write_text
    from accrot.yardstick.report import collect, figure, markdown, summary_json, terminal_tables

    results = collect(out, protocols, cells, args.seeds)
    text = markdown(results, argv=sys.argv)
    atomic_write_text(out / "report.md", text)
    atomic_write_text(out / "yardstick.json", summary_json(results))
    figure(results, out / "yardstick.png")
    console = Console(file=sys.stdout)
    for table in terminal_tables(results):
        console.print(table)
    print(f"accrot yardstick: {out / 'report.md'}, {out / 'yardstick.json'}, {out / 'yardstick.png'}")
    return 0

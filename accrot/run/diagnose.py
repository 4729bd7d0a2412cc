"""``accrot diagnose --ckpt PATH``: the theory diagnostics of a checkpoint (coherence, mixing windows, far mass,
value far norms) on its run's own evaluation blocks, as ``diagnostics.json``, figures and a table. Every option, the
checkpoint, the device and the output folder are checked before any computing."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from jsonargparse import ArgumentParser
from rich.console import Console
from rich.table import Table

from accrot.diagnostics import diagnose, plot_diagnostics, summary
from accrot.diagnostics.bundle import finite_or_none
from accrot.errors import UsageError
from accrot.io import atomic_write_text
from accrot.options import count, number, numbers, option, parse, parse_numbers, read_file, write_dir
from accrot.run.args import DEVICE, READ_CKPT, check_device
from accrot.run.checkpoints import load_data_module, open_checkpoint, output_folder, provenance

HELP = ("The theory diagnostics of a checkpoint of an accrot run, on its run's own evaluation blocks: coherence and "
        "mixing windows of the accumulated rotations, attention mass beyond --far_window, value far norms, per layer "
        "at each length. Writes diagnostics.json and figures into --out (default RUN/diagnostics) and prints the "
        "table. --ckpt takes a .ckpt file or a run directory (its checkpoints/last.ckpt).")


def _fmt_window(x: float) -> str:
    return "∞" if math.isinf(x) else "-" if math.isnan(x) else f"{x:.0f}"


def diagnostics_table(result: Mapping):
    """A rich table: per layer, measured windows (mean over heads) at each coherence length, the predicted
    window, and far mass at the shortest and the longest length."""
    L, lengths = result["train_length"], result["lengths"]
    coh_lengths = [c["length"] for c in result["layers"][0]["coherence"]] if result["layers"] else []
    mass_lengths = sorted({lengths[0], lengths[-1]})
    table = Table(title=f"diagnostics (ε = {result['eps']:g}; far: beyond each head's window, ≥ {result['far_window']})")
    table.add_column("layer", justify="right")
    for n in coh_lengths:
        table.add_column(f"window @{n / L:g}×", justify="right")
    table.add_column("predicted", justify="right")
    for n in mass_lengths:
        table.add_column(f"far mass @{n / L:g}×", justify="right")
    table.add_column(f"bound @{lengths[-1] / L:g}×", justify="right")  # the far mass predicted from L alone
    for row in summary(result):
        table.add_row(
            str(row["layer"]),
            *(_fmt_window(row[f"window@{n}"]) for n in coh_lengths),
            _fmt_window(row["predicted_window"]),
            *(f"{row[f'far_mass@{n}']:.3f}" for n in mass_lengths),
            f"{row.get(f'predicted_far_mass@{lengths[-1]}', math.nan):.3f}",
        )
    return table


def main(argv: list[str]) -> int:
    """``accrot diagnose --ckpt PATH``: coherence, mixing windows, far mass and value far norms of a checkpoint;
    writes diagnostics.json + PNGs into <run>/diagnostics/."""
    parser = ArgumentParser(prog="accrot diagnose", exit_on_error=False, description=HELP)
    option(parser, "--ckpt", kind=READ_CKPT, type=str, required=True, help="a checkpoint (.ckpt) of an accrot run, or its run "
                        "directory")
    option(parser, "--config", kind=read_file("a config.yaml"), type=str | None, default=None,
                        help="the run's config.yaml (default: RUN/config.yaml beside RUN/checkpoints/)")
    option(parser, "--multipliers", kind=numbers(), type=str, nargs="+", default=["1", "8", "32"],
                        help="lengths as multiples of the training length: 1 8 32 or '[1,8,32]'")
    option(parser, "--blocks", kind=count(1), type=int, default=16,
                        help="blocks per length, spread over the validation split (the replicates of every error bar)")
    option(parser, "--eps", kind=number(0, 1, what="a coherence level"), type=float, default=0.05, help="ε of the mixing window")
    option(parser, "--far_window", kind=count(1), type=int | None, default=None, help="far = keys more than this many tokens back "
                        "(default: training length / 4)")
    option(parser, "--queries", kind=count(1), type=int, default=32, help="last queries per block for far mass")
    option(parser, "--out", kind=write_dir("an output folder"), type=str | None, default=None, help="output folder (default: RUN/diagnostics)")
    option(parser, "--device", kind=DEVICE, type=str, default="cpu", help="cpu, cuda, cuda:1, ... (one this machine has)")
    args = parse(parser, argv)
    multipliers = _check_options(args)
    device = check_device(args.device)
    ckpt, lit, _, run_dir, config = open_checkpoint(args.ckpt, args.config)
    dm = load_data_module(config)
    train_length = int(dm.seq_len)
    lengths = sorted({max(2, round(m * train_length)) for m in multipliers})
    if args.far_window is not None and args.far_window >= lengths[-1] - 1:
        raise UsageError(f"--far_window={args.far_window} is not valid; no key of the longest length diagnosed "
                         f"({lengths[-1]} tokens) is that far back: use --far_window < {lengths[-1] - 1}, or longer "
                         "--multipliers")
    blocks = {n: dm.eval_blocks(n, args.blocks * n, record=False)[:, :n] for n in lengths}  # DataError before any work
    with output_folder(Path(args.out) if args.out else run_dir / "diagnostics") as out:
        lit.eval().to(device)
        t0 = time.perf_counter()
        with Console(stderr=True).status("diagnosing"):
            result = diagnose(lit.model, blocks, train_length, eps=args.eps, far_window=args.far_window,
                              n_queries=args.queries)
        result.update(**provenance("diagnose", argv, ckpt), seconds=round(time.perf_counter() - t0, 3),
                      blocks={str(n): int(b.shape[0]) for n, b in blocks.items()},
                      data=finite_or_none(dm.describe()))
        plot_diagnostics(result, out)
        atomic_write_text(out / "diagnostics.json", json.dumps(result, indent=1))
    Console(width=None if sys.stdout.isatty() else 120).print(diagnostics_table(result))  # a log: no wrapping
    print(out / "diagnostics.json")
    return 0


def _check_options(args) -> list[float]:
    """The multipliers; every numeric option checked (one line naming it)."""
    multipliers = parse_numbers("--multipliers", args.multipliers)
    if any(not m > 0 for m in multipliers):
        raise UsageError(f"--multipliers={multipliers!r} is not valid; give positive multiples of the training "
                         "length, e.g. --multipliers 1 8 32")
    if args.blocks < 1:
        raise UsageError(f"--blocks={args.blocks} is not valid; it must be a positive integer")
    if not 0.0 < args.eps < 1.0:
        raise UsageError(f"--eps={args.eps} is not valid; it must lie in (0, 1)")
    if args.far_window is not None and args.far_window < 0:
        raise UsageError(f"--far_window={args.far_window} is not valid; it must be >= 0")
    if args.queries < 1:
        raise UsageError(f"--queries={args.queries} is not valid; it must be a positive integer")
    return multipliers

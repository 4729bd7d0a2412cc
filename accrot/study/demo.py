"""``accrot demo``: train the tiny model under several schemes and compare how each extrapolates.

Every variant shares the config, the data, the seed, the token budget and the evaluation blocks;
only the position scheme differs. Prints one line per finished run and two tables: first the same-target rise
NLL(m·L) − NLL(L) (the same targets scored with m·L tokens of context, ± the anchors' 95 % interval: how much a
longer context hurts), then, labelled, each length's own blocks (other text at each length, so a difference there
is partly the text's); writes ``demo.json`` and ``demo.png`` (the rise first, the blocks beside it) into the demo
folder; what each run printed (Lightning's and wandb's lines) is in its ``console.log``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from accrot.logs import WANDB_MODES
from accrot.options import FLAG, FREE_TEXT, choice, count, numbers, option, parse, text, write_dir
from accrot.run.rundir import holding
from accrot.study.variants import VARIANTS as STUDY_VARIANTS

# the study's variants the demo trains, by the study's names: the anchors, the accumulated rotations and PaTH
DEMO_VARIANTS = ("NoPE", "RoPE", "ALiBi", "accum-random", "accum-learned", "accum-learned+values", "PaTH", "PaTH-FoX")
VARIANTS: dict[str, dict[str, object]] = {name: STUDY_VARIANTS[name] for name in DEMO_VARIANTS}  # name -> overrides


def main(argv: list[str]) -> int:
    from jsonargparse import ArgumentParser
    from rich.console import Console

    from accrot.display import Finished, RunDisplay, Running, plain_help
    from accrot.errors import UsageError
    from accrot.evaluation import nll_table
    from accrot.io import atomic_write_text
    from accrot.run.args import config_path
    from accrot.study.looks import look_of_scheme

    parser = ArgumentParser(prog="accrot demo", exit_on_error=False, description=plain_help(__doc__))
    option(parser, "--config", kind=text("a shipped config name or a YAML file"), type=str, default="tiny", help="shipped config name or YAML path")
    option(parser, "--root", kind=write_dir("a folder for the runs"), type=str, default="runs/demo", help="folder for the runs and the comparison")
    option(parser, "--variants", kind=choice(*VARIANTS), type=list[str] | None, default=None,
                        help=f"subset of: {', '.join(VARIANTS)}")
    option(parser, "--multipliers", kind=numbers(), type=list[float], default=[1, 2, 4, 8, 16, 32])
    option(parser, "--max_steps", kind=count(1), type=int | None, default=None, help="override trainer.max_steps")
    option(parser, "--wandb", kind=choice(*WANDB_MODES), type=str, default="auto")
    option(parser, "--extra", kind=FREE_TEXT, type=list[str], default=[], help="extra CLI overrides for every run")
    option(parser, "--quiet", kind=FLAG, action="store_true",
                        help="one line per finished run instead of the live display (also when stdout is no terminal)")
    args = parse(parser, argv)
    names = args.variants or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise UsageError(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    cfg = config_path(args.config)
    root = Path(args.root)
    console = Console(file=sys.stdout)  # the terminal, also while a run's own output goes to its log
    runnable = list(names)
    curves: dict[str, list[dict]] = {}
    rises: dict[str, list[dict]] = {}  # the same-target rise per length, with the anchors' interval
    runs: dict[str, str] = {}
    train_length = None
    display = RunDisplay("accrot demo", len(runnable), console, near=f"{args.multipliers[0]:g}×",
                         far=f"{args.multipliers[-1]:g}×", quiet=args.quiet)
    with holding(root, "--root", "the demo's folder"):
        with display:
            for name in runnable:
                t0 = time.time()
                display.update(running=[Running("training", name, t0)])
                run_dir = _run(name, _fit_args(name, cfg, root, args), root)
                doc = json.loads((run_dir / "extrapolation.json").read_text())
                curves[name], runs[name], train_length = doc["final"]["lengths"], str(run_dir), doc["train_length"]
                rises[name] = (doc["final"].get("same_targets") or {}).get("lengths", [])
                first, last = curves[name][0], curves[name][-1]
                display.update(done=len(curves), running=[], finished=[
                    Finished(f"{name} → {run_dir}", near=first["nll"], far=last["nll"], seconds=time.time() - t0)])
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(root / "demo.json", json.dumps({"train_length": train_length, "runs": runs,
                                                          "curves": curves, "same_target_rises": rises}, indent=1))
        styles = {n: look_of_scheme(VARIANTS[n]).line() for n in curves}  # the study's colours
        plot_demo(rises, curves, train_length, root / "demo.png", styles)
        if any(rises.values()):
            console.print(rise_table(rises, train_length))
        console.print(nll_table(curves, train_length, title=f"per-length blocks: NLL (nats/token) of each length's own "
                                                            f"blocks, other text at each length; L = {train_length}"))
        console.print(f"wrote {root / 'demo.json'} and {root / 'demo.png'}")
        return 0


def rise_table(rises: dict[str, list[dict]], train_length: int):
    """The same-target rise per scheme and length, ± half the anchors' 95 % interval (rich table)."""
    from rich.table import Table

    lengths = sorted({r["length"] for rows in rises.values() for r in rows})
    table = Table(title=f"same-target rise NLL(m·L) − NLL(L) (nats/token; the same targets at every length, ± the "
                        f"anchors' 95 % interval); L = {train_length}")
    table.add_column("scheme")
    for ln in lengths:
        table.add_column(f"{ln / train_length:g}×", justify="right")
    for name, rows in rises.items():
        by = {r["length"]: r for r in rows}
        cells = []
        for ln in lengths:
            r = by.get(ln)
            if r is None:
                cells.append("–")
                continue
            lo, hi = r.get("rise_ci") or (r["rise"], r["rise"])
            cells.append(f"{r['rise']:+.3f} ± {(hi - lo) / 2:.3f}")
        table.add_row(name, *cells)
    return table


def plot_demo(rises: dict[str, list[dict]], curves: dict[str, list[dict]], train_length: int, path: Path,
              styles: dict[str, dict]) -> Path:
    """Left, first: the same-target rise against length with the anchors' interval as error bars; right: each
    length's own blocks (labelled: other text at each length). One legend beside them."""
    from accrot.io import atomic_savefig, pyplot

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2), constrained_layout=True)
    for name, rows in rises.items():
        if not rows:
            continue
        xs = [r["length"] / train_length for r in rows]
        ys = [r["rise"] for r in rows]
        cis = [r.get("rise_ci") or (r["rise"], r["rise"]) for r in rows]
        style = styles.get(name, {})
        left.errorbar(xs, ys, yerr=[[max(0.0, y - c[0]) for y, c in zip(ys, cis)],
                                    [max(0.0, c[1] - y) for y, c in zip(ys, cis)]], capsize=2.5, lw=1.3, ms=3.5,
                      label=name, **style)
    left.axhline(0, color="grey", lw=0.8)
    left.set_title("same targets at every length: rise over 1× (bars: the anchors' 95 % interval)", fontsize=9)
    left.set_ylabel("NLL(m·L) − NLL(L) (nats/token)")
    for name, rows in curves.items():
        right.plot([r["length"] / train_length for r in rows], [r["nll"] for r in rows], lw=1.1, ms=3,
                   **styles.get(name, {}))
    right.set_title("per-length blocks: each length's own text (differences partly the text's)", fontsize=9)
    right.set_ylabel("NLL (nats/token)")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(lambda x, _: f"{x:g}×")
        ax.axvline(1, color="grey", ls=":", lw=1)
        ax.set_xlabel("length / training length L (dotted: L)")
        ax.grid(alpha=0.3)
    handles, labels = left.get_legend_handles_labels()
    if not handles:  # no rise recorded (a task without a corpus): the blocks' curves name the schemes
        handles, labels = right.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)
    fig.suptitle("accrot demo: tiny models, embedded corpus", fontsize=10)
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def _fit_args(name: str, cfg, root: Path, args) -> list[str]:
    """``accrot fit`` arguments of one variant: the shared recipe, its scheme, the demo's options."""
    run_name = name.replace("/", "_").replace("+", "_")
    cli_args = ["fit", "--config", str(cfg), f"--name={run_name}", f"--root={root}", f"--wandb={args.wandb}",
                f"--extrapolation.multipliers={json.dumps(args.multipliers)}", "--trainer.enable_progress_bar=false"]
    cli_args += [f"--model.scheme.{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in VARIANTS[name].items()]
    if args.max_steps is not None:
        cli_args.append(f"--trainer.max_steps={args.max_steps}")
    return cli_args + args.extra


def _run(name: str, cli_args: list[str], root: Path) -> Path:
    """Train one variant with what it prints going to its run's ``console.log``; its run directory."""
    from accrot.logs import run_log
    from accrot.run.lightning import run_lightning

    log = root / f".{name.replace('/', '_').replace('+', '_')}.console.log"
    try:
        with run_log(log):
            cli = run_lightning(cli_args)
    except BaseException:
        log.unlink(missing_ok=True)
        raise
    run_dir = Path(cli.trainer.log_dir)
    log.replace(run_dir / "console.log")
    return run_dir

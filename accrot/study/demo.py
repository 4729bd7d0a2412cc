"""``accrot demo``: train the tiny model under several schemes and compare how each extrapolates.

Every variant shares the config, the data, the seed, the token budget and the evaluation blocks;
only the position scheme differs. Prints one line per finished run and a rich table (NLL per length per
scheme), and writes ``demo.json`` and ``demo.png`` (all curves) into the demo folder; what each run printed
(Lightning's and wandb's lines) is in its ``console.log``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from accrot.study.variants import VARIANTS as STUDY_VARIANTS

# the study's variants the demo trains, by the study's names: the anchors, the accumulated rotations and PaTH
DEMO_VARIANTS = ("NoPE", "RoPE", "ALiBi", "accum-random", "accum-learned", "accum-learned+values", "PaTH", "PaTH-FoX")
VARIANTS: dict[str, dict[str, object]] = {name: STUDY_VARIANTS[name] for name in DEMO_VARIANTS}  # name -> overrides


def main(argv: list[str]) -> int:
    from jsonargparse import ArgumentParser
    from rich.console import Console

    from accrot.display import Finished, RunDisplay, Running, plain_help
    from accrot.errors import UsageError
    from accrot.evaluation import nll_table, plot_curves
    from accrot.io import atomic_write_text
    from accrot.run.args import config_path
    from accrot.study.looks import look_of_scheme

    parser = ArgumentParser(prog="accrot demo", exit_on_error=False, description=plain_help(__doc__))
    parser.add_argument("--config", type=str, default="tiny", help="shipped config name or YAML path")
    parser.add_argument("--root", type=str, default="runs/demo", help="folder for the runs and the comparison")
    parser.add_argument("--variants", type=list[str] | None, default=None,
                        help=f"subset of: {', '.join(VARIANTS)}")
    parser.add_argument("--multipliers", type=list[float], default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--max_steps", type=int | None, default=None, help="override trainer.max_steps")
    parser.add_argument("--wandb", type=str, default="auto")
    parser.add_argument("--extra", type=list[str], default=[], help="extra CLI overrides for every run")
    parser.add_argument("--quiet", action="store_true",
                        help="one line per finished run instead of the live display (also when stdout is no terminal)")
    args = parser.parse_args(argv)
    names = args.variants or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise UsageError(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    cfg = config_path(args.config)
    root = Path(args.root)
    console = Console(file=sys.stdout)  # the terminal, also while a run's own output goes to its log
    runnable = list(names)
    curves: dict[str, list[dict]] = {}
    runs: dict[str, str] = {}
    train_length = None
    display = RunDisplay("accrot demo", len(runnable), console, near=f"{args.multipliers[0]:g}×",
                         far=f"{args.multipliers[-1]:g}×", quiet=args.quiet)
    with display:
        for name in runnable:
            t0 = time.time()
            display.update(running=[Running("training", name, t0)])
            run_dir = _run(name, _fit_args(name, cfg, root, args), root)
            doc = json.loads((run_dir / "extrapolation.json").read_text())
            curves[name], runs[name], train_length = doc["final"]["lengths"], str(run_dir), doc["train_length"]
            first, last = curves[name][0], curves[name][-1]
            display.update(done=len(curves), running=[], finished=[
                Finished(f"{name} → {run_dir}", near=first["nll"], far=last["nll"], seconds=time.time() - t0)])
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / "demo.json", json.dumps({"train_length": train_length, "runs": runs,
                                                      "curves": curves}, indent=1))
    plot_curves(curves, train_length, root / "demo.png", title="accrot demo: tiny models, embedded corpus",
                styles={n: look_of_scheme(VARIANTS[n]).line() for n in curves})  # the study's colours
    console.print(nll_table(curves, train_length, title=f"NLL (nats/token) per evaluation length, L = {train_length}"))
    console.print(f"wrote {root / 'demo.json'} and {root / 'demo.png'}")
    return 0


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

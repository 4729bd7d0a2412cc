"""The ``accrot`` command: a table of subcommands, each imported only when it is called.

``accrot fit`` is a LightningCLI subcommand (:mod:`accrot.run`; LightningCLI's validate, test and predict are not
offered: ``accrot eval`` scores a checkpoint); ``--help``, ``--version`` and an
unknown command are answered without importing torch. Every bad input ends with one line ``accrot: error: ...``
and exit status 2 (:mod:`accrot.errors`); a run that diverges ends with one line and exit status 1, its run
directory kept.
"""

from __future__ import annotations

import importlib
import signal
import sys

from accrot.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_STOPPED,
    bad_input_message,
    one_line,
)

# command -> "module:function"; the function takes the command's arguments and returns an exit status
COMMANDS = {
    "eval": "accrot.run.eval:main",
    "sample": "accrot.run.sample:main",
    "diagnose": "accrot.run.diagnose:main",
    "demo": "accrot.study.demo:main",
    "bench": "accrot.bench.command:main",
    "sweep": "accrot.sweep.parent:main",
    "report": "accrot.sweep.report:main",
    "ablation": "accrot.study.ablation:main",
    "yardstick": "accrot.yardstick.command:main",
    "slurm": "accrot.sweep.slurm:main",
    "storage-proxy": "accrot.sweep.proxy:main",
}

LIGHTNING_COMMANDS = {"fit": "train a model (a LightningCLI subcommand: --config, dotted overrides, --resume RUN_DIR)"}
# LightningCLI's other subcommands, which accrot does not offer: a data module has no test split, and a checkpoint's
# scores on the validation split are accrot eval's (at every length, written beside the run)
NOT_COMMANDS = {"validate": "the validation split at many lengths", "test": "the held-out split at many lengths",
                "predict": "the NLL per length"}
COMMAND_HELP = {"eval": "evaluate a checkpoint at many lengths (JSON + PNG)",
                "sample": "continue a prompt with a checkpoint (cached decoding; greedy or sampled)",
                "diagnose": "the theory diagnostics of a checkpoint (coherence, windows, far mass, ...)",
                "demo": "train the tiny model under several schemes and compare their extrapolation",
                "bench": "side-by-side timing ratios of the kernels and the pipeline",
                "sweep": "an Optuna study from a sweep spec (workers, storages, resume)",
                "report": "the table and figures of a finished sweep",
                "ablation": "the paper's ablation in one command: every variant, both data sets, the claims",
                "yardstick": "the field's formal-language and flip-flop protocols, beside the published rows",
                "slurm": "submit accrot fit or a sweep to SLURM",
                "storage-proxy": "serve a sweep's database to many workers (Optuna's gRPC proxy + the budget lock)"}


def version() -> str:
    from importlib import metadata

    try:
        return metadata.version("accrot")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "0+unknown"


def _front_door(argv: list[str]) -> int | None:
    """Answers that need no torch: ``--help`` (and no arguments), ``--version``, an unknown command. None when
    the command is a real one (it then imports what it needs)."""
    import difflib

    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, [*LIGHTNING_COMMANDS, *COMMAND_HELP]))
        rows = "\n".join(f"  {name:<{width}}  {text}" for name, text in {**LIGHTNING_COMMANDS, **COMMAND_HELP}.items())
        print(f"usage: accrot COMMAND [options]   (accrot COMMAND --help for a command's options)\n\n"
              f"accrot {version()}: small causal LMs that differ only in their position scheme, and how they "
              f"extrapolate.\n\ncommands:\n{rows}\n\nexamples:\n  accrot fit --config tiny "
              f"--model.scheme.rotation=rope\n  accrot ablation            (the study: results/ablation-study/REPORT.md)")
        return 0 if argv else EXIT_BAD_INPUT
    if argv[0] in ("-V", "--version"):
        print(f"accrot {version()}")
        return 0
    if argv[0] in COMMANDS or argv[0] in LIGHTNING_COMMANDS:
        return None
    if argv[0] in NOT_COMMANDS:
        print(f"accrot: error: accrot {argv[0]} is not a command; score a checkpoint with accrot eval --ckpt "
              f"RUN_DIR ({NOT_COMMANDS[argv[0]]}, written into RUN_DIR/eval)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if argv[0].startswith("-"):
        # LightningCLI's options before a subcommand (--config ...): let it parse them
        return None
    close = difflib.get_close_matches(argv[0], [*LIGHTNING_COMMANDS, *COMMANDS], n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    print(f"accrot: error: unknown command {argv[0]!r}; {hint}commands: "
          f"{', '.join([*LIGHTNING_COMMANDS, *COMMANDS])} (accrot --help)", file=sys.stderr)
    return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    answered = _front_door(argv)
    if answered is not None:
        return answered
    problem = importlib.import_module("accrot.runtime").torch_problem()  # a node's own torch is used as it is
    if problem is not None:
        print(f"accrot: error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        importlib.import_module("accrot.run.launch").check_environment()
        # before torch's first parallel region and first tensor: glibc applies the allocator's thresholds to later
        # allocations only, and the intra-op threads inherit the float mode (IEEE unless ACCROT_DENORMALS=flush)
        importlib.import_module("accrot.runtime").configure_process()
        if argv and argv[0] in COMMANDS:
            module, _, func = COMMANDS[argv[0]].partition(":")
            return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
        # a user's own fit: its run directory first and last, Lightning's lines in the run's console.log
        importlib.import_module("accrot.run.lightning").run_lightning(argv, console_log=True)
        return 0
    except FloatingPointError as err:  # a diverged run: the input was fine, the run failed
        run_dir = getattr(err, "run_dir", None)
        kept = f"; its run directory {str(run_dir)!r} is kept" if run_dir and run_dir.exists() else ""
        print(f"accrot: error: the run diverged: {one_line(str(err))}{kept}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as err:
        message = bad_input_message(err)
        if message is None:
            raise
        print(f"accrot: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # Ctrl-C: whatever was running has stopped (a sweep re-queued its trials)
        print("accrot: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as err:  # --help and argparse's own exits; a run stopped by a signal
        return _exit_status(err)


def _exit_status(err: SystemExit) -> int:
    """A run stopped by a signal (callbacks.preemption checkpointed it: not a success), or an ordinary exit."""
    if type(err).__name__ == "SIGTERMException":
        run = str(getattr(err, "run_dir", None) or "RUN_DIR")
        if getattr(err, "signum", None) == signal.SIGINT:
            print(f"accrot: interrupted (Ctrl-C); the run {run!r} is checkpointed after its last step: "
                  f"continue it with `accrot fit --resume {run}`", file=sys.stderr)
            return EXIT_INTERRUPTED
        print(f"accrot: stopped by a signal (SIGTERM or the SLURM warning); the run {run!r} is checkpointed: "
              f"continue it with `accrot fit --resume {run}`", file=sys.stderr)
        return EXIT_STOPPED
    if isinstance(err.__context__, KeyboardInterrupt):  # Lightning turns a hard Ctrl-C into exit(1)
        print("accrot: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return int(err.code or 0) if isinstance(err.code, int) else 0

if __name__ == "__main__":
    sys.exit(main())

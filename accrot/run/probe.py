"""``accrot fit`` parsed and built (model, data module, trainer, callbacks) without training: how a sweep checks a
spec's every value, and how ``accrot slurm`` reads a run's layout, exactly as the run itself would."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import tempfile
from typing import Any

from accrot.lit import LitLM
from accrot.run.args import resolve_config_args
from accrot.run.lightning import AccrotCLI
from data_modules import TokenStreamDataModule


class ProbeCLI(AccrotCLI):
    """Instantiates, never fits. The parser is built once per process (building it from the model, data and
    Trainer signatures is most of a probe's time, 0.8 of 1.4 s; parsing is stateless)."""

    _built = None  # what setup_parser sets (the parsers)

    def setup_parser(self, add_subcommands, main_kwargs, subparser_kwargs) -> None:
        if ProbeCLI._built is None:
            before = set(vars(self))
            super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
            ProbeCLI._built = {k: v for k, v in vars(self).items() if k not in before}  # parser & co
        vars(self).update(ProbeCLI._built)

    def __init__(self, *args: Any, setup: bool = False, **kwargs: Any) -> None:
        self.setup = setup
        super().__init__(*args, **kwargs)

    def _run_subcommand(self, subcommand: str) -> None:
        """With ``setup``: what a run checks at its start, before its first step (the evaluation and diagnostics
        blocks cut from the data: a length the stream cannot fill fails here)."""
        if self.setup:
            from callbacks.cadence import Periodic

            for cb in self.trainer.callbacks:
                if isinstance(cb, Periodic):
                    cb.prepare(self.datamodule)


def probe(args: list[str], setup: bool = False) -> dict[str, Any]:
    """Parse ``accrot fit`` ``args`` and build everything (model, data module, trainer, callbacks) without
    training, exactly as a run would; returns the resolved config flattened to dotted keys. ``setup``: also what the
    run checks before its first step (its evaluation blocks cut from the data).

    Bad input raises what ``accrot fit`` raises (UsageError, ConfigError, DataError, ArgumentError)."""
    args = [a for a in args if not a.startswith(("--root=", "--wandb="))]
    quiet = [logging.getLogger(n) for n in ("lightning", "lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in quiet]
    with tempfile.TemporaryDirectory(prefix="accrot-probe-") as tmp, \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for lg in quiet:
            lg.setLevel(logging.ERROR)
        argv0, sys.argv = sys.argv, sys.argv[:1]
        try:
            cli = ProbeCLI(LitLM, TokenStreamDataModule, subclass_mode_data=True,
                           args=resolve_config_args([*args, f"--root={tmp}", "--wandb=disabled"]),
                           parser_kwargs={"exit_on_error": False}, auto_configure_optimizers=False, setup=setup)
            resolved = cli.config[cli.subcommand].clone().as_dict()
        finally:
            sys.argv = argv0
            for lg, level in zip(quiet, levels):
                lg.setLevel(level)
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        flat[prefix] = node
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)

    walk("", resolved)
    flat.pop("", None)
    return flat

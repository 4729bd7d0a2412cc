"""The ``accrot`` command.

``accrot fit|validate|test`` are LightningCLI subcommands (YAML configs + dotted overrides such as
``--model.scheme.rotation=rope``); ``accrot eval`` evaluates a checkpoint at many lengths;
``accrot demo`` trains the tiny model under several schemes and compares their extrapolation;
``accrot bench`` prints side-by-side timing ratios.

Every bad input ends with one line ``accrot: error: ...`` and exit status 2 (DESIGN §7).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from accrot.position.config import ConfigError

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
EXIT_BAD_INPUT = 2


class UsageError(ValueError):
    """A bad command-line value caught by accrot itself."""


def bad_input_message(err: BaseException) -> str | None:
    """The one-line message of a bad input anywhere in ``err``'s cause chain; None for a real bug."""
    from jsonargparse import ArgumentError

    from data_modules import DataError

    chain, seen = [], err
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for e in chain:  # our own messages are already one line and name the field
        if isinstance(e, (ConfigError, DataError, UsageError)):
            return one_line(str(e))
    for e in chain:
        if isinstance(e, ArgumentError):
            return one_line(str(e))
    return None


_EXPECTED = re.compile(r"Expected an? (?P<type>.*?)\. Got value: (?P<value>[^\n;]*)")
_LITERAL = re.compile(r"typing\.Literal\[(?P<choices>.*)\]")
_KEY = re.compile(r'Parser key "(?P<key>[\w.]+)"')


def one_line(message: str) -> str:
    """Collapse a (possibly nested, multi-line) parser message into one readable line."""
    message = str(message)
    expected = _EXPECTED.search(message)
    if expected:  # "model.scheme" + "rotation": the full dotted key, the bad value and what is valid
        keys = list(dict.fromkeys(m.group("key") for m in _KEY.finditer(message[: expected.start()])))
        key = ".".join(keys) or "value"
        kind = expected.group("type")
        literal = _LITERAL.fullmatch(kind)
        if literal:
            valid = f"choose one of {literal.group('choices')}"
        else:
            valid = "expected " + re.sub(r"<class '(.*?)'>", r"\1", kind)
        return f"{key}={expected.group('value').strip()!r} is not valid; {valid}"
    lines = [ln.strip(" -") for ln in message.splitlines() if ln.strip(" -")]
    # jsonargparse nests "Problem with given class_path ..." / "Parser key ...": keep the informative parts
    lines = [ln for ln in lines if not ln.startswith(("Given value type", "Subcommand", "tip:"))]
    text = "; ".join(dict.fromkeys(lines))
    return re.sub(r"\s+", " ", text)[:600]


def config_path(name: str) -> Path:
    """A shipped config by name (``tiny``) or a path to a YAML file."""
    p = Path(name)
    if p.exists() or p.suffix in (".yaml", ".yml", ".json"):
        return p  # a path: a missing file is reported by the parser with its name
    shipped = CONFIG_DIR / f"{name}.yaml"
    if shipped.exists():
        return shipped
    valid = ", ".join(sorted(f.stem for f in CONFIG_DIR.glob("*.yaml")))
    raise UsageError(f"config {name!r} is neither a YAML file nor a shipped config; shipped: {valid}")


# ---------------------------------------------------------------------------------------------------
# LightningCLI
# ---------------------------------------------------------------------------------------------------
def _make_cli_class():
    import lightning as L
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
    from lightning.pytorch.loggers import CSVLogger

    from accrot.lit import LitLM
    from callbacks.extrapolation import ExtrapolationCallback
    from callbacks.run_record import RunRecord
    from data_modules import TokenStreamDataModule

    class AccrotCLI(LightningCLI):
        """LightningCLI with accrot's run layout: ``<root>/<name>/version_N/`` holds everything of a run."""

        def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
            parser.add_argument("--name", type=str | None, default=None,
                                help="run name (default: rotation-far_mass[-values] of the scheme)")
            parser.add_argument("--root", type=str, default="runs", help="folder that holds the run directories")
            parser.add_argument("--wandb", type=str, default="auto",
                                help="auto (online if logged in, else offline), online, offline or disabled")
            parser.add_lightning_class_args(ExtrapolationCallback, "extrapolation")
            # the vocabulary is the data's (bytes: 256; a synthetic task or HF tokenizer: its own size)
            parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")

        def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
            from jsonargparse import ArgumentError

            try:
                super().parse_arguments(parser, args)
            except ArgumentError as err:
                unknown = re.search(r"unrecognized arguments: --?([\w.]+)", str(err))
                if not unknown:
                    raise
                raise UsageError(self._unknown_key_message(parser, unknown.group(1))) from err

        @staticmethod
        def _unknown_key_message(parser: LightningArgumentParser, key: str) -> str:
            import difflib

            sub = next((a for a in parser._actions if type(a).__name__.endswith("ActionSubCommands")), None)
            known: list[str] = []
            for p in (sub.choices.values() if sub is not None else [parser]):
                known += [k for k in p.get_defaults().keys() if not k.startswith("__")]
            close = difflib.get_close_matches(key, sorted(set(known)), n=3, cutoff=0.6)
            prefix = key.rpartition(".")[0]
            siblings = sorted({k[len(prefix) + 1 :].split(".")[0] for k in known if k.startswith(prefix + ".")})
            if close:
                hint = f"did you mean {', '.join(close)}?"
            elif prefix and siblings:
                hint = f"valid keys under {prefix!r}: {', '.join(siblings)}"
            else:
                hint = "run with --help for the valid keys"
            return f"unknown key {key!r}; {hint}"

        def before_instantiate_classes(self) -> None:
            cfg = self.config.get(self.subcommand, self.config)
            if cfg.get("wandb") not in ("auto", "online", "offline", "disabled"):
                raise UsageError(f"--wandb={cfg.get('wandb')!r} is not valid; choose auto, online, offline or disabled")

        def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
            cfg = self.config_init[self.subcommand]
            trainer_cfg = cfg["trainer"]
            if trainer_cfg.get("logger") in (None, True):
                kwargs["logger"] = self._loggers(cfg)
                if trainer_cfg.get("default_root_dir") is None:
                    # fast_dev_run swaps the loggers for a dummy: files still land in the run directory
                    kwargs["default_root_dir"] = str(self.run_dir)
            callbacks = list(trainer_cfg.get("callbacks") or [])
            callbacks.append(RunRecord())
            if trainer_cfg.get("enable_progress_bar") is not False:
                from lightning.pytorch.callbacks import RichProgressBar

                if not any(type(c).__name__.endswith("ProgressBar") for c in callbacks):
                    callbacks.append(RichProgressBar())
            trainer_cfg["callbacks"] = callbacks
            return super().instantiate_trainer(**kwargs)

        def _loggers(self, cfg) -> list:
            model: LitLM = cfg["model"]
            scheme = model.scheme_config
            name = cfg.get("name") or "-".join(
                [scheme.rotation, scheme.far_mass] + (["values"] if scheme.rotate_values else [])
            )
            csv = CSVLogger(save_dir=cfg.get("root", "runs"), name=name)
            self.run_dir = Path(csv.log_dir)
            if not self.run_dir.exists():
                _CREATED.append(self.run_dir)
            loggers = [csv]
            mode = wandb_mode(cfg.get("wandb", "auto"))
            if mode != "disabled" and self.subcommand == "fit":
                from lightning.pytorch.loggers import WandbLogger

                os.environ["WANDB_MODE"] = mode  # WandbLogger(offline=...) would override WANDB_MODE=disabled
                csv.experiment  # noqa: B018 - the CSV writer claims the new run directory before wandb fills it
                loggers.append(WandbLogger(save_dir=str(self.run_dir), name=f"{name}/{self.run_dir.name}",
                                           project=os.environ.get("WANDB_PROJECT", "accrot")))
            return loggers

        def before_fit(self) -> None:
            # cut the evaluation blocks before any training, so a length the stream cannot fill fails fast
            for cb in self.trainer.callbacks:
                if isinstance(cb, ExtrapolationCallback):
                    cb.prepare(self.datamodule)

    return AccrotCLI, LitLM, TokenStreamDataModule


def wandb_mode(requested: str) -> str:
    """``auto`` honours WANDB_MODE, else goes online only when an API key is configured."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


def resolve_config_args(args: list[str]) -> list[str]:
    """Let ``--config tiny`` name a shipped config (``accrot/configs/tiny.yaml``)."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg in ("-c", "--config") and i + 1 < len(out):
            out[i + 1] = str(config_path(out[i + 1]))
        elif arg.startswith("--config="):
            out[i] = "--config=" + str(config_path(arg.split("=", 1)[1]))
    return out


def run_lightning(args: list[str]):
    """Run one LightningCLI subcommand in-process; returns the CLI object (its ``trainer`` and ``run_dir``)."""
    AccrotCLI, LitLM, TokenStreamDataModule = _make_cli_class()
    args = resolve_config_args(args)
    _CREATED.clear()
    argv0, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when it sees both args= and sys.argv
    try:
        cli = AccrotCLI(
            LitLM,
            TokenStreamDataModule,
            subclass_mode_data=True,
            args=args,
            parser_kwargs={"exit_on_error": False},
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
        )
    except BaseException:
        # nothing half-written: a run that failed before its first checkpoint leaves no directory behind
        for run_dir in _CREATED:
            _remove_if_incomplete(run_dir)
        raise
    finally:
        sys.argv = argv0
        _finish_wandb()
    return cli


def _finish_wandb() -> None:
    """Close this run's wandb run: WandbLogger would otherwise reuse it for the next run in this process
    (the demo and sweep workers train several runs in one process)."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()


_CREATED: list[Path] = []  # run directories this process's current command created


def _remove_if_incomplete(run_dir: Path) -> None:
    run_dir = Path(run_dir)
    if run_dir.exists() and not any(run_dir.glob("checkpoints/*.ckpt")):
        shutil.rmtree(run_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------------
COMMANDS = {"diagnose": "accrot.diagnostics:diagnose_main", "eval": "accrot.cli:eval_main", "demo": "accrot.demo:main", "bench": "accrot.bench:main",
            "sweep": "accrot.sweep:main", "report": "accrot.report:main"}


def _load_data_module(config_file: Path, overrides: dict | None = None):
    """Instantiate the ``data`` section of a run's resolved ``config.yaml``."""
    import importlib

    import yaml

    cfg = yaml.safe_load(config_file.read_text()) or {}
    data = cfg.get("data") or {}
    if "class_path" not in data:
        raise UsageError(f"{config_file} has no data.class_path; pass --config with the run's config.yaml")
    module, _, cls = data["class_path"].rpartition(".")
    kwargs = dict(data.get("init_args") or {})
    kwargs.update(overrides or {})
    return getattr(importlib.import_module(module), cls)(**kwargs)


def resolve_run(ckpt: str, config: str | None) -> tuple[Path, Path, Path]:
    """``(checkpoint, run directory, config.yaml)`` of a run's checkpoint; a one-line UsageError if one is missing."""
    path = Path(ckpt)
    if not path.is_file():
        raise UsageError(f"checkpoint {str(path)!r} does not exist; pass the path of a .ckpt file")
    run_dir = path.resolve().parent.parent  # <run>/checkpoints/x.ckpt
    cfg = Path(config) if config else run_dir / "config.yaml"
    if not cfg.is_file():
        raise UsageError(f"config {str(cfg)!r} does not exist; pass --config with the run's config.yaml")
    return path, run_dir, cfg


def load_checkpoint(path: str | Path):
    """``(LitLM, checkpoint dict)`` from an accrot checkpoint, or a one-line UsageError (corrupt, not accrot's,
    or weights that do not fit the scheme it names)."""
    import torch

    from accrot.lit import LitLM

    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - any failure to read is the same bad input
        raise UsageError(f"checkpoint {str(path)!r} is not a readable accrot checkpoint ({type(err).__name__})") from err
    if not isinstance(state, dict) or "state_dict" not in state or "hyper_parameters" not in state:
        raise UsageError(f"checkpoint {str(path)!r} is not a readable accrot checkpoint (no weights or hyperparameters)")
    try:
        # LightningCLI adds bookkeeping keys (``_instantiator``, ``_class_path``) beside the init arguments
        hparams = {k: v for k, v in state["hyper_parameters"].items() if not k.startswith("_")}
        model = LitLM(**hparams)
        model.load_state_dict(state["state_dict"], strict=True)
    except (TypeError, RuntimeError, ValueError) as err:
        raise UsageError(f"checkpoint {str(path)!r} does not match the model it describes: {one_line(str(err))[:200]}") from err
    return model, state


def eval_main(argv: list[str]) -> int:
    """``accrot eval --ckpt PATH``: evaluate a checkpoint at many lengths; writes JSON + PNG."""
    import json

    from jsonargparse import ArgumentParser
    from rich.console import Console

    from accrot.evaluation import SCHEMA, eval_sets, evaluate_lengths
    from accrot.report import atomic_write_text, nll_table, plot_curves

    parser = ArgumentParser(prog="accrot eval", exit_on_error=False, description=eval_main.__doc__)
    parser.add_argument("--ckpt", type=str, required=True, help="checkpoint (.ckpt) of an accrot run")
    parser.add_argument("--config", type=str | None, default=None,
                        help="the run's config.yaml (default: found next to the checkpoint's run directory)")
    parser.add_argument("--multipliers", type=list[float], default=[1, 2, 4, 8, 16, 32],
                        help="evaluation lengths as multiples of the training length")
    parser.add_argument("--lengths", type=list[int] | None, default=None, help="explicit lengths (override)")
    parser.add_argument("--budget_tokens", type=int, default=32768, help="scored tokens per length")
    parser.add_argument("--max_batch_tokens", type=int, default=16384, help="tokens per forward pass")
    parser.add_argument("--out", type=str | None, default=None, help="output folder (default: <run>/eval)")
    parser.add_argument("--device", type=str, default="cpu", help="cpu, cuda, cuda:1, ...")
    args = parser.parse_args(argv)
    ckpt, run_dir, config = resolve_run(args.ckpt, args.config)
    if any(m <= 0 for m in args.multipliers) or any(ln <= 0 for ln in args.lengths or []):
        raise UsageError("evaluation lengths and multipliers must be positive")
    model, state = load_checkpoint(ckpt)
    dm = _load_data_module(config)
    train_length = int(dm.seq_len)
    lengths = args.lengths or sorted({max(1, round(m * train_length)) for m in args.multipliers})
    sets = eval_sets(dm, lengths, args.budget_tokens)  # fails before any work
    model.eval().to(args.device)
    console = Console(stderr=True)
    with console.status("evaluating"):
        results = evaluate_lengths(model, sets.blocks, train_length, args.max_batch_tokens, device=args.device,
                                   masks=sets.masks, depths=sets.depths)
    rows = [r.to_dict() for r in results]
    out = Path(args.out) if args.out else run_dir / "eval"
    out.mkdir(parents=True, exist_ok=True)
    doc = {"schema": SCHEMA, "train_length": train_length, "budget_tokens": args.budget_tokens,
           "checkpoint": str(ckpt), "scheme": model.hparams.get("scheme"), "data": dm.describe(),
           "final": {"step": state.get("global_step"), "lengths": rows}}
    atomic_write_text(out / "extrapolation.json", json.dumps(doc, indent=1))
    label = f"{doc['scheme']['rotation']}/{doc['scheme']['far_mass']}"
    plot_curves({label: rows}, train_length, out / "extrapolation.png", title=str(ckpt))
    Console().print(nll_table({label: rows}, train_length))
    print(out / "extrapolation.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in COMMANDS:
            import importlib

            module, _, func = COMMANDS[argv[0]].partition(":")
            return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
        run_lightning(argv)
        return 0
    except Exception as err:
        message = bad_input_message(err)
        if message is None:
            raise
        print(f"accrot: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SystemExit as err:  # --help and argparse's own exits
        return int(err.code or 0) if isinstance(err.code, int) else 0


if __name__ == "__main__":
    sys.exit(main())

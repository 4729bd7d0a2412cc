"""The ``accrot`` command.

``accrot fit|validate|test`` are LightningCLI subcommands (YAML configs + dotted overrides such as
``--model.scheme.rotation=rope``); ``accrot eval`` evaluates a checkpoint at many lengths;
``accrot demo`` trains the tiny model under several schemes and compares their extrapolation;
``accrot bench`` prints side-by-side timing ratios.

``accrot fit --resume RUN_DIR`` continues a run (killed, preempted, or finished with a larger
``--trainer.max_steps``) in its own directory from ``checkpoints/last.ckpt``; ``--ckpt_path last`` does the
same for the newest run of the name the command would write (and starts a new run when there is none).
A resumed run ends with exactly the metrics of an uninterrupted one (:mod:`accrot.resume`).

Every bad input ends with one line ``accrot: error: ...`` and exit status 2 (DESIGN §7); a run that
diverges (a non-finite loss or gradient) ends with one line and exit status 1, its run directory kept.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from accrot.logs import hold_startup_logs

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
EXIT_BAD_INPUT = 2
EXIT_FAILED = 1  # the input was fine but the run failed (it diverged)
EXIT_INTERRUPTED = 128 + 2  # Ctrl-C (SIGINT), the shell's code; a run checkpointed first (callbacks.preemption)
EXIT_STOPPED = 128 + 15  # stopped by SIGTERM / the SLURM warning signal, checkpointed (the shell's code for SIGTERM)
# an output directory that cannot be written (read-only, not a directory, full) is bad input, not a bug
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR}


class UsageError(ValueError):
    """A bad command-line value caught by accrot itself."""


def bad_input_message(err: BaseException) -> str | None:
    """The one-line message of a bad input anywhere in ``err``'s cause chain; None for a real bug."""
    from jsonargparse import ArgumentError

    from accrot.position.config import ConfigError
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
    for e in chain:  # an output folder that cannot be written (or filled) mid-run
        if isinstance(e, OSError) and e.errno in _UNWRITABLE and e.filename:
            return f"cannot write {str(e.filename)!r} ({e.strerror}); pass a writable --root with free space"
    return None


_EXPECTED = re.compile(r"Expected an? (?P<type>.*?)\. Got value: (?P<value>[^\n;]*)")
_LITERAL = re.compile(r"typing\.Literal\[(?P<choices>.*)\]")
_KEY = re.compile(r'Parser key "(?P<key>[\w.]+)"')
_UNION = re.compile(r"Does not validate against any of the Union subtypes; Subtypes: \[.*?\]; Errors:; "
                    r"(?P<errors>.+?)(; Expected a <class 'NoneType'>.*)?$")


_OPTIONAL_LITERAL = re.compile(r'Parser key "(?P<key>[\w.]+)":; Does not validate against any of the Union subtypes; '
                               r"Subtypes: \[typing\.Literal\[(?P<choices>[^\]]*)\], <class 'NoneType'>\].*?"
                               r"Given value: (?P<value>[^;]*)$")


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
    lines = [re.sub(r"^- ", "", ln.strip()) for ln in message.splitlines() if ln.strip(" -")]
    # jsonargparse nests "Problem with given class_path ..." / "Parser key ...": keep the informative parts
    lines = [ln for ln in lines if not ln.startswith(("Given value type", "Subcommand", "tip:"))]
    text = re.sub(r"\s+", " ", "; ".join(dict.fromkeys(lines)))
    optional = _OPTIONAL_LITERAL.search(text)
    if optional:  # an Optional[Literal[...]] key given a value outside the literal
        return (f"{optional.group('key')}={optional.group('value').strip()!r} is not valid; choose one of "
                f"{optional.group('choices')} (or null)")
    union = _UNION.match(text)
    if union:  # a class's own error, wrapped by jsonargparse's Union matching: keep that error alone
        text = union.group("errors")
    return text[:600]


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
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
    from lightning.pytorch.utilities import rank_zero_info

    from accrot.lit import LitLM
    from accrot.resume import (
        AtomicCheckpointIO,
        ResumableCSVLogger,
        check_fits,
        last_checkpoint,
        latest_resumable_run,
        read_checkpoint,
        remove_partials,
        settings_differences,
    )
    from accrot.slurm import check_launch
    from callbacks.checkpoint import make_resumable
    from callbacks.extrapolation import ExtrapolationCallback
    from callbacks.preemption import Preemption
    from callbacks.run_record import RunRecord
    from data_modules import TokenStreamDataModule

    class AccrotSaveConfig(SaveConfigCallback):
        """The saved ``config.yaml`` re-runs the run from scratch: it never names a checkpoint to start from
        (``run.json`` records the one a run started or resumed from)."""

        def __init__(self, parser, config, *args, **kwargs) -> None:
            config = config.clone()
            for key in ("ckpt_path", "resume"):
                if key in config:
                    config[key] = None
            super().__init__(parser, config, *args, **kwargs)

    class AccrotCLI(LightningCLI):
        """LightningCLI with accrot's run layout: ``<root>/<name>/version_N/`` holds everything of a run.

        ``resume_dir`` (set by :func:`run_lightning` for ``--resume``) makes the loggers reopen that run
        directory instead of opening a new version."""

        resume_dir: Path | None = None
        launch_argv: list[str] | None = None  # the command as typed (``trainer.devices>1`` re-runs it per rank)

        def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
            parser.add_argument("--name", type=str | None, default=None,
                                help="run name (default: rotation-far_mass[-values] of the scheme)")
            parser.add_argument("--root", type=str, default="runs", help="folder that holds the run directories")
            parser.add_argument("--wandb", type=str, default="auto",
                                help="auto (online if logged in, else offline), online, offline or disabled")
            parser.add_argument("--resume", type=str | None, default=None,
                                help="fit only: RUN_DIR (runs/<name>/version_N) to continue in place from its "
                                     "checkpoints/last.ckpt, with its own config.yaml (overrides allowed)")
            parser.add_lightning_class_args(ExtrapolationCallback, "extrapolation")
            # the vocabulary is the data's (bytes: 256; a synthetic task or HF tokenizer: its own size)
            parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")

        def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
            from jsonargparse import ArgumentError

            try:
                super().parse_arguments(parser, args)
            except ArgumentError as err:
                # an unknown flag, or an unknown key inside a config file (jsonargparse: "does not accept")
                unknown = (re.search(r"unrecognized arguments: --?([\w.]+)", str(err))
                           or re.search(r"does not accept option '([\w.]+)'", str(err)))
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

        def _parse_ckpt_path(self) -> None:
            """Lightning would overwrite the config's model with the checkpoint's hyperparameters, silently
            dropping ``--model.*`` overrides; accrot checks the checkpoint against the config instead and
            refuses one that does not fit (:meth:`_checkpoint_to_load`)."""

        def instantiate_classes(self) -> None:
            from lightning.fabric.utilities.exceptions import MisconfigurationException

            from accrot.position.config import ConfigError
            from data_modules import DataError

            try:
                super().instantiate_classes()
            except (UsageError, ConfigError, DataError):
                raise
            except (ValueError, MisconfigurationException) as err:
                # a constructor refusing its arguments (a callback's, the Trainer's): bad input, one line
                raise UsageError(one_line(str(err))) from err

        def before_instantiate_classes(self) -> None:
            cfg = self.config.get(self.subcommand, self.config)
            if cfg.get("wandb") not in ("auto", "online", "offline", "disabled"):
                raise UsageError(f"--wandb={cfg.get('wandb')!r} is not valid; choose auto, online, offline or disabled")
            scheme = cfg.get("model", {}).get("scheme") if hasattr(cfg.get("model", {}), "get") else None
            if scheme is not None and getattr(scheme, "seed", 0) is None:
                # the scheme's random draws follow the run's seed (resolved by LightningCLI before this hook), so
                # seeds are independent replicates; the config saved with the run records the value
                run_seed = cfg.get("seed_everything")
                scheme.seed = run_seed if isinstance(run_seed, int) and not isinstance(run_seed, bool) else 0
            if cfg.get("resume"):  # run_lightning turns a command-line --resume into --config/--ckpt_path
                raise UsageError(f"resume={cfg.get('resume')!r} in a config file is not valid; pass --resume RUN_DIR "
                                 "on the command line of accrot fit")

        def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
            cfg = self.config_init[self.subcommand]
            trainer_cfg = cfg["trainer"]
            io = self._checkpoint_io(trainer_cfg, kwargs)
            checkpoint = self._checkpoint_to_load(cfg, io)
            resumed = self.resume_dir is not None and checkpoint is not None
            record = (checkpoint or {}).get("accrot") or {}
            if trainer_cfg.get("logger") in (None, True):
                kwargs["logger"] = self._loggers(cfg, keep_rows=record.get("metrics_rows") if resumed else None,
                                                 wandb_id=record.get("wandb_id") if resumed else None)
                if trainer_cfg.get("default_root_dir") is None:
                    # fast_dev_run swaps the loggers for a dummy: files still land in the run directory
                    kwargs["default_root_dir"] = str(self.run_dir)
            elif self.resume_dir is not None:
                raise UsageError("--resume needs accrot's own loggers; remove trainer.logger from the config")
            if resumed:
                remove_partials(self.resume_dir / "checkpoints")
                rank_zero_info(f"resuming {self.resume_dir} at step {checkpoint.get('global_step')}")
            callbacks = [make_resumable(c) for c in (trainer_cfg.get("callbacks") or [])]
            start = {"ckpt_path": str(cfg.get("ckpt_path")), "step": checkpoint.get("global_step")} if checkpoint else None
            callbacks.append(RunRecord(resumed=resumed, start=start))
            if not any(isinstance(c, Preemption) for c in callbacks):  # checkpoint + requeue on SIGUSR1/SIGTERM
                callbacks.append(Preemption())
            check_launch(trainer_cfg)  # `srun -n1` with devices=2 would silently train on one rank
            if trainer_cfg.get("enable_progress_bar") is not False:
                from lightning.pytorch.callbacks import RichProgressBar

                if not any(type(c).__name__.endswith("ProgressBar") for c in callbacks):
                    callbacks.append(RichProgressBar())
            trainer_cfg["callbacks"] = callbacks
            return super().instantiate_trainer(**kwargs)

        @staticmethod
        def _checkpoint_io(trainer_cfg, kwargs) -> AtomicCheckpointIO | None:
            """Atomic checkpoint writes by default (a config that brings its own CheckpointIO keeps it)."""
            from lightning.fabric.plugins import CheckpointIO

            plugins = kwargs.get("plugins", trainer_cfg.get("plugins"))
            plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
            mine = next((p for p in plugins if isinstance(p, AtomicCheckpointIO)), None)
            if mine is None and not any(isinstance(p, CheckpointIO) for p in plugins):
                mine = AtomicCheckpointIO()
                plugins.append(mine)
            kwargs["plugins"] = plugins
            return mine

        def run_name(self, cfg) -> str:
            scheme = cfg["model"].scheme_config
            return cfg.get("name") or "-".join(
                [scheme.rotation, scheme.far_mass] + (["values"] if scheme.rotate_values else [])
            )

        def _checkpoint_to_load(self, cfg, io: AtomicCheckpointIO | None) -> dict | None:
            """Resolve ``--ckpt_path last`` to the newest resumable run of this name; read and check the
            checkpoint a command starts from (one line for a missing, corrupt or mismatched one)."""
            ckpt = cfg.get("ckpt_path")
            if self.subcommand == "fit" and ckpt == "last" and self.resume_dir is None:
                found = latest_resumable_run(cfg.get("root", "runs"), self.run_name(cfg))
                if found is None:
                    rank_zero_info(f"--ckpt_path last: no checkpoint under "
                                   f"{Path(cfg.get('root', 'runs'), self.run_name(cfg))}; starting a new run")
                    cfg["ckpt_path"] = None
                    return None
                self.resume_dir = found.resolve()
                cfg["ckpt_path"] = ckpt = str(last_checkpoint(found))
            if ckpt is None or ckpt in ("best", "last", "hpc", "registry") or "://" in str(ckpt):
                return None  # Lightning's own lookups and remote paths
            try:
                checkpoint = read_checkpoint(ckpt)
            except ValueError as err:
                raise UsageError(str(err)) from None
            if self.resume_dir is not None:  # --resume read the run's own config.yaml: it was edited
                fix = (f"undo the edit of {str(self.resume_dir / 'config.yaml')!r}, or train a new run with "
                       f"it: accrot fit --config {self.resume_dir / 'config.yaml'}")
            else:
                fix = "resume a run with `accrot fit --resume RUN_DIR`, which uses its own config"
            reason = check_fits(checkpoint, cfg["model"], ckpt, advice=fix)  # another scheme or shape: specific
            if reason:
                raise UsageError(reason)
            if self.subcommand == "fit":  # Lightning restores the whole run: the config must be the run's
                differ = settings_differences(checkpoint, dict(cfg["model"].hparams),
                                              dict(getattr(cfg["data"], "hparams", {}) or {}))
                if differ:
                    raise UsageError(f"checkpoint {str(ckpt)!r} was trained with other settings than the config: "
                                     f"{', '.join(differ[:4])}{' ...' if len(differ) > 4 else ''}; {fix} (a resumed "
                                     "run may change trainer.max_steps, evaluation and logging only)")
            if io is not None:
                io.preload(ckpt, checkpoint)  # Lightning's restore takes it from memory: read once
            return checkpoint

        def _loggers(self, cfg, keep_rows: int | None = None, wandb_id: str | None = None) -> list:
            global _LAST_RUN_DIR
            name = self.run_name(cfg)
            if self.resume_dir is not None:  # the same folder: metrics appended after the checkpoint's rows
                run = self.resume_dir
                csv = ResumableCSVLogger(save_dir=str(run.parent.parent), name=run.parent.name, version=run.name,
                                         keep_rows=keep_rows if keep_rows is not None else 10**12)
            else:
                csv = ResumableCSVLogger(save_dir=cfg.get("root", "runs"), name=name)
            self.run_dir = _LAST_RUN_DIR = Path(csv.log_dir)
            from lightning.pytorch.utilities import rank_zero_only

            if rank_zero_only.rank == 0:  # other ranks of a DDP launch: rank 0's directory (trainer.log_dir)
                _make_run_dir(self.run_dir)
            loggers = [csv]
            mode = wandb_mode(cfg.get("wandb", "auto"))
            if mode != "disabled" and self.subcommand == "fit":
                from lightning.pytorch.loggers import WandbLogger

                os.environ["WANDB_MODE"] = mode  # WandbLogger(offline=...) would override WANDB_MODE=disabled
                csv.experiment  # noqa: B018 - the CSV writer claims the new run directory before wandb fills it
                resume = {"id": wandb_id, "resume": "allow"} if wandb_id else {}
                loggers.append(WandbLogger(save_dir=str(self.run_dir), name=f"{name}/{self.run_dir.name}",
                                           project=os.environ.get("WANDB_PROJECT", "accrot"), **resume))
            return loggers

        def before_fit(self) -> None:
            # cut the evaluation blocks before any training, so a length the stream cannot fill fails fast
            for cb in self.trainer.callbacks:
                if isinstance(cb, ExtrapolationCallback):
                    cb.prepare(self.datamodule)
            if self.launch_argv is not None:  # Lightning's DDP launcher re-runs sys.argv once per extra device
                sys.argv = list(self.launch_argv)

    AccrotCLI.save_config_class = AccrotSaveConfig
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
    """Let ``--config tiny`` name a shipped config (``accrot/configs/tiny.yaml``); every config file is read and
    checked first (:func:`check_config_file`), so a broken one is one line naming the file."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg in ("-c", "--config") and i + 1 < len(out):
            out[i + 1] = str(check_config_file(config_path(out[i + 1])))
        elif arg.startswith("--config="):
            out[i] = "--config=" + str(check_config_file(config_path(arg.split("=", 1)[1])))
    return out


_SECTIONS = ("trainer", "model", "extrapolation")  # sections that hold options (data may name a class alone)


def check_config_file(path: Path) -> Path:
    """A config file that exists must be UTF-8 YAML holding a mapping whose option sections are mappings; a
    one-line UsageError naming the file otherwise (the parser would raise a decode error, a type error, or name
    ``<unicode string>``). A missing file is left to the parser, which names it."""
    import yaml

    if not path.is_file():
        return path
    where = f"config {str(path)!r}"
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{where} is not UTF-8 text (a binary file?); pass a YAML config such as "
                         "accrot/configs/tiny.yaml") from None
    except OSError as err:
        raise UsageError(f"{where} cannot be read ({err.strerror})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UsageError(f"{where} is not valid YAML: {problem}{at}") from None
    if doc is None:
        raise UsageError(f"{where} is empty; a config holds trainer:, model: and data: sections "
                         "(see accrot/configs/tiny.yaml)")
    if not isinstance(doc, dict):
        raise UsageError(f"{where} holds a {type(doc).__name__} ({str(doc)[:40]!r}), not a mapping of sections "
                         "(trainer:, model:, data:)")
    for section in _SECTIONS:
        value = doc.get(section)
        if value is not None and not isinstance(value, dict):
            raise UsageError(f"{where}: {section}: {str(value)[:40]!r} is not valid; {section} holds its options "
                             f"as a mapping ({section}: {{key: value, ...}})")
    return path


def resume_args(args: list[str]) -> tuple[list[str], Path | None]:
    """``fit --resume RUN_DIR [overrides]`` → ``fit --config RUN_DIR/config.yaml [overrides] --ckpt_path
    RUN_DIR/checkpoints/last.ckpt`` and the run directory; other arguments pass through unchanged."""
    from accrot.resume import last_checkpoint

    where = [i for i, a in enumerate(args) if a == "--resume" or a.startswith("--resume=")]
    if not where:
        return args, None
    i = where[-1]
    if args[i] == "--resume":
        if i + 1 >= len(args):
            raise UsageError("--resume needs a run directory (runs/<name>/version_N)")
        value, rest = args[i + 1], args[:i] + args[i + 2 :]
    else:
        value, rest = args[i].split("=", 1)[1], args[:i] + args[i + 1 :]
    if not rest or rest[0] != "fit":
        raise UsageError("--resume is an option of accrot fit: accrot fit --resume RUN_DIR")
    clash = [a for a in rest if a in ("-c", "--config", "--ckpt_path", "--resume")
             or a.startswith(("--config=", "--ckpt_path=", "--resume="))]
    if clash:
        raise UsageError(f"--resume takes the run's own config.yaml and last checkpoint; drop {clash[0].split('=')[0]} "
                         "(overrides such as --trainer.max_steps=N are fine)")
    run = Path(value)
    if not run.is_dir():
        raise UsageError(f"--resume {value!r} is not a directory; pass a run directory such as runs/rope-none/version_0")
    if not (run / "config.yaml").is_file():
        raise UsageError(f"--resume {value!r} has no config.yaml; it is not an accrot run directory")
    ckpt = last_checkpoint(run)
    if not ckpt.is_file():
        raise UsageError(f"--resume {value!r} has no checkpoints/last.ckpt (the run stopped before its first "
                         "checkpoint); start it again")
    return ["fit", "--config", str(run / "config.yaml"), *rest[1:], f"--ckpt_path={ckpt}"], run.resolve()


def run_lightning(args: list[str]):
    """Run one LightningCLI subcommand in-process; returns the CLI object (its ``trainer`` and ``run_dir``)."""
    global _LAST_RUN_DIR
    AccrotCLI, LitLM, TokenStreamDataModule = _make_cli_class()
    _CREATED.clear()
    _LAST_RUN_DIR = None
    AccrotCLI.launch_argv = [sys.argv[0], *args]
    args, AccrotCLI.resume_dir = resume_args(list(args))
    args = resolve_config_args(args)
    argv0, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when it sees both args= and sys.argv
    try:
        with hold_startup_logs():  # an error before training is the only line printed
            cli = AccrotCLI(
                LitLM,
                TokenStreamDataModule,
                subclass_mode_data=True,
                args=args,
                parser_kwargs={"exit_on_error": False},
                save_config_callback=AccrotCLI.save_config_class,
                save_config_kwargs={"overwrite": True},
                auto_configure_optimizers=False,
            )
    except BaseException as err:
        # nothing half-written: a run that failed before its first checkpoint leaves no directory behind;
        # a diverged run keeps its directory (its metrics show how it diverged)
        if not isinstance(err, FloatingPointError):
            for created in reversed(_CREATED):
                _remove_if_incomplete(created)
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


_CREATED: list[Path] = []  # directories this process's current command created (outermost first)
_LAST_RUN_DIR: Path | None = None  # the run directory of the current command (for the divergence message)


def _make_run_dir(run_dir: Path) -> None:
    """Create the run directory now (recording what this command created) and prove it writable, so an
    unwritable or full output folder is one line before anything runs."""
    missing, p = [], Path(run_dir).absolute()
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    _CREATED.extend(reversed(missing))
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        _write_probe(Path(run_dir) / f".accrot-write-probe-{os.getpid()}")
    except OSError as err:
        raise UsageError(f"cannot write the run directory {str(run_dir)!r} ({err.strerror or err}); pass a writable "
                         "--root with free space") from None


def _write_probe(path: Path) -> None:
    """Write and fsync 4 KiB (an unwritable or full folder fails here), then remove it."""
    try:
        with open(path, "wb") as fh:
            fh.write(b"\0" * 4096)
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        if path.exists():
            path.unlink()


def _remove_if_incomplete(path: Path) -> None:
    """Remove a run directory this command created unless it holds a checkpoint; a parent folder it
    created only if that is empty (another process may be writing a run of its own beside)."""
    path = Path(path)
    if not path.exists():
        return
    if _LAST_RUN_DIR is not None and path.resolve() == Path(_LAST_RUN_DIR).resolve():
        if not any(path.glob("checkpoints/*.ckpt")):
            shutil.rmtree(path, ignore_errors=True)
        return
    try:
        path.rmdir()
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------------
COMMANDS = {"diagnose": "accrot.diagnostics:diagnose_main", "eval": "accrot.cli:eval_main", "demo": "accrot.demo:main", "bench": "accrot.bench:main",
            "sweep": "accrot.sweep:main", "report": "accrot.report:main", "ablation": "accrot.ablation:main", "slurm": "accrot.slurm:main"}


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
    return path, run_dir, check_config_file(cfg)


def load_checkpoint(path: str | Path):
    """``(LitLM, checkpoint dict)`` from an accrot checkpoint, or a one-line UsageError (corrupt, not accrot's,
    or weights that do not fit the scheme it names)."""

    from accrot.lit import LitLM
    from accrot.resume import read_checkpoint

    try:
        state = read_checkpoint(path)
    except ValueError as err:
        raise UsageError(str(err)) from None
    try:
        # LightningCLI adds bookkeeping keys (``_instantiator``, ``_class_path``) beside the init arguments
        hparams = {k: v for k, v in state["hyper_parameters"].items() if not k.startswith("_")}
        model = LitLM(**hparams)
        model.load_state_dict(state["state_dict"], strict=True)
    except (TypeError, RuntimeError, ValueError) as err:
        raise UsageError(f"checkpoint {str(path)!r} does not match the model it describes: {one_line(str(err))[:200]}") from err
    return model, state


def _check_eval_config(ckpt: Path, state: dict, config: Path, dm) -> None:
    """``eval --config``: the model is the checkpoint's own, so a config whose model section (or training length,
    or vocabulary) says otherwise is refused, naming the keys, rather than ignored. Other data is fine."""
    import yaml

    from accrot.resume import settings_differences

    given = (yaml.safe_load(config.read_text()) or {}).get("model") or {}
    saved = dict(state.get("hyper_parameters") or {})
    wanted = {k: v for k, v in given.items() if k != "scheme" and k in saved}
    scheme = {**(saved.get("scheme") or {}), **(given.get("scheme") or {})}
    if (given.get("scheme") or {}).get("seed", 0) is None:  # "follow the run's seed": the saved value stands
        scheme["seed"] = (saved.get("scheme") or {}).get("seed")
    differ = settings_differences(state, {**saved, **wanted, "scheme": scheme}, dict(dm.hparams),
                                  data_keys=frozenset({"seq_len"}))
    vocab = getattr(dm, "vocab_size", None)
    if vocab is not None and saved.get("vocab_size") is not None and int(vocab) > int(saved["vocab_size"]):
        differ.append(f"data vocabulary {vocab} tokens (the model has {saved['vocab_size']})")
    if differ:
        raise UsageError(f"--config {str(config)!r} describes another model than checkpoint {str(ckpt)!r}: "
                         f"{', '.join(differ[:4])}{' ...' if len(differ) > 4 else ''}; evaluate with the run's own "
                         "config.yaml (the default), or a config that changes only the data")


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
    if args.config:  # another config than the run's own: it may name other data, never another model
        _check_eval_config(ckpt, state, Path(args.config), dm)
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


def _check_environment() -> None:
    """Environment switches fail before any work, like a bad option."""
    from accrot.ops import cpu_kernels

    try:
        cpu_kernels.mode()
    except ValueError as err:
        raise UsageError(str(err)) from None


LIGHTNING_COMMANDS = {"fit": "train a model (a LightningCLI subcommand: --config, dotted overrides, --resume RUN_DIR)",
                      "validate": "validate a checkpoint on the validation split (LightningCLI)",
                      "test": "test a checkpoint (LightningCLI)"}
COMMAND_HELP = {"eval": "evaluate a checkpoint at many lengths (JSON + PNG)",
                "diagnose": "the theory diagnostics of a checkpoint (coherence, windows, far mass, ...)",
                "demo": "train the tiny model under several schemes and compare their extrapolation",
                "bench": "side-by-side timing ratios of the kernels and the pipeline",
                "sweep": "an Optuna study from a sweep spec (workers, storages, resume)",
                "report": "the table and figures of a finished sweep",
                "ablation": "the paper's ablation in one command: every variant, both data sets, the claims",
                "slurm": "submit accrot fit or a sweep to SLURM"}


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
    try:
        _check_environment()
        if argv and argv[0] in COMMANDS:
            import importlib

            module, _, func = COMMANDS[argv[0]].partition(":")
            return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
        run_lightning(argv)
        return 0
    except FloatingPointError as err:  # a diverged run: the input was fine, the run failed
        kept = f"; its run directory {str(_LAST_RUN_DIR)!r} is kept" if _LAST_RUN_DIR and _LAST_RUN_DIR.exists() else ""
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
        if type(err).__name__ == "SIGTERMException":  # callbacks.preemption checkpointed it: not a success
            run = str(_LAST_RUN_DIR) if _LAST_RUN_DIR else "RUN_DIR"
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

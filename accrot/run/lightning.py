"""The Lightning run: accrot's LightningCLI (the run layout ``<root>/<name>/version_N/``, resumable loggers,
checkpoints checked against the config, run records, pre-emption) and :func:`run_lightning`, which runs one
``accrot fit`` in-process.

A resumed run ends with exactly the metrics of an uninterrupted one (:mod:`accrot.resume`); a run that fails before
its first checkpoint leaves no directory behind (:mod:`accrot.run.rundir`).
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse import ArgumentError
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from accrot import phases
from accrot.errors import BadInput, ConfigError, UsageError, one_line
from accrot.lit import LitLM
from accrot.logs import WANDB_MODES, hold_startup_logs
from accrot.options import check, choice, option, read_path, text, write_dir
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
from accrot.run.args import RESUME, data_module_class, resolve_config_args, resume_args, usable_cores
from accrot.run.launch import check_launch
from accrot.run.rundir import RunDirs, check_run_name, default_run_name
from callbacks.checkpoint import make_resumable
from callbacks.extrapolation import ExtrapolationCallback
from callbacks.preemption import Preemption
from callbacks.progress import ProgressBar
from callbacks.run_record import RunRecord
from data_modules import TokenStreamDataModule

_log = logging.getLogger(__name__)  # accrot's warnings: held with Lightning's start-up lines (accrot.logs)


class AccrotSaveConfig(SaveConfigCallback):
    """The saved ``config.yaml`` re-runs the run from scratch: it never names a checkpoint to start from
    (``run.json`` records the one a run started, resumed or took its weights from)."""

    def __init__(self, parser, config, *args, **kwargs) -> None:
        config = config.clone()
        for key in ("ckpt_path", "resume", "init_from"):
            if key in config:
                config[key] = None
        super().__init__(parser, config, *args, **kwargs)

class AccrotCLI(LightningCLI):
    """LightningCLI with accrot's run layout: ``<root>/<name>/version_N/`` holds everything of a run.

    ``resume_dir`` (set by :func:`run_lightning` for ``--resume``) makes the loggers reopen that run
    directory instead of opening a new version; ``resume_overrides``: the model and data flags typed beside
    ``--resume`` (a refusal names them). ``console_log``: the command is a user's ``accrot fit``: it prints its run
    directory first and last, and Lightning's own lines go to the run's ``console.log``."""

    def __init__(self, *args: Any, resume_dir: Path | None = None, launch_argv: list[str] | None = None,
                 dirs: RunDirs | None = None, resume_overrides: list[str] | None = None, console_log: bool = False,
                 **kwargs: Any) -> None:
        self.resume_dir = resume_dir
        self.resume_overrides = list(resume_overrides or [])
        self.console_log = console_log
        self.launch_argv = launch_argv  # the command as typed (``trainer.devices>1`` re-runs it per rank)
        self.dirs = dirs if dirs is not None else RunDirs()
        kwargs.setdefault("save_config_callback", AccrotSaveConfig)
        super().__init__(*args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """``fit`` alone: a checkpoint is scored by ``accrot eval`` (the data modules have no test split, and a
        validation pass alone would leave a run directory with no result)."""
        return {"fit": LightningCLI.subcommands()["fit"]}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # accrot's own options of fit, declared of their kinds and checked with the rest (accrot.options) in
        # before_instantiate_classes, once LightningCLI has read the config files and the command line
        option(parser, "--name", kind=text("a run name"), type=str | None, default=None,
                            help="run name, a folder inside --root (default: the scheme's cell, "
                                 "rotation[-increments]-far_mass[-values][-gate][-layers_...], e.g. accum-learned-none)")
        option(parser, "--root", kind=write_dir("a folder for the run directories"), type=str, default="runs",
               help="folder that holds the run directories")
        option(parser, "--wandb", kind=choice(*WANDB_MODES), type=str, default="auto",
                            help="auto (online if logged in, else offline; disabled where wandb is not installed), online, "
                                 "offline or disabled")
        option(parser, "--resume", kind=RESUME, type=str | None, default=None,
                            help="fit only: RUN_DIR (runs/<name>/version_N) to continue in place from its "
                                 "checkpoints/last.ckpt, with its own config.yaml (overrides allowed)")
        option(parser, "--init_from", kind=read_path("a checkpoint (.ckpt) or its run directory"), type=str | None,
               default=None,
                            help="fit only: CKPT (or a run directory: its checkpoints/last.ckpt) whose weights start a "
                                 "new run (a fresh optimiser, schedule and step count; run.json records it as init_from)")
        parser.add_lightning_class_args(ExtrapolationCallback, "extrapolation")
        # the vocabulary is the data's (bytes: 256; a synthetic task or HF tokenizer: its own size)
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        try:
            super().parse_arguments(parser, args)
            cfg = self.config.get(self.config.get("subcommand") or "fit", self.config)
            check_seed(cfg.get("seed_everything"))  # LightningCLI seeds before any later hook: checked here
        except ArgumentError as err:
            # an unknown flag, or an unknown key inside a config file (jsonargparse: "does not accept")
            bad_class = re.search(r'Parser key "data".*?Problem with given class_path \'([^\']+)\'', str(err), re.S)
            unknown = (re.search(r"unrecognized arguments: --?([\w.]+)", str(err))
                       or re.search(r"does not accept option '([\w.]+)'", str(err))
                       # jsonargparse >= 4.5x inside a class's own arguments: "Option 'x' is not accepted"
                       or re.search(r'Parser key "(\w+)".*?Option \'(\w+)\' is not accepted', str(err), re.S))
            if unknown is not None and unknown.re.groups == 2:  # name the class's own arguments as the close matches
                key = f"{unknown.group(1)}.init_args.{unknown.group(2)}"
                raise UsageError(self._unknown_init_arg_message(key, bad_class.group(1) if bad_class else None)) \
                    from err
            if bad_class and not unknown:  # a misspelt data module: one line with the close match
                data_module_class(bad_class.group(1), "data")
            if not unknown:
                raise
            raise UsageError(self._unknown_key_message(parser, unknown.group(1))) from err

    @staticmethod
    def _unknown_init_arg_message(key: str, class_path: str | None) -> str:
        """An argument the data module's class does not take: the close matches among the ones it does."""
        import inspect

        known: set[str] = set()
        if class_path:
            cls = data_module_class(class_path, "data")
            for klass in cls.__mro__:
                init = klass.__dict__.get("__init__")
                if init is not None:
                    known |= {n for n, p in inspect.signature(init).parameters.items()
                              if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        prefix, _, name = key.rpartition(".")
        close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
        if close:
            return f"unknown key {key!r}; did you mean {', '.join(f'{prefix}.{c}' for c in close)}?"
        if known:
            return f"unknown key {key!r}; {class_path} takes: {', '.join(sorted(known))}"
        return f"unknown key {key!r}; run with --help for the valid keys"

    @staticmethod
    def _unknown_key_message(parser: LightningArgumentParser, key: str) -> str:
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
        try:
            super().instantiate_classes()
        except BadInput:
            raise
        except (ValueError, MisconfigurationException) as err:
            # a constructor refusing its arguments (a callback's, the Trainer's): bad input, one line
            raise UsageError(one_line(str(err))) from err

    def _subcommand_parser(self):
        """The parser of this subcommand (fit), which holds accrot's own declared options; None if not found."""
        action = getattr(self.parser, "_subcommands_action", None)
        return getattr(action, "_name_parser_map", {}).get(self.subcommand) if action is not None else None

    def before_instantiate_classes(self) -> None:
        cfg = self.config.get(self.subcommand, self.config)
        if cfg.get("wandb") not in WANDB_MODES:  # a config file's wandb: (the command line's is checked below too)
            raise UsageError(f"--wandb={cfg.get('wandb')!r} is not valid; choose one of {', '.join(WANDB_MODES)}")
        scheme = cfg.get("model", {}).get("scheme") if hasattr(cfg.get("model", {}), "get") else None
        if scheme is not None and getattr(scheme, "seed", 0) is None:
            # the scheme's random draws follow the run's seed (resolved by LightningCLI before this hook), so
            # seeds are independent replicates; the config saved with the run records the value
            run_seed = cfg.get("seed_everything")
            scheme.seed = run_seed if isinstance(run_seed, int) and not isinstance(run_seed, bool) else 0
        if cfg.get("name") is not None:  # --name=../../x would write outside --root
            check_run_name(cfg.get("root", "runs"), cfg["name"])
        if self.subcommand == "fit":
            check_training_length(cfg.get("trainer") or {})
            check_trainer_values(cfg.get("trainer") or {})
        check_devices(cfg.get("trainer") or {})
        check_cpu_precision(cfg.get("trainer") or {})
        if cfg.get("resume"):  # run_lightning turns a command-line --resume into --config/--ckpt_path
            raise UsageError(f"resume={cfg.get('resume')!r} in a config file is not valid; pass --resume RUN_DIR "
                             "on the command line of accrot fit")
        parser = self._subcommand_parser()
        if parser is not None:  # fit's own declared options, as every other command's
            check(parser, cfg, self.launch_argv)

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        cfg = self.config_init[self.subcommand]
        trainer_cfg = cfg["trainer"]
        io = self._checkpoint_io(trainer_cfg, kwargs)
        init = self._init_from(cfg)  # before --ckpt_path's checks: giving both is the first thing to say
        checkpoint = self._checkpoint_to_load(cfg, io)
        resumed = self.resume_dir is not None and checkpoint is not None
        record = (checkpoint or {}).get("accrot") or {}
        self._place_run(cfg, trainer_cfg, kwargs, record, resumed)
        if resumed:
            remove_partials(self.resume_dir / "checkpoints")
            rank_zero_info(f"resuming {self.resume_dir} at step {checkpoint.get('global_step')}")
        callbacks = [make_resumable(c) for c in (trainer_cfg.get("callbacks") or [])]
        start = {"ckpt_path": str(cfg.get("ckpt_path")), "step": checkpoint.get("global_step")} if checkpoint else None
        how = (f"resuming at step {checkpoint.get('global_step')}" if resumed else
               f"a new run from the weights of {init['ckpt_path']} (step {init['step']})" if init else
               f"a new run from the training state of {start['ckpt_path']} (step {start['step']})" if start else
               "a new run")
        callbacks.append(RunRecord(resumed=resumed, start=start, init=init,
                                   announce=how if self.console_log and self.subcommand == "fit" else None))
        if not any(isinstance(c, Preemption) for c in callbacks):  # checkpoint + requeue on SIGUSR1/SIGTERM
            callbacks.append(Preemption())
        check_launch(trainer_cfg)  # `srun -n1` with devices=2 would silently train on one rank
        if trainer_cfg.get("enable_progress_bar") is not False:
            if not any(type(c).__name__.endswith("ProgressBar") for c in callbacks):
                callbacks.append(ProgressBar())
        trainer_cfg["callbacks"] = callbacks
        trainer = super().instantiate_trainer(**kwargs)
        check_path_kernel(getattr(self, "model", None), trainer.strategy.root_device)
        self._record_what_runs(trainer)
        if rank_zero_only.rank == 0:  # one line each, held until training starts (accrot.logs)
            for line in start_warnings(getattr(self, "model", None), trainer, cfg.get("data")):
                _log.warning(line)
        return trainer

    def _record_what_runs(self, trainer: L.Trainer) -> None:
        """A setting the trainer resolved to something else than was asked (Lightning's fallback: ``16-mixed`` on a
        CPU trains ``bf16-mixed``) is one warning line, and the saved ``config.yaml`` records what runs (``run.json``
        records it under ``ran``)."""
        from lightning.fabric.connector import _convert_precision_to_unified_args

        trainer_cfg = self.config[self.subcommand]["trainer"]
        asked = trainer_cfg.get("precision")
        ran = str(trainer.precision)
        if asked is None or str(_convert_precision_to_unified_args(asked)) == ran:
            return
        if rank_zero_only.rank == 0:
            _log.warning(f"accrot: warning: trainer.precision={asked!r} is not available on "
                         f"{trainer.strategy.root_device.type}: the run trains in {ran!r}, which its config.yaml and "
                         "run.json record")
        trainer_cfg["precision"] = ran
        for cb in trainer.callbacks:  # the config it saves was copied when the trainer was built
            if isinstance(cb, SaveConfigCallback):
                cb.config["trainer"]["precision"] = ran

    def _init_from(self, cfg) -> dict | None:
        """``--init_from CKPT``: the checkpoint's weights, loaded into the model now; the optimiser, its schedule and
        the step count start fresh (Lightning restores nothing). What ``run.json`` records as ``init_from``."""
        path = cfg.get("init_from")
        if path is None:
            return None
        if self.subcommand != "fit":
            raise UsageError("--init_from is an option of accrot fit")
        if cfg.get("ckpt_path") is not None:
            raise UsageError("--init_from starts a new run from a checkpoint's weights, --ckpt_path continues one from "
                             "its whole training state; give one of them")
        path = checkpoint_file(path, "--init_from")
        try:
            checkpoint = read_checkpoint(path)
        except ValueError as err:
            raise UsageError(str(err).replace("checkpoint ", "--init_from checkpoint ", 1)) from None
        reason = check_fits(checkpoint, self.model, path, advice=(
            "a new run from its weights takes the model of the checkpoint's run: accrot fit --config "
            "RUN_DIR/config.yaml --init_from CKPT (the data, the optimiser and the schedule may change)"))
        if reason:
            raise UsageError(reason)
        self.model.load_state_dict(checkpoint["state_dict"], strict=True)
        source = Path(path).resolve()
        return {"ckpt_path": str(source), "step": checkpoint.get("global_step"),
                "run_dir": str(source.parent.parent) if (source.parent.parent / "config.yaml").is_file() else None}

    @staticmethod
    def _checkpoint_io(trainer_cfg, kwargs) -> AtomicCheckpointIO | None:
        """Atomic checkpoint writes by default (a config that brings its own CheckpointIO keeps it)."""
        plugins = kwargs.get("plugins", trainer_cfg.get("plugins"))
        plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        mine = next((p for p in plugins if isinstance(p, AtomicCheckpointIO)), None)
        if mine is None and not any(isinstance(p, CheckpointIO) for p in plugins):
            mine = AtomicCheckpointIO()
            plugins.append(mine)
        kwargs["plugins"] = plugins
        return mine

    def run_name(self, cfg) -> str:
        return cfg.get("name") or default_run_name(cfg["model"].scheme_config)

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
        cfg["ckpt_path"] = ckpt = checkpoint_file(ckpt, "--ckpt_path")
        try:
            checkpoint = read_checkpoint(ckpt)
        except ValueError as err:
            raise UsageError(str(err)) from None
        fix = self._mismatch_advice()
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
        if self.subcommand == "fit":
            self._check_steps_left(cfg, checkpoint, ckpt)
        if io is not None:
            io.preload(ckpt, checkpoint)  # Lightning's restore takes it from memory: read once
        return checkpoint

    def _mismatch_advice(self) -> str:
        """What to do when the checkpoint a command continues does not fit its config."""
        if self.resume_dir is None:
            return "resume a run with `accrot fit --resume RUN_DIR`, which uses its own config"
        config = self.resume_dir / "config.yaml"
        if self.resume_overrides:  # the flags typed beside --resume change the model or the data
            flags = " ".join(self.resume_overrides)
            return (f"a resumed run keeps its model and data: drop {flags}, or train a new run with "
                    f"{'them' if len(self.resume_overrides) > 1 else 'it'}: accrot fit --config {config} {flags}")
        # --resume read the run's own config.yaml: it was edited
        return f"undo the edit of {str(config)!r}, or train a new run with it: accrot fit --config {config}"

    def _check_steps_left(self, cfg, checkpoint: dict, ckpt: str) -> None:
        """A checkpoint at or past ``trainer.max_steps`` leaves nothing to train: Lightning would restore it, train
        no step and call the run finished (a resume that did nothing). One line instead: how to train longer, or to
        start over from its weights."""
        max_steps, step = cfg["trainer"].get("max_steps"), checkpoint.get("global_step")
        if max_steps is None or max_steps < 0 or step is None or step < max_steps:
            return
        if self.resume_dir is not None:
            raise UsageError(f"run {str(self.resume_dir)!r} is at step {step} and trainer.max_steps={max_steps}: "
                             f"nothing left to train; pass --trainer.max_steps=N with N > {step} to train longer, or "
                             f"start a new run from its weights: accrot fit --config {self.resume_dir / 'config.yaml'} "
                             f"--init_from {ckpt}")
        raise UsageError(f"checkpoint {str(ckpt)!r} is at step {step} and trainer.max_steps={max_steps}: nothing left "
                         f"to train (--ckpt_path continues its training state); start a new run from its weights with "
                         f"--init_from {ckpt}, or train its run longer: accrot fit --resume RUN_DIR "
                         f"--trainer.max_steps=N (N > {step})")

    def _place_run(self, cfg, trainer_cfg, kwargs: dict, record: dict, resumed: bool) -> None:
        """The run directory and accrot's loggers (CSV, wandb) into the Trainer's ``kwargs``; with the loggers off
        (or the user's own), the directory alone."""
        if trainer_cfg.get("logger") in (None, True):
            kwargs["logger"] = self._loggers(cfg, keep_rows=record.get("metrics_rows") if resumed else None,
                                             wandb_id=record.get("wandb_id") if resumed else None)
            if trainer_cfg.get("default_root_dir") is None:
                # fast_dev_run swaps the loggers for a dummy: files still land in the run directory
                kwargs["default_root_dir"] = str(self.run_dir)
        elif self.resume_dir is not None:
            raise UsageError("--resume needs accrot's own loggers; remove trainer.logger from the config")
        elif trainer_cfg.get("default_root_dir") is None:
            # loggers off (or the user's own): the run still gets its own <root>/<name>/version_N, never the
            # current directory, where two runs would overwrite each other's checkpoints
            self.run_dir = self.dirs.run_dir = Path(
                ResumableCSVLogger(save_dir=cfg.get("root", "runs"), name=self.run_name(cfg)).log_dir)
            if rank_zero_only.rank == 0:
                self.dirs.make(self.run_dir)
            kwargs["default_root_dir"] = str(self.run_dir)

    def _loggers(self, cfg, keep_rows: int | None = None, wandb_id: str | None = None) -> list:
        name = self.run_name(cfg)
        if self.resume_dir is not None:  # the same folder: metrics appended after the checkpoint's rows
            run = self.resume_dir
            csv = ResumableCSVLogger(save_dir=str(run.parent.parent), name=run.parent.name, version=run.name,
                                     keep_rows=keep_rows if keep_rows is not None else 10**12)
        else:
            csv = ResumableCSVLogger(save_dir=cfg.get("root", "runs"), name=name)
        self.run_dir = self.dirs.run_dir = Path(csv.log_dir)
        if rank_zero_only.rank == 0:  # other ranks of a DDP launch: rank 0's directory (trainer.log_dir)
            self.dirs.make(self.run_dir, option="--root" if self.resume_dir is None else "--resume")
        loggers = [csv]
        mode = wandb_mode(cfg.get("wandb", "auto"))
        if mode != "disabled" and self.subcommand == "fit":
            import importlib.util

            if importlib.util.find_spec("wandb") is None:  # a minimal install (make wheelhouse HAVE=...)
                raise UsageError(f"--wandb={cfg.get('wandb')!r} (mode {mode}) needs wandb, which is not installed; "
                                 "pip install wandb, or pass --wandb=disabled")
            os.environ["WANDB_MODE"] = mode  # WandbLogger(offline=...) would override WANDB_MODE=disabled
            csv.experiment  # noqa: B018 - the CSV writer claims the new run directory before wandb fills it
            loggers.append(self._wandb(cfg, name, wandb_id))
        return loggers

    def _wandb(self, cfg, name: str, wandb_id: str | None) -> WandbLogger:
        """The run's wandb run. A sweep's trials carry ``group`` = their study and ``job_type`` = their variant (the
        worker sets WANDB_RUN_GROUP and WANDB_JOB_TYPE); every run is tagged with its seed, data and scheme cell
        (plus WANDB_TAGS) and logs the resolved config. WANDB_PROJECT and WANDB_ENTITY are honoured."""
        tags = [f"seed:{cfg.get('seed_everything')}", f"data:{type(cfg['data']).__name__}",
                f"scheme:{cfg['model'].scheme_config.label()}"]
        tags += [t.strip() for t in os.environ.get("WANDB_TAGS", "").split(",") if t.strip()]
        resolved = json.loads(json.dumps(self.config[self.subcommand].clone().as_dict(), default=str))
        resume = {"id": wandb_id, "resume": "allow"} if wandb_id else {}
        if self.console_log:  # a user's fit: wandb's banner and run summary stay in its own logs (RUN/wandb/)
            import wandb

            resume["settings"] = wandb.Settings(silent=True)
        logger = WandbLogger(save_dir=str(self.run_dir), name=f"{name}/{self.run_dir.name}",
                             project=os.environ.get("WANDB_PROJECT", "accrot"), entity=os.environ.get("WANDB_ENTITY"),
                             group=os.environ.get("WANDB_RUN_GROUP"), job_type=os.environ.get("WANDB_JOB_TYPE"),
                             tags=tags, config=resolved, **resume)
        if logger._wandb_init.get("anonymous") is None:  # Lightning passes None, which wandb warns is deprecated
            logger._wandb_init.pop("anonymous", None)
        return logger

    def after_fit(self) -> None:
        """The run directory again, as the command's last line (a user's ``accrot fit``)."""
        if self.console_log and self.trainer.is_global_zero:
            where = getattr(self, "run_dir", None) or self.trainer.default_root_dir
            print(f"run directory: {where} (finished at step {self.trainer.global_step})", flush=True)

    def before_fit(self) -> None:
        # cut the evaluation blocks before any training, so a length the stream cannot fill fails fast
        for cb in self.trainer.callbacks:
            if isinstance(cb, ExtrapolationCallback):
                cb.prepare(self.datamodule)
        if self.launch_argv is not None:  # Lightning's DDP launcher re-runs sys.argv once per extra device
            sys.argv = list(self.launch_argv)


def checkpoint_file(path: str, option: str) -> str:
    """A run directory stands for its newest checkpoint, ``checkpoints/last.ckpt`` (as ``accrot eval --ckpt`` takes
    it); a one-line UsageError for a directory without one."""
    folder = Path(path)
    if not folder.is_dir():
        return str(path)
    found = last_checkpoint(folder)
    if not found.is_file():
        raise UsageError(f"{option} {str(path)!r} is a directory without checkpoints/last.ckpt; pass a run directory "
                         "that holds one, or the path of a .ckpt file")
    return str(found)


# every Trainer setting that can leave a fit with no training step at all: a run "finished at step 0"
NO_STEP = {"max_steps": "a positive trainer.max_steps (or -1 / null for no limit)",
           "max_epochs": "a positive trainer.max_epochs (or -1 / null for no limit)",
           "limit_train_batches": "a positive trainer.limit_train_batches (a count, or a fraction in (0, 1])",
           "max_time": "a positive trainer.max_time (or null)"}


def check_training_length(trainer_cfg) -> None:
    """A fit that would train no step (any :data:`NO_STEP` setting at 0: ``max_steps=0``, ``max_epochs=0``,
    ``limit_train_batches=0`` or ``0.0``, a zero ``max_time``) is refused before its run directory exists: Lightning
    would record a run "finished at step 0" with nothing in it."""
    for key, valid in NO_STEP.items():
        value = trainer_cfg.get(key)
        # 0 only: a negative value is Lightning's to refuse (-1 is "no limit" for max_steps and max_epochs)
        zero = value == "00:00:00:00" or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                          and value == 0)
        if isinstance(value, dict):
            zero = not any(value.values())
        if zero:
            raise UsageError(f"trainer.{key}={value!r} is not valid: the run would train no step; give {valid}")


def check_trainer_values(trainer_cfg) -> None:
    """Trainer settings that Lightning accepts and then fails on mid-run (a division by zero at the first validation,
    numpy's seed bounds) or that silently invert training (a negative clipping norm flips every gradient): one line
    before the run directory exists."""
    def number(key):
        value = trainer_cfg.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    for key, valid in (("val_check_interval", "a positive number of steps or a fraction in (0, 1]"),
                       ("accumulate_grad_batches", "a positive whole number"),
                       ("log_every_n_steps", "a positive whole number")):
        value = number(key)
        if value is not None and value <= 0:
            raise UsageError(f"trainer.{key}={value!r} is not valid; give {valid}")
    clip = number("gradient_clip_val")
    if clip is not None and clip < 0:
        raise UsageError(f"trainer.gradient_clip_val={clip!r} is not valid; give a norm >= 0 (0 or null: no clipping)")


def check_seed(seed) -> None:
    """numpy's seed bounds, which Lightning's seeding would hit with a traceback."""
    if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed <= 2**32 - 1:
        raise UsageError(f"seed_everything={seed!r} is not valid; give a whole number from 0 to {2**32 - 1}")


def check_devices(trainer_cfg) -> None:
    """``trainer.devices`` of no device at all (0, "0", []): one line naming the option, not Lightning's
    ``Trainer(devices='0')`` text."""
    devices = trainer_cfg.get("devices")
    if devices in (0, "0", []) and not isinstance(devices, bool):
        raise UsageError(f"trainer.devices={devices!r} is not valid; give a number of devices >= 1, a list of device "
                         "indices ([0, 1]) or auto")


def trains_on_cpu(trainer_cfg) -> bool:
    """Whether ``trainer.accelerator`` resolves to the CPU: ``cpu``, or ``auto`` (the default) without CUDA or MPS."""
    import torch

    accelerator = trainer_cfg.get("accelerator")
    if accelerator is None or str(accelerator) == "auto":
        mps = getattr(torch.backends, "mps", None)
        return not torch.cuda.is_available() and not (mps is not None and mps.is_available())
    return str(accelerator) == "cpu"


def check_cpu_precision(trainer_cfg) -> None:
    """A bfloat16 precision (``bf16-mixed``, ``bf16-true``, and ``16-mixed``, which Lightning turns into
    ``bf16-mixed`` on a CPU) on a CPU without hardware bf16 is refused in one line before anything is created:
    there it would train several times slower than the float32 default, silently."""
    from lightning.fabric.connector import _convert_precision_to_unified_args

    from accrot.runtime import cpu_bf16_problem

    asked = trainer_cfg.get("precision")
    if asked is None or not trains_on_cpu(trainer_cfg):
        return
    try:
        unified = str(_convert_precision_to_unified_args(asked))
    except ValueError:  # not a precision at all: Lightning's own message names the valid ones
        return
    on_cpu = "bf16-mixed" if unified == "16-mixed" else unified  # Lightning's CPU fallback
    problem = cpu_bf16_problem(on_cpu)
    if problem:
        shown = f" (on a CPU: {on_cpu})" if on_cpu != unified else ""
        raise UsageError(f"trainer.precision={asked!r}{shown} is not valid on this CPU: {problem}")


def start_warnings(model, trainer, data) -> list[str]:
    """One line for each setting that will not do what it says: more CPU processes than cores (each rank also
    trains its own batch), and scheme options the chosen scheme never reads."""
    from accrot.position import ignored

    lines = []
    cores, ranks = usable_cores(), trainer.num_devices
    if trainer.strategy.root_device.type == "cpu" and ranks > cores:
        batch = (getattr(data, "hparams", None) or {}).get("batch_size")
        each = f" = {ranks * batch}" if isinstance(batch, int) else ""
        lines.append(f"accrot: warning: trainer.devices={ranks} starts {ranks} CPU processes on {cores} core"
                     f"{'s' if cores != 1 else ''}: they share the cores, and the global batch is {ranks} x "
                     f"data.batch_size{each}; use trainer.devices <= {cores} on this machine")
    scheme = getattr(model, "scheme_config", None)
    for name, reader in ignored(scheme) if scheme is not None else []:
        lines.append(f"accrot: warning: model.scheme.{name}={getattr(scheme, name)!r} is ignored by "
                     f"{scheme.label()} (only {reader} reads it)")
    return lines


def check_path_kernel(model, device) -> None:
    """``model.scheme.path_kernel=fla`` where it cannot run (no CUDA device, no Triton or fla, a head dim fla lacks):
    one line before any training, instead of an error at the first forward."""
    scheme = getattr(model, "scheme_config", None)
    from accrot.position.declared import reads

    if scheme is None or "path_kernel" not in reads(scheme) or scheme.path_kernel != "fla":
        return
    from accrot.ops.path import FLA_HEAD_DIMS, fla_problem

    problem = fla_problem(device)
    if problem is None:
        head_dim = model.model_config.d_model // model.model_config.n_heads
        if head_dim not in FLA_HEAD_DIMS:
            problem = (f"kernel='fla' supports head dims {', '.join(map(str, FLA_HEAD_DIMS))} (got {head_dim} = "
                       f"model.d_model / model.n_heads); change them or use kernel='chunked'")
    if problem is not None:
        raise ConfigError(problem.replace("kernel=", "model.scheme.path_kernel="))


def wandb_mode(requested: str) -> str:
    """``auto`` honours WANDB_MODE, else goes online only when an API key is configured; where wandb is not
    installed (a node's minimal install, make wheelhouse HAVE=...) it is off."""
    if requested != "auto":
        return requested
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        return "disabled"
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


def run_lightning(args: list[str], console_log: bool = False):
    """Run ``accrot fit`` in-process; returns the CLI object (its ``trainer`` and ``run_dir``).
    ``console_log``: a user's own command (``accrot fit`` in a shell): the run directory is printed first and last,
    and Lightning's lines go to its ``console.log`` (a demo or sweep trial keeps its caller's output)."""
    phases.start_run().enter("setup")  # where this run's wall time goes (run.json's "timing")
    dirs = RunDirs()
    launch_argv = [sys.argv[0], *args]
    typed = list(args)
    args, resume_dir = resume_args(list(args))
    overrides = _model_and_data_flags(typed) if resume_dir is not None else []  # what a refused resume names
    argv0, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when it sees both args= and sys.argv
    try:
        if resume_dir is not None:  # held before its config.yaml is read: the run's writer may be rewriting it
            dirs.hold(resume_dir, option="--resume", what="the run directory")
        args = resolve_config_args(args)
        with hold_startup_logs():  # an error before training is the only line printed
            cli = AccrotCLI(
                LitLM,
                TokenStreamDataModule,
                subclass_mode_data=True,
                args=args,
                parser_kwargs={"exit_on_error": False},
                save_config_kwargs={"overwrite": True},
                auto_configure_optimizers=False,
                resume_dir=resume_dir,
                launch_argv=launch_argv,
                dirs=dirs,
                resume_overrides=overrides,
                console_log=console_log,
            )
    except BaseException as err:
        # nothing half-written: a run that failed before its first checkpoint leaves no directory behind;
        # a diverged run keeps its directory (its metrics show how it diverged)
        if not isinstance(err, FloatingPointError):
            dirs.remove_incomplete()
        err.run_dir = dirs.run_dir  # what `accrot` names in its one line (a diverged or stopped run's directory)
        raise
    finally:
        sys.argv = argv0
        finish_wandb()
        dirs.release()  # the run directory's lock: another command may write it now
    return cli


def _model_and_data_flags(args: list[str]) -> list[str]:
    """The ``--model.*`` and ``--data*`` flags of a command line, each with its value (``--k=v`` or ``--k v``);
    ``num_workers``, which a resumed run may change, left out."""
    out = []
    for i, arg in enumerate(args):
        if arg.startswith(("--model", "--data")) and "num_workers" not in arg:
            given = "=" in arg or i + 1 >= len(args) or args[i + 1].startswith("--")
            out.append(arg if given else f"{arg}={args[i + 1]}")
    return out


def finish_wandb() -> None:
    """Close this run's wandb run: WandbLogger would otherwise reuse it for the next run in this process
    (the demo and sweep workers train several runs in one process)."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()

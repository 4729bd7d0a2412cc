"""The Lightning run: accrot's LightningCLI (the run layout ``<root>/<name>/version_N/``, resumable loggers,
checkpoints checked against the config, run records, pre-emption) and :func:`run_lightning`, which runs one
``accrot fit|validate|test`` in-process.

A resumed run ends with exactly the metrics of an uninterrupted one (:mod:`accrot.resume`); a run that fails before
its first checkpoint leaves no directory behind (:mod:`accrot.run.rundir`).
"""

from __future__ import annotations

import difflib
import json
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
from accrot.logs import hold_startup_logs
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
from accrot.run.args import resolve_config_args, resume_args
from accrot.run.launch import check_launch
from accrot.run.rundir import RunDirs
from callbacks.checkpoint import make_resumable
from callbacks.extrapolation import ExtrapolationCallback
from callbacks.preemption import Preemption
from callbacks.progress import ProgressBar
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

    def __init__(self, *args: Any, resume_dir: Path | None = None, launch_argv: list[str] | None = None,
                 dirs: RunDirs | None = None, **kwargs: Any) -> None:
        self.resume_dir = resume_dir
        self.launch_argv = launch_argv  # the command as typed (``trainer.devices>1`` re-runs it per rank)
        self.dirs = dirs if dirs is not None else RunDirs()
        kwargs.setdefault("save_config_callback", AccrotSaveConfig)
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--name", type=str | None, default=None,
                            help="run name (default: rotation-far_mass[-values][-gate][-layers_...] of the scheme)")
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
            if not any(type(c).__name__.endswith("ProgressBar") for c in callbacks):
                callbacks.append(ProgressBar())
        trainer_cfg["callbacks"] = callbacks
        trainer = super().instantiate_trainer(**kwargs)
        check_path_kernel(getattr(self, "model", None), trainer.strategy.root_device)
        return trainer

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
        scheme = cfg["model"].scheme_config
        parts = [scheme.rotation, scheme.far_mass] + (["values"] if scheme.rotate_values else [])
        parts += {"none": [], "elementwise": ["gate"], "headwise": ["headgate"]}[scheme.output_gate]
        parts += ["layers_" + "_".join(scheme.layer_pattern)] if scheme.layer_pattern else []
        return cfg.get("name") or "-".join(parts)

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
        name = self.run_name(cfg)
        if self.resume_dir is not None:  # the same folder: metrics appended after the checkpoint's rows
            run = self.resume_dir
            csv = ResumableCSVLogger(save_dir=str(run.parent.parent), name=run.parent.name, version=run.name,
                                     keep_rows=keep_rows if keep_rows is not None else 10**12)
        else:
            csv = ResumableCSVLogger(save_dir=cfg.get("root", "runs"), name=name)
        self.run_dir = self.dirs.run_dir = Path(csv.log_dir)
        if rank_zero_only.rank == 0:  # other ranks of a DDP launch: rank 0's directory (trainer.log_dir)
            self.dirs.make(self.run_dir)
        loggers = [csv]
        mode = wandb_mode(cfg.get("wandb", "auto"))
        if mode != "disabled" and self.subcommand == "fit":
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
        return WandbLogger(save_dir=str(self.run_dir), name=f"{name}/{self.run_dir.name}",
                           project=os.environ.get("WANDB_PROJECT", "accrot"), entity=os.environ.get("WANDB_ENTITY"),
                           group=os.environ.get("WANDB_RUN_GROUP"), job_type=os.environ.get("WANDB_JOB_TYPE"),
                           tags=tags, config=resolved, **resume)

    def before_fit(self) -> None:
        # cut the evaluation blocks before any training, so a length the stream cannot fill fails fast
        for cb in self.trainer.callbacks:
            if isinstance(cb, ExtrapolationCallback):
                cb.prepare(self.datamodule)
        if self.launch_argv is not None:  # Lightning's DDP launcher re-runs sys.argv once per extra device
            sys.argv = list(self.launch_argv)


def check_path_kernel(model, device) -> None:
    """``model.scheme.path_kernel=fla`` where it cannot run (no CUDA device, no Triton or fla, a head dim fla lacks):
    one line before any training, instead of an error at the first forward."""
    scheme = getattr(model, "scheme_config", None)
    if scheme is None or scheme.rotation != "path" or scheme.path_kernel != "fla":
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


def run_lightning(args: list[str]):
    """Run one LightningCLI subcommand in-process; returns the CLI object (its ``trainer`` and ``run_dir``)."""
    phases.start_run().enter("setup")  # where this run's wall time goes (run.json's "timing")
    dirs = RunDirs()
    launch_argv = [sys.argv[0], *args]
    args, resume_dir = resume_args(list(args))
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
                save_config_kwargs={"overwrite": True},
                auto_configure_optimizers=False,
                resume_dir=resume_dir,
                launch_argv=launch_argv,
                dirs=dirs,
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
    return cli


def finish_wandb() -> None:
    """Close this run's wandb run: WandbLogger would otherwise reuse it for the next run in this process
    (the demo and sweep workers train several runs in one process)."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()

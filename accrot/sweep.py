"""``accrot sweep SPEC``: Optuna studies over accrot runs (DESIGN §6).

A study spec (``sweeps/*.yaml``, schema in README "Sweeps") names a base config, fixed overrides, a search
space over the CLI's dotted keys (categorical / int / float, log scale, conditional on other keys), the
objective(s) read from the extrapolation evaluation (``nll@16x``, ...), sampler, pruner, budget, seeds and
storage. Each trial is one ordinary ``accrot fit`` run, in-process in a worker, with its own run directory.

Processes. The parent validates the spec (every stratum's config is built by the real CLI parser, without
training), creates the studies and the storage schema (so workers never race on creating it), then starts
``--workers`` worker processes on the same storage and watches them. A worker that dies (signal, OOM)
leaves its running trial failed with the reason, retried (same params and seed) up to ``retries`` times,
and is replaced. Workers on other nodes run ``accrot sweep SPEC --worker --storage URL`` against the same
storage. A trial runs on one device of its worker (with several GPUs the parent gives each worker one, round
robin); Lightning cannot re-launch an in-process run per rank, so multi-device trials are rejected here and
belong to an srun launcher (the pruning callback already reports from rank 0 and broadcasts its decision).

Budget. ``trials`` counts configurations per study; each configuration runs once per seed in ``seeds``
(the copies are enqueued with the same params when the configuration is first sampled, so the sampler
never mistakes a seed for a hyperparameter). Each worker takes a storage-wide budget lock (file lock next
to SQLite/journal files, ``pg_advisory_lock`` on PostgreSQL) from the budget check until its trial exists,
so N workers never overshoot the budget. With ``variants`` every variant is its own study
(``<name>/<variant>``) with its own sampler and the same budget, so no variant can be starved.

Storages. SQLite under the run root by default (``<root>/<name>/study.db``, WAL mode, long busy timeout),
``postgresql://`` for many nodes, ``journal:///abs/path.log`` (Optuna's JournalStorage on a
JournalFileBackend) on a shared filesystem. RDB storages use Optuna's heartbeat (``heartbeat_interval``,
``grace_period``) with a retrying stale-trial callback; Optuna 5's JournalStorage has no heartbeat, so
journal workers write a ``heartbeat`` user attribute every interval and fail (and retry) running trials
whose heartbeat is older than the grace period.

References: Akiba et al., "Optuna: A Next-generation Hyperparameter Optimization Framework", KDD 2019.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import io
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from accrot.cli import UsageError, bad_input_message, config_path, one_line
from accrot.report import metric_key, parse_metric

SPEC_DIR = Path(__file__).resolve().parent.parent / "sweeps"
PARAM_TYPES = ("categorical", "int", "float")
SAMPLERS = ("tpe", "random", "grid", "nsga2")
PRUNERS = ("median", "hyperband", "threshold", "none")
WANDB_MODES = ("auto", "online", "offline", "disabled")
# the driver sets these per trial; a spec must not
RESERVED_KEYS = ("config", "root", "name", "seed_everything", "wandb", "print_config", "ckpt_path")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
# user attributes that describe one attempt (a retry starts without them)
_ATTEMPT_ATTRS = ("worker", "run_dir", "metrics", "fail_reason", "pruned_reason", "heartbeat", "step", "train_length",
                  "retry_of", "retry_reason")


# ---------------------------------------------------------------------------------------------------
# spec
# ---------------------------------------------------------------------------------------------------
def _spec_fields(cls) -> list[str]:
    return [f.name for f in fields(cls) if f.init]


def _strict(cls, data: Any, where: str):
    """Build dataclass ``cls`` from a mapping; unknown keys and invalid values name ``where``."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise UsageError(f"{where} must be a mapping, not {type(data).__name__} ({data!r})")
    valid = _spec_fields(cls)
    for key in data:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(f"{where}: unknown key {key!r}; {hint}valid keys: {', '.join(valid)}")
    try:
        return cls(**data)
    except UsageError as err:
        raise UsageError(f"{where}: {err}") from None
    except (TypeError, ValueError) as err:
        raise UsageError(f"{where}: {one_line(str(err))}") from None


def _number(value: Any, name: str) -> float | None:
    """YAML 1.1 reads ``1e-4`` as a string: accept it as a number."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not valid; it must be a number") from None


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


@dataclass
class ParamSpec:
    """One search-space dimension over a dotted CLI key.

    ``when`` makes it conditional: ``{model.scheme.rotation: accum}`` (or a list of allowed values) — the
    parameter is sampled only when every named key has an allowed value (an earlier sampled parameter, or
    the config's value after overrides and variant).
    """

    type: str = "categorical"
    choices: list | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    when: dict | None = None

    def __post_init__(self) -> None:
        if self.type not in PARAM_TYPES:
            raise ValueError(f"type={self.type!r} is not valid; choose one of {', '.join(PARAM_TYPES)}")
        if not isinstance(self.log, bool):
            raise ValueError(f"log={self.log!r} is not valid; use true or false")
        if self.type == "categorical":
            if not isinstance(self.choices, list) or not self.choices:
                raise ValueError("a categorical parameter needs a non-empty list `choices`")
            bad = [c for c in self.choices if not _scalar(c)]
            if bad:
                raise ValueError(f"choice {bad[0]!r} is not valid; choices are numbers, strings, booleans or null")
            if len({json.dumps(c) for c in self.choices}) != len(self.choices):
                raise ValueError(f"choices {self.choices!r} repeat a value")
            extra = [k for k in ("low", "high", "step") if getattr(self, k) is not None] + (["log"] if self.log else [])
            if extra:
                raise ValueError(f"{extra[0]} is for int/float parameters, not categorical ones")
        else:
            if self.choices is not None:
                raise ValueError(f"choices is for categorical parameters; a {self.type} parameter takes low and high")
            self.low, self.high, self.step = (_number(self.low, "low"), _number(self.high, "high"),
                                              _number(self.step, "step"))
            if self.low is None or self.high is None:
                raise ValueError(f"a {self.type} parameter needs low and high")
            if self.type == "int":
                for name in ("low", "high", "step"):
                    value = getattr(self, name)
                    if value is not None:
                        if float(value) != int(value):
                            raise ValueError(f"{name}={value!r} is not valid for an int parameter; use an integer")
                        setattr(self, name, int(value))
            if not self.low <= self.high:
                raise ValueError(f"low={self.low!r} > high={self.high!r}")
            if self.log and self.low <= 0:
                raise ValueError(f"low={self.low!r} is not valid with log: true; it must be > 0")
            if self.step is not None and (self.step <= 0 or self.log):
                raise ValueError(f"step={self.step!r} is not valid; a positive step, and not with log: true")
        if self.when is not None:
            if not isinstance(self.when, Mapping) or not self.when:
                raise ValueError(f"when={self.when!r} is not valid; give a mapping key: value (or key: [values])")
            norm = {}
            for key, allowed in self.when.items():
                allowed = allowed if isinstance(allowed, list) else [allowed]
                if not _DOTTED.match(str(key)) or not all(_scalar(a) for a in allowed):
                    raise ValueError(f"when: {key!r}: {allowed!r} is not valid; use a dotted key and scalar values")
                norm[str(key)] = allowed
            self.when = norm

    def active(self, context: Mapping[str, Any]) -> bool:
        return all(k in context and context[k] in allowed for k, allowed in (self.when or {}).items())

    def suggest(self, trial, name: str) -> Any:
        if self.type == "categorical":
            return trial.suggest_categorical(name, self.choices)
        if self.type == "int":
            return trial.suggest_int(name, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)

    def grid_values(self, name: str) -> list:
        if self.type == "categorical":
            return list(self.choices)
        if self.type == "int" and not self.log:
            return list(range(self.low, self.high + 1, self.step or 1))
        raise ValueError(f"{name}: the grid sampler needs categorical (or int) parameters; give `choices`")


@dataclass
class ObjectiveSpec:
    """``metric`` of the final extrapolation evaluation (``nll@16x``); direction defaults by metric."""

    metric: str = ""
    direction: str | None = None

    def __post_init__(self) -> None:
        field_, mult = parse_metric(self.metric)
        self.metric = metric_key(field_, mult)  # canonical: nll@16x
        if self.direction is None:
            self.direction = "maximize" if field_ == "accuracy" else "minimize"
        if self.direction not in ("minimize", "maximize"):
            raise ValueError(f"direction={self.direction!r} is not valid; choose minimize or maximize")

    @property
    def multiplier(self) -> float:
        return parse_metric(self.metric)[1]


@dataclass
class SamplerSpec:
    """``type``: tpe | random | grid | nsga2. TPE options: n_startup_trials (10), multivariate (true: a
    grouped multivariate TPE that models conditional spaces), constant_liar (true: parallel workers do not
    pile onto one point). NSGA-II: population_size (50). ``seed`` is offset per worker."""

    type: str = "tpe"
    seed: int | None = 0
    n_startup_trials: int | None = None
    multivariate: bool | None = None
    constant_liar: bool | None = None
    population_size: int | None = None

    _OPTIONS = {"tpe": ("n_startup_trials", "multivariate", "constant_liar"), "random": (), "grid": (),
                "nsga2": ("population_size",)}

    def __post_init__(self) -> None:
        if self.type not in SAMPLERS:
            raise ValueError(f"type={self.type!r} is not valid; choose one of {', '.join(SAMPLERS)}")
        for name in ("n_startup_trials", "multivariate", "constant_liar", "population_size"):
            if getattr(self, name) is not None and name not in self._OPTIONS[self.type]:
                raise ValueError(f"{name} is not an option of the {self.type} sampler")
        for name in ("seed", "n_startup_trials", "population_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name}={value!r} is not valid; it must be a non-negative integer")
        if self.population_size is not None and self.population_size < 2:
            raise ValueError(f"population_size={self.population_size!r} is not valid; it must be >= 2")

    def build(self, space: Mapping[str, ParamSpec], worker_index: int = 0):
        seed = None if self.seed is None else self.seed + 7919 * worker_index  # parallel workers draw differently
        with _quiet_experimental():
            if self.type == "tpe":
                mv = True if self.multivariate is None else self.multivariate
                return optuna.samplers.TPESampler(
                    seed=seed, n_startup_trials=10 if self.n_startup_trials is None else self.n_startup_trials,
                    multivariate=mv, group=mv, constant_liar=True if self.constant_liar is None else self.constant_liar)
            if self.type == "random":
                return optuna.samplers.RandomSampler(seed=seed)
            if self.type == "grid":
                return _GridSampler({k: p.grid_values(k) for k, p in space.items()}, seed=seed)
            return optuna.samplers.NSGAIISampler(population_size=self.population_size or 50, seed=seed)


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler without its ``after_trial`` stop rule. That rule reads the finished trial's
    ``grid_id``, which enqueued trials (our seed copies and retries carry fixed params) never get: when a
    seed copy finished while the grid's last point still ran in another worker, it raised ``KeyError:
    'grid_id'`` and killed the worker. The stop is redundant here: the budget lock ends every study."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


@dataclass
class PrunerSpec:
    """``type``: median | hyperband | threshold | none. Steps are optimiser steps of the extrapolation
    evaluations (``extrapolation.every_n_steps``). Median: n_startup_trials (5), n_warmup_steps (0),
    interval_steps (1). Hyperband: min_resource (1), max_resource ("auto"), reduction_factor (3).
    Threshold: lower and/or upper bound on the reported metric."""

    type: str = "none"
    n_startup_trials: int | None = None
    n_warmup_steps: int | None = None
    interval_steps: int | None = None
    min_resource: int | None = None
    max_resource: int | str | None = None
    reduction_factor: int | None = None
    lower: float | None = None
    upper: float | None = None

    _OPTIONS = {"median": ("n_startup_trials", "n_warmup_steps", "interval_steps"),
                "hyperband": ("min_resource", "max_resource", "reduction_factor"),
                "threshold": ("lower", "upper"), "none": ()}

    def __post_init__(self) -> None:
        if self.type not in PRUNERS:
            raise ValueError(f"type={self.type!r} is not valid; choose one of {', '.join(PRUNERS)}")
        for name in [f for opts in self._OPTIONS.values() for f in opts]:
            if getattr(self, name) is not None and name not in self._OPTIONS[self.type]:
                raise ValueError(f"{name} is not an option of the {self.type} pruner")
        self.lower, self.upper = _number(self.lower, "lower"), _number(self.upper, "upper")
        if self.type == "threshold" and self.lower is None and self.upper is None:
            raise ValueError("the threshold pruner needs lower and/or upper")
        if self.max_resource is not None and self.max_resource != "auto" and not isinstance(self.max_resource, int):
            raise ValueError(f"max_resource={self.max_resource!r} is not valid; an integer or 'auto'")

    def build(self):
        if self.type == "median":
            return optuna.pruners.MedianPruner(
                n_startup_trials=5 if self.n_startup_trials is None else self.n_startup_trials,
                n_warmup_steps=self.n_warmup_steps or 0, interval_steps=self.interval_steps or 1)
        if self.type == "hyperband":
            return optuna.pruners.HyperbandPruner(min_resource=self.min_resource or 1,
                                                  max_resource=self.max_resource or "auto",
                                                  reduction_factor=self.reduction_factor or 3)
        if self.type == "threshold":
            return optuna.pruners.ThresholdPruner(lower=self.lower, upper=self.upper)
        return optuna.pruners.NopPruner()


@dataclass
class HeartbeatSpec:
    """A running trial whose worker sent no heartbeat for ``grace`` seconds is failed (and retried)."""

    interval: int = 30
    grace: int = 120

    def __post_init__(self) -> None:
        for name in ("interval", "grace"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}={value!r} is not valid; a positive number of seconds")
        if self.grace <= self.interval:
            raise ValueError(f"grace={self.grace} must exceed interval={self.interval}")


@dataclass
class Stratum:
    """One study of a spec: the whole spec, or one of its variants."""

    variant: str | None
    overrides: dict
    study_name: str


@dataclass
class SweepSpec:
    """A study spec (``sweeps/*.yaml``); every key is checked, unknown keys are errors."""

    name: str = ""
    base: str = ""
    objectives: list = field(default_factory=list)
    space: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)
    variants: dict = field(default_factory=dict)
    sampler: Any = None
    pruner: Any = None
    trials: int | None = None
    timeout: float | None = None
    seeds: list = field(default_factory=lambda: [0])
    storage: str | None = None
    root: str = "runs/sweeps"
    wandb: str = "auto"
    retries: int = 1
    heartbeat: Any = None
    description: str = ""
    path: Path = field(default=Path("."), init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"name={self.name!r} is not valid; letters, digits and _ . + - (it names the study)")
        if not isinstance(self.base, str) or not self.base:
            raise ValueError("base is required: a shipped config name (tiny) or a YAML path")
        if not isinstance(self.objectives, list) or not self.objectives:
            raise ValueError("objectives is required: a list such as [{metric: nll@16x, direction: minimize}]")
        self.objectives = [_strict(ObjectiveSpec, {"metric": o} if isinstance(o, str) else o, f"objectives[{i}]")
                           for i, o in enumerate(self.objectives)]
        if len({o.metric for o in self.objectives}) != len(self.objectives):
            raise ValueError("objectives repeat a metric")
        for section in ("space", "overrides", "variants"):
            value = getattr(self, section)
            if value is None:
                setattr(self, section, {})
            elif not isinstance(value, Mapping):
                raise ValueError(f"{section} must be a mapping of dotted keys")
        self.overrides = self._check_overrides(self.overrides, "overrides")
        space = {}
        for key, value in self.space.items():
            self._check_key(key, "space")
            spec = {"type": "categorical", "choices": value} if isinstance(value, list) else value
            space[key] = _strict(ParamSpec, spec, f"space.{key}")
        self.space = space
        seen: set[str] = set()
        for key, p in self.space.items():
            for cond in p.when or {}:
                if cond == key or (cond in self.space and cond not in seen):
                    raise ValueError(f"space.{key}.when names {cond!r}, which is not an earlier search-space key")
            seen.add(key)
        variants = {}
        for vname, vover in self.variants.items():
            if not _NAME.match(str(vname)):
                raise ValueError(f"variant name {vname!r} is not valid; letters, digits and _ . + -")
            variants[str(vname)] = self._check_overrides(vover or {}, f"variants.{vname}")
        self.variants = variants
        for where, fixed in [("overrides", self.overrides), *((f"variants.{v}", o) for v, o in variants.items())]:
            searched = sorted(set(fixed) & set(self.space))
            if searched:
                raise ValueError(f"{where} sets {searched[0]!r}, which the space searches; keep it in one place")
        self.sampler = _strict(SamplerSpec, self.sampler, "sampler")
        self.pruner = _strict(PrunerSpec, self.pruner, "pruner")
        self.heartbeat = _strict(HeartbeatSpec, self.heartbeat, "heartbeat")
        if len(self.objectives) > 1 and self.pruner.type != "none":
            raise ValueError(f"pruner {self.pruner.type!r} needs a single objective (this spec has "
                             f"{len(self.objectives)}); set pruner: {{type: none}}")
        if self.sampler.type == "grid":
            conditional = [k for k, p in self.space.items() if p.when]
            if conditional:
                raise ValueError(f"the grid sampler cannot take conditional parameters ({conditional[0]}); "
                                 "split them into variants")
            size = math.prod(len(p.grid_values(k)) for k, p in self.space.items())
            if self.trials is None:
                self.trials = size
            elif self.trials > size:
                raise ValueError(f"trials={self.trials} exceeds the grid's {size} points")
        if not isinstance(self.trials, int) or isinstance(self.trials, bool) or self.trials <= 0:
            raise ValueError(f"trials={self.trials!r} is not valid; the number of configurations per study (> 0)")
        self.timeout = _number(self.timeout, "timeout")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"timeout={self.timeout!r} is not valid; seconds (> 0) or null")
        if (not isinstance(self.seeds, list) or not self.seeds
                or not all(isinstance(s, int) and not isinstance(s, bool) for s in self.seeds)
                or len(set(self.seeds)) != len(self.seeds)):
            raise ValueError(f"seeds={self.seeds!r} is not valid; a list of distinct integers (one run per seed)")
        if self.wandb not in WANDB_MODES:
            raise ValueError(f"wandb={self.wandb!r} is not valid; choose one of {', '.join(WANDB_MODES)}")
        if not isinstance(self.retries, int) or isinstance(self.retries, bool) or self.retries < 0:
            raise ValueError(f"retries={self.retries!r} is not valid; a non-negative integer")
        if self.storage is not None and not isinstance(self.storage, str):
            raise ValueError(f"storage={self.storage!r} is not valid; a URL string or null")

    @staticmethod
    def _check_key(key: Any, where: str) -> None:
        if not isinstance(key, str) or not _DOTTED.match(key):
            raise ValueError(f"{where}: key {key!r} is not valid; use the CLI's dotted keys (model.lr)")
        if key.split(".")[0] in RESERVED_KEYS:
            raise ValueError(f"{where}: key {key!r} is set by the sweep itself (seeds: sets seed_everything, "
                             "root: the run root)")

    def _check_overrides(self, overrides: Any, where: str) -> dict:
        if not isinstance(overrides, Mapping):
            raise ValueError(f"{where} must be a mapping of dotted keys to values")
        for key in overrides:
            self._check_key(key, where)
        return dict(overrides)

    # -- derived -------------------------------------------------------------------------------------
    @property
    def budget(self) -> int:
        """Optuna trials per study: configurations × seeds."""
        return self.trials * len(self.seeds)

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    def strata(self) -> list[Stratum]:
        if not self.variants:
            return [Stratum(None, {}, self.name)]
        return [Stratum(v, o, f"{self.name}/{v}") for v, o in self.variants.items()]

    def base_path(self) -> Path:
        p = Path(self.base)
        if not p.exists() and p.suffix and (self.path.parent / p).exists():
            p = self.path.parent / p  # relative to the spec file
        return Path(config_path(str(p))).resolve()

    def fingerprint(self) -> str:
        """What makes trials of a study comparable: a re-run with a changed spec must not join the study."""
        doc = {"base": self.base, "objectives": [(o.metric, o.direction) for o in self.objectives],
               "space": {k: vars(p) for k, p in self.space.items()}, "overrides": self.overrides,
               "variants": self.variants, "seeds": self.seeds}
        return hashlib.sha1(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def find_spec(name: str) -> Path:
    """A spec by path, or by name from ``./sweeps`` or the shipped ``sweeps/``."""
    p = Path(name)
    if p.is_file():
        return p
    if not p.suffix:
        for folder in (Path("sweeps"), SPEC_DIR):
            if (folder / f"{name}.yaml").is_file():
                return folder / f"{name}.yaml"
    shipped = ", ".join(sorted(f.stem for f in SPEC_DIR.glob("*.yaml")))
    raise UsageError(f"sweep spec {name!r} does not exist; give a YAML path or one of: {shipped}")


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check a spec file; every problem is a one-line :class:`UsageError` naming the key."""
    path = find_spec(str(path))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise UsageError(f"{path}: not valid YAML ({one_line(str(err))})") from None
    spec = _strict(SweepSpec, data, str(path))
    spec.path = path.resolve()
    return spec


# ---------------------------------------------------------------------------------------------------
# trial configs: sampling and the real CLI parser
# ---------------------------------------------------------------------------------------------------
def render(value: Any) -> str:
    """A value as the CLI reads it after ``--key=``."""
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def override_args(overrides: Mapping[str, Any]) -> list[str]:
    return [f"--{k}={render(v)}" for k, v in overrides.items()]


def sample_space(trial, space: Mapping[str, ParamSpec], context: Mapping[str, Any]) -> dict[str, Any]:
    """Suggest every active parameter in order; ``context`` holds the config's values of ``when`` keys."""
    ctx, values = dict(context), {}
    for key, p in space.items():
        if p.active(ctx):
            values[key] = ctx[key] = p.suggest(trial, key)
    return values


def runs_root(spec: SweepSpec, root: Path, stratum: Stratum) -> Path:
    base = Path(root) / spec.name
    return (base / stratum.variant if stratum.variant else base) / "runs"


def trial_args(spec: SweepSpec, stratum: Stratum, root: Path, number: int, seed: int,
               values: Mapping[str, Any]) -> list[str]:
    """The ``accrot fit`` arguments of one trial."""
    args = ["fit", "--config", str(spec.base_path()), "--trainer.enable_progress_bar=false",
            *override_args(spec.overrides), *override_args(stratum.overrides), *override_args(values),
            f"--root={runs_root(spec, root, stratum)}", f"--name=trial_{number:04d}",
            f"--seed_everything={seed}", f"--wandb={spec.wandb}"]
    if spec.pruner.type != "none":
        cb = {"class_path": "callbacks.pruning.OptunaPruning",
              "init_args": {"study": stratum.study_name, "trial": number, "metric": spec.objectives[0].metric}}
        args.append(f"--trainer.callbacks+={json.dumps(cb)}")
    return args


_PROBE_CLS = None


def probe(args: list[str]) -> dict[str, Any]:
    """Parse ``accrot fit`` ``args`` and build everything (model, data module, trainer, callbacks) without
    training, exactly as a run would; returns the resolved config flattened to dotted keys.

    Bad input raises what ``accrot fit`` raises (UsageError, ConfigError, DataError, ArgumentError)."""
    global _PROBE_CLS
    from accrot.cli import _make_cli_class, resolve_config_args

    if _PROBE_CLS is None:
        AccrotCLI, LitLM, DataModule = _make_cli_class()

        class ProbeCLI(AccrotCLI):
            _built = None  # what setup_parser sets (the parsers): built once per process; parsing is stateless

            def setup_parser(self, add_subcommands, main_kwargs, subparser_kwargs) -> None:
                # building the parser from the model, data and Trainer signatures is most of a probe's time
                # (0.8 of 1.4 s); a spec checks every choice with one probe each
                if ProbeCLI._built is None:
                    before = set(vars(self))
                    super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
                    ProbeCLI._built = {k: v for k, v in vars(self).items() if k not in before}  # parser & co
                vars(self).update(ProbeCLI._built)

            def _run_subcommand(self, subcommand: str) -> None:  # instantiate, never fit
                pass

        _PROBE_CLS = (ProbeCLI, LitLM, DataModule)
    ProbeCLI, LitLM, DataModule = _PROBE_CLS
    args = [a for a in args if not a.startswith(("--root=", "--wandb="))]
    quiet = [logging.getLogger(n) for n in ("lightning", "lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in quiet]
    with tempfile.TemporaryDirectory(prefix="accrot-probe-") as tmp, \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for lg in quiet:
            lg.setLevel(logging.ERROR)
        argv0, sys.argv = sys.argv, sys.argv[:1]
        try:
            cli = ProbeCLI(LitLM, DataModule, subclass_mode_data=True,
                           args=resolve_config_args([*args, f"--root={tmp}", "--wandb=disabled"]),
                           parser_kwargs={"exit_on_error": False}, auto_configure_optimizers=False)
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


@dataclass
class StratumInfo:
    """What validation learned about a stratum from its resolved config."""

    context: dict  # config values of every `when` key that is not in the space
    multipliers: list
    train_length: int | None


def check_stratum(spec: SweepSpec, stratum: Stratum, n_samples: int = 1, seed: int = 0) -> StratumInfo:
    """Build the stratum's config (no training), check every key and objective against it, then build
    ``n_samples`` sampled trial configs; one-line UsageError naming the spec on any problem."""
    where = f"{spec.path}" + (f" (variant {stratum.variant})" if stratum.variant else "")
    base_args = ["fit", "--config", str(spec.base_path()), *override_args(spec.overrides),
                 *override_args(stratum.overrides)]
    try:
        flat = probe(base_args)
    except Exception as err:  # noqa: BLE001 - a bad fixed override is the spec's bad input
        message = bad_input_message(err)
        if message is None:
            raise
        raise UsageError(f"{where}: overrides are not valid: {message}") from None
    known = sorted(k for k in flat if not k.startswith("__"))

    def check_known(key: str, what: str) -> None:
        if key in flat or any(k.startswith(key + ".") for k in known):
            return
        close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else f"run `accrot fit --config {spec.base} --help`"
        raise UsageError(f"{where}: {what} {key!r} is not a key of the accrot fit config; {hint}")

    for key in spec.space:
        check_known(key, "search-space key")
    context = {}
    for key, p in spec.space.items():
        for cond in p.when or {}:
            if cond not in spec.space:
                check_known(cond, f"condition key (space.{key}.when)")
                context[cond] = flat.get(cond)
    devices, nodes = flat.get("trainer.devices"), flat.get("trainer.num_nodes") or 1
    if isinstance(devices, str) and re.fullmatch(r"\d+", devices.strip()):
        devices = int(devices)  # "2" (Lightning also takes "0,1" and "auto")
    if isinstance(devices, list):
        n_devices = len(devices)
    elif isinstance(devices, int):
        n_devices = devices
    else:
        n_devices = len([d for d in str(devices).split(",") if d.strip()]) if "," in str(devices) else 1
    if n_devices > 1 or int(nodes) > 1:  # a worker runs its trials in-process: Lightning cannot re-launch it per rank
        raise UsageError(f"{where}: trainer.devices={devices!r}, trainer.num_nodes={nodes!r}: a sweep trial runs on "
                         "one device in its worker (workers share GPUs round robin); use trainer.devices=1")
    multipliers = [float(m) for m in (flat.get("extrapolation.multipliers") or [])]
    for o in spec.objectives:
        if not any(math.isclose(o.multiplier, m) for m in multipliers):
            raise UsageError(f"{where}: objective {o.metric!r} is never produced: the runs evaluate at "
                             f"multipliers {', '.join(f'{m:g}' for m in multipliers)} "
                             f"(set extrapolation.multipliers in overrides, or use one of "
                             f"{', '.join(metric_key('nll', m) for m in multipliers)})")
    train_length = flat.get("data.init_args.seq_len", flat.get("data.seq_len"))
    # sampled configs go through the real parser too (values, cross-field checks, the pruning callback)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed), directions=spec.directions)
    finally:
        optuna.logging.set_verbosity(verbosity)
    for _ in range(n_samples):
        trial = study.ask()
        values = sample_space(trial, spec.space, context)
        args = trial_args(spec, stratum, Path(tempfile.gettempdir()), trial.number, spec.seeds[0], values)
        try:
            probe(args)
        except Exception as err:  # noqa: BLE001
            message = bad_input_message(err)
            if message is None:
                raise
            raise UsageError(f"{where}: sampled config {render(values)} is not valid: {message}") from None
        study.tell(trial, [0.0] * len(spec.objectives))
    if n_samples:
        _check_every_value(spec, stratum, where, values, context)
    return StratumInfo(context=context, multipliers=multipliers,
                       train_length=int(train_length) if train_length is not None else None)


_UNSET = object()  # a parameter the sample left out (inactive)


def _check_every_value(spec: SweepSpec, stratum: Stratum, where: str, sample: Mapping[str, Any],
                       context: Mapping[str, Any]) -> None:
    """Every categorical choice and both bounds of every range go through the CLI's own checks (:func:`probe`),
    one at a time on top of a valid sample, before any trial starts: a choice no sample happened to draw
    (``rotation: [none, rope, rotary]``) would otherwise fail its trials one by one. A conditional parameter is
    checked with its ``when`` keys set to an allowed value; parameters the checked value switches off are left
    out, as a trial would leave them."""
    for key, p in spec.space.items():
        candidates = list(p.choices) if p.type == "categorical" else [p.low, p.high]
        forced = {cond: (allowed[0] if isinstance(allowed, list) else allowed)
                  for cond, allowed in (p.when or {}).items() if cond in spec.space}
        for value in candidates:
            if p.type == "int":
                value = int(value)
            ctx, values = dict(context), {}
            for k, q in spec.space.items():  # in order, as sample_space activates them
                v = value if k == key else forced.get(k, sample.get(k, _UNSET))
                if k == key or (v is not _UNSET and q.active(ctx)):
                    values[k] = ctx[k] = v
            if values == dict(sample):
                continue  # the sample itself: already probed
            try:
                probe(trial_args(spec, stratum, Path(tempfile.gettempdir()), 0, spec.seeds[0], values))
            except Exception as err:  # noqa: BLE001
                message = bad_input_message(err)
                if message is None:
                    raise
                raise UsageError(f"{where}: space.{key} value {value!r} is not valid: {message}") from None


# ---------------------------------------------------------------------------------------------------
# storages
# ---------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet_experimental() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def redact(url: str) -> str:
    """A storage URL without its password (for messages and logs)."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def _pg_driver() -> str:
    """``psycopg`` (3) when installed, else ``psycopg2`` (the pinned dev extra), else psycopg for the error."""
    import importlib.util

    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return driver
    return "psycopg"


@dataclass
class StorageRef:
    url: str
    kind: str  # sqlite | postgresql | journal
    path: Path | None = None

    @classmethod
    def parse(cls, url: str | None, name: str, root: str | Path) -> StorageRef:
        """``url``, or the default SQLite file ``<root>/<name>/study.db`` when it is empty."""
        if not url:
            path = (Path(root) / name / "study.db").resolve()
            return cls(f"sqlite:///{path}", "sqlite", path)
        if url.startswith("sqlite:///"):
            path = Path(url[len("sqlite:///"):])
            if str(path) in ("", ":memory:"):
                raise UsageError(f"storage {url!r} is not valid; workers need a file: sqlite:///PATH")
            return cls(f"sqlite:///{path.resolve()}", "sqlite", path.resolve())
        if re.match(r"^postgres(ql)?(\+\w+)?://", url):
            url = re.sub(r"^postgres(ql)?", "postgresql", url)
            if url.startswith("postgresql://"):  # no driver named: the installed one (SQLAlchemy 2.1 assumes psycopg 3)
                url = f"postgresql+{_pg_driver()}://" + url[len("postgresql://"):]
            return cls(url, "postgresql")
        if url.startswith("journal://"):
            if not url[len("journal://"):].startswith("/"):  # relative to whichever folder each worker starts in
                raise UsageError(f"storage {url!r} names a relative file; write journal:///ABS/PATH.log (three "
                                 "slashes: workers on other machines or folders must find the same file)")
            path = Path(url[len("journal://"):]).resolve()
            return cls(f"journal://{path}", "journal", path)
        raise UsageError(f"storage {redact(url)!r} is not supported; use sqlite:///PATH, "
                         "postgresql://USER@HOST[:PORT]/DB or journal:///ABS/PATH.log")

    @property
    def dashboard(self) -> str:
        """The storage argument optuna-dashboard takes."""
        return str(self.path) if self.kind == "journal" else self.url


def open_storage(ref: StorageRef, heartbeat: HeartbeatSpec | None = None, retries: int = 0,
                 create: bool = False):
    """The Optuna storage of ``ref``; UsageError if it cannot be reached (before any trial starts)."""
    from optuna.storages import JournalStorage, RDBStorage
    from optuna.storages.journal import JournalFileBackend

    try:
        if ref.kind == "journal":
            if not ref.path.parent.is_dir():
                if not create:
                    raise OSError(f"directory {ref.path.parent} does not exist")
                ref.path.parent.mkdir(parents=True, exist_ok=True)
            if not create and not ref.path.is_file():
                raise OSError(f"{ref.path} does not exist")
            return JournalStorage(JournalFileBackend(str(ref.path)))
        if ref.kind == "sqlite":
            if not ref.path.is_file() and not create:
                raise OSError(f"{ref.path} does not exist")
            ref.path.parent.mkdir(parents=True, exist_ok=True)
            engine = {"connect_args": {"timeout": 120}}  # wait for the writer instead of "database is locked"
        else:
            engine = {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
        kwargs: dict[str, Any] = {}
        if heartbeat is not None:
            kwargs = {"heartbeat_interval": heartbeat.interval, "grace_period": heartbeat.grace,
                      "heartbeat_stale_trial_callback": RetryTrial(retries, reason="stopped sending heartbeats")}
        with _quiet_experimental():
            storage = RDBStorage(ref.url, engine_kwargs=engine, **kwargs)
        if ref.kind == "sqlite":
            import sqlite3

            with contextlib.closing(sqlite3.connect(ref.path, timeout=120)) as con:
                con.execute("PRAGMA journal_mode=WAL")  # readers (dashboard, parent) never block the writer
        return storage
    except UsageError:
        raise
    except Exception as err:  # noqa: BLE001 - OSError, sqlalchemy errors, psycopg2 errors: all unreachable
        raise unreachable(ref, err) from None


def unreachable(ref: StorageRef, err: BaseException) -> UsageError:
    reason = one_line(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
    return UsageError(f"storage {redact(ref.url)!r} is unreachable: {reason}")


@contextlib.contextmanager
def creation_lock(ref: StorageRef, name: str) -> Iterator[None]:
    """One parent at a time creates the schema and the studies: two sweeps started at once on a fresh storage
    would race on ``CREATE TABLE`` (the same storage-wide lock as the budget's)."""
    lock = BudgetLock(ref, name)
    try:
        if ref.path is not None:
            ref.path.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except Exception as err:  # noqa: BLE001 - what stops the lock stops the storage: unreachable
        raise unreachable(ref, err) from None
    try:
        yield
    finally:
        lock.release()


TRANSIENT_GRACE = 180.0  # seconds the parent keeps retrying a storage that went away (a database restart)


def transient(err: BaseException) -> bool:
    """A storage error that a retry may cure: a dropped connection, a restarting server, a locked SQLite."""
    import sqlalchemy.exc

    return isinstance(err, (optuna.exceptions.StorageInternalError, sqlalchemy.exc.OperationalError,
                            sqlalchemy.exc.InterfaceError, sqlalchemy.exc.DisconnectionError))


def retry_storage(fn, what: str, console=None, grace: float = TRANSIENT_GRACE):
    """``fn()``, retried with backoff while the storage is briefly unavailable (up to ``grace`` seconds)."""
    deadline, delay = None, 0.5
    while True:
        try:
            return fn()
        except Exception as err:
            if not transient(err):
                raise
            now = time.time()
            if deadline is None:
                deadline = now + grace
                if console is not None:
                    console.print(f"[yellow]storage unavailable ({what}: {type(err).__name__}); retrying for up to "
                                  f"{grace:.0f} s[/]")
            if now > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 5.0)


class BudgetLock:
    """A storage-wide lock held from the budget check until the new trial exists (so N workers never
    overshoot ``trials``): fcntl next to SQLite, Optuna's NFS-safe symlink lock next to a journal file
    (forcibly released after 30 s if its holder died), a PostgreSQL advisory lock (released with its
    connection). ``release`` is idempotent."""

    def __init__(self, ref: StorageRef, name: str) -> None:
        self.ref, self.name = ref, name
        self._held = False
        self._handle: Any = None

    def acquire(self) -> None:
        if self.ref.kind == "sqlite":
            import fcntl

            self._handle = open(f"{self.ref.path}.budget-lock", "a")  # noqa: SIM115 - held across calls
            fcntl.flock(self._handle, fcntl.LOCK_EX)
        elif self.ref.kind == "journal":
            from optuna.storages.journal import JournalFileSymlinkLock

            self._handle = JournalFileSymlinkLock(f"{self.ref.path}.budget")
            self._handle.acquire()
        else:
            import sqlalchemy
            from sqlalchemy.pool import NullPool

            key = int.from_bytes(hashlib.sha1(f"accrot-sweep:{self.name}".encode()).digest()[:8], "big", signed=True)
            engine = sqlalchemy.create_engine(self.ref.url, poolclass=NullPool,
                                              connect_args={"connect_timeout": 10})
            conn = engine.connect()
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
            self._handle = (engine, conn, key)
        self._held = True

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        if self.ref.kind == "sqlite":
            self._handle.close()  # closing the descriptor drops the flock
        elif self.ref.kind == "journal":
            self._handle.release()
        else:
            import sqlalchemy

            engine, conn, key = self._handle
            with contextlib.suppress(Exception):
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.close()
            engine.dispose()
        self._handle = None


# ---------------------------------------------------------------------------------------------------
# dead workers: fail with the reason, retry with the same params and seed
# ---------------------------------------------------------------------------------------------------
class RetryTrial:
    """Re-queue a failed trial as a WAITING one with the same params, seed and configuration, at most
    ``max_retry`` times per original trial. Keeps Optuna's ``failed_trial`` / ``retry_history`` system
    attributes (so ``RetryHeartbeatStaleTrialCallback.retried_trial_number`` still works), drops the
    attempt's own user attributes (worker, run_dir, fail_reason, ...) and records ``retry_of``."""

    def __init__(self, max_retry: int, reason: str = "") -> None:
        self.max_retry = max_retry
        self.reason = reason

    def __call__(self, study, trial) -> None:
        history = [*trial.system_attrs.get("retry_history", []), trial.number]
        if len(history) > self.max_retry:
            return
        user = {k: v for k, v in trial.user_attrs.items() if k not in _ATTEMPT_ATTRS}
        user["retry_of"] = trial.number
        if self.reason and "fail_reason" not in trial.user_attrs:
            user["retry_reason"] = f"trial {trial.number} {self.reason}"
        system = {**trial.system_attrs, "failed_trial": history[0], "retry_history": history}
        study.add_trial(optuna.trial.create_trial(state=TrialState.WAITING, params=trial.params,
                                                  distributions=trial.distributions, user_attrs=user,
                                                  system_attrs=system))


def fail_trial(study, storage, trial, reason: str, retry: RetryTrial | None) -> bool:
    """Fail a RUNNING trial with ``reason`` (a user attribute) and retry it; False if it had finished."""
    try:
        storage.set_trial_user_attr(trial._trial_id, "fail_reason", reason)
        if not storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
            return False
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    if retry is not None:
        retry(study, storage.get_trial(trial._trial_id))
    return True


def fail_stale_journal(study, storage, heartbeat: HeartbeatSpec, retry: RetryTrial) -> int:
    """Journal storages have no Optuna heartbeat: fail RUNNING trials whose ``heartbeat`` attribute (or
    start) is older than the grace period."""
    now, n = time.time(), 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        last = t.user_attrs.get("heartbeat") or (t.datetime_start.timestamp() if t.datetime_start else now)
        if now - last > heartbeat.grace:
            reason = (f"no heartbeat from worker {t.user_attrs.get('worker', '?')} for {now - last:.0f} s "
                      f"(grace {heartbeat.grace} s): worker presumed dead")
            n += fail_trial(study, storage, t, reason, retry)
    return n


def recover_stale(study, storage, ref: StorageRef, spec: SweepSpec) -> None:
    """Fail (and re-queue) running trials whose worker stopped sending heartbeats, on any storage."""
    if ref.kind == "journal":
        fail_stale_journal(study, storage, spec.heartbeat, RetryTrial(spec.retries))
    else:
        with _quiet_experimental():
            optuna.storages.fail_stale_trials(study)  # Optuna's heartbeat; its callback re-queues


class _JournalHeartbeat:
    """Writes the trial's ``heartbeat`` user attribute every ``interval`` seconds (journal storages)."""

    def __init__(self, storage, trial_id: int, interval: int) -> None:
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a trial that just finished refuses the write
                self.storage.set_trial_user_attr(self.trial_id, "heartbeat", time.time())
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> _JournalHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def budget_state(study, budget: int) -> tuple[int, int, int]:
    """(trials that count against the budget, waiting, running); a failed trial that was retried does
    not count (its retry does)."""
    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    live = [t for t in trials if not (t.state == TrialState.FAIL and t.number in retried)]
    return (len(live), sum(t.state == TrialState.WAITING for t in live),
            sum(t.state == TrialState.RUNNING for t in live))


def can_start(study, budget: int) -> bool:
    counted, waiting, _ = budget_state(study, budget)
    return counted < budget or waiting > 0


def scheme_label(scheme: Mapping[str, Any] | None) -> str:
    """``accum:learned/forget+values``: the cell of the ablation grid a run belongs to."""
    if not scheme:
        return "?"
    rot = scheme.get("rotation", "none")
    if scheme.get("increments"):
        rot += f":{scheme['increments']}"
    return f"{rot}/{scheme.get('far_mass', 'none')}" + ("+values" if scheme.get("rotate_values") else "")


# ---------------------------------------------------------------------------------------------------
# the worker: trials in-process, one after another
# ---------------------------------------------------------------------------------------------------
class TrialFailed(RuntimeError):
    """A trial that ran but produced no usable objective; its message is the trial's ``fail_reason``."""


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class _Study:
    stratum: Stratum
    study: Any
    attrs: dict


def load_studies(spec: SweepSpec, storage, worker_index: int = 0) -> list[_Study]:
    out = []
    for stratum in spec.strata():
        try:
            with _quiet_experimental():
                study = optuna.load_study(study_name=stratum.study_name, storage=storage,
                                          sampler=spec.sampler.build(spec.space, worker_index),
                                          pruner=spec.pruner.build())
        except KeyError:
            raise UsageError(f"study {stratum.study_name!r} is not in the storage; start the sweep once with "
                             f"`accrot sweep {spec.path} --workers 0` (creates it) before adding workers") from None
        attrs = study.user_attrs.get("accrot", {})
        if attrs.get("fingerprint") != spec.fingerprint():
            raise UsageError(f"study {stratum.study_name!r} in the storage was created from a different spec "
                             "(space, objectives, overrides or seeds changed); rename the spec or use a new storage")
        out.append(_Study(stratum, study, attrs))
    return out


def run_worker(spec: SweepSpec, ref: StorageRef, root: Path, worker_index: int = 0,
               deadline: float | None = None, ranks=None) -> int:
    """Run trials until every study's budget is spent (or the deadline passes).

    ``ranks`` (:class:`accrot.sweep_ddp.Ranks`, global rank 0 of a multi-process worker): every trial is a DDP
    run over all ranks; the other ranks follow with :func:`accrot.sweep_ddp.follow`."""
    from accrot.cli import run_lightning
    from accrot.report import metric_value, metrics_of
    from callbacks.extrapolation import ExtrapolationCallback
    from callbacks.pruning import OptunaPruning, active_trial

    storage = open_storage(ref, spec.heartbeat if ref.kind != "journal" else None, spec.retries)
    studies = load_studies(spec, storage, worker_index)
    lock = BudgetLock(ref, spec.name)
    me = worker_id()
    print(f"worker {me}: {spec.name} on {redact(ref.url)}", flush=True)

    def objective_for(entry: _Study):
        stratum, study = entry.stratum, entry.study
        context = entry.attrs.get("context", {})

        def objective(trial):
            attr(trial, "worker", me)
            if ranks is not None:  # the other ranks mirror the suggestions (optuna's TorchDistributedTrial)
                values = ranks.sample(entry, trial, context)
            else:
                values = retry_storage(lambda: sample_space(trial, spec.space, context), "sampling")
            seed = trial.user_attrs.get("seed")
            if seed is None:  # a fresh configuration: queue its other seeds with the same params
                seed = spec.seeds[0]
                attr(trial, "seed", seed)
                attr(trial, "config", trial.number)
                for s in spec.seeds[1:]:
                    retry_storage(lambda s=s: study.enqueue_trial(dict(trial.params), user_attrs={"seed": s, "config": trial.number}), "queueing a seed")
            lock.release()  # the trial (and its seed copies) now count against the budget
            args = trial_args(spec, stratum, root, trial.number, seed, values)
            if ranks is not None:
                args += ranks.launch(trial, seed, values)
            os.environ["WANDB_RUN_GROUP"] = stratum.study_name  # a study's runs form one wandb group
            trial_root = runs_root(spec, root, stratum) / f"trial_{trial.number:04d}"
            beat = (_JournalHeartbeat(storage, trial._trial_id, spec.heartbeat.interval) if ref.kind == "journal"
                    else contextlib.nullcontext())
            try:
                with beat, active_trial(stratum.study_name, trial):
                    cli = run_lightning(args)
            except optuna.TrialPruned as err:
                _record_run_dir(trial, trial_root)
                attr(trial, "pruned_reason", str(err))
                raise
            except SystemExit as err:
                if type(err).__name__ != "SIGTERMException" or ranks is not None:
                    raise  # a multi-rank SLURM worker is requeued and continues this trial (accrot.sweep_ddp)
                # this worker was told to stop (SIGTERM: the sweep interrupted, a scheduler): the run is
                # checkpointed; fail the trial with the reason and queue its retry, then end the worker
                _record_run_dir(trial, trial_root)
                attr(trial, "fail_reason", f"worker {me} was stopped by {_signal_name(err)} during the trial "
                                           "(checkpointed)")
                RetryTrial(spec.retries)(study, retry_storage(lambda: study._storage.get_trial(trial._trial_id),
                                                              "reading the stopped trial"))
                raise
            except Exception as err:  # noqa: BLE001 - every failure of a run is this trial's result
                _record_run_dir(trial, trial_root)
                reason = bad_input_message(err) or f"{type(err).__name__}: {one_line(str(err))}"
                if isinstance(err, FloatingPointError):
                    reason = f"the run diverged: {reason}"
                attr(trial, "fail_reason", reason)
                raise TrialFailed(reason) from err
            finally:
                _end_run()
            # trainer.log_dir is a broadcast under DDP, which the other ranks (done with the run) would not join
            run_dir = Path(cli.trainer.loggers[0].log_dir if ranks is not None else cli.trainer.log_dir).resolve()
            ext = next(c for c in cli.trainer.callbacks if isinstance(c, ExtrapolationCallback))
            final = ext.history[-1]
            metrics = metrics_of(final["lengths"])
            attr(trial, "run_dir", str(run_dir))
            attr(trial, "metrics", metrics)
            attr(trial, "step", final["step"])
            attr(trial, "train_length", ext.train_length)
            attr(trial, "variant", stratum.variant or scheme_label(cli.model.hparams.get("scheme")))
            if len(spec.objectives) == 1:  # intermediate values: the pruner's (and the dashboard's) curve
                pruning = [c for c in cli.trainer.callbacks if isinstance(c, OptunaPruning)]
                done = pruning[0].reported if pruning else set()
                for h in ext.history:
                    value = metric_value(h["lengths"], spec.objectives[0].metric)
                    if h["step"] not in done and math.isfinite(value):
                        retry_storage(lambda value=value, h=h: trial.report(value, h["step"]), "reporting")
            out = [metrics[o.metric] for o in spec.objectives]
            bad = [(o.metric, v) for o, v in zip(spec.objectives, out) if not math.isfinite(v)]
            if bad:
                reason = f"objective {bad[0][0]}={bad[0][1]} at step {final['step']} (the run diverged)"
                attr(trial, "fail_reason", reason)
                raise TrialFailed(reason)
            return out[0] if len(out) == 1 else out

        return objective

    ran = 0
    while deadline is None or time.time() < deadline:
        try:
            lock.acquire()
            if ranks is not None and ranks.continue_requeued(studies, objective_for):
                ran += 1  # the trial this SLURM job ran before it was requeued, under its own number
                continue
            for entry in studies:  # orphans of dead workers elsewhere count against the budget until failed
                recover_stale(entry.study, storage, ref, spec)
            entry = _next_study(studies, spec.budget)
            if entry is None:
                break
            try:
                entry.study.optimize(objective_for(entry), n_trials=1, catch=(Exception,), gc_after_trial=True)
            except SystemExit as err:
                if type(err).__name__ != "SIGTERMException" or ranks is not None:
                    raise
                print(f"worker {me}: stopped by {_signal_name(err)}; its trial is failed and queued again", flush=True)
                return 128 + 15
            ran += 1
            reconcile_orphans(studies, storage, me, spec.retries)  # a storage error Optuna swallowed
        except Exception as err:
            if not transient(err):
                raise
            # the storage went away (a database restart) around a trial's start or end: wait for it, then fail
            # (and retry) what this worker left unfinished; a storage gone for good ends the worker
            print(f"worker {me}: storage unavailable ({type(err).__name__}); waiting for it", flush=True)
            retry_storage(lambda: reconcile_orphans(studies, storage, me, spec.retries), "reconciling")
        finally:
            with contextlib.suppress(Exception):
                lock.release()
    if ranks is not None:
        ranks.stop()
    print(f"worker {me}: done after {ran} trial(s)", flush=True)
    return 0


def attr(trial, key: str, value) -> None:
    """``trial.set_user_attr`` that rides out a storage restart."""
    retry_storage(lambda: trial.set_user_attr(key, value), f"recording {key}")


def reconcile_orphans(studies: list[_Study], storage, me: str, retries: int) -> int:
    """Trials of this worker that a storage outage left unaccounted for: RUNNING ones (the tell failed) are
    failed with the reason and retried; FAIL ones without a reason (Optuna told FAIL after a storage error
    inside the objective) are retried. Returns how many."""
    reason = "the storage was unavailable when the trial ended (e.g. a database restart)"
    n = 0
    for entry in studies:
        trials = entry.study.get_trials(deepcopy=False)
        retried = {t.user_attrs.get("retry_of") for t in trials}
        for t in trials:
            if t.user_attrs.get("worker") != me or t.number in retried:
                continue
            if t.state == TrialState.RUNNING:
                n += fail_trial(entry.study, storage, t, f"{reason}", RetryTrial(retries))
            elif t.state == TrialState.FAIL and not t.user_attrs.get("fail_reason"):
                RetryTrial(retries, reason="failed while the storage was unavailable")(entry.study, t)
                n += 1
    return n


def _end_run() -> None:
    """Between in-process runs: close the wandb run (Lightning leaves it open, so the next trial would log
    into it) and hand cached accelerator memory back."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        with contextlib.suppress(Exception):
            wandb.finish()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _record_run_dir(trial, trial_root: Path) -> None:
    found = sorted(trial_root.glob("version_*"), key=lambda p: p.stat().st_mtime)
    if found:
        trial.set_user_attr("run_dir", str(found[-1].resolve()))


def _next_study(studies: list[_Study], budget: int) -> _Study | None:
    """Queued trials (seed copies, retries) first, then the study with the fewest trials."""
    best, key = None, None
    for entry in studies:
        counted, waiting, _ = budget_state(entry.study, budget)
        if counted >= budget and not waiting:
            continue
        k = (not waiting, counted)
        if key is None or k < key:
            best, key = entry, k
    return best


# ---------------------------------------------------------------------------------------------------
# the parent: validate, create, launch, watch, recover
# ---------------------------------------------------------------------------------------------------
_WORKER_BOOT = "import sys; from accrot.cli import main; sys.exit(main(sys.argv[1:]))"


def create_studies(spec: SweepSpec, storage, infos: Mapping[str, StratumInfo]) -> list:
    out = []
    for stratum in spec.strata():
        info = infos[stratum.study_name]
        with _quiet_experimental():
            study = optuna.create_study(storage=storage, study_name=stratum.study_name,
                                        directions=spec.directions, load_if_exists=True)
        attrs = study.user_attrs.get("accrot")
        if attrs is None:
            study.set_user_attr("accrot", {
                "spec": spec.name, "spec_file": str(spec.path), "variant": stratum.variant,
                "fingerprint": spec.fingerprint(), "objectives": [o.metric for o in spec.objectives],
                "directions": spec.directions, "budget": spec.budget, "trials": spec.trials, "seeds": spec.seeds,
                "context": info.context, "multipliers": info.multipliers, "train_length": info.train_length,
            })
            with _quiet_experimental():
                study.set_metric_names([o.metric for o in spec.objectives])
        elif attrs.get("fingerprint") != spec.fingerprint():
            raise UsageError(f"study {stratum.study_name!r} already exists in the storage from a different spec "
                             "(space, objectives, overrides or seeds changed); rename the spec or use a new storage")
        out.append(study)
    return out


def _signal_name(err: BaseException) -> str:
    """The signal that stopped a run (callbacks.preemption records it on the exception): SIGTERM, SIGINT, ..."""
    signum = getattr(err, "signum", None)
    return signal.Signals(signum).name if signum else "SIGTERM"


def _describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen
    log: Path

    @property
    def id(self) -> str:
        return f"{socket.gethostname()}:{self.proc.pid}"


def run_sweep(spec: SweepSpec, ref: StorageRef, root: Path, workers: int) -> int:
    """The parent: validate, create the studies, run ``workers`` worker processes, recover dead ones."""
    from rich.console import Console

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the parent prints its own progress
    infos = {}
    with console.status(f"checking {spec.path.name}: building every stratum's config"):
        for stratum in spec.strata():
            infos[stratum.study_name] = check_stratum(spec, stratum)
    with creation_lock(ref, spec.name):
        storage = open_storage(ref, spec.heartbeat if ref.kind != "journal" else None, spec.retries, create=True)
        studies = create_studies(spec, storage, infos)
    console.print(f"[bold]{spec.name}[/]: {len(studies)} stud{'y' if len(studies) == 1 else 'ies'} × "
                  f"{spec.trials} configurations × {len(spec.seeds)} seed(s) on {redact(ref.url)}")
    if workers == 0:
        console.print(f"studies ready; add workers with `accrot sweep {spec.path} --worker --storage URL`")
        return 0
    for study in studies:
        recover_stale(study, storage, ref, spec)
    if not any(can_start(s, spec.budget) for s in studies):
        console.print("every study has spent its budget; nothing to run (raise `trials` to extend it)")
        _print_summary(console, spec, studies, ref, root)
        return 0
    deadline = time.time() + spec.timeout if spec.timeout else None
    logs = Path(root) / spec.name / "workers"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", ACCROT_SWEEP_STORAGE=ref.url,
               ACCROT_SWEEP_DEADLINE="" if deadline is None else repr(deadline))
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    gpus = _gpu_ids()
    retry = RetryTrial(spec.retries)
    claims: list[int] = []  # open, flock'ed claim files: this parent's worker indices
    next_index = 0

    def claim_index() -> int:
        """The lowest worker index no live parent of this sweep holds. The index offsets the sampler seed, so two
        parents started at once (on one machine or on nodes sharing the root) must not both run worker 0: their
        samplers would draw the same configurations. flock is released when a parent dies, so a crash leaves
        no stale claim behind."""
        import fcntl

        nonlocal next_index
        while True:
            i, next_index = next_index, next_index + 1
            fd = os.open(logs / f".worker-{i}.claim", os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held by another parent
                os.close(fd)
                continue
            claims.append(fd)
            return i

    def spawn() -> _Worker:
        i = claim_index()
        wenv = dict(env)
        if len(gpus) > 1:  # one GPU per worker, round robin
            wenv["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]
        log = logs / f"worker-{i}.log"
        cmd = [sys.executable, "-c", _WORKER_BOOT, "sweep", str(spec.path), "--worker",
               f"--root={root}", f"--worker_index={i}"]
        with open(log, "ab") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=wenv)
        return _Worker(i, proc, log)

    def work_left() -> bool:
        return (deadline is None or time.time() < deadline) and retry_storage(
            lambda: any(can_start(s, spec.budget) for s in studies), "checking the budget", console)

    live = [spawn() for _ in range(workers)]
    console.print(f"{workers} worker(s); logs in {logs}; watch: make dashboard STORAGE='{ref.dashboard}'")
    seen: set[tuple[str, int]] = set()
    respawns, max_respawns = 0, workers * max(1, spec.retries)
    failed_workers = 0
    next_report = time.monotonic() + REPORT_EVERY
    try:
        while live:
            time.sleep(0.5)
            for w in list(live):
                rc = w.proc.poll()
                if rc is None:
                    continue
                live.remove(w)
                if rc == 0:
                    continue
                failed_workers += 1
                reason = f"worker {w.id} {_describe_exit(rc)} while running the trial"
                n = retry_storage(lambda w=w, reason=reason: sum(
                    fail_trial(s, storage, t, reason, retry) for s in studies
                    for t in s.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                    if t.user_attrs.get("worker") == w.id), "failing the dead worker's trial", console)
                console.print(f"[red]worker {w.index} ({w.id}) {_describe_exit(rc)}[/]: {n} running trial(s) "
                              f"failed{' and re-queued' if spec.retries else ''}; log: {w.log}")
                if work_left() and respawns < max_respawns:
                    respawns += 1
                    live.append(spawn())
            # reading every study's trials costs the parent a good part of a core with many studies (the
            # ablation has 22): report finished trials every few seconds, not at every liveness check
            if time.monotonic() >= next_report:
                retry_storage(lambda: _print_finished(console, studies, seen), "reading the trials", console)
                next_report = time.monotonic() + REPORT_EVERY
    except KeyboardInterrupt:
        for w in live:  # a terminal's Ctrl-C reached them too: give them time, then terminate, then kill
            for sig, wait in ((None, 10), (signal.SIGTERM, 20), (signal.SIGKILL, None)):
                if sig is not None:
                    w.proc.send_signal(sig)
                try:
                    w.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        for s in studies:
            for t in s.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                if any(t.user_attrs.get("worker") == w.id for w in live):
                    fail_trial(s, storage, t, "the sweep was interrupted", retry)
        raise
    finally:
        for fd in claims:
            os.close(fd)
    retry_storage(lambda: _print_finished(console, studies, seen), "reading the trials", console)
    left = retry_storage(lambda: [s.study_name for s in studies if can_start(s, spec.budget)], "the budget", console)
    retry_storage(lambda: _print_summary(console, spec, studies, ref, root), "the summary", console)
    if left and (deadline is None or time.time() < deadline):
        console.print(f"[red]unfinished: {', '.join(left)} ({failed_workers} worker(s) died)[/]")
        return 1
    dead = retry_storage(lambda: _all_failed(studies), "the failed studies", console)
    if dead:
        console.print(f"[red]every trial failed in {len(dead)} of {len(studies)} stud{'y' if len(studies) == 1 else 'ies'}: "
                      + "; ".join(f"{name} ({n} failed; first: {why})" for name, n, why in dead[:3]) + "[/]")
        return 1
    return 0


def _all_failed(studies) -> list[tuple[str, int, str]]:
    """``(study, failed trials, first reason)`` of every study whose finished trials all failed."""
    out = []
    for s in studies:
        finished = s.get_trials(deepcopy=False, states=_FINISHED)
        failed = [t for t in finished if t.state == TrialState.FAIL]
        if finished and len(failed) == len(finished):
            why = next((t.user_attrs.get("fail_reason") for t in failed if t.user_attrs.get("fail_reason")), "?")
            out.append((s.study_name, len(failed), " ".join(str(why).split())[:200]))
    return out


REPORT_EVERY = 5.0  # seconds between the parent's reads of finished trials


def _gpu_ids() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001
        return []


def _print_finished(console, studies, seen: set) -> None:
    for s in studies:
        for t in s.get_trials(deepcopy=False, states=_FINISHED):
            if (s.study_name, t.number) in seen:
                continue
            seen.add((s.study_name, t.number))
            if t.state == TrialState.COMPLETE:
                names = s.user_attrs.get("accrot", {}).get("objectives", [])
                what = ", ".join(f"{n}={v:.4f}" for n, v in zip(names, t.values))
            else:
                what = t.user_attrs.get("fail_reason") or t.user_attrs.get("pruned_reason", "")
            console.print(f"{s.study_name} #{t.number} {t.state.name.lower()} seed={t.user_attrs.get('seed')} "
                          f"{what}", markup=False)


def _print_summary(console, spec: SweepSpec, studies, ref: StorageRef, root: Path) -> None:
    for s in studies:
        trials = s.get_trials(deepcopy=False)
        counts = {st.name.lower(): sum(t.state == st for t in trials) for st in _FINISHED}
        line = f"{s.study_name}: " + ", ".join(f"{v} {k}" for k, v in counts.items())
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        if done and len(spec.objectives) == 1:
            best = s.best_trial
            line += f"; best #{best.number} {spec.objectives[0].metric}={best.value:.4f} {best.params}"
        console.print(line, markup=False)
    default = StorageRef.parse(None, spec.name, "runs/sweeps").url == ref.url
    where = "" if default else f" --storage '{redact(ref.url)}'"
    console.print(f"report: accrot report --study {spec.name}{where}", markup=False)


# ---------------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    """``accrot sweep SPEC [--workers N] [--storage URL]``: run an Optuna study spec."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog="accrot sweep", exit_on_error=False, description=main.__doc__)
    parser.add_argument("spec", type=str, help="a spec file (sweeps/smoke.yaml) or a shipped spec's name (smoke)")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes on this machine (0: validate and create the study only)")
    parser.add_argument("--storage", type=str | None, default=None,
                        help="sqlite:///PATH, postgresql://USER@HOST/DB or journal:///ABS/PATH.log "
                             "(default: the spec's, else <root>/<name>/study.db)")
    parser.add_argument("--root", type=str | None, default=None, help="run root (default: the spec's root)")
    parser.add_argument("--worker", action="store_true",
                        help="run as a worker on an existing study (other nodes; the driver starts these itself)")
    parser.add_argument("--worker_index", type=int, default=0, help="offsets the sampler seed of a worker")
    parser.add_argument("--distributed", action="store_true",
                        help="with --worker, under srun/torchrun: this process is one rank; every trial is a DDP run "
                             "over all ranks (rank 0 talks to Optuna; accrot.sweep_ddp)")
    parser.add_argument("--nodes", type=int | None, default=None, help="--distributed: nodes (default: SLURM_NNODES)")
    parser.add_argument("--tasks_per_node", type=int | None, default=None,
                        help="--distributed: ranks per node (default: SLURM_NTASKS_PER_NODE or LOCAL_WORLD_SIZE)")
    args = parser.parse_args(argv)
    if args.distributed and not args.worker:
        raise UsageError("--distributed is an option of a worker: accrot sweep SPEC --worker --distributed --storage URL")
    if args.workers < 0:
        raise UsageError(f"worker count {args.workers} is not valid; use 0 (create the study only) or more")
    spec = load_spec(args.spec)
    root = Path(args.root or spec.root).resolve()
    url = args.storage or (os.environ.get("ACCROT_SWEEP_STORAGE") if args.worker else None) or spec.storage
    ref = StorageRef.parse(url, spec.name, root)
    if args.worker:
        deadline = os.environ.get("ACCROT_SWEEP_DEADLINE")
        deadline = float(deadline) if deadline else (time.time() + spec.timeout if spec.timeout else None)
        if args.distributed:
            from accrot.sweep_ddp import run_distributed_worker

            return run_distributed_worker(spec, ref, root, args.worker_index, deadline, args.nodes, args.tasks_per_node)
        return run_worker(spec, ref, root, args.worker_index, deadline)
    return run_sweep(spec, ref, root, args.workers)

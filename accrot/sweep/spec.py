"""The sweep spec (``sweeps/*.yaml``): typed sections for the search space, objective(s), sampler, pruner,
heartbeat and strata, checked on load so every mistake is one line naming the key and what is valid."""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import itertools
import json
import math
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import optuna
import yaml

from accrot.errors import UsageError, check_choice, one_line
from accrot.io import load_yaml
from accrot.metrics import metric_key, parse_metric
from accrot.options import Kind
from accrot.run.args import config_path

SPEC_DIR = Path(__file__).resolve().parents[2] / "sweeps"
ParamType = Literal["categorical", "int", "float"]
SamplerType = Literal["tpe", "random", "grid", "nsga2"]
PrunerType = Literal["median", "hyperband", "threshold", "none"]
WandbMode = Literal["auto", "online", "offline", "disabled"]
Direction = Literal["minimize", "maximize"]
ArtifactStoreType = Literal["filesystem", "s3", "gcs", "none"]
# the driver sets these per trial; a spec must not
RESERVED_KEYS = ("config", "root", "name", "seed_everything", "wandb", "print_config", "ckpt_path")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
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
    for key, value in data.items():
        problem = _type_problem(_field_types(cls).get(key), value)
        if problem:
            raise UsageError(f"{where}: {key}={value!r} is not valid; {problem}")
    try:
        return cls(**data)
    except UsageError as err:
        raise UsageError(f"{where}: {err}") from None
    except (TypeError, ValueError) as err:
        raise UsageError(f"{where}: {one_line(str(err))}") from None


_SIMPLE = {int: "an integer", bool: "true or false", str: "a string", type(None): "null"}


def _field_types(cls) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(cls)


def _type_problem(hint: Any, value: Any) -> str | None:
    """What is wrong with ``value`` for a field annotated ``hint``, judged on the plain types alone (int, bool, str,
    None and unions of them): every field of every spec section is typed-checked the same way, so a field added
    later is too. Fields that take numbers (YAML 1.1 reads ``1e-4`` as a string), choices or mappings are checked
    by their section."""
    import types
    import typing

    members = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    if hint is None or not all(m in _SIMPLE for m in members):
        return None
    if any(isinstance(value, m) and not (m is int and isinstance(value, bool)) for m in members):
        return None
    return "expected " + " or ".join(_SIMPLE[m] for m in members)


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

    type: ParamType = "categorical"
    choices: list | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    when: dict | None = None

    def __post_init__(self) -> None:
        check_choice("type", self.type, ParamType)
        if not isinstance(self.log, bool):
            raise ValueError(f"log={self.log!r} is not valid; use true or false")
        if self.type == "categorical":
            self._check_categorical()
        else:
            self._check_numeric()
        if self.when is not None:
            self._check_when()

    def _check_categorical(self) -> None:
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

    def _check_numeric(self) -> None:
        if self.choices is not None:
            raise ValueError(f"choices is for categorical parameters; a {self.type} parameter takes low and high")
        self.low, self.high, self.step = (_number(self.low, "low"), _number(self.high, "high"),
                                          _number(self.step, "step"))
        if self.low is None or self.high is None:
            raise ValueError(f"a {self.type} parameter needs low and high")
        if self.type == "int":
            for name in ("low", "high", "step"):
                value = getattr(self, name)
                if value is not None and float(value) != int(value):
                    raise ValueError(f"{name}={value!r} is not valid for an int parameter; use an integer")
                setattr(self, name, None if value is None else int(value))
        if not self.low <= self.high:
            raise ValueError(f"low={self.low!r} > high={self.high!r}")
        if self.log and self.low <= 0:
            raise ValueError(f"low={self.low!r} is not valid with log: true; it must be > 0")
        if self.step is not None and (self.step <= 0 or self.log):
            raise ValueError(f"step={self.step!r} is not valid; a positive step, and not with log: true")

    def _check_when(self) -> None:
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
    direction: Direction | None = None

    def __post_init__(self) -> None:
        field_, mult = parse_metric(self.metric)
        self.metric = metric_key(field_, mult)  # canonical: nll@16x
        if self.direction is None:
            self.direction = "maximize" if field_ == "accuracy" else "minimize"
        check_choice("direction", self.direction, Direction)

    @property
    def multiplier(self) -> float:
        return parse_metric(self.metric)[1]


@dataclass
class SamplerSpec:
    """``type``: tpe | random | grid | nsga2. TPE options: n_startup_trials (10), multivariate (true: a
    grouped multivariate TPE that models conditional spaces), constant_liar (true: parallel workers do not
    pile onto one point). NSGA-II: population_size (50). ``seed`` is offset per worker."""

    type: SamplerType = "tpe"
    seed: int | None = 0
    n_startup_trials: int | None = None
    multivariate: bool | None = None
    constant_liar: bool | None = None
    population_size: int | None = None

    _OPTIONS = {"tpe": ("n_startup_trials", "multivariate", "constant_liar"), "random": (), "grid": (),
                "nsga2": ("population_size",)}

    def __post_init__(self) -> None:
        check_choice("type", self.type, SamplerType)
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
        with quiet_experimental():
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
    """Optuna's grid sampler without its ``after_trial`` stop rule, which reads a ``grid_id`` that enqueued trials
    (seed copies and retries) never get. The budget lock ends every study instead."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


@dataclass
class PrunerSpec:
    """``type``: median | hyperband | threshold | none. Steps are optimiser steps of the extrapolation
    evaluations (``extrapolation.every_n_steps``). Median: n_startup_trials (5), n_warmup_steps (0),
    interval_steps (1). Hyperband: min_resource (1), max_resource ("auto"), reduction_factor (3).
    Threshold: lower and/or upper bound on the reported metric."""

    type: PrunerType = "none"
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
        check_choice("type", self.type, PrunerType)
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
class ArtifactsSpec:
    """Where every trial's files (curves, diagnostics, config, run record) go, for the dashboard to show.
    ``filesystem`` (default): ``path``, or ``<root>/<name>/artifacts`` beside the study (a shared filesystem on a
    cluster); ``s3`` / ``gcs``: ``bucket`` (boto3 / google-cloud-storage must be installed); ``none``: no uploads."""

    type: ArtifactStoreType = "filesystem"
    path: str | None = None
    bucket: str | None = None

    def __post_init__(self) -> None:
        check_choice("type", self.type, ArtifactStoreType)
        if self.type in ("s3", "gcs") and not self.bucket:
            raise ValueError(f"an {self.type} artifact store needs bucket")
        if self.type != "filesystem" and self.path is not None:
            raise ValueError(f"path is for the filesystem artifact store, not {self.type}")

    def directory(self, root: Path, name: str) -> Path | None:
        """The filesystem store's folder (what ``optuna-dashboard --artifact-dir`` takes)."""
        if self.type != "filesystem":
            return None
        return Path(self.path).resolve() if self.path else (Path(root) / name / "artifacts").resolve()

    def build(self, root: Path, name: str):
        """The store, retried with backoff like the storage (a few tries: an upload never holds a run up long)."""
        from optuna.artifacts import Backoff, Boto3ArtifactStore, FileSystemArtifactStore, GCSArtifactStore

        if self.type == "none":
            return None
        if self.type == "filesystem":
            store = FileSystemArtifactStore(self.directory(root, name))  # made at the first upload
        elif self.type == "s3":
            store = Boto3ArtifactStore(self.bucket)
        else:
            store = GCSArtifactStore(self.bucket)
        return Backoff(store, max_retries=3, min_delay=0.1, max_delay=2.0)


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
    sampler: SamplerSpec | Mapping | None = None  # a mapping in the YAML, checked into the spec
    pruner: PrunerSpec | Mapping | None = None
    trials: int | None = None
    timeout: float | None = None
    seeds: list = field(default_factory=lambda: [0])
    storage: str | None = None
    root: str = "runs/sweeps"
    wandb: WandbMode = "auto"
    retries: int = 1
    heartbeat: HeartbeatSpec | Mapping | None = None
    artifacts: ArtifactsSpec | Mapping | None = None
    shared_study: bool = False  # variants of a group share one study, the variant and seed trial parameters
    description: str = ""
    path: Path = field(default=Path("."), init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME.match(self.name):
            raise ValueError(f"name={self.name!r} is not valid; letters, digits and _ . + - (it names the study)")
        if not isinstance(self.base, str) or not self.base:
            raise ValueError("base is required: a shipped config name (tiny) or a YAML path")
        self._check_objectives()
        for section in ("space", "overrides", "variants"):
            value = getattr(self, section)
            if value is None:
                setattr(self, section, {})
            elif not isinstance(value, Mapping):
                raise ValueError(f"{section} must be a mapping of dotted keys")
        self.overrides = self._check_overrides(self.overrides, "overrides")
        self._check_space()
        self._check_variants()
        self.sampler = _strict(SamplerSpec, self.sampler, "sampler")
        self.pruner = _strict(PrunerSpec, self.pruner, "pruner")
        self.heartbeat = _strict(HeartbeatSpec, self.heartbeat, "heartbeat")
        self.artifacts = _strict(ArtifactsSpec, self.artifacts, "artifacts")
        if len(self.objectives) > 1 and self.pruner.type != "none":
            raise ValueError(f"pruner {self.pruner.type!r} needs a single objective (this spec has "
                             f"{len(self.objectives)}); set pruner: {{type: none}}")
        self._check_budget()
        self._check_run_settings()
        self._check_shared()

    def _check_objectives(self) -> None:
        if not isinstance(self.objectives, list) or not self.objectives:
            raise ValueError("objectives is required: a list such as [{metric: nll@16x, direction: minimize}]")
        self.objectives = [_strict(ObjectiveSpec, {"metric": o} if isinstance(o, str) else o, f"objectives[{i}]")
                           for i, o in enumerate(self.objectives)]
        if len({o.metric for o in self.objectives}) != len(self.objectives):
            raise ValueError("objectives repeat a metric")

    def _check_space(self) -> None:
        """Every dimension a ParamSpec over a dotted key; a condition names an earlier dimension only."""
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

    def _check_variants(self) -> None:
        """Named override sets; no key is both fixed (overrides or a variant) and searched."""
        variants = {}
        for vname, vover in self.variants.items():
            if not NAME.match(str(vname)):
                raise ValueError(f"variant name {vname!r} is not valid; letters, digits and _ . + -")
            variants[str(vname)] = self._check_overrides(vover or {}, f"variants.{vname}")
        self.variants = variants
        for where, fixed in [("overrides", self.overrides), *((f"variants.{v}", o) for v, o in variants.items())]:
            searched = sorted(set(fixed) & set(self.space))
            if searched:
                raise ValueError(f"{where} sets {searched[0]!r}, which the space searches; keep it in one place")

    def _check_budget(self) -> None:
        """``trials`` configurations per study (a grid's size by default, and never more)."""
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
        if not self.space and self.trials > 1:  # nothing to sample: the trials would all be one config
            raise ValueError(f"space is empty, so each of trials={self.trials} would run the same config; give the "
                             "space its search keys, or set trials: 1 (seeds: repeats each config)")
        self.timeout = _number(self.timeout, "timeout")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"timeout={self.timeout!r} is not valid; seconds (> 0) or null")

    def _check_run_settings(self) -> None:
        if (not isinstance(self.seeds, list) or not self.seeds
                or not all(isinstance(s, int) and not isinstance(s, bool) for s in self.seeds)
                or len(set(self.seeds)) != len(self.seeds)):
            raise ValueError(f"seeds={self.seeds!r} is not valid; a list of distinct integers (one run per seed)")
        check_choice("wandb", self.wandb, WandbMode)
        if not isinstance(self.retries, int) or isinstance(self.retries, bool) or self.retries < 0:
            raise ValueError(f"retries={self.retries!r} is not valid; a non-negative integer")
        if self.storage is not None and not isinstance(self.storage, str):
            raise ValueError(f"storage={self.storage!r} is not valid; a URL string or null")

    def _check_shared(self) -> None:
        """``shared_study``: the fixed grid (variants × grid points × seeds) queued in one study per group, so the
        dashboard compares variants on one page. Tuning samplers and pruners compare the trials of a study with
        each other, which would tune and prune across variants: those specs keep one study per variant."""
        if not isinstance(self.shared_study, bool):
            raise ValueError(f"shared_study={self.shared_study!r} is not valid; true or false")
        if not self.shared_study:
            return
        if not self.variants:
            raise ValueError("shared_study: true needs variants (they become the `variant` parameter of one study)")
        if self.sampler.type != "grid":
            raise ValueError(f"shared_study: true runs a fixed grid; set sampler: {{type: grid}} (sampler "
                             f"{self.sampler.type!r} would tune across variants: keep one study per variant)")
        if self.pruner.type != "none":
            raise ValueError(f"shared_study: true needs pruner: {{type: none}} (pruner {self.pruner.type!r} would "
                             "compare, and prune, one variant against another)")
        taken = sorted({"variant", "seed"} & set(self.space))
        if taken:
            raise ValueError(f"space key {taken[0]!r} is a parameter of a shared study; rename it")

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
        """Optuna trials per variant: configurations × seeds (a study's: :meth:`budget_of`)."""
        return self.trials * len(self.seeds)

    def budget_of(self, study_name: str) -> int:
        """Optuna trials of one study: configurations × seeds × the variants it holds."""
        return self.budget * len(self.studies()[study_name])

    def grid(self) -> list[dict]:
        """Every point of a grid space, in the order a shared study queues them."""
        keys = list(self.space)
        values = [self.space[k].grid_values(k) for k in keys]
        return [dict(zip(keys, point)) for point in itertools.product(*values)]

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    def strata(self) -> list[Stratum]:
        if not self.variants:
            return [Stratum(None, {}, self.name)]
        return [Stratum(v, o, self._study_of(v)) for v, o in self.variants.items()]

    def studies(self) -> dict[str, list[Stratum]]:
        """Each study's strata: one per study, or, with ``shared_study``, every variant of its group."""
        out: dict[str, list[Stratum]] = {}
        for stratum in self.strata():
            out.setdefault(stratum.study_name, []).append(stratum)
        return out

    def _study_of(self, variant: str) -> str:
        """``<spec>/<variant>``; shared: ``<spec>/<group>``, the group being the name before its first ``.`` (the
        ablation's data set: ``corpus.RoPE`` is in ``ablation/corpus``), or ``<spec>`` for names without one."""
        if not self.shared_study:
            return f"{self.name}/{variant}"
        group, dot, _ = variant.partition(".")
        return f"{self.name}/{group}" if dot else self.name

    def base_path(self) -> Path:
        p = Path(self.base)
        if not p.exists() and p.suffix and (self.path.parent / p).exists():
            p = self.path.parent / p  # relative to the spec file
        return Path(config_path(str(p))).resolve()

    def fingerprint(self, seeds: bool = True) -> str:
        """What makes trials of a study comparable: a re-run with a changed spec must not join the study.
        ``seeds=False``: the same without the seeds, which a shared study's grid may grow by (staged seeds)."""
        doc = {"base": self.base, "objectives": [(o.metric, o.direction) for o in self.objectives],
               "space": {k: vars(p) for k, p in self.space.items()}, "overrides": self.overrides,
               "variants": self.variants, **({"seeds": self.seeds} if seeds else {})}
        if self.shared_study:  # only when set: studies made before the key existed keep their fingerprint
            doc["shared_study"] = True
        return hashlib.sha1(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def find_spec(name: str) -> Path:
    """A spec by path, or by name from ``./sweeps`` or the shipped ``sweeps/``."""
    p = Path(name)
    if p.is_file():
        return p
    if p.is_dir():
        raise UsageError(f"sweep spec {name!r} is a folder; give a spec file (sweeps/smoke.yaml) or a shipped spec's "
                         f"name ({', '.join(sorted(f.stem for f in SPEC_DIR.glob('*.yaml')))})")
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
        data = load_yaml(path.read_text())
    except yaml.YAMLError as err:
        raise UsageError(f"{path}: not valid YAML ({one_line(str(err))})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{path}: cannot be read ({getattr(err, 'strerror', None) or err})") from None
    if not isinstance(data, dict) or not data:  # empty, comments only, `---`, or a list or a scalar
        what = "empty (no keys)" if not data else f"a {type(data).__name__}, not a mapping of keys"
        raise UsageError(f"{path}: the spec is {what}; a spec holds name:, base:, space: ... (see sweeps/smoke.yaml)")
    spec = _strict(SweepSpec, data, str(path))
    spec.path = path.resolve()
    return spec


@contextlib.contextmanager
def quiet_experimental() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _check_spec(flag: str, value) -> None:
    load_spec(str(value))  # found, read and checked whole: every problem is one line naming the file and the key


SPEC = Kind("spec", _check_spec, ("MISSING", "A_DIR", "EMPTY_YAML", "COMMENTS_YAML", "DASHES_YAML", "LIST_YAML", ""),
            "a spec file or a shipped spec's name")

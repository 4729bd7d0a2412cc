"""From a spec to trial configs: sampling a stratum's space, a trial's ``accrot fit`` arguments, and the check of
every stratum (and every value of its space) by the real CLI parser, without training."""

from __future__ import annotations

import difflib
import json
import math
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from accrot.errors import UsageError, bad_input_message
from accrot.metrics import metric_key
from accrot.sweep.spec import ParamSpec, Stratum, SweepSpec


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
    flat = _probe_or_explain(base_args, f"{where}: overrides are not valid", setup=True)
    context = _check_keys(spec, flat, where)
    _check_one_device(flat, where)
    multipliers = _check_objectives(spec, flat, where)
    train_length = flat.get("data.init_args.seq_len", flat.get("data.seq_len"))
    _check_samples(spec, stratum, where, context, n_samples, seed)
    return StratumInfo(context=context, multipliers=multipliers,
                       train_length=int(train_length) if train_length is not None else None)


_SET_UP: set[str] = set()  # the data and evaluation settings whose set-up a probe has checked (in this process)


def _probe_or_explain(args: list[str], what: str, setup: bool = False) -> dict[str, Any]:
    """``setup``: the stratum's set-up (evaluation blocks cut from its data) checked as well, once per distinct
    data and evaluation settings: the strata of an ablation share a few."""
    from accrot.run.probe import probe  # imports Lightning: not at `accrot sweep --help`

    try:
        if setup:
            key = json.dumps([a for a in args if a.startswith(("--data", "--extrapolation", "--trainer.callbacks",
                                                               "--config"))])
            flat = probe(args, setup=key not in _SET_UP)
            _SET_UP.add(key)
            return flat
        return probe(args)
    except Exception as err:  # noqa: BLE001 - a bad value of the spec is the spec's bad input
        message = bad_input_message(err)
        if message is None:
            raise
        raise UsageError(f"{what}: {message}") from None


def _check_keys(spec: SweepSpec, flat: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Every searched key and every condition key is a key of the config; returns the conditions' config values."""
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
    return context


def _check_one_device(flat: Mapping[str, Any], where: str) -> None:
    """A worker runs its trials in-process: Lightning cannot re-launch one per rank."""
    from accrot.run.launch import device_count  # imports torch: not at a worker's start

    devices, nodes = flat.get("trainer.devices"), flat.get("trainer.num_nodes") or 1
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)  # "2" (Lightning also takes "0,1" and "auto")
    if (device_count(devices) or 1) > 1 or int(nodes) > 1:
        raise UsageError(f"{where}: trainer.devices={devices!r}, trainer.num_nodes={nodes!r}: a sweep trial runs on "
                         "one device in its worker (workers share GPUs round robin); use trainer.devices=1")


def _check_objectives(spec: SweepSpec, flat: Mapping[str, Any], where: str) -> list[float]:
    """Every objective is a length the runs evaluate; returns the evaluated multipliers."""
    multipliers = [float(m) for m in (flat.get("extrapolation.multipliers") or [])]
    for o in spec.objectives:
        if not any(math.isclose(o.multiplier, m) for m in multipliers):
            raise UsageError(f"{where}: objective {o.metric!r} is never produced: the runs evaluate at "
                             f"multipliers {', '.join(f'{m:g}' for m in multipliers)} "
                             f"(set extrapolation.multipliers in overrides, or use one of "
                             f"{', '.join(metric_key('nll', m) for m in multipliers)})")
    return multipliers


def _check_samples(spec: SweepSpec, stratum: Stratum, where: str, context: Mapping[str, Any], n_samples: int,
                   seed: int) -> None:
    """Sampled configs go through the real parser too (values, cross-field checks, the pruning callback), then
    every value of the space on top of the last sample."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed), directions=spec.directions)
    finally:
        optuna.logging.set_verbosity(verbosity)
    values: dict[str, Any] = {}
    for _ in range(n_samples):
        trial = study.ask()
        values = sample_space(trial, spec.space, context)
        args = trial_args(spec, stratum, Path(tempfile.gettempdir()), trial.number, spec.seeds[0], values)
        _probe_or_explain(args, f"{where}: sampled config {render(values)} is not valid")
        study.tell(trial, [0.0] * len(spec.objectives))
    if n_samples:
        _check_every_value(spec, stratum, where, values, context)


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
            _probe_or_explain(trial_args(spec, stratum, Path(tempfile.gettempdir()), 0, spec.seeds[0], values),
                              f"{where}: space.{key} value {value!r} is not valid")

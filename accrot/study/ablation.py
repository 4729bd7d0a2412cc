"""``accrot ablation``: the paper's controlled experiment in one command (PAPER.md).

It trains every variant of :data:`VARIANTS` on each data set of :data:`DATASETS` with the same recipe, token
budget, seeds and evaluation blocks, evaluates each run to 64× its training length, runs the theory
diagnostics on the corpus models, and writes ``<out>/<study>/REPORT.md`` (:mod:`accrot.study.report` builds it): the
tables, the figures and every claim of PAPER.md marked supported / not supported / inconclusive.

It is a sweep (:mod:`accrot.sweep`): one Optuna study per data set (``<study>/corpus``, ``<study>/local``), in which
the whole grid of variants × seeds (one learning rate) is queued at the start, each trial carrying its variant and
seed. The spec it generates is written beside the results (``<study>.yaml``), so

* a second ``accrot ablation`` with the same options resumes: trials already complete are not run again (the
  storage knows them), an interrupted one is retried;
* ``--workers N`` runs N worker processes; ``--storage postgresql://...`` lets workers on other machines
  (``accrot sweep <out>/<study>/<study>.yaml --worker --storage URL``, or ``accrot slurm sweep``) join;
* ``--report_only`` rebuilds the report from whatever trials are complete.

Sizes (:data:`SIZES`): ``study`` (the default: the shipped tiny recipe at d_model 96, L = 128, 300 steps, 3 seeds:
about 50 minutes on 2 CPU cores, the size measured to resolve the claims there), ``tiny`` (the tiny recipe, d 64,
at 150 steps, 2 seeds, evaluated to 32× L: a 12-minute quick look whose verdicts are mostly inconclusive), ``small`` (small.yaml, L = 512, 5000
steps, 3 seeds: a GPU), ``paper`` (small.yaml's shape at 20 000 steps and batch 32, 3 seeds: a GPU node or a
cluster).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from accrot.errors import DataError, UsageError
from accrot.io import atomic_write_text
from accrot.run.args import config_path
from accrot.study.report import build_report, write_notes
from accrot.study.variants import (
    DATASETS,
    DEFAULT_DATASETS,
    DEFAULT_VARIANTS,
    MIN_SEQ_LEN,
    SIZES,
    VARIANTS,
    WINDOW_FRACTION,
    WINDOWED,
    Size,
)
from accrot.sweep.parent import Terminated, run_sweep
from accrot.sweep.spec import load_spec
from accrot.sweep.storage import StorageRef


def checkpoint_callback(base: str) -> dict[str, Any]:
    """The recipe's own checkpoint callback (a ``trainer.callbacks`` override replaces the whole list)."""
    doc = yaml.safe_load(Path(config_path(base)).read_text())
    (ckpt,) = [c for c in doc["trainer"]["callbacks"] if c["class_path"].endswith("ModelCheckpoint")]
    return ckpt


def build_spec(study: str, size: Size, seeds: int, variants: list[str], datasets: list[str],
               wandb: str = "auto", max_steps: int | None = None,
               multipliers: list[float] | None = None, text_root: str | None = None) -> dict[str, Any]:
    """The sweep spec of the ablation (``accrot sweep`` reads the same YAML); ``text_root``: the folder of
    ``.txt`` files of the ``text`` data set."""
    multipliers = list(multipliers or size.multipliers)
    longest = max(multipliers)
    diag = sorted({m for m in size.diagnostics if m <= longest} | {1, longest})
    common = {**size.overrides, "extrapolation.multipliers": multipliers}
    if max_steps is not None:
        common["trainer.max_steps"] = max_steps
    ckpt = checkpoint_callback(size.base)
    diagnostics = {"class_path": "callbacks.diagnostics.DiagnosticsCallback",
                   "init_args": {"multipliers": diag, "blocks": 2, "draws": size.fresh_draws}}
    strata: dict[str, dict[str, Any]] = {}
    for data in datasets:
        for label in variants:
            over = {f"model.scheme.{k}": v for k, v in VARIANTS[label].items()}
            seq_len = max(size.seq_len, MIN_SEQ_LEN.get(data, 0))
            if label in WINDOWED:
                over["model.scheme.window"] = WINDOW_FRACTION * seq_len
            over.update(DATASETS[data])
            if seq_len != size.seq_len:
                over["data.init_args.seq_len"] = seq_len
            if data == "text":
                over["data.init_args.root"] = text_root
            # the theory diagnostics (T1–T4) on the corpus models
            over["trainer.callbacks"] = [ckpt, diagnostics] if data == "corpus" else [ckpt]
            strata[f"{data}.{label}"] = over
    return {
        "name": study,
        "description": "accrot ablation: the variants of PAPER.md on each data set, same recipe, budget and seeds",
        "base": size.base,
        "overrides": common,
        "space": {"model.lr": [size.lr]},  # one point: the grid is variants × seeds, nothing is tuned
        "variants": strata,
        # one study per data set (ablation/corpus, ...): its trials carry the variant and seed as parameters, so one
        # dashboard page compares the variants; the whole grid is queued at the start (resumes where it stopped)
        "shared_study": True,
        "objectives": [{"metric": "nll@1x", "direction": "minimize"}],
        "sampler": {"type": "grid", "seed": 0},
        "pruner": {"type": "none"},
        "seeds": list(range(seeds)),
        "wandb": wandb,
        "retries": 2,
    }


HELP = ("The paper's ablation in one command: every variant on each data set (default: the embedded corpus and the "
        "local-dependency task) with the same recipe, token budget, seeds and evaluation blocks, evaluated to 64x L "
        "(32x at --size tiny), the theory diagnostics on the corpus models, and REPORT.md with the tables, figures "
        "and every claim marked supported / not supported / inconclusive, in --out/ablation-SIZE/. It is a sweep "
        "with one Optuna study per data set, the whole grid of variants x seeds queued at the start; it resumes: run "
        "the same command again after an interruption. Sizes: study (default; 78 runs, about 50 min on 2 CPU "
        "cores), tiny (a 12-minute quick look), small and paper (a GPU); --max_steps, --seeds and --multipliers "
        "below a size's make a quick look, which the report marks as such.")


def main(argv: list[str]) -> int:
    """``accrot ablation [--size study|tiny|small|paper] [--seeds N] [--workers N] [--storage URL] [--out results]``."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog="accrot ablation", exit_on_error=False, description=HELP)
    parser.add_argument("--size", type=str, default="study",
                        help="study (the default), tiny, small or paper (see the README for costs)")
    parser.add_argument("--seeds", type=int | None, default=None, help="seeds per variant (default: the size's)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes on this machine (0: none)")
    parser.add_argument("--storage", type=str | None, default=None,
                        help="Optuna storage URL (default: sqlite under <out>/<study>/)")
    parser.add_argument("--out", type=str, default="results", help="results folder")
    parser.add_argument("--study", type=str | None, default=None, help="study name (default: ablation-<size>)")
    # nargs: `--variants NoPE RoPE` as a shell user types it; `--variants '[NoPE, RoPE]'` (YAML) works too
    parser.add_argument("--variants", type=str, nargs="+", default=None, help=f"subset of: {', '.join(VARIANTS)}")
    parser.add_argument("--datasets", type=str, nargs="+", default=None,
                        help=f"any of: {', '.join(DATASETS)} (default: {', '.join(DEFAULT_DATASETS)})")
    parser.add_argument("--text_root", type=str | None, default=None,
                        help="the folder of .txt files of the `text` data set (any depth; split by file)")
    parser.add_argument("--max_steps", type=int | None, default=None, help="override the size's training steps")
    parser.add_argument("--multipliers", type=str, nargs="+", default=None,
                        help="evaluation lengths as multiples of L (default: 1 2 4 ... 64)")
    parser.add_argument("--wandb", type=str, default="auto", help="auto, online, offline or disabled")
    parser.add_argument("--report_only", action="store_true", help="only rebuild REPORT.md from complete trials")
    parser.add_argument("--quiet", action="store_true",
                        help="one line per finished run instead of the live display (also when stderr is no terminal)")
    args = parser.parse_args(argv)
    args.variants, args.datasets = _words(args.variants, "--variants"), _words(args.datasets, "--datasets")
    args.multipliers = _numbers(_words(args.multipliers, "--multipliers"))

    size, seeds, variants, datasets = _check_args(args)
    study = args.study or f"ablation-{args.size}"
    out = Path(args.out).resolve()
    folder = out / study
    spec_doc = build_spec(study, size, seeds, variants, datasets, args.wandb, args.max_steps, args.multipliers,
                          text_root=args.text_root)
    spec_path = folder / f"{study}.yaml"


    started = time.time()
    if not args.report_only:
        _write_spec(spec_path, spec_doc)
        spec = load_spec(spec_path)
        ref = StorageRef.parse(args.storage, spec.name, out)
        with _sigterm_as_interrupt():
            rc = run_sweep(spec, ref, out, args.workers, on_progress=lambda: write_notes(spec, ref), quiet=args.quiet,
                           headline=headline(describe_scope(spec_doc, args.size)))
        if rc != 0 or args.workers == 0:
            return rc
    elif not spec_path.is_file():
        raise UsageError(f"no ablation study at {folder} (no {spec_path.name}); run it first without --report_only")
    spec = load_spec(spec_path)
    ref = StorageRef.parse(args.storage, spec.name, out)
    meta = {"command": "accrot ablation " + " ".join(argv), "size": args.size, "size_cost": size.cost,
            "seeds": seeds, "workers": args.workers, "started": started,
            "scope": describe_scope(yaml.safe_load(spec_path.read_text()), args.size)}
    built = time.perf_counter()
    report = build_report(spec, ref, folder, meta, console=Console(stderr=True, highlight=False))
    # the eval-time extension rows (PI, NTK, YaRN of the RoPE runs) are evaluated here, after the sweep's split
    print(f"report: {report} (built in {time.perf_counter() - built:.0f} s, eval-time extension rows included)")
    return 0


def describe_scope(doc: dict[str, Any], size_name: str) -> dict[str, Any]:
    """What an ablation runs, read from its spec (``build_spec``'s document): variants × data sets × seeds, steps,
    model shape, training and evaluation lengths; and ``below``, where it falls short of its size preset (fewer
    steps, seeds or lengths), which makes it a quick look."""
    base = yaml.safe_load(Path(config_path(doc["base"])).read_text())
    common, strata = doc["overrides"], doc["variants"]
    steps = int(common.get("trainer.max_steps", base["trainer"]["max_steps"]))
    seq_len = base["data"]["init_args"]["seq_len"]
    scope = {
        "variants": list(dict.fromkeys(k.split(".", 1)[1] for k in strata)),
        "datasets": list(dict.fromkeys(k.split(".", 1)[0] for k in strata)),
        "seeds": len(doc["seeds"]), "runs": len(strata) * len(doc["seeds"]) * len(doc["space"]["model.lr"]),
        "steps": steps, "d_model": common.get("model.d_model", base["model"]["d_model"]),
        "n_layers": common.get("model.n_layers", base["model"]["n_layers"]),
        "train_lengths": sorted({v.get("data.init_args.seq_len", seq_len) for v in strata.values()}),
        "multipliers": [float(m) for m in common["extrapolation.multipliers"]], "preset": size_name, "below": [],
    }
    size = SIZES.get(size_name)
    if size is not None:
        preset_steps = int(size.overrides.get("trainer.max_steps", base["trainer"]["max_steps"]))
        for fewer, of, what in ((steps, preset_steps, "steps"), (scope["seeds"], size.seeds, "seeds")):
            if fewer < of:
                scope["below"].append(f"{fewer} {what} of its {of}")
        if max(scope["multipliers"]) < max(size.multipliers):
            scope["below"].append(f"lengths to {max(scope['multipliers']):g}× of its {max(size.multipliers):g}×")
    return scope


def headline(scope: dict[str, Any]) -> str:
    """``12 runs = 3 variants × 2 data sets × 2 seeds, 5 steps each (d 96, 2 layers, L = 128), evaluated at 1×, 2×,
    4× L; below the study preset (5 steps of its 300, ...): a quick look``: what the ablation starts."""
    def n(count: int, what: str) -> str:
        return f"{count} {what}{'s' if count != 1 else ''}"

    lengths = "/".join(str(L) for L in scope["train_lengths"])
    text = (f"{n(scope['runs'], 'run')} = {n(len(scope['variants']), 'variant')} × "
            f"{n(len(scope['datasets']), 'data set')} × {n(scope['seeds'], 'seed')}, {scope['steps']} steps each "
            f"(d {scope['d_model']}, {scope['n_layers']} layers, L = {lengths}), evaluated at "
            f"{', '.join(f'{m:g}×' for m in scope['multipliers'])} L")
    if scope["below"]:
        text += f"; below the {scope['preset']} preset ({', '.join(scope['below'])}): a quick look"
    return text


def _check_args(args) -> tuple[Size, int, list[str], list[str]]:
    """The size preset, seeds, variants and data sets the options ask for; a one-line UsageError otherwise."""
    if args.size not in SIZES:
        raise UsageError(f"--size={args.size!r} is not valid; choose one of {', '.join(SIZES)}")
    size = SIZES[args.size]
    seeds = size.seeds if args.seeds is None else args.seeds
    if seeds < 1:
        raise UsageError(f"--seeds={seeds} is not valid; at least 1 (2 or more to tell a difference from noise)")
    if args.workers < 0:
        raise UsageError(f"--workers={args.workers} is not valid; 0 (create the study only) or more")
    variants = args.variants or list(DEFAULT_VARIANTS)
    datasets = args.datasets or list(DEFAULT_DATASETS)
    for given, known, what in ((variants, VARIANTS, "variant"), (datasets, DATASETS, "data set")):
        unknown = [v for v in given if v not in known]
        if unknown:
            raise UsageError(f"unknown {what} {unknown[0]!r}; choose from {', '.join(known)}")
        if len(set(given)) != len(given):
            raise UsageError(f"a {what} is listed twice: {', '.join(given)}")
    _check_data(datasets, args)
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError(f"--max_steps={args.max_steps} is not valid; a positive number of steps")
    if args.multipliers is not None and (not args.multipliers or 1 not in args.multipliers
                                         or any(m <= 0 for m in args.multipliers)):
        raise UsageError(f"--multipliers={args.multipliers} is not valid; positive multiples of L that include 1")
    return size, seeds, variants, datasets


def _check_data(datasets: list[str], args) -> None:
    """What the optional data sets need, checked before any worker starts (one line each)."""
    if "prose" in datasets:  # the line names the package to install
        from data_modules.prose import require_program

        require_program()
    if "text" in datasets:
        if args.text_root is None:
            raise UsageError("the text data set needs --text_root DIR, a folder of .txt files")
        from data_modules.stdlib import StdlibDataModule

        args.text_root = str(Path(args.text_root).expanduser().resolve())
        try:  # lists and splits its files
            StdlibDataModule(root=args.text_root, glob=DATASETS["text"]["data.init_args.glob"])
        except DataError as err:  # the data module's advice names its glob and split options, which the ablation lacks
            if "match glob" in str(err):
                raise UsageError(f"--text_root {args.text_root!r} holds no .txt files (at any depth); pass a folder of "
                                 ".txt files") from None
            if "val_fraction" in str(err):
                raise UsageError(f"--text_root {args.text_root!r} has too few .txt files to hold out a validation "
                                 "split (5 % of the files, at least one); pass a folder with more files") from None
            raise
    elif args.text_root is not None:
        raise UsageError("--text_root is given but --datasets does not name text; add text to --datasets")


def _words(values: list[str] | None, flag: str) -> list[str] | None:
    """Items of a list flag given either as shell words (``a b``) or as one YAML list (``'[a, b]'``)."""
    if values is None:
        return None
    out: list[str] = []
    for value in values:
        if value.lstrip().startswith("["):
            try:
                items = yaml.safe_load(value)
            except yaml.YAMLError:
                items = None
            if not isinstance(items, list):
                raise UsageError(f"{flag}={value!r} is not valid; give names (a b) or one YAML list ('[a, b]')")
            out.extend(str(v) for v in items)
        else:
            out.extend(v for v in value.replace(",", " ").split())
    return out


def _numbers(values: list[str] | None) -> list[float] | None:

    if values is None:
        return None
    try:
        return [float(v) for v in values]
    except ValueError:
        raise UsageError(f"--multipliers={values} is not valid; positive multiples of L that include 1") from None


def _write_spec(path: Path, doc: dict[str, Any]) -> None:
    """Write the generated spec; an existing one with other content means other options: refuse, one line."""
    text = ("# generated by `accrot ablation`; `accrot sweep` reads it too (workers on other machines)\n"
            + yaml.safe_dump(doc, sort_keys=False))
    if path.is_file():
        old = yaml.safe_load(path.read_text())
        if old != doc:
            changed = sorted(k for k in set(old) | set(doc) if old.get(k) != doc.get(k))
            raise UsageError(f"{path.parent} holds an ablation with other options ({', '.join(changed)} differ); "
                             "pass --study NAME for a new one, or the same options to resume it")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


class _sigterm_as_interrupt:
    """SIGTERM (a scheduler, ``kill``) stops the sweep the way Ctrl-C does: workers are stopped and their running
    trials failed and re-queued, so the next ``accrot ablation`` picks them up."""
    def __enter__(self) -> None:
        self._old = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._raise)

    @staticmethod
    def _raise(signum, frame) -> None:
        raise Terminated

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGTERM, self._old)


"""``accrot ablation``: the paper's controlled experiment in one command.

It trains every variant of :data:`VARIANTS` on each data set of :data:`DATASETS` with the same recipe, token
budget, seeds and evaluation blocks, evaluates each run to 64× its training length, runs the theory
diagnostics on the corpus models, and writes ``<out>/<study>/REPORT.md`` (:mod:`accrot.study.report` builds it): the
tables, the figures and every claim of the study (accrot/study/CLAIMS.md) marked supported / not supported / inconclusive.

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
steps, 5 seeds after a learning-rate grid per variant: a GPU), ``paper`` (small.yaml's shape at 20 000 steps and
batch 32, 5 seeds after the grid: a GPU node or a cluster).
"""

from __future__ import annotations

import copy
import math
import re
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
from accrot.study.results import CORPUS
from accrot.study.tuning import headline as tuning_headline
from accrot.study.tuning import lr_table, pending, tuned, tuning_doc, tuning_name, with_lrs, without_lrs
from accrot.study.tuning import summary as lr_summary
from accrot.study.variants import (
    DATASET_VARIANTS,
    DATASETS,
    DEFAULT_DATASETS,
    DEFAULT_VARIANTS,
    MIN_SEQ_LEN,
    SIZES,
    STATE_TASKS,
    STATE_VARIANTS,
    VARIANTS,
    WINDOW_FRACTION,
    WINDOWED,
    Size,
)
from accrot.sweep.parent import Terminated, run_sweep
from accrot.sweep.spec import RESERVED_KEYS, load_spec
from accrot.sweep.storage import StorageRef


def checkpoint_callback(base: str) -> dict[str, Any]:
    """The recipe's own checkpoint callback (a ``trainer.callbacks`` override replaces the whole list)."""
    doc = yaml.safe_load(Path(config_path(base)).read_text())
    (ckpt,) = [c for c in doc["trainer"]["callbacks"] if c["class_path"].endswith("ModelCheckpoint")]
    return ckpt


def build_spec(study: str, size: Size, seeds: int, variants: list[str], datasets: list[str],
               wandb: str = "auto", max_steps: int | None = None,
               multipliers: list[float] | None = None, text_root: str | None = None, *, corpus: str = CORPUS,
               hf_source: str | None = None, tokens: int | None = None,
               settings: dict[str, Any] | None = None, only: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The sweep spec of the ablation (``accrot sweep`` reads the same YAML); ``text_root``: the folder of
    ``.txt`` files of the ``text`` data set; ``hf_source``: the hub name or local files of the ``hf`` data set;
    ``corpus``: the data set the theory diagnostics run on (and the claims read); ``tokens``: the training budget
    per run (:func:`token_budget`); ``settings``: dotted overrides for every run (``--set``, ``--precision``; a
    ``model.lr`` among them replaces the size's learning rate); ``only``: per data set, the variants it runs
    (the others run every one of ``variants``)."""
    multipliers = list(multipliers or size.multipliers)
    longest = max(multipliers)
    diag = sorted({m for m in size.diagnostics if m <= longest} | {1, longest})
    settings = dict(settings or {})
    lr = settings.pop("model.lr", size.lr)
    common = {**size.overrides, "extrapolation.multipliers": multipliers}
    if max_steps is not None:
        common["trainer.max_steps"] = max_steps
    ckpt = checkpoint_callback(size.base)
    if tokens is not None:  # the recipe's cadences at the size's length; a data set at another length gets its own
        budget, ckpt = token_budget(tokens, size, {**common, **settings}, size.seq_len)
        common.update(budget)
    common.update(settings)  # last: what the user sets wins over the size and the budget
    diagnostics = {"class_path": "callbacks.diagnostics.DiagnosticsCallback",
                   "init_args": {"multipliers": diag, "blocks": 2, "draws": size.fresh_draws}}
    strata: dict[str, dict[str, Any]] = {}
    for data in datasets:
        seq_len = max(size.seq_len, MIN_SEQ_LEN.get(data, 0))
        budget, own_ckpt = ({}, ckpt) if tokens is None or seq_len == size.seq_len else \
            token_budget(tokens, size, {**common, **settings}, seq_len)
        for label in variants:
            if only and data in only and label not in only[data]:
                continue
            over = {f"model.scheme.{k}": v for k, v in VARIANTS[label].items()}
            if label in WINDOWED:
                over["model.scheme.window"] = WINDOW_FRACTION * seq_len
            over.update(DATASETS[data])
            if seq_len != size.seq_len:
                over["data.init_args.seq_len"] = seq_len
            over.update(budget)
            if data == "text":
                over["data.init_args.root"] = text_root
            if data == "hf":
                over["data.init_args.path"] = hf_source
            # the theory diagnostics (T1–T4) on the data set the claims are read on
            over["trainer.callbacks"] = [own_ckpt, diagnostics] if data == corpus else [own_ckpt]
            strata[f"{data}.{label}"] = over
    return {
        "name": study,
        "description": "accrot ablation: the study's variants on each data set, same recipe, budget and seeds",
        "base": size.base,
        "overrides": common,
        "space": {"model.lr": [lr]},  # one point: the grid is variants × seeds (--tune_lr: each variant's own lr)
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


def recipe(size: Size) -> dict[str, Any]:
    """The size's recipe flattened to dotted keys: its shipped config with the size's overrides on top."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = node

    walk("", yaml.safe_load(Path(config_path(size.base)).read_text()))
    return {**flat, **size.overrides}


def token_budget(tokens: int, size: Size, common: dict[str, Any], seq_len: int) -> tuple[dict[str, Any], dict]:
    """``--tokens N``: ``trainer.max_steps = N / (batch × seq_len)`` (rounded), and the recipe's warm-up, validation,
    evaluation and checkpoint cadences kept as the same fractions of the run (tiny: 10 % warm-up, 3 validations;
    small: 4 %, 10). Returns the overrides and the checkpoint callback at its cadence."""
    preset = recipe(size)
    batch = int(common.get("data.init_args.batch_size", preset["data.init_args.batch_size"]))
    steps = max(1, round(tokens / (batch * seq_len)))
    total = int(preset["trainer.max_steps"])

    def scaled(key: str, floor: int = 1) -> int:
        value = int(preset[key] or 0)
        return 0 if value == 0 else max(floor, round(value * steps / total))

    ckpt = copy.deepcopy(checkpoint_callback(size.base))
    every = ckpt["init_args"].get("every_n_train_steps")
    if every:
        ckpt["init_args"]["every_n_train_steps"] = min(steps, max(1, round(every * steps / total)))
    return {"trainer.max_steps": steps, "model.warmup_steps": scaled("model.warmup_steps", 0),
            "trainer.val_check_interval": min(steps, scaled("trainer.val_check_interval")),
            "extrapolation.every_n_steps": scaled("extrapolation.every_n_steps")}, ckpt


HELP = ("The paper's ablation in one command: every variant on each data set (default: the embedded corpus and the "
        "local-dependency task) with the same recipe, token budget, seeds and evaluation blocks, evaluated to 64x L "
        "(32x at --size tiny), the theory diagnostics on the --corpus models, and REPORT.md with the tables, figures "
        "and every claim marked supported / not supported / inconclusive, in --out/ablation-SIZE/. It is a sweep "
        "with one Optuna study per data set, the whole grid of variants x seeds queued at the start; it resumes: run "
        "the same command again after an interruption. Sizes: study (default; 75 runs, about 50 min on 2 CPU "
        "cores), tiny (a 12-minute quick look), small and paper (a GPU); --max_steps, --seeds and --multipliers "
        "below a size's make a quick look, which the report marks as such.")


def _parser():
    from jsonargparse import ActionYesNo, ArgumentParser

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
                        help=f"any of: {', '.join(d for d in DATASETS if d != 'hf')}, hf:NAME_OR_FILES (default: "
                             f"{', '.join(DEFAULT_DATASETS)})")
    parser.add_argument("--corpus", type=str, default="stdlib",
                        help="the data set the claims are read on: stdlib, prose, text or hf:NAME_OR_FILES")
    parser.add_argument("--text_root", type=str | None, default=None,
                        help="the folder of .txt files of the `text` data set (any depth; split by file)")
    parser.add_argument("--max_steps", type=int | None, default=None, help="override the size's training steps")
    parser.add_argument("--tokens", type=int | None, default=None,
                        help="training tokens per run (sets the steps; the cadences follow)")
    parser.add_argument("--tune_lr", action=ActionYesNo, default=None,
                        help="each variant's lr from a 3-point grid first (default: on for small, paper)")
    parser.add_argument("--precision", type=str | None, default=None,
                        help="trainer.precision of every run (bf16-mixed on a GPU)")
    parser.add_argument("--set", type=str, action="append", default=None, dest="settings",
                        help="KEY=VALUE: an accrot fit override for every run (repeatable)")
    parser.add_argument("--multipliers", type=str, nargs="+", default=None,
                        help="evaluation lengths as multiples of L (default: 1 2 4 ... 64)")
    parser.add_argument("--wandb", type=str, default="auto", help="auto, online, offline or disabled")
    parser.add_argument("--report_only", action="store_true", help="only rebuild REPORT.md from complete trials")
    parser.add_argument("--quiet", action="store_true",
                        help="one line per finished run instead of the live display (also when stderr is no terminal)")
    return parser


def main(argv: list[str]) -> int:
    """``accrot ablation [--size study|tiny|small|paper] [--seeds N] [--workers N] [--storage URL] [--out results]``."""
    args = _parser().parse_args(argv)
    args.variants, args.datasets = _words(args.variants, "--variants"), _words(args.datasets, "--datasets")
    args.multipliers = _numbers(_words(args.multipliers, "--multipliers"))

    size, seeds, variants, datasets = _check_args(args)
    study = args.study or f"ablation-{args.size}"
    out = Path(args.out).resolve()
    folder = out / study
    spec_doc = build_spec(study, size, seeds, variants, datasets, args.wandb, args.max_steps, args.multipliers,
                          text_root=args.text_root, corpus=args.corpus_data, hf_source=args.hf_source,
                          tokens=args.tokens, settings=args.settings,
                          only=None if args.variants else DATASET_VARIANTS)
    spec_path = folder / f"{study}.yaml"
    tune_path = folder / f"{tuning_name(study)}.yaml"
    ref = StorageRef.parse(args.storage, study, out)
    started = time.time()
    if not args.report_only:
        _check_settings(args, spec_doc)
        tune = size.tune_lr if args.tune_lr is None else args.tune_lr
        rc = _run(args, spec_doc, spec_path, tune_path if tune else None, ref, out)
        if rc is not None:
            return rc
    elif not spec_path.is_file():
        raise UsageError(f"no ablation study at {folder} (no {spec_path.name}); run it first without --report_only")
    spec = load_spec(spec_path)
    meta = {"command": "accrot ablation " + " ".join(argv), "size": args.size, "size_cost": size.cost,
            "seeds": seeds, "workers": args.workers, "started": started,
            "scope": describe_scope(yaml.safe_load(spec_path.read_text()), args.size)}
    if tune_path.is_file() and tuned(yaml.safe_load(spec_path.read_text())):
        meta["lr"] = lr_table(load_spec(tune_path), ref)
    built = time.perf_counter()
    report = build_report(spec, ref, folder, meta, console=Console(stderr=True, highlight=False))
    # the eval-time extension rows (PI, NTK, YaRN of the RoPE runs) are evaluated here, after the sweep's split
    print(f"report: {report} (built in {time.perf_counter() - built:.0f} s, eval-time extension rows included)")
    return 0


def _run(args, doc: dict[str, Any], spec_path: Path, tune_path: Path | None, ref: StorageRef, out: Path) -> int | None:
    """The sweeps: with ``tune_path``, the learning-rate grid first (:mod:`accrot.study.tuning`), then the ablation at
    the rates it chose. Returns None when the runs are done (the report follows), else the exit status."""
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    if tune_path is not None:
        _check_resumable(spec_path, doc)  # before the grid runs: an ablation with other options would refuse after it
        grid_doc = tuning_doc(doc)
        _write_spec(tune_path, grid_doc)
        grid = load_spec(tune_path)
        if pending(grid, ref):
            with _sigterm_as_interrupt():
                rc = run_sweep(grid, ref, spec_path.parent, args.workers, quiet=args.quiet,
                               headline=tuning_headline(grid_doc))
            if rc != 0 or args.workers == 0:
                if rc == 0:
                    console.print(f"the ablation's own study ({spec_path.name}) is made once the grid is done: run "
                                  "this command again then", markup=False)
                return rc
        table = lr_table(grid, ref)
        for line in lr_summary(table):
            console.print(line, markup=False)
        doc = with_lrs(doc, {label: cell["lr"] for label, cell in table["cells"].items()})
    _write_spec(spec_path, doc)
    spec = load_spec(spec_path)
    with _sigterm_as_interrupt():
        rc = run_sweep(spec, ref, out, args.workers, on_progress=lambda: write_notes(spec, ref), quiet=args.quiet,
                       headline=headline(describe_scope(doc, args.size)))
    return rc if rc != 0 or args.workers == 0 else None


def describe_scope(doc: dict[str, Any], size_name: str) -> dict[str, Any]:
    """What an ablation runs, read from its spec (``build_spec``'s document): variants × data sets × seeds, steps,
    model shape, training and evaluation lengths; and ``below``, where it falls short of its size preset (fewer
    steps, seeds or lengths), which makes it a quick look."""
    base = yaml.safe_load(Path(config_path(doc["base"])).read_text())
    common, strata = doc["overrides"], doc["variants"]
    steps = int(common.get("trainer.max_steps", base["trainer"]["max_steps"]))
    seq_len = base["data"]["init_args"]["seq_len"]
    batch = int(common.get("data.init_args.batch_size", base["data"]["init_args"]["batch_size"]))
    tokens = {}  # per data set: steps × batch × its training length (a data set may train longer sequences)
    for label, over in strata.items():
        data = label.split(".", 1)[0]
        tokens[data] = int(over.get("trainer.max_steps", steps)) * batch * int(over.get("data.init_args.seq_len", seq_len))
    scope = {
        "variants": list(dict.fromkeys(k.split(".", 1)[1] for k in strata)),
        "datasets": list(dict.fromkeys(k.split(".", 1)[0] for k in strata)),
        "seeds": len(doc["seeds"]), "runs": len(strata) * len(doc["seeds"]) * math.prod(
            len(v) for v in (doc.get("space") or {}).values()),
        "steps": steps, "d_model": common.get("model.d_model", base["model"]["d_model"]),
        "n_layers": common.get("model.n_layers", base["model"]["n_layers"]),
        "train_lengths": sorted({v.get("data.init_args.seq_len", seq_len) for v in strata.values()}),
        "multipliers": [float(m) for m in common["extrapolation.multipliers"]], "preset": size_name, "below": [],
        "batch": batch, "tokens": tokens, "precision": common.get("trainer.precision", base["trainer"]["precision"]),
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
    """The size preset, seeds, variants and data sets the options ask for; a one-line UsageError otherwise. Sets
    ``args.corpus_data`` (the data set the claims read), ``args.hf_source`` and ``args.settings`` (a dict)."""
    if args.size not in SIZES:
        raise UsageError(f"--size={args.size!r} is not valid; choose one of {', '.join(SIZES)}")
    size = SIZES[args.size]
    seeds = size.seeds if args.seeds is None else args.seeds
    if seeds < 1:
        raise UsageError(f"--seeds={seeds} is not valid; at least 1 (2 or more to tell a difference from noise)")
    if args.workers < 0:
        raise UsageError(f"--workers={args.workers} is not valid; 0 (create the study only) or more")
    datasets = _datasets(args)
    state_only = all(d in STATE_TASKS for d in datasets)
    variants = args.variants or list(STATE_VARIANTS if state_only else DEFAULT_VARIANTS)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise UsageError(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    if len(set(variants)) != len(variants):
        raise UsageError(f"a variant is listed twice: {', '.join(variants)}")
    _check_data(datasets, args)
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError(f"--max_steps={args.max_steps} is not valid; a positive number of steps")
    if args.multipliers is not None and (not args.multipliers or 1 not in args.multipliers
                                         or any(m <= 0 for m in args.multipliers)):
        raise UsageError(f"--multipliers={args.multipliers} is not valid; positive multiples of L that include 1")
    args.settings = _parse_settings(args.settings, args.precision)
    _check_tokens(args, size)
    return size, seeds, variants, datasets


CORPORA = {"stdlib": "corpus", "corpus": "corpus", "prose": "prose", "text": "text"}  # --corpus -> data set


def _datasets(args) -> list[str]:
    """``--datasets`` with ``--corpus`` joined (first, when not listed; by default it replaces the embedded corpus
    beside the local task); ``hf:SOURCE`` entries become the data set ``hf``. Sets ``args.corpus_data`` and
    ``args.hf_source``."""
    corpus, sources = args.corpus, []
    if corpus.startswith("hf:"):
        args.corpus_data = "hf"
        sources.append(corpus[3:])
    elif corpus in CORPORA:
        args.corpus_data = CORPORA[corpus]
    else:
        raise UsageError(f"--corpus={corpus!r} is not valid; choose stdlib, prose, text (with --text_root) or "
                         "hf:NAME_OR_FILES")
    given = args.datasets or [args.corpus_data if d == CORPUS else d for d in DEFAULT_DATASETS]
    datasets = []
    for d in given:
        if d.startswith("hf:"):
            sources.append(d[3:])
            d = "hf"
        if d not in DATASETS or (d == "hf" and not sources):
            known = ", ".join(x for x in DATASETS if x != "hf")
            hint = "; the hf data set is hf:NAME_OR_FILES" if d == "hf" else ""
            raise UsageError(f"unknown data set {d!r}; choose from {known}, hf:NAME_OR_FILES{hint}")
        datasets.append(d)
    if len(set(datasets)) != len(datasets):
        raise UsageError(f"a data set is listed twice: {', '.join(given)}")
    state_only = args.datasets and all(d in STATE_TASKS for d in datasets)
    if args.corpus_data not in datasets and not state_only:  # a state-tracking study reads S1–S3 only
        datasets.insert(0, args.corpus_data)
    if len(set(sources)) > 1:
        raise UsageError(f"two Hugging Face sources ({', '.join(f'hf:{s}' for s in dict.fromkeys(sources))}); the "
                         "ablation takes one hf data set")
    args.hf_source = sources[0] if sources else None
    return datasets


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
    if "hf" in datasets:
        args.hf_source = _check_hf(args.hf_source)


def _check_hf(source: str) -> str:
    """The ``hf`` data set's source, checked by the Hugging Face data module itself (local files listed, a hub
    name looked up in the cache when offline); local paths made absolute for workers started elsewhere."""
    from data_modules.hf import HFDataModule
    from data_modules.hf_source import looks_local

    if not source.strip():
        raise UsageError("hf: needs a source: hf:NAME (a Hugging Face hub data set; cached, when offline) or "
                         "hf:PATH (local text, JSONL or Parquet files)")
    path = str(Path(source).expanduser().resolve()) if looks_local(source) else source
    try:
        HFDataModule(path=path)
    except DataError as err:
        raise UsageError(f"hf:{source}: {err}") from None
    return path


# --set keys that an option of the ablation sets (the option, so the report and the spec say it in one place)
OWN_OPTION = {"trainer.max_steps": "--max_steps or --tokens", "extrapolation.multipliers": "--multipliers",
              "trainer.precision": "--precision", "seed_everything": "--seeds",
              "data.init_args.seq_len": "--size (the training length is the size's; the variants' windows follow it)"}
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")  # Lightning's names
_KEY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def _parse_settings(items: list[str] | None, precision: str | None) -> dict[str, Any]:
    """``--set KEY=VALUE`` (VALUE read as YAML: numbers, booleans, lists) and ``--precision`` as dotted overrides."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not _KEY.match(key):
            raise UsageError(f"--set {item!r} is not valid; give KEY=VALUE with a dotted key of accrot fit "
                             "(--set model.weight_decay=0.05)")
        if key in OWN_OPTION or key.split(".")[0] in RESERVED_KEYS:
            raise UsageError(f"--set {key}=... is not valid: the ablation sets {key} itself; use "
                             f"{OWN_OPTION.get(key, 'the option of the same name, if any')}")
        if key in out:
            raise UsageError(f"--set {key} is given twice; give each key once")
        try:
            out[key] = yaml.safe_load(text)
        except yaml.YAMLError:
            out[key] = text
    if "model.lr" in out:
        out["model.lr"] = _positive(out["model.lr"])
    if precision is not None:
        if precision not in PRECISIONS:
            raise UsageError(f"--precision={precision!r} is not valid; choose one of {', '.join(PRECISIONS)}")
        out["trainer.precision"] = precision
    return out


def _positive(value: Any) -> float:
    """``--set model.lr``: the ablation's learning rate (the centre of ``--tune_lr``'s grid), a positive number."""
    try:
        lr = float(value)
    except (TypeError, ValueError):
        lr = math.nan
    if not 0 < lr < math.inf:
        raise UsageError(f"--set model.lr={value} is not valid; a positive learning rate (3e-3)")
    return lr


def _check_tokens(args, size: Size) -> None:
    """``--tokens N``: a whole number of steps of the size's batch (or ``--set data.init_args.batch_size``)."""
    if args.tokens is None:
        return
    if args.max_steps is not None:
        raise UsageError(f"--tokens={args.tokens} and --max_steps={args.max_steps} both set the training length; "
                         "give one")
    batch = int(args.settings.get("data.init_args.batch_size", recipe(size)["data.init_args.batch_size"]))
    step = batch * size.seq_len
    if args.tokens < step:
        raise UsageError(f"--tokens={args.tokens} is not valid; at least one step of {batch} x {size.seq_len} = "
                         f"{step} tokens")


def _check_settings(args, doc: dict[str, Any]) -> None:
    """``--set`` keys the variants or data sets set are refused (they are what the runs differ in); the overrides
    are then built by the real ``accrot fit`` parser for one variant of each data set, before anything runs."""
    if not args.settings:
        return
    per_stratum = sorted({k for over in doc["variants"].values() for k in over})
    for key in args.settings:
        # a data set's `data` (its data module's class) leaves the module's own arguments (data.init_args.X) free
        clash = next((k for k in per_stratum if k == key or k.startswith(key + ".")
                      or (key.startswith(k + ".") and k != "data")), None)
        if clash is not None:
            raise UsageError(f"--set {key}=... is not valid: the ablation sets {clash} per variant or data set (what "
                             "its runs differ in); choose them with --variants and --datasets")
    from accrot.sweep.spec import SweepSpec
    from accrot.sweep.trials import check_stratum

    given = " ".join([*(f"--set {k}={v}" for k, v in args.settings.items() if k != "trainer.precision"),
                      *([f"--precision {args.precision}"] if args.precision else [])])
    try:
        spec = SweepSpec(**copy.deepcopy(doc))
    except (UsageError, ValueError) as err:
        raise UsageError(f"{given}: {err}") from None
    spec.path = Path(given)  # names the options in check_stratum's line
    first = {}
    for stratum in spec.strata():
        first.setdefault(stratum.variant.split(".", 1)[0], stratum)
    for stratum in first.values():
        check_stratum(spec, stratum, n_samples=0)


def _check_resumable(path: Path, doc: dict[str, Any]) -> None:
    """Before ``--tune_lr``'s grid runs: an ablation already in ``path``'s folder must have been made with these
    options, its learning rates aside (they are the grid's to choose)."""
    if path.is_file():
        _refuse_other_options(path, yaml.safe_load(path.read_text()), doc, tuned_new=True)


def _refuse_other_options(path: Path, old: dict[str, Any], new: dict[str, Any], tuned_new: bool | None = None) -> None:
    """One line naming the options that differ (``--tune_lr`` for the learning rates, else the spec's keys)."""
    tuned_new = tuned(new) if tuned_new is None else tuned_new
    changed = [] if tuned(old) == tuned_new else ["--tune_lr"]
    if changed or tuned_new:  # the rates are the grid's (or absent): compare the rest
        old, new = without_lrs(old), without_lrs(new)
    changed += sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if changed:
        verb = "differs" if changed == ["--tune_lr"] else "differ"
        raise UsageError(f"{path.parent} holds an ablation with other options ({', '.join(changed)} {verb}); "
                         "pass --study NAME for a new one, or the same options to resume it")


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
        _refuse_other_options(path, yaml.safe_load(path.read_text()), doc)
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


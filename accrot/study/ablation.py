"""``accrot ablation``: the paper's controlled experiment in one command.

It trains every variant of :data:`VARIANT_RECORDS` on each data set of :data:`DATASET_RECORDS` with the same recipe, token
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
about 50 minutes on 2 CPU cores: every claim at a first look), ``decide`` (the same runs of only the six variants
C1–C3 compare, on the corpus, 10 seeds, no theory diagnostics: about 40 minutes; it resolves C1–C3, C3 on
the random pair (the learned pair needs about 80–110 seeds at this size by its own seeds-needed lines, ``--seeds
N`` batches resume); a ``--seeds 5`` batch first is resumed by the plain command), ``tiny`` (the tiny recipe, d 64,
at 150 steps, 2 seeds, evaluated to 32× L: a 12-minute quick look whose verdicts are mostly inconclusive), ``small`` (small.yaml, L = 512, 5000
steps, 5 seeds after a learning-rate grid per variant: a GPU), ``paper`` (small.yaml's shape at 20 000 steps and
batch 32, 5 seeds after the grid: a GPU node or a cluster).
"""

from __future__ import annotations

import contextlib
import copy
import math
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from accrot.errors import BadInput, UsageError
from accrot.io import atomic_write_text
from accrot.logs import WANDB_MODES
from accrot.options import FLAG, Kind, choice, count, option, parse, read_dir, text, words, write_dir
from accrot.options import numbers as numbers_kind
from accrot.run.args import config_path
from accrot.run.rundir import holding
from accrot.study.options import (
    CORPORA,
    PRECISIONS,
    check_args,
    check_resumable,
    check_settings,
    more_seeds,
    numbers,
    recipe,
    refuse_other_options,
)
from accrot.study.report import build_report, write_notes
from accrot.study.results import ALSO_DIAGNOSED, CORPUS
from accrot.study.tuning import headline as tuning_headline
from accrot.study.tuning import lr_table, pending, tuned, tuning_doc, tuning_name, with_lrs
from accrot.study.tuning import summary as lr_summary
from accrot.study.variants import (
    DATASET_RECORDS,
    DATASET_VARIANTS,
    DEFAULT_DATASETS,
    SIZES,
    VARIANT_RECORDS,
    WINDOW_FRACTION,
    Size,
)
from accrot.sweep.parent import Terminated, run_sweep
from accrot.sweep.spec import load_spec
from accrot.sweep.storage import STORAGE, StorageRef


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
                   "init_args": {"multipliers": diag, "blocks": size.diagnostic_blocks,
                                 "draws": size.fresh_draws}}
    strata: dict[str, dict[str, Any]] = {}
    for data in datasets:
        record = DATASET_RECORDS[data]
        seq_len = max(size.seq_len, record.min_seq_len)
        budget, own_ckpt = ({}, ckpt) if tokens is None or seq_len == size.seq_len else \
            token_budget(tokens, size, {**common, **settings}, seq_len)
        for label in variants:
            if only and data in only and label not in only[data]:
                continue
            variant = VARIANT_RECORDS[label]
            over = {f"model.scheme.{k}": v for k, v in variant.scheme.items()}
            if variant.windowed:
                over["model.scheme.window"] = WINDOW_FRACTION * seq_len
            over.update(record.overrides)
            if seq_len != size.seq_len:
                over["data.init_args.seq_len"] = seq_len
            over.update(budget)
            if data == "text":
                over["data.init_args.root"] = text_root
            if data == "hf":
                over["data.init_args.path"] = hf_source
            # the theory diagnostics (T1–T5) on the data set the claims are read on, and on the local task (T3 reads
            # the far mass there too, where the far keys are distractors by construction)
            diagnosed = data in (corpus, *ALSO_DIAGNOSED) and size.diagnose
            over["trainer.callbacks"] = [own_ckpt, diagnostics] if diagnosed else [own_ckpt]
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
        "and every claim's verdict, in --out/ablation-SIZE/. It is a sweep "
        "with one Optuna study per data set, its grid of variants x seeds queued at the start; it resumes: run the "
        "same command again (more --seeds: a second batch). Sizes: study (default; 84 runs, about 50 min on 2 CPU "
        "cores), decide (resolves C1–C3, about 40 min), tiny (a 12-minute look), small "
        "and paper (a GPU); less "
        "than a size's --max_steps, --seeds or --multipliers is a quick look, which the report marks.")


def _is_hf(value: str) -> bool:
    return value.startswith("hf:") and len(value) > 3


def _check_set(flag: str, value) -> None:
    for item in value if isinstance(value, (list, tuple)) else [value]:
        key, eq, _ = str(item).partition("=")
        if not eq or not key.strip():
            raise UsageError(f"{flag} {str(item)!r} is not valid; give KEY=VALUE with a dotted key of accrot fit "
                             "(--set model.weight_decay=0.05)")


DATASET_KIND = choice(*(d for d in DATASET_RECORDS if d != "hf"), also=_is_hf, what="hf:NAME_OR_FILES")
CORPUS_KIND = choice(*CORPORA, also=_is_hf, what="hf:NAME_OR_FILES")
SET_KIND = Kind("settings", _check_set, ("novalue", "=3", ""), "KEY=VALUE")


def _parser():
    from jsonargparse import ActionYesNo, ArgumentParser

    parser = ArgumentParser(prog="accrot ablation", exit_on_error=False, description=HELP)
    option(parser, "--size", kind=choice(*SIZES), type=str, default="study",
                        help="study, decide, tiny, small or paper")
    option(parser, "--seeds", kind=count(1, 1000), type=int | None, default=None, help="seeds per variant (default: the size's)")
    option(parser, "--workers", kind=count(0, 256), type=int, default=2, help="worker processes on this machine (0: none)")
    option(parser, "--storage", kind=STORAGE, type=str | None, default=None,
                        help="Optuna storage URL (default: sqlite under <out>/<study>/)")
    option(parser, "--out", kind=write_dir("a results folder"), type=str, default="results", help="results folder")
    option(parser, "--study", kind=text("a study name"), type=str | None, default=None, help="study name (default: ablation-<size>)")
    # nargs: `--variants NoPE RoPE` as a shell user types it; `--variants '[NoPE, RoPE]'` (YAML) works too
    option(parser, "--variants", kind=choice(*VARIANT_RECORDS), type=str, nargs="+", default=None, help=f"subset of: {', '.join(VARIANT_RECORDS)}")
    option(parser, "--datasets", kind=DATASET_KIND, type=str, nargs="+", default=None,
                        help=f"any of: {', '.join(d for d in DATASET_RECORDS if d != 'hf')}, hf:NAME_OR_FILES (default: "
                             f"{', '.join(DEFAULT_DATASETS)})")
    option(parser, "--corpus", kind=CORPUS_KIND, type=str, default="stdlib",
                        help="the data set the claims are read on: stdlib, prose, text or hf:NAME_OR_FILES")
    option(parser, "--text_root", kind=read_dir("a folder of .txt files"), type=str | None, default=None,
                        help="the `text` data set's folder of .txt files (any depth; split by file)")
    option(parser, "--max_steps", kind=count(1), type=int | None, default=None, help="override the size's training steps")
    option(parser, "--tokens", kind=count(1), type=int | None, default=None,
                        help="training tokens per run (sets the steps; the cadences follow)")
    option(parser, "--tune_lr", kind=FLAG, action=ActionYesNo, default=None,
                        help="each variant's lr from a 3-point grid first (default: on for small, paper)")
    option(parser, "--precision", kind=choice(*PRECISIONS), type=str | None, default=None,
                        help="trainer.precision of every run (bf16-mixed on a GPU)")
    option(parser, "--set", kind=SET_KIND, type=str, action="append", default=None, dest="settings",
                        help="KEY=VALUE: an accrot fit override for every run (repeatable)")
    option(parser, "--multipliers", kind=numbers_kind(), type=str, nargs="+", default=None,
                        help="evaluation lengths as multiples of L (default: 1 2 4 ... 64)")
    option(parser, "--wandb", kind=choice(*WANDB_MODES), type=str, default="auto", help="auto, online, offline or disabled")
    option(parser, "--report_only", kind=FLAG, action="store_true", help="only rebuild REPORT.md from complete trials")
    option(parser, "--quiet", kind=FLAG, action="store_true",
                        help="a line per finished run (as when stderr is no terminal)")
    return parser


def main(argv: list[str]) -> int:
    """``accrot ablation [--size study|decide|tiny|small|paper] [--seeds N] [--workers N] [--storage URL] [--out results]``."""
    args = parse(_parser(), argv)
    args.variants, args.datasets = words(args.variants, "--variants"), words(args.datasets, "--datasets")
    args.multipliers = numbers(words(args.multipliers, "--multipliers"))

    size, seeds, variants, datasets = check_args(args)
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
    # refused before the folder is made: nothing left behind
    if args.report_only and not spec_path.is_file():
        raise UsageError(f"no ablation study at {folder} (no {spec_path.name}); run it first without --report_only")
    if not args.report_only:
        check_settings(args, spec_doc)
    with holding(folder, "--out", "the ablation's folder"):  # one ablation writes a folder at a time
        started = time.time()
        if not args.report_only:
            tune = size.tune_lr if args.tune_lr is None else args.tune_lr
            rc = _run(args, spec_doc, spec_path, tune_path if tune else None, ref, out)
            if rc is not None:
                return rc
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
        check_resumable(spec_path, doc)  # before the grid runs: an ablation with other options would refuse after it
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
    with _written_spec(spec_path, doc):
        spec = load_spec(spec_path)
        with _sigterm_as_interrupt():
            rc = run_sweep(spec, ref, out, args.workers, on_progress=lambda: write_notes(spec, ref),
                           quiet=args.quiet, headline=headline(describe_scope(doc, args.size)))
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
        "per_dataset": dict(Counter(k.split(".", 1)[0] for k in strata)),  # variants run on each data set
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
    per = scope.get("per_dataset") or {}
    if per and len(set(per.values())) > 1:  # each data set runs what its claims read: the product would not hold
        grid = f"({' + '.join(f'{k} on {d}' for d, k in per.items())}) variants × {n(scope['seeds'], 'seed')}"
    else:
        grid = (f"{n(len(scope['variants']), 'variant')} × {n(len(scope['datasets']), 'data set')} × "
                f"{n(scope['seeds'], 'seed')}")
    text = (f"{n(scope['runs'], 'run')} = {grid}, {scope['steps']} steps each "
            f"(d {scope['d_model']}, {scope['n_layers']} layers, L = {lengths}), evaluated at "
            f"{', '.join(f'{m:g}×' for m in scope['multipliers'])} L")
    if scope["below"]:
        text += f"; below the {scope['preset']} preset ({', '.join(scope['below'])}): a quick look"
    return text


def _write_spec(path: Path, doc: dict[str, Any]) -> list[Path]:
    """Write the generated spec; an existing one with other content means other options: refuse, one line.
    Returns what it created (the file, and the folders it made), outermost last."""
    text = ("# generated by `accrot ablation`; `accrot sweep` reads it too (workers on other machines)\n"
            + yaml.safe_dump(doc, sort_keys=False))
    if path.is_file():
        old = yaml.safe_load(path.read_text())
        if more_seeds(old, doc):  # a second batch of seeds: the first batch's runs are kept, the rest queued
            atomic_write_text(path, text)
            return []
        refuse_other_options(path, old, doc)
        return []
    made = [p for p in path.parents if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return [path, *made]


@contextlib.contextmanager
def _written_spec(path: Path, doc: dict[str, Any]) -> Iterator[None]:
    """The generated spec, written for the sweep's checks; if they refuse it (bad input, found before any study
    exists), the spec and the folders made for it are removed again: nothing is left half-made."""
    made = _write_spec(path, doc)
    try:
        yield
    except BadInput:
        for p in made:
            with contextlib.suppress(OSError):
                p.unlink() if p.is_file() else p.rmdir()
        raise


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


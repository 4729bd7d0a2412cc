"""The ablation's options checked before anything runs: the size, seeds, variants and data sets they ask for,
``--corpus``/``--datasets`` resolved to data sets (``hf:SOURCE`` checked by the Hugging Face data module itself),
``--set``/``--precision`` parsed and tried on the real ``accrot fit`` parser, ``--tokens`` against the size's batch,
and a resumed ablation refused when its options differ. Every bad option is one line (UsageError)."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import yaml

from accrot.errors import DataError, UsageError
from accrot.run.args import config_path
from accrot.study.results import CORPUS
from accrot.study.tuning import tuned, without_lrs
from accrot.study.variants import (
    DATASET_RECORDS,
    DEFAULT_DATASETS,
    DEFAULT_VARIANTS,
    SIZES,
    STATE_VARIANTS,
    VARIANT_RECORDS,
    Size,
)
from accrot.sweep.spec import NAME, RESERVED_KEYS


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


def check_args(args) -> tuple[Size, int, list[str], list[str]]:
    """The size preset, seeds, variants and data sets the options ask for; a one-line UsageError otherwise. Sets
    ``args.corpus_data`` (the data set the claims read), ``args.hf_source`` and ``args.settings`` (a dict)."""
    if args.size not in SIZES:
        raise UsageError(f"--size={args.size!r} is not valid; choose one of {', '.join(SIZES)}")
    size = SIZES[args.size]
    seeds = size.seeds if args.seeds is None else args.seeds
    if seeds < 1:
        raise UsageError(f"--seeds={seeds} is not valid; at least 1 (2 or more to tell a difference from noise)")
    study = getattr(args, "study", None)  # it names the study and its folder under --out
    if study is not None and not NAME.match(study):
        raise UsageError(f"--study={study!r} is not valid; a study name is letters, digits and _ . + - "
                         "(no '/'), e.g. --study ablation-long")
    if args.workers < 0:
        raise UsageError(f"--workers={args.workers} is not valid; 0 (create the study only) or more")
    datasets = datasets_of(args, size)
    state_only = all(DATASET_RECORDS[d].state for d in datasets)
    variants = args.variants or list(size.variants or (STATE_VARIANTS if state_only else DEFAULT_VARIANTS))
    unknown = [v for v in variants if v not in VARIANT_RECORDS]
    if unknown:
        raise UsageError(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANT_RECORDS)}")
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


def datasets_of(args, size: Size | None = None) -> list[str]:
    """``--datasets`` with ``--corpus`` joined (first, when not listed; by default it replaces the embedded corpus
    beside the local task, or in the size preset's own data sets); ``hf:SOURCE`` entries become the data set
    ``hf``. Sets ``args.corpus_data`` and ``args.hf_source``."""
    corpus, sources = args.corpus, []
    if corpus.startswith("hf:"):
        args.corpus_data = "hf"
        sources.append(corpus[3:])
    elif corpus in CORPORA:
        args.corpus_data = CORPORA[corpus]
    else:
        raise UsageError(f"--corpus={corpus!r} is not valid; choose stdlib, prose, text (with --text_root) or "
                         "hf:NAME_OR_FILES")
    defaults = (size.datasets if size is not None else None) or DEFAULT_DATASETS
    given = args.datasets or [args.corpus_data if d == CORPUS else d for d in defaults]
    datasets = []
    for d in given:
        if d.startswith("hf:"):
            sources.append(d[3:])
            d = "hf"
        if d not in DATASET_RECORDS or (d == "hf" and not sources):
            known = ", ".join(x for x in DATASET_RECORDS if x != "hf")
            hint = "; the hf data set is hf:NAME_OR_FILES" if d == "hf" else ""
            raise UsageError(f"unknown data set {d!r}; choose from {known}, hf:NAME_OR_FILES{hint}")
        datasets.append(d)
    if len(set(datasets)) != len(datasets):
        raise UsageError(f"a data set is listed twice: {', '.join(given)}")
    state_only = args.datasets and all(DATASET_RECORDS[d].state for d in datasets)
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
            StdlibDataModule(root=args.text_root, glob=DATASET_RECORDS["text"].overrides["data.init_args.glob"])
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


def check_settings(args, doc: dict[str, Any]) -> None:
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


def check_resumable(path: Path, doc: dict[str, Any]) -> None:
    """Before ``--tune_lr``'s grid runs: an ablation already in ``path``'s folder must have been made with these
    options, its learning rates aside (they are the grid's to choose)."""
    if path.is_file():
        old = yaml.safe_load(path.read_text())
        if tuned(old) and more_seeds(without_lrs(old), without_lrs(doc)):  # a second batch of seeds
            return
        refuse_other_options(path, old, doc, tuned_new=True)


def more_seeds(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """The same ablation asked with more seeds, the old ones first (``--seeds 3``, then ``--seeds 6``): staged."""
    a, b = old.get("seeds") or [], new.get("seeds") or []
    same = {k: v for k, v in old.items() if k != "seeds"} == {k: v for k, v in new.items() if k != "seeds"}
    return same and len(b) > len(a) and b[:len(a)] == a


def refuse_other_options(path: Path, old: dict[str, Any], new: dict[str, Any], tuned_new: bool | None = None) -> None:
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


def numbers(values: list[str] | None) -> list[float] | None:

    if values is None:
        return None
    try:
        return [float(v) for v in values]
    except ValueError:
        raise UsageError(f"--multipliers={values} is not valid; positive multiples of L that include 1") from None

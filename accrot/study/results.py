"""The ablation's runs as records: :func:`collect` reads the complete trials of a study (their
``extrapolation.json`` and, on the data set the theory is read on, ``diagnostics/diagnostics.json``) into
:class:`Run` records indexed by :class:`Results`, and the readers of a run's diagnostics the claims use."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS = "corpus"  # the data set the claims and the theory diagnostics are read on, unless the study says another
# besides the claims' data set, the ablation diagnoses the local task, whose far keys are distractors by
# construction: the far-mass lower bound (T3) is read there too
ALSO_DIAGNOSED = ("local",)
DIAGNOSTICS_SCHEMA = "accrot.diagnostics/2"


@dataclass
class Run:
    """One complete trial: its evaluation per multiplier and, on the theory's data set, its diagnostics."""

    dataset: str
    variant: str
    seed: int
    run_dir: str
    lengths: dict[float, dict[str, Any]]  # multiplier -> the extrapolation.json row (+ same_target_rise, _nll)
    train_length: int
    diagnostics: dict | None = None
    params: int | None = None  # trainable parameters (run.json)
    lr: float | None = None  # the learning rate it trained at (run.json's hparams)
    # an eval-time extension row: the rope_scaling kind its trained run (``run_dir``, of RoPE) was evaluated again with
    extension: str | None = None
    head_dim: int | None = None  # d_model / n_heads (run.json's hparams)

    def value(self, field_: str, mult: float) -> float | None:
        row = self.lengths.get(float(mult))
        return None if row is None or row.get(field_) is None else float(row[field_])

    @property
    def same_targets(self) -> bool:
        """Whether the evaluation scored the same targets at every length it evaluated (then its rise is read)."""
        return bool(self.lengths) and all(row.get("same_target_nll") is not None for row in self.lengths.values())

    def rise(self, mult: float, relative: bool = True) -> float | None:
        """How much worse the model is at ``mult`` × L than at L: on the same targets where the evaluation scored
        them at every length (each target with mult·L tokens before it, against L: paired per anchor, no cold
        start), else on each length's own blocks; ``relative``: as a fraction of NLL(1×), else in nats."""
        name = "same_target_nll" if self.same_targets else "nll"
        a, b = self.value(name, mult), self.value(name, 1)
        if a is None or b is None:
            return None
        if not relative:
            return a - b
        return None if b == 0 else a / b - 1.0

    @property
    def diag(self) -> dict:
        """The diagnostics bundle (empty when the run has none, or one of an older layout)."""
        d = self.diagnostics or {}
        return d if d.get("schema") == DIAGNOSTICS_SCHEMA else {}


class Results:
    """The runs of one ablation, indexed by (data set, variant); ``corpus``: the data set the claims read."""

    def __init__(self, runs: Iterable[Run], corpus: str = CORPUS) -> None:
        self.runs = sorted(runs, key=lambda r: (r.dataset, r.variant, r.seed))
        self.corpus = corpus
        self.by: dict[tuple[str, str], list[Run]] = {}
        self._pools: dict[tuple[str, float], object] = {}
        for r in self.runs:
            self.by.setdefault((r.dataset, r.variant), []).append(r)
        # the eval-time extension rows: label -> rope_scaling kind
        self.extensions = {r.variant: r.extension for r in self.runs if r.extension is not None}

    def trained(self) -> int:
        """Runs that were trained (not RoPE's eval-time extension rows, which are evaluations of trained runs)."""
        return sum(r.extension is None for r in self.runs)

    def is_extension(self, variant: str) -> bool:
        """Whether ``variant`` names eval-time extension rows (evaluations of trained runs), not a trained variant."""
        return variant in self.extensions

    def datasets(self) -> list[str]:
        return sorted({r.dataset for r in self.runs}, key=lambda d: (d != self.corpus, d))

    def variants(self, dataset: str) -> list[str]:
        """The variants run on ``dataset``, each once, in the study's order; the eval-time extension rows right
        after the variant they evaluate (RoPE); names the study does not define last."""
        from accrot.study.variants import EXTENSION_RECORDS, VARIANT_RECORDS

        present = {v for d, v in self.by if d == dataset}
        of = {e.kind: e.of for e in EXTENSION_RECORDS}
        after: dict[str, list[str]] = {}
        for label in sorted(present & set(self.extensions)):
            after.setdefault(of.get(self.extensions[label], ""), []).append(label)  # an unknown kind: last
        known = [e for v in VARIANT_RECORDS if v in present for e in (v, *after.get(v, []))]
        return known + sorted(present - set(known))

    def multipliers(self, dataset: str) -> list[float]:
        return sorted({m for r in self.runs if r.dataset == dataset for m in r.lengths})

    def longest(self, dataset: str | None = None) -> float:
        return max(self.multipliers(dataset or self.corpus), default=1.0)

    def values(self, dataset: str, variant: str, field_: str, mult: float) -> list[float]:
        out = [r.value(field_, mult) for r in self.by.get((dataset, variant), [])]
        return [v for v in out if v is not None and math.isfinite(v)]

    def per_seed(self, dataset: str, variant: str, fn: Callable[[Run], float | None]) -> list[float]:
        out = [fn(r) for r in self.by.get((dataset, variant), [])]
        return [v for v in out if v is not None and math.isfinite(v)]

    def seeded(self, dataset: str, variant: str, fn: Callable[[Run], float | None]) -> dict[int, float]:
        """``{seed: fn(run)}`` over the variant's runs with a finite value (paired comparisons read the seeds)."""
        out = {r.seed: fn(r) for r in self.by.get((dataset, variant), [])}
        return {k: v for k, v in out.items() if v is not None and math.isfinite(v)}

    def seeded_values(self, dataset: str, variant: str, field_: str, mult: float) -> dict[int, float]:
        return self.seeded(dataset, variant, lambda r: r.value(field_, mult))

    def seeded_blocks(self, dataset: str, variant: str, mult: float) -> dict[int, list[float]]:
        """``{seed: per-block NLL at mult}`` where the evaluation recorded its blocks (the same blocks for every
        variant and seed)."""
        out = {}
        for r in self.by.get((dataset, variant), []):
            blocks = (r.lengths.get(float(mult)) or {}).get("block_nll")
            if blocks and all(b is not None and math.isfinite(b) for b in blocks):
                out[r.seed] = [float(b) for b in blocks]
        return out

    def pool(self, dataset: str, mult: float):
        """The two-way (variant × seed) model of the NLL at ``mult`` over every trained variant of ``dataset``
        (:class:`~accrot.study.stats.Pool`), fitted once."""
        from accrot.study.stats import Pool

        key = (dataset, float(mult))
        if key not in self._pools:
            table = {v: self.seeded_values(dataset, v, "nll", mult) for v in self.variants(dataset)
                     if not self.is_extension(v)}
            self._pools[key] = Pool.fit({v: t for v, t in table.items() if t})
        return self._pools[key]

    def relabelled(self, reads: Mapping[str, str], seeds: Container[int] | None = None) -> Results:
        """A copy in which each variant ``target`` of ``reads`` (``{target: source}``) holds the runs of ``source``
        under its own name, on every data set (on ``seeds`` only, where given; elsewhere it keeps its own runs); a
        source keeps its own runs unless it is itself a target. How a claim's null puts a control in the place of
        the variant the claim is about (``{"accum-learned": "RoPE"}``) or exchanges two variants' labels on some
        seeds (``{"a": "b", "b": "a"}, seeds={1}``): the same rule then reads data where its effect is absent."""
        from dataclasses import replace

        def swapped(seed: int) -> bool:
            return seeds is None or seed in seeds

        runs = [r for r in self.runs if not (r.variant in reads and swapped(r.seed))]
        for target, source in reads.items():
            runs += [replace(r, variant=target) for r in self.runs if r.variant == source and swapped(r.seed)]
        return Results(runs, self.corpus)

    def alternate_seeds(self, a: str, b: str) -> set[int]:
        """Every other seed (the 2nd, 4th, ...) of those both ``a`` and ``b`` ran, on any data set: where a label
        exchange puts the one in the other's place while the rest keep their own."""
        common = sorted({r.seed for r in self.runs if r.variant == a} & {r.seed for r in self.runs if r.variant == b})
        return set(common[1::2])

    def diagnosed(self, variant: str, dataset: str | None = None) -> list[Run]:
        """The variant's runs that have diagnostics (of the current layout), on the theory's data set unless
        ``dataset`` names another (the local task's, :data:`ALSO_DIAGNOSED`)."""
        return [r for r in self.by.get((dataset or self.corpus, variant), []) if r.diag]


def unmixable(res: Results, variant: str) -> list[tuple[int, float, float]]:
    """The variant's pairs that cannot mix within the longest evaluated length whatever it learns, from its own bound
    and ladder (:func:`~accrot.position.accum.unmixable_pairs`; empty where it has none, is no study variant, or ran
    without a recorded head width): the regularity condition fails there by construction."""
    from accrot.position.accum import unmixable_pairs
    from accrot.position.declared import config_of
    from accrot.study.variants import VARIANTS

    runs = res.by.get((res.corpus, variant), [])
    if variant not in VARIANTS or not runs or runs[0].head_dim is None:
        return []
    return unmixable_pairs(config_of(VARIANTS[variant]), runs[0].head_dim, res.longest() * runs[0].train_length)


def outside_premise(res: Results, variant: str) -> str | None:
    """Why a claim about rotations that mix is not read on ``variant`` (its unmixable pairs), or None."""
    slow = unmixable(res, variant)
    if not slow:
        return None
    return f"pairs {slow[0][0]}–{slow[-1][0]} cannot mix within {times(res.longest())} L (its ladder)"


def times(m: float) -> str:
    return f"{m:g}×"


def mean_of(xs: Iterable[float | None]) -> float | None:
    vals = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return sum(vals) / len(vals) if vals else None


def diag_layers(run: Run) -> list[dict]:
    return run.diag.get("layers") or []


def length_of(run: Run, mult: float) -> int | None:
    L = run.diag.get("train_length")
    return None if L is None else int(round(L * mult))


def entries(run: Run, key: str, length: int | None) -> list[dict]:
    """Every layer's entry of ``key`` (``coherence``, ``far``, ``value_far_norm``) at ``length``."""
    return [e for layer in diag_layers(run) for e in layer.get(key, []) if e["length"] == length]


def head_values(run: Run, key: str, name: str, length: int | None) -> list[float | None]:
    """``name`` of every (layer, head) at ``length`` (e.g. the far mass per head), layer-major."""
    return [v for e in entries(run, key, length) for v in e.get(name) or []]


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b - 1.0


def horizon(run: Run, tolerance: float = 0.05) -> float | None:
    """The largest evaluated multiple m whose NLL, and every shorter one's, is within ``tolerance`` of 1×'s
    (:meth:`Run.rise`: on the same targets where the evaluation scored them)."""
    if run.rise(1) is None:
        return None
    best = None
    for m in sorted(run.lengths):
        value = run.rise(m)
        if value is None or value > tolerance:
            break
        best = m
    return best


def best_at(res: Results, dataset: str, variants: Sequence[str], mult: float) -> str | None:
    """The variant of ``variants`` with the lowest mean NLL at ``mult`` on ``dataset`` (None if none ran)."""
    means = {v: sum(vals) / len(vals) for v in variants if (vals := res.values(dataset, v, "nll", mult))}
    return min(means, key=means.get) if means else None


# ---------------------------------------------------------------------------------------------------
# reading a study
# ---------------------------------------------------------------------------------------------------
def theory_dataset(spec) -> str:
    """The data set an ablation spec runs the theory diagnostics on (``accrot ablation --corpus``): the one whose
    strata carry the diagnostics callback (besides :data:`ALSO_DIAGNOSED`, diagnosed for the far-mass bound alone,
    unless it is the only one); :data:`CORPUS` for a spec without it."""
    found = []
    for stratum in spec.strata():
        callbacks = stratum.overrides.get("trainer.callbacks") or []
        if any(str(c.get("class_path", "")).endswith("DiagnosticsCallback") for c in callbacks if isinstance(c, dict)):
            found.append((stratum.variant or CORPUS).split(".", 1)[0])
    return next((d for d in found if d not in ALSO_DIAGNOSED), found[0] if found else CORPUS)


def collect(spec, ref, corpus: str | None = None) -> Results:
    """The complete trials of every stratum of an ablation spec, with their evaluation and diagnostics; the claims
    read ``corpus`` (default: the data set the spec diagnoses, :func:`theory_dataset`)."""
    import optuna
    from optuna.trial import TrialState

    from accrot.sweep.storage import open_storage

    storage = open_storage(ref)
    runs = []
    for name, strata in spec.studies().items():
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            continue  # not created yet
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            # a study per variant, or one per data set whose trials carry their variant (shared_study)
            label = t.user_attrs.get("variant") if spec.shared_study else strata[0].variant
            dataset, _, variant = (label or "corpus.?").partition(".")
            run = read_run(Path(t.user_attrs.get("run_dir", "")), dataset, variant, int(t.user_attrs.get("seed", 0)))
            if run is not None:
                runs.append(run)
    return Results(runs, corpus or theory_dataset(spec))


def final_lengths(doc: Mapping[str, Any]) -> dict[float, dict[str, Any]]:
    """An ``extrapolation.json``'s final rows by multiplier, each with its same-target rise and NLL where the
    evaluation recorded them (``same_target_rise``, ``same_target_nll``)."""
    lengths = {float(r["multiplier"]): dict(r) for r in doc["final"]["lengths"]}
    for rise in (doc["final"].get("same_targets") or {}).get("lengths", []):
        row = lengths.get(float(rise["multiplier"]))
        if row is not None:
            row["same_target_rise"], row["same_target_nll"] = rise["rise"], rise["nll"]
            if rise.get("rise_ci") is not None:  # the anchors' interval of this run's rise
                row["same_target_rise_ci"] = tuple(rise["rise_ci"])
    return lengths


def read_run(run_dir: Path, dataset: str, variant: str, seed: int) -> Run | None:
    """A :class:`Run` from a run directory's files (None without its ``extrapolation.json``)."""
    ext = run_dir / "extrapolation.json"
    if not ext.is_file():
        return None
    doc = json.loads(ext.read_text())
    diag_path = run_dir / "diagnostics" / "diagnostics.json"
    record = run_dir / "run.json"
    info = json.loads(record.read_text()) if record.is_file() else {}
    hparams = info.get("hparams") or {}
    params, lr = info.get("parameters"), hparams.get("lr")
    d_model, heads = hparams.get("d_model"), hparams.get("n_heads")
    return Run(
        dataset=dataset, variant=variant, seed=seed, run_dir=str(run_dir),
        lengths=final_lengths(doc),
        train_length=int(doc["train_length"]),
        diagnostics=json.loads(diag_path.read_text()) if diag_path.is_file() else None,
        params=params if isinstance(params, int) else None,
        lr=float(lr) if isinstance(lr, (int, float)) else None,
        head_dim=d_model // heads if isinstance(d_model, int) and isinstance(heads, int) and heads else None,
    )

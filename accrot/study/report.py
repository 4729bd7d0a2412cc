"""The ablation's report: ``REPORT.md`` (tables, the claims and their verdicts), ``results.csv``, ``claims.json``
and the figures."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from accrot.io import atomic_write_text
from accrot.position.rope_scaling import KINDS
from accrot.study.claims import HORIZON_TOLERANCE, check_calibration, check_claims
from accrot.study.figures import (
    dataset_title,
    plot_depth_heatmap,
    plot_horizon,
    plot_nll,
    plot_per_position,
    plot_rise,
    plot_theory,
)
from accrot.study.results import Results, Run, collect, horizon, mean_of, times
from accrot.study.state import plot_state_heatmap, reading_note
from accrot.study.stats import RULES as STATS_RULES
from accrot.study.stats import Claim, fmt
from accrot.study.theory import (
    by_seed,
    head_windows,
    t3_rows,
    variants_of,
    window_lengths,
)
from accrot.study.variants import ANSWER_TASKS, EXTENSION_RECORDS, STATE_TASKS

# ---------------------------------------------------------------------------------------------------
# writing the report
# ---------------------------------------------------------------------------------------------------
RULES = STATS_RULES + """

The instruments. Coherence is measured on the model's own transports (learned and token increments, PaTH) with
every diagnostics block a replicate, at 1×, 8× and 64× L; the window of each head is a log-linear fit of the decay
over 1 ≤ Δ ≤ 7/8 of the length, *censored* when the fit cannot place it there, with a jackknife error bar over the
blocks. Random position increments are measured under fresh draws of their own distribution instead (32 per block
at the default size): their coherence is |φ|^Δ whatever the model, so they calibrate the estimator (the instrument
checks) and decide nothing. Far keys of a head are those beyond its own window (never nearer than L/4). Every
instrument and every rule is tested on synthetic truth at the default size's geometry (tests/study/test_verdicts.py)."""


def _table(res: Results, dataset: str, field_: str, digits: int = 3) -> str:
    """Per variant: its trainable parameters, seeds, ``field_`` at every length (mean ± std over seeds) and, for
    NLL, each seed's horizon."""
    mults = res.multipliers(dataset)
    horizon_col = field_ == "nll"
    head = ("| variant | params | seeds | " + " | ".join(times(m) for m in mults)
            + (" | horizon |" if horizon_col else " |"))
    lines = [head, "|" + "---|" * (len(mults) + 3 + horizon_col)]
    for v in res.variants(dataset):
        runs = res.by.get((dataset, v), [])
        cells = [fmt(res.values(dataset, v, field_, m), digits) for m in mults]
        if field_ == "nll":
            cells.append(_horizon_cell(res, dataset, v))
        lines.append(f"| {v} | {_params(runs)} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _params(runs: Sequence[Run]) -> str:
    """Trainable parameters (run.json), e.g. ``246 k``; ``–`` where none is recorded (an extension row: its RoPE's)."""
    counts = sorted({r.params for r in runs if r.params})
    return " / ".join(f"{n / 1000:.0f} k" for n in counts) or "–"


def _horizon_cell(res: Results, dataset: str, variant: str) -> str:
    """The per-seed horizons (C2), e.g. ``8× 16× ≥64×`` (≥: it held at the longest length evaluated)."""
    longest = max(res.multipliers(dataset), default=None)
    hs = res.per_seed(dataset, variant, horizon)
    return " ".join(f"{'≥' if h == longest else ''}{h:g}×" for h in hs) or "–"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # |φ|^Δ and |Δ| would split a markdown table's cells


def _claims_md(claims: Sequence[Claim]) -> str:
    """The claims table (claim, the rule in one sentence, the quantity that decides it, verdict, why) and every
    claim's comparisons, each with its numbers and outcome."""
    lines = ["| # | claim | rule | decided by | on its null | verdict | why |", "|---|---|---|---|---|---|---|"]
    for c in claims:
        lines.append(f"| {c.id} | {_cell(c.claim)} | {_cell(c.rule)} | {_cell(c.test)} | {c.null_verdict} | "
                     f"**{c.verdict}** | {_cell(c.why())} |")
    lines.append("")
    for c in claims:
        lines.append(f"**{c.id} — {c.verdict}.** {c.claim}. Rule: {c.rule}. Decided by: {c.test}.")
        for comp in c.comparisons:
            lines.append(f"- {comp.line()}")
        if c.note:
            lines.append(f"- {c.note}")
        if c.null is not None:
            lines.append(f"- On its null ({c.null_what}): **{c.null.own_verdict}**")
            lines += [f"  - {comp.line()}" for comp in c.null.comparisons]
        elif c.null_what == "":
            lines.append("- No null defined yet: nothing has shown that this rule can read otherwise.")
        lines.append("")
    return "\n".join(lines)


def _calibration_md(checks: Sequence[Claim]) -> str:
    """The instrument checks: they hold by construction of the instrument, so they say the instrument is right,
    not that the theory is."""
    if not any(c.comparisons for c in checks):
        return ""
    lines = ["## Instrument checks (not findings)", "",
             "Random position increments with one spread for every pair have a known coherence, |φ|^Δ, under fresh "
             "draws of their distribution whatever the model has learned: these rows check that the estimator and the window fit recover it on "
             "the trained models' own q and k. They hold by construction and support no claim.", "",
             "| check | rule | verdict |", "|---|---|---|"]
    lines += [f"| {c.id}: {_cell(c.claim)} | {_cell(c.rule)} | **{c.verdict}** |" for c in checks]
    lines.append("")
    for c in checks:
        lines += [f"- {comp.line()}" for comp in c.comparisons]
    lines += list(dict.fromkeys(f"- {c.note}" for c in checks if c.note))  # the same note once
    return "\n".join(lines) + "\n"


def _windows_md(res: Results) -> str:
    """T1/T2's evidence: per variant with its own transport, the mean window over heads at 8× and the longest
    length (mean ± std over seeds) and the heads placed."""
    rows = []
    for v in variants_of(res, "own"):
        runs = res.diagnosed(v)
        pair = window_lengths(runs[0])
        if pair is None:
            continue
        cells = []
        for n in pair:
            means = [mean_of(w for _, w, _ in head_windows(r, n)) for r in runs]
            cells.append(fmt([m for m in means if m is not None], 1))
        placed = [f"{sum(w is not None for _, w, _ in head_windows(r, pair[1]))}/{len(head_windows(r, pair[1]))}"
                  for r in runs]
        rows.append(f"| {v} | {cells[0]} | {cells[1]} | {' '.join(placed)} |")
    if not rows:
        return ""
    L = res.diagnosed(variants_of(res, "own")[0])[0].train_length
    head = ["Mixing windows of the trained transports (T1, T2): mean over the heads placed, tokens, mean ± std over "
            "seeds; heads placed at the longest length, per seed.", "",
            f"| variant | window at {times(pair[0] / L)} | window at {times(pair[1] / L)} | placed |", "|---|---|---|---|"]
    return "\n".join(head + rows) + "\n"


def _far_md(res: Results) -> str:
    """T3's table: far mass measured and predicted (from L alone) per variant, and the horizons."""
    rows = t3_rows(res)
    if not rows:
        return ""
    longest = res.longest()
    lines = ["The lower bound (T3): far attention mass (beyond each head's window, at least L/4; last queries of each "
             "block), measured and predicted from statistics at L alone, mean ± std over seeds; the extrapolation "
             "horizon measured (NLL within 5 % of 1×, on the same targets where scored), per seed. No horizon is "
             "predicted from the far mass: what a far key's value is worth is not known at L.", "",
             f"| variant | role | measured 1× | 8× measured | 8× predicted | {times(longest)} measured | "
             f"{times(longest)} predicted | horizon |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['role']} | {fmt(r['measured@1'])} | {fmt(r['measured@8'])} | "
                     f"{fmt(r['predicted@8'])} | {fmt(r[f'measured@{longest:g}'])} | "
                     f"{fmt(r[f'predicted@{longest:g}'])} | {by_seed(r['horizon'])} |")
    return "\n".join(lines) + "\n"


def results_csv(res: Results) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["dataset", "variant", "seed", "multiplier", "length", "nll", "accuracy", "last_window_nll", "run_dir"])
    for r in res.runs:
        for m, row in sorted(r.lengths.items()):
            w.writerow([r.dataset, r.variant, r.seed, m, row.get("length"), row.get("nll"), row.get("accuracy"),
                        row.get("last_window_nll"), r.run_dir])
    return buf.getvalue()


def _answer_part(res: Results, dataset: str) -> list[str]:
    """A task that scores answers only: their accuracy table, and for a state task what an answer needs."""
    if dataset not in ANSWER_TASKS:
        return []
    note = reading_note(dataset) if dataset in STATE_TASKS else ""
    return ["", "Answer accuracy:", "", _table(res, dataset, "accuracy")] + (["", note] if note else [])


def write_report(res: Results, folder: Path, meta: Mapping[str, Any]) -> Path:
    """``REPORT.md`` + ``results.csv`` + ``claims.json`` + PNGs into ``folder``; returns the report's path."""
    folder.mkdir(parents=True, exist_ok=True)
    claims = check_claims(res)
    figures: list[Path] = []
    sections = []
    for dataset in res.datasets():
        figures.append(plot_nll(res, dataset, folder / f"nll_{dataset}.png"))
        # a task scores its answers only, always at the end of a block: no per-position curve to draw
        pp = None if dataset in ANSWER_TASKS else plot_per_position(res, dataset, folder / f"per_position_{dataset}.png")
        if pp:
            figures.append(pp)
        hz = plot_horizon(res, dataset, folder / f"horizon_{dataset}.png")
        if hz:
            figures.append(hz)
        part = [f"## {dataset_title(dataset)}", "",
                "NLL (nats/token; on a synthetic task: answers only) per evaluation length, mean ± std over seeds.",
                "", _table(res, dataset, "nll")]
        part += _answer_part(res, dataset)
        part += ["", f"![NLL vs length](nll_{dataset}.png)"]
        rise = plot_rise(res, dataset, folder / f"rise_{dataset}.png")
        if rise:
            figures.append(rise)
            part += ["", "The same targets at every length: NLL(m·L) − NLL(L) on the last L/4 tokens of windows ending "
                     "at shared anchors, each with m·L tokens of context (the per-length blocks above score other "
                     "text at each length, their 1× a cold start), mean ± std over seeds:", "",
                     _table(res, dataset, "same_target_rise"), "", f"![same-target rise]({rise.name})"]
        heat = plot_depth_heatmap(res, dataset, folder / f"depth_{dataset}.png")
        if heat:
            figures.append(heat)
            part += ["", "Accuracy per depth of the key and evaluation length (mean over seeds):", "",
                     f"![accuracy per depth and length]({heat.name})"]
        state = plot_state_heatmap(res, dataset, folder / f"state_{dataset}.png", dataset_title(dataset)) \
            if dataset in STATE_TASKS else None
        if state:
            figures.append(state)
            part += ["", "Answer accuracy per evaluation length and position of the answer in the block (mean over "
                     "seeds): where a variant loses the state as the sequence grows.", "",
                     f"![accuracy per length and position]({state.name})"]
        if pp:
            part += ["", f"![per-position NLL]({pp.name})"]
        if hz:
            part += ["", f"Extrapolation horizon (C2): the largest multiple m whose NLL, and every shorter one's, "
                     f"stays within {HORIZON_TOLERANCE:.0%} of NLL(1×), per seed.", "", f"![horizon]({hz.name})"]
        sections.append("\n".join(part))
    theory = plot_theory(res, folder)
    figures += theory
    lengths = {d: next(r.train_length for r in res.runs if r.dataset == d) for d in res.datasets()}
    train_length = " ".join(f"{n} ({d})" for d, n in lengths.items()) if len(set(lengths.values())) > 1 \
        else next(iter(lengths.values()), None)
    wall = time.time() - meta["started"] if meta.get("started") else None
    head = [
        f"# {meta.get('study', folder.name)}: does accumulation explain extrapolation?", "",
        f"- command: `{meta.get('command', '')}`",
        *_scope_lines(meta, res, train_length),
        f"- revision: {_revision()}; written {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
        + (f"; this invocation took {wall / 60:.1f} min" if wall else ""),
        "- every variant: the same recipe, data, token budget, seeds and evaluation blocks; only the position "
        "scheme differs. Runs, configs and checkpoints: `runs/` below this folder; every number: `results.csv`.",
        "",
    ]
    seeds = min((len(runs) for runs in res.by.values()), default=0)
    caution = [] if seeds >= 3 else [
        f"> **{seeds} seed{'s' if seeds != 1 else ''} per variant**: a 95 % interval over "
        f"{'one seed does not exist' if seeds < 2 else 'two seeds is ±12.7 standard errors'}, so the claims this "
        "spread cannot resolve are marked inconclusive. Three seeds or more (`--seeds 3`) are what a verdict "
        "needs.", ""]
    claims_md = ["## Claims", "", *_quick_look(meta), *caution, _read_on(res), "", mixing_note(res), "",
                 _claims_md(claims),
                 _windows_md(res), _far_md(res), _calibration_md(check_calibration(res)), RULES, ""]
    if theory:
        claims_md += [f"![{p.stem}]({p.name})" for p in theory]
    sections.append(_lr_md(res, meta))
    text = "\n".join(head) + "\n" + "\n\n".join(sections) + "\n\n" + "\n".join(claims_md) + "\n"
    atomic_write_text(folder / "results.csv", results_csv(res))
    atomic_write_text(folder / "claims.json", json.dumps(
        [{**asdict(c), "verdict": c.verdict, "own_verdict": c.own_verdict, "null_verdict": c.null_verdict,
          "why": c.why()} for c in claims], indent=1))
    atomic_write_text(folder / "REPORT.md", text)
    return folder / "REPORT.md"


def _scope_lines(meta: Mapping[str, Any], res: Results, train_length) -> list[str]:
    """The header's account of what ran (``meta["scope"]``, from the ablation's spec: variants × data sets × seeds,
    steps, lengths) and of the size preset it was measured against."""
    forms = "; ".join(f"{e.name}: {KINDS[e.kind].note}" for e in EXTENSION_RECORDS)
    extensions = (f" (and {len(res.runs) - res.trained()} eval-time extension rows of the RoPE runs, s = T / L at "
                  f"each length; {forms})" if len(res.runs) > res.trained() else "")
    scope = meta.get("scope")
    if not scope:  # a report built without the ablation's spec at hand
        return [f"- size: {meta.get('size', '?')} ({meta.get('size_cost', '')}); training length L = {train_length}; "
                f"seeds per variant: {meta.get('seeds', '?')}; complete runs: {res.trained()}{extensions}"]
    lengths = ", ".join(f"{m:g}×" for m in scope["multipliers"])
    per = scope.get("per_dataset") or {}
    variants = f"{len(scope['variants'])} variants ({', '.join(scope['variants'])})"
    if any(n != len(scope["variants"]) for n in per.values()):  # a data set runs only the variants its claims read
        grid = (f"{variants} on {len(per)} data sets, each running what its claims read "
                f"({', '.join(f'{d}: {n}' for d, n in per.items())} variants)")
    else:
        grid = f"{variants} × {len(scope['datasets'])} data sets ({', '.join(scope['datasets'])})"
    ran = (f"- ran: {scope['runs']} runs = {grid} × {scope['seeds']} seeds; "
           f"{scope['steps']} training steps each (d {scope['d_model']}, {scope['n_layers']} layers, training length "
           f"L = {train_length}); evaluated at {lengths} L; complete runs: {res.trained()}{extensions}")
    ran = [ran, *_budget_lines(scope, res)]
    preset = f"- size preset: {scope['preset']} ({meta.get('size_cost', '')})"
    if scope["below"]:
        preset += f"; this study ran below it ({', '.join(scope['below'])}): a quick look, not a result"
    return [*ran, preset]


def mixing_note(res: Results) -> str:
    """Which pairs of each learned rotation cannot mix within the longest evaluated length, from its own bound and
    ladder (:func:`~accrot.position.accum.unmixable_pairs`): the regularity condition fails for them by
    construction, so a claim read on that variant tests its ladder, not the claim."""
    from accrot.study.results import unmixable

    lines = []
    for v in res.variants(res.corpus):
        slow = unmixable(res, v)
        runs = res.by.get((res.corpus, v), [])
        n = res.longest() * runs[0].train_length if runs else 0
        if slow:
            first, last = slow[0], slow[-1]
            lines.append(f"- **{v}**: pairs {first[0]}–{last[0]} of {runs[0].head_dim // 2} cannot mix within "
                         f"{times(res.longest())} L ({n:,.0f} tokens) whatever it learns: their largest step is at "
                         f"most {first[1]:.3g} rad, so their shortest window is {first[2]:,.0f} tokens or more.")
    if not lines:
        return ""
    return ("Learned rotations whose own bound keeps pairs coherent over the whole context (the regularity "
            "condition fails for those pairs by construction; what such a variant shows about C2, C3, T1, T2 and T4 "
            "is its ladder's, not the claim's, so those claims show it as a labelled row and do not count "
            "it):\n\n" + "\n".join(lines))


def _read_on(res: Results) -> str:
    """The claims' data set (``accrot ablation --corpus``): the language-model claims and the theory diagnostics are
    read on it; N1 adds the tasks."""
    if res.corpus not in res.datasets():
        return ("Only state-tracking tasks ran: S1–S3 are read on their answer accuracy; the claims on NLL and the "
                "theory diagnostics need a language corpus (`accrot ablation` without `--datasets`, or with "
                "`--corpus`).")
    return (f"Read on **{dataset_title(res.corpus)}** (data set `{res.corpus}`): the claims on NLL and the theory "
            "diagnostics (`accrot ablation --corpus` chooses it).")


def _budget_lines(scope: Mapping[str, Any], res: Results) -> list[str]:
    """The token budget per run (steps × batch × L) and tokens per trainable parameter, per variant (run.json's
    ``parameters``), and the precision the runs trained in."""
    tokens = scope.get("tokens") or {}
    if not tokens:
        return []
    per_data = "; ".join(f"{d}: {n:,}" for d, n in tokens.items()) if len(set(tokens.values())) > 1 else \
        f"{next(iter(tokens.values())):,}"
    ratios = {}  # variant -> tokens per parameter, on the data set the claims read (else the first)
    data = res.corpus if res.corpus in tokens else next(iter(tokens))
    for v in res.variants(data):
        params = {r.params for r in res.by.get((data, v), []) if r.params}
        if len(params) == 1 and not res.is_extension(v):
            ratios[v] = tokens[data] / params.pop()
    line = (f"- budget: {per_data} training tokens per run ({scope['steps']} steps × {scope['batch']} sequences × L); "
            f"precision {scope.get('precision', '32-true')}")
    if ratios:
        lo, hi = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
        span = f"{ratios[lo]:.3g} ({lo}) to {ratios[hi]:.3g} ({hi})" if lo != hi else f"{ratios[lo]:.3g}"
        line += f"; tokens per parameter on {data}: {span}"
    return [line]


def _lr_md(res: Results, meta: Mapping[str, Any]) -> str:
    """Each variant's learning rate: the rate its runs trained at (their run records) and, after ``--tune_lr``,
    the grid it was chosen from (NLL at 1× L of one seed per point, the chosen one in bold)."""
    table = meta.get("lr")
    used = {(r.dataset, r.variant): r.lr for r in res.runs if r.lr is not None}
    if not table:
        rates = sorted({lr for lr in used.values()})
        if not rates:
            return "## Learning rates\n\nNo run recorded its learning rate."
        return ("## Learning rates\n\nEvery variant trained at " + ", ".join(f"{lr:g}" for lr in rates)
                + " (the size's; `--tune_lr` gives each variant its own from a grid).")
    grid = table["grid"]
    lines = ["## Learning rates", "",
             f"Each variant trained its seeds at the learning rate of lowest {table['criterion']} (NLL at 1× L, the "
             f"validation stream) in a grid of {len(grid)} rates, one run each at seed {table['seed']} (a seed none of "
             "the compared runs uses); *edge*: the best rate is the grid's smallest or largest, so its optimum may lie "
             "beyond. With one seed per point, rates whose NLLs differ by less than the seeds' spread are picked "
             "between by noise.", "",
             "| data set | variant | lr | " + " | ".join(f"NLL at {g:g}" for g in grid) + " |",
             "|---|---|---|" + "---|" * len(grid)]
    for label, cell in table["cells"].items():
        data, _, variant = label.partition(".")
        lr = used.get((data, variant), cell["lr"])
        note = f" ({cell['note']})" if cell["note"] else ""
        nll = [cell["nll"].get(f"{g:g}", "missing") for g in grid]
        cells = ["–" if v == "missing" else "failed" if v is None else
                 (f"**{v:.3f}**" if math.isclose(g, cell["lr"]) else f"{v:.3f}") for g, v in zip(grid, nll)]
        lines.append(f"| {data} | {variant} | {lr:g}{note} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _quick_look(meta: Mapping[str, Any]) -> list[str]:
    """The claims section's first words when the study ran below its size preset."""
    scope = meta.get("scope") or {}
    if not scope.get("below"):
        return []
    return [f"> **A quick look, not a result**: this study ran below its `{scope['preset']}` preset "
            f"({', '.join(scope['below'])}). Its verdicts describe these short runs only; the claims are checked at "
            f"the preset (`accrot ablation --size {scope['preset']}`).", ""]


def _revision() -> str:
    from accrot.io import git_revision

    try:
        return git_revision() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def build_report(spec, ref, folder: Path, meta: Mapping[str, Any], console=None) -> Path:
    from accrot.study.extensions import extension_runs
    from accrot.study.results import Results

    res = collect(spec, ref)
    res = Results([*res.runs, *extension_runs(res, console)], res.corpus)  # RoPE's eval-time extensions
    write_notes(spec, ref, res)
    return write_report(res, folder, {**meta, "study": spec.name})


def write_notes(spec, ref, res: Results | None = None) -> None:
    """The claims table and verdicts so far as the note of every study of the ablation (its dashboard page)."""
    import optuna
    from optuna_dashboard import save_note

    from accrot.sweep.storage import open_storage

    res = collect(spec, ref) if res is None else res
    runs = res.trained()
    body = (f"## {spec.name}: the study's claims, {runs} complete run{'s' if runs != 1 else ''} so far\n\n"
            + _claims_md(check_claims(res)) + "\n" + RULES.split("\n\n")[0] + "\n")
    storage = open_storage(ref)
    for name in spec.studies():
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            continue  # not created yet
        save_note(study, body)

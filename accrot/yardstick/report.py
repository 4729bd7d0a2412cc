"""The yardstick's report: one table per protocol in the papers' form, the published rows beside accrot's, the
predictions (fixed in :mod:`accrot.yardstick.protocols` before any run) against what came out, and S1/S2 re-read
with a learnability gate.

Per cell, the rows are the seeds at the chosen learning rate (seed 0's grid run at that rate is seed 0). "Learned"
counts the seeds whose score at the training lengths reached ``LEARNED``; a claim about length is *not tested* on a
cell none of whose seeds learned. The outcome "solved beyond" is the mean over the learned seeds of the test score
reaching ``SOLVED``; a constant or random predictor sits at scaled accuracy 0 ± 2/√N, so the rule can come out
either way. S1 and S2 compare seeds by an exact rank test (every seed of one cell above every seed of the other:
p = 1/C(2n, n), 0.05 at 3 seeds); the same rule is evaluated on a pair the claim says carries no difference (RoPE
against NoPE: neither has a running state) and a rule that reads *for* there is reported as uninformative.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from accrot.yardstick.cells import CELLS
from accrot.yardstick.protocols import LEARNED, SOLVED, Protocol, predict
from accrot.yardstick.runner import Job, choose_lr, load


class Results(dict):
    """``{protocol name: {cell: CellResult}}``, and ``protocols``: each protocol as the command ran it (its steps
    and learning-rate grid)."""

    def __init__(self) -> None:
        super().__init__()
        self.protocols: dict[str, Protocol] = {}


@dataclass
class CellResult:
    cell: str
    lr: float | None = None
    runs: list[dict] = field(default_factory=list)  # the seeds at the chosen lr
    grid: list[dict] = field(default_factory=list)
    missing: int = 0

    def values(self, group: str) -> list[float]:
        return [r[group] for r in self.runs]

    @property
    def params(self) -> int | None:
        return self.runs[0]["model"]["parameters"] if self.runs else None


def collect(out: Path, protocols: list[Protocol], cells: list[str], seeds: int) -> Results:
    """The finished runs in ``out`` of each protocol (as the command runs it) and cell."""
    results = Results()
    for protocol in protocols:
        p, n_steps = protocol.name, protocol.steps
        results.protocols[p] = protocol
        results[p] = {}
        for c in cells:
            res = CellResult(c)
            grid = [load(out, Job(p, c, lr, 0, n_steps)) for lr in protocol.lrs]
            res.grid = [g for g in grid if g is not None]
            if len(res.grid) == len(grid):
                res.lr = choose_lr(protocol, res.grid)
                for s in range(seeds):
                    r = load(out, Job(p, c, res.lr, s, n_steps))
                    (res.runs.append(r) if r is not None else None)
                res.missing = seeds - len(res.runs)
            else:
                res.missing = seeds + len(grid) - len(res.grid)
            results[p][c] = res
    return results


def _good(protocol: Protocol, value: float, threshold: float) -> bool:
    if protocol.kind == "flipflop":  # an error rate: "learned" / "solved" when the reads are right 1 − (1 − t) …
        return value <= 1 - threshold
    return value >= threshold


def outcome(protocol: Protocol, res: CellResult) -> tuple[str, int]:
    """``(outcome, seeds that learned)``: "not tested" when none learned at the training lengths."""
    learned = [r for r in res.runs if _good(protocol, r["train"], LEARNED)]
    if not res.runs:
        return "not run", 0
    if not learned:
        return "not tested", 0
    beyond = sum(r["test"] for r in learned) / len(learned)
    return ("solved beyond" if _good(protocol, beyond, SOLVED) else "not beyond"), len(learned)


def verdict(prediction: str, result: str) -> str:
    if result in ("not tested", "not run"):
        return result
    if prediction == "open":
        return "(open)"
    held = (result == "solved beyond") == (prediction == "yes")
    return "as predicted" if held else "against the prediction"


def _fmt(v: float | None, digits: int = 2) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def rank_test(a: list[float], b: list[float]) -> tuple[str, float]:
    """("for" | "against" | "unresolved", p): every value of ``a`` above every value of ``b`` (or the reverse) is
    the exact rank test's most extreme outcome, p = 1 / C(n_a + n_b, n_a)."""
    if not a or not b:
        return "not tested", math.nan
    p = 1 / math.comb(len(a) + len(b), len(a))
    above, below = min(a) > max(b), max(a) < min(b)
    if p > 0.05:
        return "unresolved (too few seeds)", p
    return ("for" if above else "against" if below else "unresolved"), p


def claims(results: dict) -> list[str]:
    """S1 on parity (accumulated SO(2) cells above RoPE and NoPE beyond the training lengths) and S2 on modular
    arithmetic (PaTH above every SO(2) cell), gated on learning, each with its null (RoPE against NoPE)."""
    lines = []
    specs = [("S1", "parity", ["accum-learned-plain", "accum-learned", "accum-learned+values"], ["RoPE", "NoPE"],
              "commuting accumulation carries the abelian parity state beyond the training lengths"),
             ("S2", "modarith", ["PaTH", "PaTH-reflect"], ["accum-learned-plain", "accum-learned",
                                                           "accum-learned+values"],
              "non-commuting accumulation carries more: PaTH tracks the non-abelian automaton beyond them")]
    for name, p, cells, against, text in specs:
        if p not in results:
            continue
        protocol = results.protocols[p]
        rows = results[p]
        lines.append(f"**{name}** ({text}), on {protocol.title.lower()}:")
        for c in cells:
            if c not in rows:
                continue
            out, n = outcome(protocol, rows[c])
            if out in ("not tested", "not run"):
                lines.append(f"- {c}: **{out}** (no seed reached scaled accuracy {LEARNED} at the training lengths)")
                continue
            for b in against:
                if b not in rows:
                    continue
                v, pv = rank_test(rows[c].values("test"), rows[b].values("test"))
                lines.append(f"- {c} above {b} beyond the training lengths: **{v}** (p = {_fmt(pv, 3)}; "
                             f"{_fmt(_mean(rows[c].values('test')))} vs {_fmt(_mean(rows[b].values('test')))})")
        if "RoPE" in rows and "NoPE" in rows:
            v, pv = rank_test(rows["RoPE"].values("test"), rows["NoPE"].values("test"))
            informative = "uninformative at this size" if v == "for" else "the rule does not read for on its null"
            lines.append(f"- null (RoPE above NoPE, neither with a state): {v} (p = {_fmt(pv, 3)}): {informative}")
        lines.append("")
    return lines


def _mean(v: list[float]) -> float | None:
    return sum(v) / len(v) if v else None


def markdown(results: dict, argv: list[str]) -> str:
    from accrot.io import git_revision

    lines = ["# accrot yardstick: the field's length-generalisation protocols", "",
             f"`{' '.join(['accrot', *argv[1:]]) if argv else 'accrot yardstick'}` at revision "
             f"{git_revision(Path(__file__).parent)} (the report's code).", ""]
    records = [r for p in results.values() for c in p.values() for r in [*c.grid, *c.runs]]
    cost = sum(r["ran"]["seconds"] for r in records)
    trained = sorted({r["ran"]["revision"][:12] for r in records})
    lines += [f"Runs trained at revision {', '.join(trained) or '–'}; worker time of the runs listed: {cost / 60:.0f} "
              "min (one thread each; longer where more processes than cores ran).", ""]
    lines += ["## What the algebra predicts (fixed before any run)", "",
              "| cell | running state its transport can carry | " + " | ".join(results) + " |",
              "|---|---|" + "---|" * len(results)]
    cells = list(next(iter(results.values()))) if results else []
    for c in cells:
        row = [predict(results.protocols[p], CELLS[c]).beyond for p in results]
        lines.append(f"| {c} | {CELLS[c].state} | " + " | ".join(row) + " |")
    lines.append("")
    for c in cells:
        for p in results:
            pr = predict(results.protocols[p], CELLS[c])
            if c in ("NoPE", "accum-learned-plain", "PaTH", "PaTH-contract", "accum-token"):
                lines.append(f"- {c} on {p}: {pr.beyond}: {pr.why}.")
    lines.append("")
    for p, rows in results.items():
        protocol = results.protocols[p]
        lines += _protocol_table(protocol, rows)
    lines += ["## S1 and S2 re-read, gated on learning", "", *claims(results)]
    return "\n".join(lines) + "\n"


def _stats(protocol: Protocol, values: list[float]) -> str:
    """``best / median / mean`` of the seeds (best: the highest accuracy or the lowest error rate)."""
    if not values:
        return "–"
    best = min(values) if protocol.kind == "flipflop" else max(values)
    return f"{_fmt(best)} / {_fmt(statistics.median(values))} / {_fmt(statistics.fmean(values))}"


def _protocol_table(protocol: Protocol, rows: dict[str, CellResult]) -> list[str]:
    flip = protocol.kind == "flipflop"
    groups = protocol.groups()
    shape = protocol.shape
    lines = [f"## {protocol.title}", "",
             f"Protocol: {protocol.source}.", "",
             f"Here: {shape['n_layers']} layer(s), d_model {shape['d_model']}, {shape['n_heads']} heads, "
             f"{protocol.steps} steps of batch {protocol.batch_size}, learning rates "
             f"{', '.join(f'{lr:g}' for lr in protocol.lrs)} on seed 0. {protocol.cut}.", ""]
    if flip:
        dens = [f"FFL({d:g})" for d in protocol.densities]
        lines += [f"Read error rate, best / median / mean of the seeds; training on {dens[0]}. Learned: in-distribution "
                  f"error <= {1 - LEARNED:.2f}; solved beyond: mean of {' and '.join(dens[1:])} <= {1 - SOLVED:.2f}.",
                  "", f"| cell | params | lr | learned | {' | '.join(dens)} | predicted | outcome |",
                  "|---|---|---|---|" + "---|" * len(dens) + "---|---|"]
    else:
        lines += [f"Scaled accuracy, best / median / mean of the seeds, at the training sizes "
                  f"({', '.join(map(str, groups['train']))}) and beyond them ({', '.join(map(str, groups['test']))}). "
                  f"Learned: >= {LEARNED} at the training sizes; solved beyond: the learned seeds' mean >= {SOLVED}.",
                  "", "| cell | params | lr | learned | at training sizes | beyond | predicted | outcome |",
                  "|---|---|---|---|---|---|---|---|"]
    for c, res in rows.items():
        pred = predict(protocol, CELLS[c]).beyond
        result, n_learned = outcome(protocol, res)
        missing = f" ({res.missing} missing)" if res.missing else ""
        if flip:
            cols = [_stats(protocol, [1 - r["accuracy"][str(d)] for r in res.runs]) for d in protocol.densities]
        else:
            cols = [_stats(protocol, res.values("train")), _stats(protocol, res.values("test"))]
        lines.append(f"| {c} | {res.params or '–'} | {f'{res.lr:g}' if res.lr else '–'} | "
                     f"{n_learned}/{len(res.runs)}{missing} | {' | '.join(cols)} | {pred} | {verdict(pred, result)} |")
    if protocol.published:
        lines += ["", "Published rows (as printed in the paper):", ""]
        if flip:
            lines += ["| model | FFL(0.8) | FFL(0.98) | FFL(0.1) | source |", "|---|---|---|---|---|"]
            lines += [f"| {r.model} | {_pct(r.a)} | {_pct(r.b)} | {_pct(r.c)} | {r.source} |"
                      for r in protocol.published]
        else:
            lines += ["| model | best | median | source |", "|---|---|---|---|"]
            lines += [f"| {r.model} | {_fmt(r.a, 3)} | {_fmt(r.b, 3)} | {r.source}{'; ' + r.note if r.note else ''} |"
                      for r in protocol.published]
    lines.append("")
    return lines


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:g} %"


def terminal_tables(results: Results) -> list:
    """One compact rich table per protocol for the terminal (the full tables are report.md's)."""
    from rich.table import Table

    tables = []
    for p, rows in results.items():
        protocol = results.protocols[p]
        flip = protocol.kind == "flipflop"
        t = Table(title=f"{protocol.title}: {'read error rate' if flip else 'scaled accuracy'}, mean of the seeds",
                  title_justify="left")
        for col in ("cell", "learned", "training", "beyond", "predicted", "outcome"):
            t.add_column(col, justify="left" if col in ("cell", "predicted", "outcome") else "right")
        for c, res in rows.items():
            pred = predict(protocol, CELLS[c]).beyond
            result, n = outcome(protocol, res)
            t.add_row(c, f"{n}/{len(res.runs)}", _fmt(_mean(res.values("train"))), _fmt(_mean(res.values("test"))),
                      pred, verdict(pred, result))
        tables.append(t)
    return tables


def summary_json(results: dict) -> str:
    doc = {}
    for p, rows in results.items():
        protocol = results.protocols[p]
        doc[p] = {}
        for c, res in rows.items():
            result, n = outcome(protocol, res)
            per_size = _per_key(res)
            doc[p][c] = {"lr": res.lr, "seeds": [r["settings"]["seed"] for r in res.runs], "learned": n,
                         "train": res.values("train"), "test": res.values("test"), "outcome": result,
                         "predicted": predict(protocol, CELLS[c]).beyond, "accuracy_by_size": per_size,
                         "parameters": res.params, "grid": {str(g["settings"]["lr"]): g["train"] for g in res.grid}}
    return json.dumps(doc, indent=1) + "\n"


def _per_key(res: CellResult) -> dict[str, list[float]]:
    keys = list(res.runs[0]["accuracy"]) if res.runs else []
    return {k: [r["accuracy"][k] for r in res.runs] for k in keys}


_COLOURS = {"none": "0.55", "abelian": "tab:blue", "non-abelian": "tab:red", "contraction": "tab:green"}


def figure(results: dict, path: Path) -> None:
    from accrot.io import atomic_savefig, pyplot
    from data_modules.examples import scaled_accuracy

    plt = pyplot()
    panels = list(results)
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.6 * max(1, len(panels)), 4.0), squeeze=False)
    styles = ["-", "--", ":", "-."]
    for ax, p in zip(axes[0], panels, strict=False):
        protocol = results.protocols[p]
        seen: dict[str, int] = {}
        for c, res in results[p].items():
            if not res.runs:
                continue
            state = CELLS[c].state
            k = seen.get(state, 0)
            seen[state] = k + 1
            per = _per_key(res)
            if protocol.kind == "formal":
                n = 2 if protocol.data.get("task") == "parity" else 5
                keys = sorted(per, key=int)  # the records' keys are sorted as strings
                xs = [int(s) for s in keys]
                ys = [[scaled_accuracy(v, n) for v in per[s]] for s in keys]
            else:
                keys = [str(d) for d in protocol.densities]
                xs = list(range(len(keys)))
                ys = [[1 - v for v in per[s]] for s in keys]
            mean = [sum(y) / len(y) for y in ys]
            ax.plot(xs, mean, styles[k % 4], color=_COLOURS[state], marker="o", ms=3, label=c)
            ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=_COLOURS[state], alpha=0.08)
        if protocol.kind == "formal":
            curriculum = protocol.data_module(0).curriculum
            lo, hi = curriculum.shortest, curriculum.longest
            ax.axvspan(lo, hi, color="0.9", zorder=0, label="training sizes")
            ax.set_xscale("log", base=2)
            sizes = sorted({*protocol.train_sizes, *protocol.test_sizes})
            ax.set_xticks(sizes, [str(v) for v in sizes], fontsize=7)
            ax.minorticks_off()
            ax.set_xlabel("problem size (symbols)")
            ax.set_ylabel("scaled accuracy (0 = chance)")
            ax.axhline(0, color="0.3", lw=0.6)
            ax.set_ylim(-0.3, 1.05)
        else:
            ax.set_xticks(range(len(protocol.densities)),
                          [f"FFL({d:g})" + (" train" if i == 0 else "") for i, d in enumerate(protocol.densities)])
            ax.set_ylabel("read error rate (0.5 = chance)")
            ax.axhline(0.5, color="0.3", lw=0.6, ls=":")
            ax.set_ylim(-0.02, 0.6)
        ax.set_title(protocol.title, fontsize=10)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, max(1, len(labels))), fontsize=8, frameon=False)
    fig.suptitle("accrot yardstick: mean over seeds (band: min–max); grey no state, blue commuting SO(2), red "
                 "Householder, green contraction only", fontsize=9)
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    atomic_savefig(fig, path)
    plt.close(fig)

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

from accrot.study.stats import ALPHA
from accrot.yardstick.cells import CELLS
from accrot.yardstick.protocols import LEARNED, SOLVED, Protocol, applies, predict
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
        for c in sorted(cells, key=lambda name: not CELLS[name].control):  # the controls' rows first
            if not applies(protocol, CELLS[c]):
                continue  # a control with no fixed form on this task: not run, not listed
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
    the exact rank test's most extreme outcome, p = 1 / C(n_a + n_b, n_a), decided at the study's one-sided α
    (0.025: 4 seeds a side reach p = 1/70; 3 a side only 1/20, which cannot decide)."""
    if not a or not b:
        return "not tested", math.nan
    p = 1 / math.comb(len(a) + len(b), len(a))
    above, below = min(a) > max(b), max(a) < min(b)
    if p > ALPHA:
        return "unresolved (too few seeds)", p
    return ("for" if above else "against" if below else "unresolved"), p


def controls(protocol: Protocol, rows: dict[str, CellResult]) -> tuple[str, list[str]]:
    """``(gate, lines)``: whether the protocol's positive controls (the controls predicted "yes") are solved beyond
    the training sizes. ``separates`` when every one is, ``fails`` when one is not (then no prediction is judged:
    the protocol cannot tell a cell without the state from a cell it failed to teach), ``none`` where no control
    runs (no fixed transport is exact for the task: nothing is judged either)."""
    positive = [c for c in rows if CELLS[c].control and predict(protocol, CELLS[c]).beyond == "yes"]
    if not positive:
        return "none", [f"No positive control on {protocol.name} (no fixed transport is exact for this task): the "
                        "predictions are printed, not judged."]
    lines, ok = [], True
    for c in positive:
        out, n = outcome(protocol, rows[c])
        ok &= out == "solved beyond"
        lines.append(f"- control {c}: {out} ({n}/{len(rows[c].runs)} seeds learned; beyond: "
                     f"{_fmt(_mean(rows[c].values('test')))})")
    head = ("The positive controls are solved beyond the training sizes: the protocol can separate the cells, and "
            "the predictions are judged." if ok else
            "A positive control is not solved beyond the training sizes: at this budget the protocol cannot separate "
            "a cell without the state from one it failed to teach, so no prediction is judged.")
    return ("separates" if ok else "fails"), [head, *lines]


def judged(protocol: Protocol, rows: dict[str, CellResult], cell: str) -> str:
    """The verdict printed for ``cell``: the rule's, behind the controls' gate (controls themselves are read)."""
    pred = predict(protocol, CELLS[cell]).beyond
    result, _ = outcome(protocol, rows[cell])
    gate, _ = controls(protocol, rows)
    if gate != "separates" and not CELLS[cell].control and result not in ("not run",):
        return "not judged (controls)" if gate == "fails" else "not judged (no control)"
    return verdict(pred, result)


S1_CELLS = ["accum-learned-plain", "accum-learned", "accum-learned+values"]


def claims(results: dict) -> list[str]:
    """S1 on every parity protocol (accumulated SO(2) cells above RoPE and NoPE beyond the training lengths) and
    S2 on modular arithmetic (PaTH above every SO(2) cell), gated on the controls and on learning; each rule is
    evaluated on a positive control (the fixed clock above NoPE: it must read for) and on its null (RoPE against
    NoPE: it must not)."""
    lines = []
    specs = [("S1", "parity", S1_CELLS, ["RoPE", "NoPE"],
              "commuting accumulation carries the abelian parity state beyond the training lengths"),
             ("S2", "modarith", ["PaTH", "PaTH-reflect"], S1_CELLS,
              "non-commuting accumulation carries more: PaTH tracks the non-abelian automaton beyond them")]
    for name, task, cells, against, text in specs:
        for p, rows in results.items():
            protocol = results.protocols[p]
            if protocol.kind != "formal" or protocol.data.get("task") != task or protocol.clock == "modsum":
                continue
            lines.append(f"**{name}** ({text}), on {protocol.title.lower()}, one-sided α = {ALPHA}:")
            lines += _claim(protocol, rows, cells, against)
            lines.append("")
    return lines


def _claim(protocol: Protocol, rows: dict[str, CellResult], cells: list[str], against: list[str]) -> list[str]:
    gate, _ = controls(protocol, rows)
    if gate != "separates":
        return [f"- not read: {'a positive control failed' if gate == 'fails' else 'no positive control'} on this "
                "protocol (above)"]
    lines = []
    for c in (c for c in cells if c in rows):
        out, _ = outcome(protocol, rows[c])
        if out in ("not tested", "not run"):
            lines.append(f"- {c}: **{out}** (no seed reached scaled accuracy {LEARNED} at the training lengths)")
            continue
        lines += [_compare(rows, c, b, "beyond the training lengths") for b in against if b in rows]
    if "clock" in rows and "NoPE" in rows:
        v, pv = rank_test(rows["clock"].values("test"), rows["NoPE"].values("test"))
        lines.append(f"- positive check (the fixed clock above NoPE): {v} (p = {_fmt(pv, 3)}): "
                     + ("the rule can read for" if v == "for" else "the rule cannot read for even here"))
    if "RoPE" in rows and "NoPE" in rows:
        v, pv = rank_test(rows["RoPE"].values("test"), rows["NoPE"].values("test"))
        informative = "uninformative at this size" if v == "for" else "the rule does not read for on its null"
        lines.append(f"- null (RoPE above NoPE, neither with a state): {v} (p = {_fmt(pv, 3)}): {informative}")
    return lines


def _compare(rows: dict[str, CellResult], c: str, b: str, where: str) -> str:
    v, pv = rank_test(rows[c].values("test"), rows[b].values("test"))
    return (f"- {c} above {b} {where}: **{v}** (p = {_fmt(pv, 3)}; "
            f"{_fmt(_mean(rows[c].values('test')))} vs {_fmt(_mean(rows[b].values('test')))})")


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
    cells = list(dict.fromkeys(c for rows in results.values() for c in rows))
    for c in cells:
        row = [predict(results.protocols[p], CELLS[c]).beyond if c in results[p] else "–" for p in results]
        lines.append(f"| {c} | {CELLS[c].state} | " + " | ".join(row) + " |")
    lines.append("")
    for c in cells:
        for p in results:
            if c in results[p]:
                pr = predict(results.protocols[p], CELLS[c])
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
             f"Protocol: {protocol.source}.", ""]
    if protocol.deviation:
        lines += [f"**Deviation from the published protocol:** {protocol.deviation}.", ""]
    lines += [f"Here: {shape['n_layers']} layer(s), d_model {shape['d_model']}, {shape['n_heads']} heads, "
              f"{protocol.steps} steps of batch {protocol.batch_size}, learning rates "
              f"{', '.join(f'{lr:g}' for lr in protocol.lrs)} on seed 0. {protocol.cut}.", ""]
    if not flip:
        lines += ["**Controls first.** " + "\n".join(controls(protocol, rows)[1]), ""]
    if flip:
        dens = [f"FFL({d:g})" for d in protocol.densities]
        lines += [f"Read error rate, best / median / mean of the seeds; training on {dens[0]}. Learned: in-distribution "
                  f"error <= {1 - LEARNED:.2f}; solved beyond: mean of {' and '.join(dens[1:])} <= {1 - SOLVED:.2f}. "
                  "conv: the width of the cell's short causal convolution (0: none; each cell with one has a "
                  "'(no conv)' twin). k: the number of previous instructions a read that looks back no further "
                  f"would need to err as the cell does in distribution (such a read errs 0.5·p^k at density p: "
                  f"k = 2 gives {0.5 * protocol.densities[0] ** 2:.2f}).",
                  "", f"| cell | conv | params | lr | learned | {' | '.join(dens)} | k | predicted | outcome |",
                  "|---|---|---|---|---|" + "---|" * len(dens) + "---|---|---|"]
    else:
        lines += [f"Scaled accuracy, best / median / mean of the seeds, at the training sizes "
                  f"({', '.join(map(str, groups['train']))}) and beyond them ({', '.join(map(str, groups['test']))}). "
                  f"Learned: >= {LEARNED} at the training sizes; solved beyond: the learned seeds' mean >= {SOLVED}.",
                  "", "| cell | params | lr | learned | at training sizes | beyond | predicted | outcome |",
                  "|---|---|---|---|---|---|---|---|"]
    for c, res in rows.items():
        pred = predict(protocol, CELLS[c]).beyond
        _, n_learned = outcome(protocol, res)
        missing = f" ({res.missing} missing)" if res.missing else ""
        head = f"| {c} | " + (f"{CELLS[c].conv} | " if flip else "")
        if flip:
            errs = [1 - r["accuracy"][str(protocol.densities[0])] for r in res.runs]
            cols = [_stats(protocol, [1 - r["accuracy"][str(d)] for r in res.runs]) for d in protocol.densities]
            cols.append(_fmt(_lookback(_mean(errs), protocol.densities[0]), 1))
        else:
            cols = [_stats(protocol, res.values("train")), _stats(protocol, res.values("test"))]
        lines.append(f"{head}{res.params or '–'} | {f'{res.lr:g}' if res.lr else '–'} | "
                     f"{n_learned}/{len(res.runs)}{missing} | {' | '.join(cols)} | {pred} | "
                     f"{judged(protocol, rows, c)} |")
    if not flip:
        lines += _per_size_table(protocol, rows) + _clock_table(protocol, rows)
    if protocol.published:
        lines += ["", "Published rows (as printed in the paper; its own protocol and budget):", ""]
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


def _lookback(error: float | None, p: float) -> float | None:
    """The k with 0.5·p^k = error: how many previous instructions a read that looks no further would need."""
    if error is None or not 0 < error < 0.5:
        return None
    return math.log(2 * error) / math.log(p)


def _per_size_table(protocol: Protocol, rows: dict[str, CellResult]) -> list[str]:
    """Scaled accuracy at every size, mean of the seeds (and the lowest seed): a clock wrong at some sizes and right
    at others shows here, where the mean over the test sizes would sit near 0."""
    from data_modules.examples import scaled_accuracy

    sizes = sorted({*protocol.train_sizes, *protocol.test_sizes})
    lines = ["", "Scaled accuracy at every size, mean of the seeds (lowest seed in brackets); sizes above "
             f"{max(protocol.train_sizes)} are beyond the training sizes:", "",
             "| cell | " + " | ".join(map(str, sizes)) + " |", "|---|" + "---|" * len(sizes)]
    for c, res in rows.items():
        cols = []
        for n in sizes:
            v = [scaled_accuracy(r["accuracy"][str(n)], protocol.modulus) for r in res.runs if str(n) in r["accuracy"]]
            cols.append(f"{_fmt(_mean(v))} ({_fmt(min(v))})" if v else "–")
        lines.append(f"| {c} | " + " | ".join(cols) + " |")
    return lines


def holds_to(protocol: Protocol, run: dict) -> int:
    """The largest size up to which every scored size has scaled accuracy >= SOLVED (0: not even the smallest)."""
    from data_modules.examples import scaled_accuracy

    last = 0
    for n in sorted({*protocol.train_sizes, *protocol.test_sizes}):
        if scaled_accuracy(run["accuracy"][str(n)], protocol.modulus) < SOLVED:
            break
        last = n
    return last


def _clock_table(protocol: Protocol, rows: dict[str, CellResult]) -> list[str]:
    """Each SO(2) seed's learned clock (:mod:`accrot.yardstick.angles`) against what it did beyond the training
    sizes: the error guarantees the clock up to its horizon π/(n·e); did the accuracy hold that far?"""
    clocked = [(c, r) for c, res in rows.items() for r in res.runs if r.get("clock")]
    if not clocked:
        return []
    top = max(protocol.test_sizes)
    lines = ["", f"The learned clock, read from each SO(2) cell's own angles (its best pair): the error against the "
             f"exact clock (rad, the worst symbol), each symbol's angle there, the horizon π/({protocol.modulus}·error) "
             f"up to which the error keeps the clock within half a sector (a guarantee; errors of opposite sign can "
             f"hold it further), and the largest size up to which the seed's scaled accuracy stays >= {SOLVED}. The "
             f"error predicts the state carried to {top} where the horizon reaches {top}; a horizon short of the "
             "training sizes predicts a readout that cannot rely on the clock.", "",
             "| cell | seed | error | median pair | angles | horizon | holds to | as the error predicts |",
             "|---|---|---|---|---|---|---|---|"]
    for c, r in clocked:
        k = r["clock"]
        h = k["horizon"]
        held = holds_to(protocol, r)
        predicted_far = h >= top
        happened = held >= top
        agrees = ("yes" if predicted_far == happened else
                  "no: held beyond the guarantee" if happened else "no: the readout failed first")
        angles = ", ".join(f"{s} {v:+.3f}" for s, v in k["angles"].items())
        lines.append(f"| {c} | {r['settings']['seed']} | {k['error']:.4f} | {k['median_error']:.3f} | {angles} | "
                     f"{'∞' if not math.isfinite(h) else f'{h:.0f}'} | {held} | {agrees} |")
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
                      pred, judged(protocol, rows, c))
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
                         "parameters": res.params, "grid": {str(g["settings"]["lr"]): g["train"] for g in res.grid},
                         "judged": judged(protocol, rows, c), "clock": [r.get("clock") for r in res.runs],
                         "conv": CELLS[c].conv}
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
                n = protocol.modulus
                keys = sorted(per, key=int)  # the records' keys are sorted as strings
                xs = [int(s) for s in keys]
                ys = [[scaled_accuracy(v, n) for v in per[s]] for s in keys]
            else:
                keys = [str(d) for d in protocol.densities]
                xs = list(range(len(keys)))
                ys = [[1 - v for v in per[s]] for s in keys]
            mean = [sum(y) / len(y) for y in ys]
            colour = "black" if CELLS[c].control else _COLOURS[state]  # the controls: black
            marker = {"clock": "s", "reflection": "D"}.get(CELLS[c].control, "o")  # the two controls told apart
            ax.plot(xs, mean, styles[k % 4], color=colour, marker=marker, ms=3, label=c)
            ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=colour, alpha=0.08)
            horizons = [r["clock"]["horizon"] for r in res.runs if r.get("clock")]
            if protocol.kind == "formal" and horizons and not CELLS[c].control:
                # the learned clock's horizon (median over seeds): where its angle error lets it drift half a sector
                h = statistics.median(horizons)
                if h < 2 * max(xs):
                    ax.plot([min(max(h, 2), 2 * max(xs))], [-0.25], marker="v", color=colour, ms=7)
        if protocol.kind == "formal":
            curriculum = protocol.data_module(0).curriculum
            lo, hi = curriculum.shortest, curriculum.longest
            ax.axvspan(lo, hi, color="0.9", zorder=0, label="training sizes")
            ax.set_xscale("log", base=2)
            sizes = sorted({*protocol.train_sizes, *protocol.test_sizes})
            ax.set_xlim(min(1, lo) * 0.9, 2 * max(sizes))
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
    fig.suptitle("accrot yardstick: mean over seeds (band: min–max); black: the pinned controls; grey no state, blue "
                 "commuting SO(2), red Householder, green contraction only;\n▼ at the bottom: a learned clock's "
                 "horizon π/(n·angle error), median over seeds (off the plot when beyond twice the largest size)",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    atomic_savefig(fig, path)
    plt.close(fig)

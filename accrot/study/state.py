"""What accumulated transformations can carry, across lengths: the claims S1–S3 on the state-tracking tasks
(``data_modules/state.py``), read on their answer accuracy per evaluation length, and the accuracy heatmaps.

The algebra: accumulated SO(2) rotations commute (their product is a rotation by the summed angle), so they can
carry an abelian running state (a parity, a count mod n) and nothing non-abelian; Householder products (PaTH) do
not commute and can carry the running product of permutations (S5, A5). Whether each keeps its state *past* the
training length, where the far set grows, is what these claims ask:

* **S1** (commuting accumulation carries abelian state): on parity and counting mod n, the mean answer accuracy
  over 8×–64× L of accum-learned and accum-learned+values above RoPE's and NoPE's (paired over seeds).
* **S2** (non-commuting accumulation carries more): on the word problems (S3, S5, A5), PaTH's accuracy at L above
  1/|G'| + 0.05, the best a commuting state can do (it holds the product only up to the commutator subgroup G':
  1/3 for S3, where the sign is what it holds; 1/60 for S5 and A5), and its accuracy at L and its mean over
  2×–64× L above every SO(2) accumulation's, which stay under that limit at the longest length. Beating the SO(2)
  cells alone is not enough: on S3 with transpositions the sign is (−1)^(elements so far), which any model that
  counts positions has.
* **S3** (far-mass control keeps state reads exact at length): on flip-flop at the sparse density, every
  far-mass-controlled variant with a rotation (a logit term growing with distance: ALiBi, a forget gate) reads the
  last write at the longest length with accuracy above 0.95, where every rotation-only variant (an accumulated
  transport without one; an output gate leaves a variant rotation-only) falls below it. The other far-mass designs
  (scalable softmax; NoPE layers interleaved with RoPE ones, which accumulate nothing) are on neither side: shown in
  the tables, not counted.

Which variant is which is read off its parts' declared facts (:func:`accrot.position.facts`), never its family name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from accrot.position import SchemeFacts, facts
from accrot.study.looks import frame, look
from accrot.study.results import Results, Run, mean_of, times
from accrot.study.stats import Claim, Comparison, compare_threshold, compare_variants
from accrot.study.variants import DATASETS
from data_modules.state import commuting_ceiling, group_table

LEARNED = 0.9  # scaled accuracy (acc − chance) / (1 − chance) at L a variant must reach before its length is read
GATE = (f"; a variant that did not learn the task at L (scaled accuracy under {LEARNED:g}) is not tested, and "
        "nothing tested: not tested")
S2_MARGIN = 0.05  # "at the commuting limit": at most this far above 1/|G'| (data_modules.state.commuting_ceiling)
S3_EXACT = 0.95  # "reads exactly": 95 % of the reads right at the longest length
ABELIAN = ("parity", "modcount")
GROUPS = ("s3", "s5", "a5")
FLIPFLOP = ("flipflop",)


def variant_facts(variant: str) -> SchemeFacts:
    """The declared facts of a study variant's scheme (its overrides; NoPE's for a name the study does not know)."""
    from accrot.study.variants import VARIANTS

    return facts(VARIANTS.get(variant, {}))


def controlled(variant: str) -> bool:
    """Far-mass control: a logit term that grows with distance (ALiBi, a forget gate). Scalable softmax, an output
    gate and NoPE layers are far-mass designs (:func:`far_mass_design`), not this control."""
    return variant_facts(variant).controls_far_mass


def far_mass_design(variant: str) -> bool:
    """Any of the field's far-mass designs: a growing bias, scalable softmax, an output gate, NoPE layers."""
    return variant_facts(variant).far_mass_design


def rotation_only(variant: str) -> bool:
    """An accumulated transport (accum, PaTH) whose far mass nothing controls (:attr:`SchemeFacts.rotation_only`)."""
    return variant_facts(variant).rotation_only


def chance(task: str) -> float:
    """The accuracy of a guess on ``task``'s answers: 1/n mod n, 1/|G| on a word problem, 1/2 on flip-flop."""
    spec = DATASETS.get(task, {})
    if "data.init_args.group" in spec:
        return 1.0 / len(group_table(spec["data.init_args.group"])[0])
    if "data.init_args.modulus" in spec:
        return 1.0 / spec["data.init_args.modulus"]
    return 0.5


def untested(res: Results, task: str, variant: str) -> Comparison | None:
    """The learnability gate: a "not tested" comparison when ``variant`` did not learn ``task`` at L (its mean
    scaled accuracy over seeds under :data:`LEARNED`): a model that answers at chance at L says nothing about what
    it carries beyond L. None when it learned (or did not run: its comparisons then say so)."""
    values = res.values(task, variant, "accuracy", 1.0)
    if not values:
        return None
    c = chance(task)
    scaled = (sum(values) / len(values) - c) / (1 - c)
    if scaled >= LEARNED:
        return None
    return Comparison(f"{task}: {variant} learned at L", f"scaled accuracy at L {scaled:.2f} < {LEARNED:g} "
                      f"(chance {c:.3g}): its length is not tested", "not tested")


def mean_accuracy(lo: float, hi: float):
    """Per run: the mean answer accuracy over the evaluated multiples in [lo, hi]."""
    def read(run: Run) -> float | None:
        return mean_of(run.value("accuracy", m) for m in run.lengths if lo <= m <= hi)
    return read


def _accuracy_vs(res: Results, task: str, what: str, a: str, b: str, fn) -> Comparison:
    return compare_variants(what, a, res.seeded(task, a, fn), b, res.seeded(task, b, fn), lower_is_for=False)


def s1(res: Results) -> Claim | None:
    tasks = [t for t in ABELIAN if any(d == t for d, _ in res.by)]
    if not tasks:
        return None
    c = Claim("S1", "commuting accumulation carries abelian state beyond L",
              "parity / counting mod n: mean answer accuracy over 8×–64× L, accum-learned (and +values) against RoPE "
              "and NoPE", rule="for when each accumulated variant's accuracy is resolved above RoPE's and NoPE's "
                               "(paired over seeds); every comparison must be for" + GATE)
    for task in tasks:
        beyond = mean_accuracy(min(8.0, res.longest(task)), math.inf)  # 8×–64× L (a quick look: its longest)
        for v in ("accum-learned", "accum-learned+values"):
            if not res.by.get((task, v)):
                continue
            if (gate := untested(res, task, v)) is not None:
                c.comparisons.append(gate)
                continue
            for anchor in ("RoPE", "NoPE"):
                c.comparisons.append(_accuracy_vs(res, task, f"{task}: {v} vs {anchor}", v, anchor, beyond))
    if not c.comparisons:
        c.comparisons.append(Comparison("accum-learned on an abelian task", "not run", "missing"))
    return c


def s2(res: Results) -> Claim | None:
    tasks = [t for t in GROUPS if any(d == t for d, _ in res.by)]
    if not tasks:
        return None
    c = Claim("S2", "non-commuting accumulation carries more: PaTH tracks permutation products",
              "word problems (S3 / S5 / A5): PaTH's answer accuracy at L and its mean over 2×–64× L against every "
              "SO(2) accumulation's; those at the longest length against the commuting limit 1/|G'|",
              rule=f"for when PaTH lies above 1/|G'| + {S2_MARGIN:g} at L (the best a commuting state can do: 1/3 on "
                   "S3, where the sign is all it holds, 1/60 on S5 and A5) and is resolved above each SO(2) "
                   "accumulation at L and beyond, and each of those stays under that limit at the longest length; "
                   "every comparison must be for" + GATE)
    at_l, beyond = mean_accuracy(1, 1), mean_accuracy(2, math.inf)
    for task in tasks:
        so2 = [v for v in res.variants(task) if (f := variant_facts(v)).accumulates and f.commutes]
        longest = res.longest(task)
        limit = commuting_ceiling(DATASETS[task]["data.init_args.group"]) + S2_MARGIN
        if (gate := untested(res, task, "PaTH")) is not None:  # PaTH never learned it: nothing to carry beyond
            c.comparisons.append(gate)
            continue
        if res.by.get((task, "PaTH")):  # above what any commuting state can hold: the evidence of a non-abelian one
            c.comparisons.append(compare_threshold(
                f"{task}: PaTH beyond the commuting limit at L", res.values(task, "PaTH", "accuracy", 1.0), limit,
                below_is_for=False, label="accuracy "))
        for v in so2:
            if res.by.get((task, "PaTH")):
                c.comparisons.append(_accuracy_vs(res, task, f"{task}: PaTH vs {v} at L", "PaTH", v, at_l))
                c.comparisons.append(_accuracy_vs(res, task, f"{task}: PaTH vs {v} beyond L", "PaTH", v, beyond))
            c.comparisons.append(compare_threshold(
                f"{task}: {v} at the commuting limit at {times(longest)}", res.values(task, v, "accuracy", longest),
                limit, label="accuracy "))
    if not c.comparisons:
        c.comparisons.append(Comparison("PaTH and an SO(2) accumulation", "not run", "missing"))
    return c


def s3(res: Results) -> Claim | None:
    tasks = [t for t in FLIPFLOP if any(d == t for d, _ in res.by)]
    if not tasks:
        return None
    c = Claim("S3", "far-mass control keeps state reads exact at length",
              "flip-flop at the sparse density: the last write's read accuracy at the longest length",
              rule=f"for when every far-mass-controlled variant lies above {S3_EXACT:g} and every rotation-only "
                   "variant below it; every comparison must be for" + GATE)
    for task in tasks:
        longest = res.longest(task)
        for v in res.variants(task):
            values = res.values(task, v, "accuracy", longest)
            counted = (controlled(v) and variant_facts(v).rotates) or rotation_only(v)
            if counted and (gate := untested(res, task, v)) is not None:
                c.comparisons.append(gate)
            elif controlled(v) and variant_facts(v).rotates:
                c.comparisons.append(compare_threshold(f"{task}: {v} exact at {times(longest)}", values, S3_EXACT,
                                                       below_is_for=False, label="accuracy "))
            elif rotation_only(v):
                c.comparisons.append(compare_threshold(f"{task}: {v} fails at {times(longest)}", values, S3_EXACT,
                                                       label="accuracy "))
    if not c.comparisons:
        c.comparisons.append(Comparison("far-mass-controlled and rotation-only variants", "not run", "missing"))
    return c


STATE_CHECKS = (s1, s2, s3)


def reading_note(dataset: str) -> str:
    """One sentence for a state task's section of the report: what an answer needs, and the accuracy of a guess."""
    spec = DATASETS.get(dataset, {})
    args = {k.rsplit(".", 1)[1]: v for k, v in spec.items() if k.startswith("data.init_args.")}
    hidden = "the model does not read earlier answers, so each needs the whole prefix"
    if "group" in args:
        group = args["group"]
        order = len(group_table(group)[0])
        return (f"Each answer is the running product of every permutation before it ({hidden}); a guess scores "
                f"1/{order} = {1 / order:.3f}, a commuting state at best 1/|G'| = {commuting_ceiling(group):.3f}.")
    if "modulus" in args:
        n = args["modulus"]
        return f"Each answer is the number of 1-bits so far mod {n} ({hidden}); a guess scores 1/{n}."
    if dataset.startswith("flipflop"):
        return "A read prints the latest write (in the stream, as the flip-flop language defines it); a guess scores 0.5."
    return ""


# ---------------------------------------------------------------------------------------------------
# accuracy per length and position
# ---------------------------------------------------------------------------------------------------
def position_bins(longest: float) -> list[tuple[float, float]]:
    """Position bins in multiples of L: [0, 1), [1, 2), [2, 4), ... up to the longest length."""
    edges = [0.0, 1.0]
    while edges[-1] < longest:
        edges.append(edges[-1] * 2)
    return list(zip(edges, edges[1:]))


def accuracy_grid(res: Results, task: str, variant: str) -> tuple[list[float], list[tuple[float, float]], list]:
    """``(multiples, position bins, accuracy [bin][multiple])``: the answer accuracy (mean over seeds) of the
    answers whose position in the block lies in each bin (multiples of L), at each evaluation length; NaN where a
    length has no position in the bin."""
    runs = res.by.get((task, variant), [])
    mults = res.multipliers(task)
    bins = position_bins(max(mults, default=1.0))
    grid = []
    for lo, hi in bins:
        line = []
        for m in mults:
            vals = [a for r in runs if (a := _bin_accuracy(r, m, lo, hi)) is not None]
            line.append(sum(vals) / len(vals) if vals else math.nan)
        grid.append(line)
    return mults, bins, grid


def _bin_accuracy(run: Run, mult: float, lo: float, hi: float) -> float | None:
    row = run.lengths.get(float(mult)) or {}
    width, acc = row.get("bucket_width"), row.get("bucket_accuracy")
    if not width or not acc:
        return None
    L = run.train_length
    vals = [a for i, a in enumerate(acc) if a is not None and lo * L <= (i + 0.5) * width < hi * L]
    return sum(vals) / len(vals) if vals else None


def plot_state_heatmap(res: Results, task: str, path: Path, title: str) -> Path | None:
    """One panel per variant: answer accuracy per evaluation length (x) and position in the block (y, multiples of
    L), mean over seeds, the value in each cell."""
    from accrot.io import atomic_savefig, pyplot

    panels = [(v, *accuracy_grid(res, task, v)) for v in res.variants(task)]
    panels = [p for p in panels if any(math.isfinite(a) for line in p[3] for a in line)]
    if not panels:
        return None
    plt = pyplot()
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols + 1.2, 2.8 * rows + 0.7), squeeze=False,
                             layout="constrained")
    image = None
    for k, (ax, (v, mults, bins, grid)) in enumerate(zip(axes.flat, panels)):
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(mults)), [times(m) for m in mults], fontsize=6)
        ax.set_yticks(range(len(bins)), [f"{lo:g}–{hi:g}" for lo, hi in bins], fontsize=6)
        for i, line in enumerate(grid):
            for j, acc in enumerate(line):
                if math.isfinite(acc):
                    ax.text(j, i, f"{acc:.2f}", ha="center", va="center", fontsize=5,
                            color="black" if acc > 0.6 else "white")
        seeds = len(res.by.get((task, v), []))
        ax.set_title(f"{v}, {seeds} seed{'s' if seeds != 1 else ''}", fontsize=8)
        frame(ax, look(v).color)
        if k >= len(panels) - cols:
            ax.set_xlabel("evaluation length / L", fontsize=7)
        if k % cols == 0:
            ax.set_ylabel("answer position / L", fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.colorbar(image, ax=axes, shrink=0.8, label="answer accuracy (mean over seeds)")
    fig.suptitle(f"{title}: answer accuracy per length and position", fontsize=10)
    atomic_savefig(fig, path)
    plt.close(fig)
    return path


def accuracy_table(res: Results, task: str, variants: Sequence[str] | None = None) -> str:
    """Answer accuracy per variant and length (mean ± std over seeds), markdown."""
    from accrot.study.stats import fmt

    mults = res.multipliers(task)
    lines = ["| variant | seeds | " + " | ".join(times(m) for m in mults) + " |", "|" + "---|" * (len(mults) + 2)]
    for v in variants or res.variants(task):
        cells = [fmt(res.values(task, v, "accuracy", m)) for m in mults]
        lines.append(f"| {v} | {len(res.by.get((task, v), []))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

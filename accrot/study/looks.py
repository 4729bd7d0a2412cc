"""How every variant is drawn, in every figure of the study (the report's curves and heatmaps, the demo's figure):
one look per variant, derived from its scheme overrides, never from its display label.

A hue per family, read off the scheme:

* **baselines** (greys and browns): no accumulated transform — NoPE, RoPE (fixed angles), ALiBi, and RoPE with
  any far-mass design; RoPE's evaluation-time extensions keep RoPE's colour with a dash pattern of their own;
* **rotation-only SO(2)** (blues and violets): accumulated angles (``rotation: accum``) without far-mass control;
* **PaTH** (greens): accumulated Householder transforms, with or without a forget gate;
* **far-mass cells** (reds and oranges): accumulated angles with far-mass control (a bias, a gate, scalable
  softmax), the cells the lower bound points to.

Within a family each member takes the next shade and the next marker in the order of ``VARIANTS``, the default
selection first, so the default variants get the shades farthest apart; a variant that transports its values along
the rotation is drawn with a long dash, its shades counted apart from the solid lines'. Any two default variants differ by a CIELAB ΔE of at least 20 or by their
dash pattern (``tests/study/test_figures.py`` holds that)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accrot.study.variants import DEFAULT_VARIANTS, EXTENSIONS, VARIANTS

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p")  # the k-th member of a family takes the k-th


@dataclass(frozen=True)
class Family:
    """A group of variants drawn in one hue, and one panel of the curves' figures."""

    title: str
    shades: tuple[str, ...]  # hex sRGB; the k-th member takes the k-th (the default variants come first)


FAMILIES: dict[str, Family] = {
    "baseline": Family("baselines (no accumulated transform)",
                       ("#8f8f8f", "#000000", "#85603c", "#4d4d4d", "#c4ad93", "#aaaaaa", "#3d2b1f")),
    "so2": Family("rotation-only SO(2) accumulation",
                  ("#2166ac", "#6baed6", "#6a3d9a", "#08306b", "#17becf", "#a08fd0", "#3f8fd0", "#3f007d")),
    "path": Family("PaTH (Householder accumulation)", ("#33a02c", "#00441b", "#8fd175")),
    "cell": Family("far-mass cells (accumulation + far-mass control)",
                   ("#d62728", "#fd8d3c", "#67001f", "#f768a1", "#b35806", "#e7298a")),
    # a label the study does not define (an older results folder, another variant table)
    "other": Family("other variants", ("#bcbd22", "#e377c2", "#8c564b", "#7f7f7f", "#17becf")),
}
# RoPE's eval-time extensions: RoPE's colour, a dash pattern per kind (on-off lengths in points), no band
EXTENSION_DASHES = {"pi": (4.0, 2.0), "ntk": (1.0, 1.5), "yarn": (6.0, 2.0, 1.0, 2.0)}


@dataclass(frozen=True)
class Look:
    """One variant's colour, marker and line in every figure."""

    family: str  # a key of FAMILIES
    color: str  # hex sRGB
    marker: str
    dashes: tuple[float, ...] | None = None  # None: a solid line
    evaluation_only: bool = False  # an evaluation of another variant's runs (no seeds' band of its own)

    @property
    def linestyle(self) -> Any:
        return "-" if self.dashes is None else (0, self.dashes)

    def line(self) -> dict[str, Any]:
        """matplotlib's ``plot`` keywords of this look."""
        return {"color": self.color, "marker": self.marker, "linestyle": self.linestyle}


def family_of(scheme: Mapping[str, Any]) -> str:
    """The family of a variant's ``model.scheme`` overrides (a key of :data:`FAMILIES`), from what its parts declare:
    ``baseline`` (nothing accumulates: NoPE, RoPE, ALiBi), ``path`` (a product that does not commute), ``cell`` (an
    accumulated rotation with a far-mass design on its logits or output) and ``so2`` (an accumulated rotation
    alone)."""
    from accrot.position import facts

    declared = facts(dict(scheme))
    if not declared.accumulates:
        return "baseline"
    if not declared.commutes:
        return "path"
    cell = declared.controls_far_mass or declared.scales_logits or declared.gates_output
    return "cell" if cell else "so2"


VALUE_DASHES = (5.0, 1.5)  # values transported along the rotation: a long dash, in every family


def _dashes(scheme: Mapping[str, Any]) -> tuple[float, ...] | None:
    from accrot.position import facts

    return VALUE_DASHES if facts(dict(scheme)).rotates_values else None


def _study_looks() -> dict[str, Look]:
    """Every study variant's look (the default selection first within each family), and the extensions'."""
    looks: dict[str, Look] = {}
    taken: dict[tuple[str, tuple[float, ...] | None], int] = {}
    members: dict[str, int] = {}
    for name in [*DEFAULT_VARIANTS, *(v for v in VARIANTS if v not in DEFAULT_VARIANTS)]:
        family, dashes = family_of(VARIANTS[name]), _dashes(VARIANTS[name])
        k = taken.get((family, dashes), 0)  # solid and dashed lines take their shades apart
        taken[family, dashes] = k + 1
        m = members.get(family, 0)  # and the markers in one count over the family
        members[family] = m + 1
        shades = FAMILIES[family].shades
        looks[name] = Look(family, shades[k % len(shades)], MARKERS[m % len(MARKERS)], dashes)
    rope = looks["RoPE"]
    for label, kind in EXTENSIONS.items():
        looks[label] = Look(rope.family, rope.color, "x", EXTENSION_DASHES[kind], evaluation_only=True)
    return looks


LOOKS = _study_looks()


def look(variant: str) -> Look:
    """The look of a study variant (or eval-time extension) by its name; a name the study does not define gets a
    fixed look of the "other" family, the same in every figure."""
    if variant in LOOKS:
        return LOOKS[variant]
    h = zlib.crc32(variant.encode())
    shades = FAMILIES["other"].shades
    return Look("other", shades[h % len(shades)], MARKERS[(h // len(shades)) % len(MARKERS)])


def look_of_scheme(scheme: Mapping[str, Any]) -> Look:
    """The look of the study variant with exactly these scheme overrides (the demo names its variants its own way);
    overrides the study does not define: the first shade of their family."""
    for name, overrides in VARIANTS.items():
        if dict(overrides) == dict(scheme):
            return LOOKS[name]
    family = family_of(scheme)
    return Look(family, FAMILIES[family].shades[0], MARKERS[0])


def by_family(variants: list[str]) -> dict[str, list[str]]:
    """``variants`` grouped by family, in the families' order (empty families left out), each in the given order."""
    groups: dict[str, list[str]] = {f: [] for f in FAMILIES}
    for v in variants:
        groups[look(v).family].append(v)
    return {f: vs for f, vs in groups.items() if vs}


def frame(ax, color: str) -> None:
    """A panel of one variant (a heatmap) framed in the variant's colour."""
    for spine in ax.spines.values():
        spine.set_edgecolor(color)
        spine.set_linewidth(2.0)

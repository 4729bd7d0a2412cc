"""Metric names of an evaluation (``nll@16x``: the grammar sweeps, pruning and reports share) and the
``mean ± std`` summaries of several seeds."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

# ``nll@{m}x``, ``last_window_nll@{m}x``, ``ppl@{m}x``, ``accuracy@{m}x`` with m an evaluation multiplier;
# an ``extrap/`` prefix (the name the extrapolation callback logs) is accepted.
METRIC_FIELDS = ("nll", "last_window_nll", "ppl", "accuracy")
_METRIC = re.compile(r"^(?:extrap/)?(?P<field>nll|last_window_nll|ppl|accuracy)@(?P<mult>\d+(?:\.\d+)?)x$")


def parse_metric(name: str) -> tuple[str, float]:
    """``"nll@16x"`` -> ``("nll", 16.0)``; ValueError naming the valid forms otherwise."""
    m = _METRIC.match(str(name).strip())
    if not m:
        raise ValueError(f"metric {name!r} is not valid; use FIELD@Mx with FIELD one of "
                         f"{', '.join(METRIC_FIELDS)} and M an evaluation multiplier (e.g. nll@16x)")
    return m.group("field"), float(m.group("mult"))


def metric_key(field: str, multiplier: float) -> str:
    return f"{field}@{multiplier:g}x"


def metrics_of(lengths: Sequence[Mapping]) -> dict[str, float]:
    """Every metric of one evaluation (the ``lengths`` rows of an ``extrapolation.json`` entry), flat."""
    out = {}
    for row in lengths:
        for field in METRIC_FIELDS:
            if row.get(field) is not None:
                out[metric_key(field, float(row["multiplier"]))] = float(row[field])
    return out


def metric_value(lengths: Sequence[Mapping], name: str) -> float:
    """The value of metric ``name`` in one evaluation; KeyError if that multiplier was not evaluated."""
    field, mult = parse_metric(name)
    for row in lengths:
        if math.isclose(float(row["multiplier"]), mult):
            return float(row[field])
    evaluated = ", ".join(f"{float(r['multiplier']):g}" for r in lengths)
    raise KeyError(f"metric {name!r}: multiplier {mult:g} was not evaluated (evaluated: {evaluated})")


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def pm(values: Sequence[float], digits: int = 4, empty: str = "-") -> str:
    """``mean ± std`` over seeds (just the mean for one value, ``empty`` for none)."""
    if not values:
        return empty
    mean, std = mean_std(values)
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"

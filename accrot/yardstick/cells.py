"""The cells a yardstick runs: position schemes as ``model.scheme`` overrides, each with what the algebra predicts.

Most are the study's variants under their names (:mod:`accrot.study.variants`); three differ and say why:

- ``FoX`` is the forget gate alone (no rotation), the far-mass control without any state.
- ``accum-learned-plain`` is the form whose pairs can mix (one full-rank projection, no ladder, no convolution) with
  its bound at π instead of the study's 1 rad: parity needs a half turn per odd symbol, and a bound below π would
  exclude it by construction, which tests nothing.
- ``accum-token`` is drawn with the study's mixing window (three quarters of the training row).
- ``clock`` and ``reflection`` are positive controls whose transport is pinned to the task's exact state, never
  learned (:mod:`accrot.yardstick.controls`); they run only on the protocols with an exact clock.
- ``… (no conv)`` twins drop the short causal convolution the reference cells have (Selective RoPE's width-4 one
  on the increments, PaTH's width-3 one on w): a convolution reads the last few tokens directly, which on
  flip-flop is part of what a sparse-read advantage could be.

Parameter counts are matched to NoPE's by each cell's own SwiGLU width (:func:`matched_hidden`): the schemes'
projections (PaTH's w and β, the learned increments) are paid for by fewer hidden units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accrot.study.variants import PLAIN_LEARNED, VARIANT_RECORDS


@dataclass(frozen=True)
class Cell:
    name: str
    scheme: dict
    description: str
    windowed: bool = False  # random increments whose window is set to 3/4 of the training row
    state: str = ""  # what running state the scheme's algebra can carry (the predictions read it)
    control: str = ""  # "clock" or "reflection": a positive control whose transport is pinned (controls.py)

    @property
    def conv(self) -> int:
        """Width of the scheme's short causal convolution (0: none), as its config fills it in."""
        from accrot.position import SchemeConfig

        return SchemeConfig(**self.scheme).conv_size or 0


def _variant(name: str, state: str, **kw) -> Cell:
    v = VARIANT_RECORDS[name]
    return Cell(name, dict(v.scheme), v.description, windowed=v.windowed, state=state, **kw)


def _no_conv(cell: Cell) -> Cell:
    return Cell(f"{cell.name} (no conv)", {**cell.scheme, "conv_size": 0},
                f"{cell.description} Without its short causal convolution.", windowed=cell.windowed,
                state=cell.state)


NONE, ABELIAN, FULL, CONTRACT = "none", "abelian", "non-abelian", "contraction"
CELLS: dict[str, Cell] = {c.name: c for c in (
    _variant("NoPE", NONE),
    _variant("RoPE", NONE),
    _variant("ALiBi", NONE),
    Cell("FoX", {"far_mass": "forget"}, "FoX's forget gate alone, no rotation: far-mass control without a state.",
         state=NONE),
    _variant("accum-token", NONE),  # a frozen table: a state only if its draw happens to turn a b by ~π
    Cell("accum-learned-plain", {"rotation": "accum", "increments": "learned", **PLAIN_LEARNED,
                                 "max_increment": math.pi},
         "Learned increments whose pairs can mix: one full-rank projection of the input, no ladder, no convolution, "
         "bounded at π (a half turn per symbol is reachable).", state=ABELIAN),
    _variant("accum-learned", ABELIAN),
    _variant("accum-learned+values", ABELIAN),
    _variant("PaTH", FULL),
    _variant("PaTH-contract", CONTRACT),
    _variant("PaTH-reflect", FULL),
    Cell("clock", {"rotation": "accum", "increments": "random_token"},
         "Positive control: the task's exact clock pinned in a token table (every pair of q, k turns by 2π·count/n "
         "per symbol), never learned.", state=ABELIAN, control="clock"),
    Cell("reflection", {"rotation": "path", "path_beta": "reflection", "conv_size": 0, "path_rank": 0},
         "Positive control: PaTH with every factor pinned, a reflection along a fixed w on each odd-count symbol "
         "and the identity elsewhere, never learned.", state=FULL, control="reflection"),
)}
CELLS.update({c.name: c for c in map(_no_conv, (CELLS["accum-learned"], CELLS["PaTH"], CELLS["PaTH-reflect"]))})
DEFAULT_CELLS = tuple(CELLS)

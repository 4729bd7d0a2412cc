"""Positive controls: cells whose transport is set exactly, never learned, so a protocol can be tried on a cell
that is known to carry the state. If a control is not solved beyond the training sizes, the protocol (the budget,
the readout through attention, the data) cannot separate the cells, whatever the learned cells do.

- **fixed clock** (``clock``): an accumulated SO(2) rotation whose per-token table is pinned: every head and pair
  of q, k turns by ``2π·c(byte)/n`` at each byte, c the byte's count in the task (:data:`CLOCKS`): parity turns
  ``b`` by π and every other byte by 0, so q_tᵀ R(θ_s − θ_t) k_s = (−1)^(b's in s+1..t) q_tᵀ k_s at any length;
  a sum of digits mod 5 turns digit d by 2πd/5. The table is the ``random_token`` source's buffer
  (:class:`~accrot.position.accum.RandomTokenIncrements`), overwritten after the model is built: a buffer, so
  the optimiser never moves it, and ``angles()`` reads it as for any table.
- **fixed reflection** (``reflection``): PaTH with every factor pinned, H_j = I − β_j w wᵀ with one fixed unit w
  per head and β_j = 2 where byte j is counted, 0 elsewhere (:class:`PinnedReflection`): the key of s reaches t
  reflected along w once per counted byte between them, (−1)^count along w. A reflection has order 2: it carries
  parity, not a count mod 5 (there it is a negative control).

Only the transport is pinned; everything else (embeddings, q/k/v, the readout) trains as in every other cell.
The scheme contract is unchanged: the clock's ``angles`` and the reflection's ``householder`` return what the
forward uses, in their usual shapes.
"""

from __future__ import annotations

import math

import torch

from accrot.position.base import RotationPart
from accrot.position.path import PathRotation

# per task: (modulus n, {byte: its count c}); a fixed clock turns byte b by 2π·c(b)/n, every other byte by 0
# (the alphabet: every symbol a problem can hold, the ones that count 0 included; the angle read-out scores them all)
CLOCKS: dict[str, tuple[int, dict[int, int]]] = {
    "parity": (2, {ord("a"): 0, ord("b"): 1}),
    "modsum": (5, {**{ord(str(d)): d for d in range(5)}, ord("+"): 0}),  # a sum of digits mod 5: digit d counts d
}


def clock_angles(task: str) -> dict[int, float]:
    """``{byte: its exact angle}`` of the fixed clock on ``task``'s counted bytes (others turn by 0)."""
    n, counts = CLOCKS[task]
    return {b: 2 * math.pi * c / n for b, c in counts.items()}


def pin_clock(model: torch.nn.Module, task: str) -> None:
    """Overwrite every layer's ``random_token`` table ``[V, H, P]`` with the exact clock of ``task``."""
    from accrot.position.accum import RandomTokenIncrements

    tables = [m for m in model.modules() if isinstance(m, RandomTokenIncrements)]
    if not tables:
        raise ValueError("a fixed clock pins a random_token table; this model has none")
    for source in tables:
        table = torch.zeros_like(source.table)  # [V, H, P]
        for byte, angle in clock_angles(task).items():
            table[byte] = angle
        source.table.copy_(table)


class PinnedReflection(PathRotation):
    """PaTH's rotation with fixed factors: ``householder(x, tokens) -> (w [B, H, T, D], beta [B, H, T])`` with w one
    unit vector per head (the first coordinate, for every token) and β = 2 on the counted bytes, 0 elsewhere.
    No parameters: the projections of w and β are not built."""

    def __init__(self, cfg, d_model: int, n_heads: int, counted: list[int]) -> None:
        RotationPart.__init__(self, cfg, d_model, n_heads)
        self.w_conv = None  # read by PathRotation's decoding: no convolution here
        w = torch.zeros(n_heads, self.head_dim)
        w[:, 0] = 1.0
        flip = torch.zeros(cfg.vocab_size)
        flip[counted] = 2.0
        self.register_buffer("w", w)  # [H, D]
        self.register_buffer("beta_of", flip)  # [V]

    def householder(self, x: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dt = torch.promote_types(x.dtype, torch.float32)
        B, T = tokens.shape
        w = self.w.to(dt)[None, :, None, :].expand(B, -1, T, -1).contiguous()  # [B, H, T, D]
        beta = self.beta_of.to(dt)[tokens][:, None, :].expand(-1, self.n_heads, -1).contiguous()  # [B, H, T]
        return w, beta

    def decode_state(self, x: torch.Tensor, tokens: torch.Tensor) -> dict:
        return {}

    def decode_householder(self, x, tokens, state):
        return self.householder(x, tokens)

    def describe(self) -> dict:
        return {"pinned": "reflection", "counted": self.beta_of.nonzero().flatten().tolist()}


def pin_reflection(model: torch.nn.Module, task: str) -> None:
    """Replace every layer's PaTH rotation with :class:`PinnedReflection` on ``task``'s counted bytes."""
    # a reflection has order 2: it flips on the bytes of odd count (parity: b; a sum mod 5: the odd digits, which
    # carries the sum mod 2 only, so there it is a negative control)
    counted = sorted(b for b, c in CLOCKS[task][1].items() if c % 2)
    schemes = [m for m in model.modules() if isinstance(getattr(m, "rotation", None), PathRotation)]
    if not schemes:
        raise ValueError("a fixed reflection pins PaTH's factors; this model has no PaTH layer")
    for scheme in schemes:
        old = scheme.rotation
        scheme.rotation = PinnedReflection(old.cfg, old.d_model, old.n_heads, counted)


def pin(model: torch.nn.Module, control: str, task: str) -> None:
    """Pin ``model``'s transport as ``control`` (``clock`` or ``reflection``) says, for ``task``."""
    if task not in CLOCKS:
        raise ValueError(f"no fixed {control} is defined for task {task!r}; controls exist for {', '.join(CLOCKS)}")
    (pin_clock if control == "clock" else pin_reflection)(model, task)

"""The learned clock read from an SO(2) cell's own angles, against the exact clock of the task.

Each layer's ``scheme.angles(x, tokens)`` ``[B, H, T, P]`` is what its forward rotates by; the per-position
increment is δ_t = θ_t − θ_{t−1} (θ_{−1} = 0), wrapped to (−π, π]. Per (layer, head, pair) and per symbol of the
task's alphabet, the symbol's angle is the circular mean of δ over the positions reading it (layer 0 reads the
token alone; a later layer's δ can depend on the context, and the circular spread says how much).

The exact clock of counting mod n turns symbol s by 2π·k·c(s)/n for a k coprime to n (parity: b by π, a by 0).
A pair's **error** is, at the best such k, the largest distance over the alphabet between a symbol's angle and its
exact one. An error e keeps the accumulated angle within half a sector (π/n) of the exact clock's for every
problem of at most ``π / (n·e)`` symbols (each symbol adds at most e): that is the **horizon** the pair predicts,
a guarantee (errors of opposite sign cancel, so a clock can hold further). The cell's clock is its best pair (the
smallest error): a readout can use any one pair. Symbols outside the alphabet (START, the query) sit on every
path to the answer equally, so their angle is a constant offset and is not scored.
"""

from __future__ import annotations

import math

import torch


def wrap(a: torch.Tensor) -> torch.Tensor:
    """Angles wrapped to (−π, π]."""
    return torch.remainder(a + math.pi, 2 * math.pi) - math.pi


@torch.no_grad()
def layer_angles(model: torch.nn.Module, inputs: torch.Tensor) -> list[torch.Tensor]:
    """Each SO(2) layer's angles on ``inputs [B, T]``: a list of ``[B, H, T, P]`` float64 (empty: no such layer)."""
    from accrot.position.scheme import PositionScheme

    seen: list[torch.Tensor] = []

    def hook(module, args):
        q, k, v, x, tokens = args
        seen.append(module.angles(x, tokens).double().expand(tokens.shape[0], -1, -1, -1))

    schemes = [m for m in model.modules() if isinstance(m, PositionScheme) and m.rotation.kind == "so2"]
    handles = [s.register_forward_pre_hook(hook) for s in schemes]
    try:
        model(inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


def symbol_angles(theta: torch.Tensor, tokens: torch.Tensor, symbols: list[int]) -> tuple[torch.Tensor,
                                                                                           torch.Tensor]:
    """``(mean [S, H, P], resultant [S, H, P])``: per symbol the circular mean of the increments δ_t read at its
    positions (``theta [B, H, T, P]``, ``tokens [B, T]``) and the mean resultant length (1: the same δ everywhere)."""
    delta = wrap(torch.diff(theta, dim=2, prepend=torch.zeros_like(theta[:, :, :1])))  # [B, H, T, P]
    means, lengths = [], []
    for s in symbols:
        at = (tokens == s)[:, None, :, None].to(delta.dtype)  # [B, 1, T, 1]
        n = at.sum().clamp(min=1)  # positions reading s
        c = (torch.cos(delta) * at).sum((0, 2)) / n  # [H, P]
        si = (torch.sin(delta) * at).sum((0, 2)) / n
        means.append(torch.atan2(si, c))
        lengths.append(torch.sqrt(c**2 + si**2))
    return torch.stack(means), torch.stack(lengths)


def clock_error(means: torch.Tensor, counts: list[int], modulus: int) -> torch.Tensor:
    """``[...]`` the error of each pair's clock: min over k coprime to ``modulus`` of max over the symbols of
    |wrap(mean_s − 2π·k·c_s/n)|; ``means [S, ...]`` the symbols' angles, ``counts [S]`` their counts."""
    c = torch.tensor(counts, dtype=means.dtype).reshape(-1, *([1] * (means.dim() - 1)))  # [S, 1, ...]
    errs = [wrap(means - 2 * math.pi * k * c / modulus).abs().amax(0)
            for k in range(1, modulus) if math.gcd(k, modulus) == 1]
    return torch.stack(errs).amin(0)


def horizon(error: float, modulus: int) -> float:
    """The problem size up to which an error per symbol keeps the clock within half a sector: π / (n·e)."""
    return math.inf if error <= 0 else math.pi / (modulus * error)


def read_clock(model: torch.nn.Module, inputs: torch.Tensor, counts: dict[int, int], modulus: int) -> dict | None:
    """The best pair's clock of ``model`` on ``inputs [B, T]`` for the alphabet ``counts`` ({byte: count}): its
    error (rad), the horizon it predicts, where it is (layer, head, pair), each symbol's angle there and the
    angles' circular spread; the median pair's error beside. None where the model has no SO(2) layer."""
    layers = layer_angles(model, inputs)
    if not layers:
        return None
    symbols = sorted(counts)
    best = None
    errors = []
    for layer, theta in enumerate(layers):
        means, lengths = symbol_angles(theta, inputs, symbols)  # [S, H, P] each
        err = clock_error(means, [counts[s] for s in symbols], modulus)  # [H, P]
        errors.append(err.flatten())
        h, p = divmod(int(err.argmin()), err.shape[1])
        if best is None or err[h, p] < best["error"]:
            best = {"error": float(err[h, p]), "layer": layer, "head": h, "pair": p,
                    "angles": {chr(s): float(means[i, h, p]) for i, s in enumerate(symbols)},
                    "resultant": min(float(lengths[i, h, p]) for i in range(len(symbols)))}
    best["horizon"] = horizon(best["error"], modulus)
    best["median_error"] = float(torch.cat(errors).median())
    return best

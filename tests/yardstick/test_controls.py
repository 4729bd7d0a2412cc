"""The positive controls are exact by construction (the clock's angles are π per b accumulated, the reflection's
transport is (−1)^count along w), stay fixed under training, and the angle read-out finds a planted clock's error
and horizon; a learned or position-free cell reads as what it is."""

from __future__ import annotations

import math

import pytest
import torch

from accrot.model import ModelConfig, Transformer
from accrot.position import SchemeConfig, explicit
from accrot.yardstick.angles import clock_error, horizon, read_clock, wrap
from accrot.yardstick.cells import CELLS
from accrot.yardstick.controls import CLOCKS, pin
from accrot.yardstick.protocols import PROTOCOLS, predict
from accrot.yardstick.runner import matched_hidden


def _model(cell: str, task: str | None = "parity", layers: int = 2) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=256, d_model=32, n_layers=layers, n_heads=2,
                                    scheme=SchemeConfig(**CELLS[cell].scheme))).eval()
    if task is not None and CELLS[cell].control:
        pin(model, CELLS[cell].control, task)
    return model


def _parity_rows(n: int = 6, length: int = 30) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    body = torch.where(torch.rand(n, length, generator=g) < 0.5, ord("a"), ord("b"))
    return torch.cat([torch.full((n, 1), 0xFD), body, torch.full((n, 1), ord("="))], 1)  # [n, length + 2]


def test_the_fixed_clock_turns_b_by_pi_and_nothing_else():
    model = _model("clock")
    tokens = _parity_rows()
    exact = math.pi * (tokens == ord("b")).double().cumsum(1)  # [B, T]: π per b so far, by the bytes alone
    for layer in model.blocks:
        x = torch.randn(*tokens.shape, 32)
        theta = layer.attn.scheme.angles(x, tokens).double()  # [B, H, T, P]
        assert theta.shape[1:] == (2, tokens.shape[1], 8)
        gap = wrap(theta - exact[:, None, :, None]).abs().max()
        assert gap < 1e-5, gap  # every head and pair, every position: the exact clock
    # content does not move it: another x gives the same angles
    s = model.blocks[1].attn.scheme
    assert torch.equal(s.angles(torch.randn(*tokens.shape, 32), tokens), s.angles(torch.zeros(*tokens.shape, 32),
                                                                                   tokens))


def test_the_fixed_clock_for_a_sum_mod_5_turns_digit_d_by_two_fifths_pi_d():
    model = _model("clock", "modsum")
    tokens = torch.tensor([[0xFD, *b"3+4+1+0+2", ord("=")]])
    digits = [int(chr(t)) if chr(t).isdigit() else 0 for t in tokens[0].tolist()]
    exact = 2 * math.pi / 5 * torch.tensor(digits, dtype=torch.float64).cumsum(0)
    theta = model.blocks[0].attn.scheme.angles(torch.zeros(1, tokens.shape[1], 32), tokens).double()
    assert wrap(theta[0] - exact[None, :, None]).abs().max() < 1e-5


def test_the_pinned_table_is_a_buffer_training_cannot_move():
    model = _model("clock").train()
    names = {n for n, _ in model.named_parameters()}
    assert not any("table" in n for n in names)
    before = model.blocks[0].attn.scheme.rotation.source.table.clone()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    tokens = _parity_rows()
    model(tokens).sum().backward()
    opt.step()
    assert torch.equal(model.blocks[0].attn.scheme.rotation.source.table, before)


def test_the_fixed_reflection_is_exact_and_has_no_parameters():
    model = _model("reflection")
    tokens = _parity_rows(2, 12)
    s = model.blocks[0].attn.scheme
    w, beta = s.householder(torch.randn(*tokens.shape, 32), tokens)  # [B, H, T, D], [B, H, T]
    assert torch.equal(beta[:, 0], 2.0 * (tokens == ord("b")))
    assert torch.equal(w[..., 0], torch.ones_like(w[..., 0])) and w[..., 1:].abs().max() == 0
    assert not [n for n, _ in s.named_parameters()]
    # the score of key s at query t is q·k with k's first coordinate flipped once per b in s+1..t
    B, T, D = tokens.shape[0], tokens.shape[1], 16
    q, k = torch.randn(B, 2, T, D, dtype=torch.float64), torch.randn(B, 2, T, D, dtype=torch.float64)
    rows = torch.arange(T)
    scores = explicit.scores(s, q, k, torch.zeros(B, T, 32, dtype=torch.float64), tokens, rows)  # [B, H, T, T]
    count = (tokens == ord("b")).double().cumsum(1)  # [B, T]
    sign = (-1.0) ** (count[:, :, None] - count[:, None, :])  # [B, t, s]
    flipped = q[..., :, None, 0] * k[..., None, :, 0] * sign[:, None]  # [B, H, t, s]
    rest = torch.einsum("bhtd,bhsd->bhts", q[..., 1:], k[..., 1:])
    want = (flipped + rest) * D**-0.5
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    assert torch.allclose(scores[..., causal], want[..., causal], atol=1e-9)
    # and the fast path the model trains with is that attention
    v = torch.randn(B, 2, T, D)
    fast = s(q.float(), k.float(), v, torch.zeros(B, T, 32), tokens)
    twin = explicit.attention(s, q, k, v.double(), torch.zeros(B, T, 32, dtype=torch.float64), tokens)
    assert torch.allclose(fast.double(), twin, atol=1e-4)


def test_the_controls_match_nope_parameters_and_run_only_where_a_clock_exists():
    for cell in ("clock", "reflection"):
        _, params, nope = matched_hidden(PROTOCOLS["parity"], CELLS[cell], 42)
        assert abs(params - nope) / nope < 0.01
    from accrot.yardstick.protocols import applies

    assert applies(PROTOCOLS["parity"], CELLS["clock"]) and not applies(PROTOCOLS["modarith"], CELLS["clock"])
    assert applies(PROTOCOLS["modarith"], CELLS["NoPE"])
    # the reflection has order 2: a positive control of parity, a negative one of a sum mod 5
    assert predict(PROTOCOLS["parity"], CELLS["reflection"]).beyond == "yes"
    assert predict(PROTOCOLS["modsum"], CELLS["reflection"]).beyond == "no"
    assert predict(PROTOCOLS["modsum"], CELLS["clock"]).beyond == "yes"


# --- the angle read-out -----------------------------------------------------------------------------------------


def _planted(angles: dict[str, float]) -> Transformer:
    """The clock cell with a table whose angles are set by hand: ``{symbol: δ}`` on every head and pair."""
    model = _model("clock", task=None)
    for layer in model.blocks:
        table = torch.zeros_like(layer.attn.scheme.rotation.source.table)
        for sym, a in angles.items():
            table[ord(sym)] = a
        layer.attn.scheme.rotation.source.table.copy_(table)
    return model


def test_the_read_out_finds_a_planted_clocks_error_and_horizon():
    n, counts = CLOCKS["parity"]
    model = _planted({"a": 0.01, "b": math.pi - 0.03, "=": 1.0})  # the query's angle is an offset: not scored
    k = read_clock(model, _parity_rows(), counts, n)
    assert k["error"] == pytest.approx(0.03, abs=1e-5)  # the worse symbol: b, 0.03 short of π
    assert k["angles"]["a"] == pytest.approx(0.01, abs=1e-5) and abs(k["angles"]["b"]) == pytest.approx(
        math.pi - 0.03, abs=1e-5)
    assert k["horizon"] == pytest.approx(math.pi / (2 * 0.03), rel=1e-3)  # 52 symbols within a quarter turn
    assert k["resultant"] == pytest.approx(1.0)  # the same δ at every position
    exact = read_clock(_planted({"b": math.pi}), _parity_rows(), counts, n)
    assert exact["error"] < 1e-5 and exact["horizon"] > 1e5
    # −π is the same half turn; a b that turns by 0 is no clock at all
    assert read_clock(_planted({"b": -math.pi}), _parity_rows(), counts, n)["error"] < 1e-5
    assert read_clock(_planted({}), _parity_rows(), counts, n)["error"] == pytest.approx(math.pi, abs=1e-5)


def test_a_sum_clock_may_turn_by_any_generator_of_the_cycle():
    # 2π·2d/5 is as exact a clock of the sum mod 5 as 2πd/5 (k = 2 is coprime to 5); 2π·d/4 is not
    digits = torch.arange(5, dtype=torch.float64)
    counts = list(range(5))
    assert clock_error((4 * math.pi / 5 * digits)[:, None], counts, 5).item() < 1e-9
    err = clock_error((2 * math.pi / 4 * digits)[:, None], counts, 5).item()
    assert err > 0.2
    assert horizon(0.0, 5) == math.inf and horizon(0.1, 5) == pytest.approx(math.pi / 0.5)


def test_a_cell_without_angles_reads_none_and_rope_reads_a_far_clock():
    n, counts = CLOCKS["parity"]
    assert read_clock(_model("NoPE"), _parity_rows(), counts, n) is None
    assert read_clock(_model("PaTH"), _parity_rows(), counts, n) is None
    rope = read_clock(_model("RoPE"), _parity_rows(), counts, n)
    # RoPE turns a and b alike (ω_i per token): its best pair is the slowest, whose a-error is tiny but whose b
    # is far from π
    assert rope["error"] > 1.0

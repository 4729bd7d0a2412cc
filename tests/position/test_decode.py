"""Cached decoding equals the forward: after a prefill, every step's logits are the full forward's at that position,
for every cell of the bench grid and the increments, floors and patterns beyond it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from accrot.bench.grid import Cell, grid
from accrot.model import ModelConfig, Transformer
from accrot.position import ConfigError, SchemeConfig
from accrot.position.decode import transport_keys
from accrot.position.rope_scaling import RopeScaling, apply_rope_scaling

L = 16  # the "training length" the prompts and the caches grow past
# ‖ref − fast‖ ≤ rtol·‖ref‖ + atol per step. Learned increments and the forget gate are float32 by contract, in a
# float64 model too: one position's projection rounds differently from the whole prompt's (another matrix shape),
# which moves an angle or a decay by ~1e-7 and these sharp weights amplify; everything else is float64
RTOL, RTOL_FORGET, RTOL_LEARNED, ATOL = 1e-7, 2e-6, 1e-4, 1e-9

EXTRA = {  # what the grid does not hold: the other increments, a mixing floor, patterns on other rotations
    "accum:random_token/none+v": SchemeConfig(rotation="accum", increments="random_token", rotate_values=True),
    "accum:random_token/forget": SchemeConfig(rotation="accum", increments="random_token", far_mass="forget"),
    "accum:learned+floor/alibi+v": SchemeConfig(rotation="accum", increments="learned", window=24.0,
                                                far_mass="alibi", rotate_values=True),
    "accum:learned(plain)/none": SchemeConfig(rotation="accum", increments="learned", learned_form="plain",
                                              increment_rank=0, conv_size=0, learned_ladder=False),
    "accum:softplus/ssmax+v": SchemeConfig(rotation="accum", increments="softplus", far_mass="ssmax",
                                           rotate_values=True),
    "accum:softplus+floor/none": SchemeConfig(rotation="accum", increments="softplus", sigma=0.3),
    "accum:random_position(mean rope)/ssmax+headgate": SchemeConfig(
        rotation="accum", increments="random_position", increment_mean="rope", far_mass="ssmax",
        output_gate="headwise"),
    "path(plain)/forget+gate": SchemeConfig(rotation="path", far_mass="forget", path_rank=0, conv_size=0,
                                            output_gate="elementwise"),
    "path{reflection}/forget": SchemeConfig(rotation="path", path_beta="reflection", far_mass="forget"),
    "path/forget(cell,none)": SchemeConfig(rotation="path", far_mass="forget", layer_pattern=["none", "cell"]),
    "accum:learned/forget+v(cell,none)": SchemeConfig(rotation="accum", increments="learned", far_mass="forget",
                                                      rotate_values=True, layer_pattern=["cell", "none"]),
}
SCHEMES = {c.name: c.scheme() for c in grid()} | EXTRA


def decoding_model(scheme: SchemeConfig, seed: int = 0, n_layers: int = 2) -> Transformer:
    """A float64 model in eval mode whose weights are large enough that attention is sharp and every part of the
    scheme (its angles, Householder factors, gates and decay) moves the logits: at the 0.02 init a decoding bug
    would hide under near-uniform attention."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=256, d_model=32, n_layers=n_layers, n_heads=2, init_std=0.3,
                      scheme=dataclasses.replace(scheme, seed=seed))
    model = Transformer(cfg).double().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".scheme." in name:  # every scheme weight away from its init (zero gates, tiny projections)
                p.add_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def close(ref: torch.Tensor, fast: torch.Tensor, rtol: float) -> tuple[bool, float]:
    err = float((ref - fast).norm())
    return err <= rtol * float(ref.norm()) + ATOL, err / max(float(ref.norm()), 1e-300)


def check_decoding(model: Transformer, prompt: torch.Tensor, new: int) -> None:
    """Greedy decoding of ``new`` tokens after ``prompt [B, T]``: the prefill's logits and every step's are the full
    forward's over the same prefix."""
    scheme = model.cfg.scheme
    learned = scheme.increments in ("learned", "softplus")
    rtol = RTOL_LEARNED if learned else RTOL_FORGET if scheme.far_mass == "forget" else RTOL
    with torch.no_grad():
        logits, cache = model.prefill(prompt)
        ok, rel = close(model(prompt), logits, rtol)
        assert ok, f"prefill differs from the forward (relative {rel:.2e})"
        seq = prompt
        last = logits[:, -1]
        for i in range(new):
            token = last.argmax(-1)  # [B]
            seq = torch.cat((seq, token[:, None]), 1)
            last = model.step(token, cache)  # [B, V]
            ref = model(seq)[:, -1]
            ok, rel = close(ref, last, rtol)
            assert ok, f"step {i} (position {seq.shape[1] - 1}) differs from the forward (relative {rel:.2e})"


@pytest.mark.parametrize("name", list(SCHEMES))
def test_decoding_equals_forward(name):
    """A short prompt whose cache grows past L, and a prompt longer than L: every step is the forward."""
    model = decoding_model(SCHEMES[name])
    gen = torch.Generator().manual_seed(3)
    check_decoding(model, torch.randint(0, 256, (2, 3), generator=gen), new=L + 6)
    check_decoding(model, torch.randint(0, 256, (1, 2 * L + 5), generator=gen), new=6)


@pytest.mark.parametrize("name", ["accum:random_position/forget+values", "accum:learned+floor/alibi+v"])
def test_decoding_crosses_a_chunk_of_fixed_draws(name):
    """The fixed random increments come in chunks of 256 positions: decoding across a chunk's end reads the next."""
    model = decoding_model(SCHEMES[name], n_layers=1)
    check_decoding(model, torch.randint(0, 256, (1, 252)), new=8)


def test_transported_keys_are_the_householder_products():
    from accrot.ops.path.naive import householder_product

    gen = torch.Generator().manual_seed(0)
    B, H, T, D = 1, 2, 7, 4
    k = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)
    w = torch.nn.functional.normalize(torch.randn(B, H, T, D, generator=gen, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(B, H, T, generator=gen, dtype=torch.float64)
    got = transport_keys(k, w, beta)
    for s in range(T):
        M = householder_product(w[:, :, s + 1:], beta[:, :, s + 1:]) if s + 1 < T else torch.eye(D).double()
        torch.testing.assert_close(got[:, :, s], (M @ k[:, :, s, :, None])[..., 0])


def test_decoding_refuses_training_draws_and_rope_extensions():
    model = decoding_model(SchemeConfig(rotation="accum", increments="random_position")).train()
    with pytest.raises(ConfigError, match="eval"):
        model.prefill(torch.randint(0, 256, (1, 4)))
    rope = decoding_model(SchemeConfig(rotation="rope"))
    apply_rope_scaling(rope, RopeScaling("yarn", L, None))
    with pytest.raises(ConfigError, match="RoPE extension"):
        rope.prefill(torch.randint(0, 256, (1, 4)))


def test_grid_cells_are_all_covered():
    assert {c.name for c in grid()} <= set(SCHEMES)
    assert isinstance(grid()[0], Cell)

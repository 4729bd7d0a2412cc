"""The explicit twin of a scheme (accrot.position.explicit) against the fast path on every cell of the bench's grid,
RoPE's evaluation-time extensions and scalable softmax included (outputs and gradients, float64), and against the
ops' own naive twins on a few cells, so the twin is never checked only against itself."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from accrot.bench.grid import grid
from accrot.position import SchemeConfig, build, explicit
from accrot.position.rope_scaling import RopeScaling, apply_rope_scaling
from tests.helpers.tolerance import assert_close
from tests.position.reference import inputs, naive_scheme_attention

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py

H, D = 2, 8


def _cell_configs() -> dict[str, tuple[SchemeConfig, int]]:
    """``name -> (cfg, layer)``: every cell of the grid (each layer of a layer pattern), with chunks and blocks
    smaller than T so the kernels' chunked and blocked paths run."""
    cells = grid()
    out = {}
    for cell in cells:
        cfg = dataclasses.replace(cell.scheme(), chunk_size=4, block_size=4)
        for layer in range(len(cell.layer_pattern or ["cell"])):
            out[cell.name + (f"@{layer}" if cell.layer_pattern else "")] = (cfg, layer)
    # increment kinds and forms the grid leaves out
    extra = {
        "accum:random_token/none+v": dict(rotation="accum", increments="random_token", window=6, rotate_values=True),
        "accum:softplus/forget": dict(rotation="accum", increments="softplus", far_mass="forget"),
        "accum:learned-floor/ssmax+v": dict(rotation="accum", increments="learned", window=6, far_mass="ssmax",
                                            rotate_values=True),
        "path-plain/forget+headgate": dict(rotation="path", path_rank=0, conv_size=0, learned_init_std=None,
                                           far_mass="forget", output_gate="headwise", chunk_size=4),
        "path-reflection/forget": dict(rotation="path", path_beta="reflection", far_mass="forget", chunk_size=4),
        "path-contract/none": dict(rotation="path", beta_max=1.0, chunk_size=4),
    }
    out.update({name: (SchemeConfig(**options), 0) for name, options in extra.items()})
    return out


CELLS = _cell_configs()
# RoPE past its training length (8 < T) with each evaluation-time extension, alone and with other terms
EXTENDED = {
    f"rope+{kind}{suffix}": (kind, options)
    for kind in ("pi", "ntk", "yarn")
    for suffix, options in (("", {}), ("+v+ssmax", dict(rotate_values=True, far_mass="ssmax")))
} | {"rope+yarn+alibi+gate": ("yarn", dict(far_mass="alibi", output_gate="elementwise", block_size=4))}


def perturbed(scheme: torch.nn.Module) -> torch.nn.Module:
    """Every parameter moved off its initialisation (zero gates, near-zero learned angles, one ssmax s for all
    heads), so each term differs per token, head and coordinate; float64, eval mode."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in scheme.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return scheme.double().eval()


def extended(kind: str, **options) -> torch.nn.Module:
    scheme = build(SchemeConfig(rotation="rope", **options), H * D, H)
    assert apply_rope_scaling(scheme, RopeScaling(kind, train_length=8)) == 1
    return scheme


def rtols(scheme: torch.nn.Module) -> tuple[float, float]:
    """(output, gradient) tolerances: float64 throughout, but what the contract computes in float32 — learned
    increments' angles, the forget gate's log f — rounds the float32 quantities' gradients."""
    cfg = scheme.cfg
    learned = cfg.rotation == "accum" and cfg.increments in ("learned", "softplus")
    forget = cfg.far_mass == "forget"
    return (1e-10, 1e-5 if learned or forget else 1e-9)


def check_against_fast(scheme: torch.nn.Module, T: int = 17) -> None:
    q, k, v, x, tokens = inputs(B=2, T=T, H=H, D=D)
    leaves = [t.requires_grad_() for t in (q, k, v, x)]
    named = [(n, p) for n, p in scheme.named_parameters() if p.requires_grad]
    fast = scheme(q, k, v, x, tokens)
    ref = explicit.attention(scheme, q, k, v, x, tokens)
    assert ref.dtype == torch.float64 and ref.shape == fast.shape == (2, H, T, D)
    out_rtol, grad_rtol = rtols(scheme)
    assert_close(ref, fast, out_rtol, "output")
    g = torch.randn(fast.shape, generator=torch.Generator().manual_seed(2), dtype=fast.dtype)
    wrt = leaves + [p for _, p in named]
    ref_g = torch.autograd.grad(ref, wrt, g, allow_unused=True)
    fast_g = torch.autograd.grad(fast, wrt, g, allow_unused=True)
    for a, b, what in zip(ref_g, fast_g, ["q", "k", "v", "x"] + [n for n, _ in named]):
        if a is None or b is None:  # a parameter the output does not depend on, on either side
            assert (a is None or a.abs().max() == 0) and (b is None or b.abs().max() == 0), what
            continue
        assert_close(a, b, grad_rtol, what)


@pytest.mark.parametrize("name", list(CELLS))
def test_every_cell_fast_path_matches_the_explicit_twin(name):
    """PositionScheme.forward against explicit.attention: outputs and the gradients of q, k, v, x and every
    parameter, float64, T = 17 (not a multiple of the chunk or block)."""
    cfg, layer = CELLS[name]
    check_against_fast(perturbed(build(cfg, H * D, H, layer=layer)))


@pytest.mark.parametrize("name", list(EXTENDED))
def test_rope_extended_at_evaluation_matches_the_explicit_twin(name):
    """An evaluation-time RoPE extension past its training length: rescaled frequencies, and for YaRN the
    temperature on every logit (the rotation part's ``logit_scale``), times ssmax's row factor where it has one."""
    kind, options = EXTENDED[name]
    scheme = perturbed(extended(kind, **options))
    if kind == "yarn":
        assert scheme.rotation.logit_scale(17) > 1.0
    check_against_fast(scheme)


# a few cells of every term kind, for the independent check against the ops' naive twins
NAIVE = {
    "nope": dict(rotation="none"),
    "rope-alibi+values": dict(rotation="rope", far_mass="alibi", rotate_values=True),
    "accum-random-forget+values+gate": dict(rotation="accum", increments="random_position", window=6,
                                            far_mass="forget", rotate_values=True, output_gate="elementwise"),
    "accum-learned+values+ssmax": dict(rotation="accum", increments="learned", far_mass="ssmax", rotate_values=True),
    "path-fox+headgate": dict(rotation="path", far_mass="forget", output_gate="headwise", chunk_size=4),
    "path-ssmax": dict(rotation="path", far_mass="ssmax", chunk_size=4),
}


@pytest.mark.parametrize("name", [*NAIVE, "rope+yarn+v+ssmax"])
def test_explicit_twin_matches_the_ops_naive_twins(name):
    """explicit.attention against the scheme rebuilt from its exposed quantities by the ops' naive twins
    (naive_attention with naive_decay_bias, naive_path_attention_products, naive_rotate_pairs_cs): outputs and
    gradients, float64. The twin must agree with a computation that shares none of its code."""
    if name in NAIVE:
        scheme = perturbed(build(SchemeConfig(**NAIVE[name]), H * D, H))
    else:
        scheme = perturbed(extended("yarn", rotate_values=True, far_mass="ssmax"))
    q, k, v, x, tokens = inputs(B=2, T=15, H=H, D=D)
    leaves = [t.requires_grad_() for t in (q, k, v, x)]
    params = [p for p in scheme.parameters() if p.requires_grad]
    ref = naive_scheme_attention(scheme, q, k, v, x, tokens)
    out = explicit.attention(scheme, q, k, v, x, tokens)
    assert_close(ref, out, 1e-10, "output")
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)
    ref_g = torch.autograd.grad(ref, leaves + params, g, allow_unused=True)
    out_g = torch.autograd.grad(out, leaves + params, g, allow_unused=True)
    for a, b in zip(ref_g, out_g):
        assert (a is None) == (b is None)
        if a is not None:
            assert_close(a, b, rtols(scheme)[1])


@pytest.mark.parametrize("name", ["rope+values", "accum-learned+values+ssmax", "path-fox+headgate"])
def test_rows_are_rows_of_the_whole_attention(name):
    """Any ascending subset of query rows gives exactly those rows of the full explicit attention; the logits carry
    −inf above the diagonal and the factor equals the scheme's exposed ``logit_scale``."""
    options = NAIVE.get(name, dict(rotation="rope", rotate_values=True, far_mass="ssmax"))
    scheme = perturbed(build(SchemeConfig(**options), H * D, H))
    q, k, v, x, tokens = inputs(B=2, T=13, H=H, D=D)
    with torch.no_grad():
        full = explicit.explicit_rows(scheme, q, k, x, tokens, torch.arange(13))
        rows = torch.tensor([0, 4, 5, 12])
        part = explicit.explicit_rows(scheme, q, k, x, tokens, rows)
        factor = explicit.logit_factor(scheme, x, tokens)
    future = torch.ones(13, 13, dtype=torch.bool).triu(1)  # s > t
    assert bool(torch.isneginf(full.logits).eq(future).all()) and bool((full.probabilities[..., future] == 0).all())
    finite = full.logits.masked_fill(future, 0.0)  # [B, H, T, T]
    assert_close(finite[:, :, rows], part.logits.masked_fill(future[rows], 0.0), 1e-13)
    assert_close(full.scores[:, :, rows], part.scores, 1e-13)
    assert_close(full.probabilities[:, :, rows], part.probabilities, 1e-13)
    assert_close(full.probabilities.sum(-1), torch.ones(2, H, 13, dtype=torch.float64), 1e-14)
    assert_close(scheme.logit_scale(x, tokens).double(), factor.expand(2, -1, -1), 1e-14)

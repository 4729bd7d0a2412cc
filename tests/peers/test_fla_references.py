"""accrot's forget gate and RoPE against fla's own pure-PyTorch references (fla-core, imported as fla ships it;
PaTH's reference is compared in tests/ops/test_path_fla.py), outputs and gradients:

* the forget gate (FoX) against ``fla.ops.forgetting_attn.naive.naive_forgetting_attn`` on fla's own test shapes
  (B 3; T 1000 and 211, odd and not a multiple of any block; head dims 60 and 110, and 100), the gate's log f in
  fla's test range (−0.1, −0.01), fed to fla as the per-step ``g`` accrot's part computes;
* RoPE against ``fla.modules.rotary.ops.rotary_embedding_ref`` with fla's ``RotaryEmbedding`` tables (its inverse
  frequencies and its half-split, non-interleaved layout), in the forward and in cached decoding, where each new
  token's rotation is fla's table read at its offset (fla's ``seqlen_offset``).

Tolerance: fla's references compute in float32, as accrot does here; relative 1e-5 on outputs and 1e-4 on
gradients (float32 softmax attention over up to 1 000 keys: a few hundred roundings, each 6e-8), where an error of
the layout, a slope or an offset of one position gives relative errors of order 0.1 to 1 (checked below).
"""

from __future__ import annotations

import pytest
import torch

from accrot.position import SchemeConfig, build
from tests.helpers.fla import import_fla, needs_fla
from tests.helpers.tolerance import assert_close

pytestmark = [needs_fla, pytest.mark.usefixtures("one_thread")]

OUT_RTOL, GRAD_RTOL = 1e-5, 1e-4


def attention_and_grads(fn, q, k, v, params) -> dict[str, torch.Tensor]:
    """fn's output ``[B, H, T, D]`` and the gradients of a fixed random projection of it with respect to q, k, v and
    ``params`` (named tensors)."""
    leaves = {"q": q, "k": k, "v": v, **params}
    for t in leaves.values():
        t.grad = None
        t.requires_grad_(True)
    out = fn(q, k, v)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(11), dtype=out.dtype)
    (out * probe).sum().backward()
    return {"out": out.detach(), **{f"d{name}": t.grad.clone() for name, t in leaves.items()}}


def assert_all_close(ref: dict, got: dict, label: str) -> None:
    for name in ref:
        assert_close(ref[name], got[name], OUT_RTOL if name == "out" else GRAD_RTOL, name=f"{label} {name}")


# fla's tests/ops/test_forgetting_attn.py runs B 3 with (T 1000, D 60) and (T 211, D 110); D 100 as well
FORGET_SHAPES = [(3, 2, 1000, 60), (3, 2, 211, 110), (2, 3, 211, 100)]


def forget_scheme(H: int, D: int, seed: int = 0):
    """accrot's forget-gate scheme (no rotation) at a head width D, its bias set so log f = logsigmoid(w·x + b) lies
    in fla's test range (−0.1, −0.01): b = 3 and w·x of spread about 0.15."""
    torch.manual_seed(seed)
    scheme = build(SchemeConfig(far_mass="forget", forget_bias_init=3.0), H * D, H)
    with torch.no_grad():
        scheme.far_mass.proj.weight.normal_(0.0, 0.15 / (H * D) ** 0.5)
    return scheme


@pytest.mark.parametrize("B, H, T, D", [pytest.param(*s, id="B{}-H{}-T{}-D{}".format(*s)) for s in FORGET_SHAPES])
def test_forget_gate_equals_fla_naive_forgetting_attn(B, H, T, D):
    naive_forgetting_attn = import_fla("fla.ops.forgetting_attn.naive").naive_forgetting_attn

    scheme = forget_scheme(H, D)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    x = torch.randn(B, T, H * D, generator=g)
    tokens = torch.zeros(B, T, dtype=torch.long)
    log_f = scheme.log_decay(x, tokens)  # [B, H, T]
    assert -0.1 < log_f.min() and log_f.max() < -0.01  # fla's test range
    params = dict(scheme.far_mass.named_parameters())

    def fla(q, k, v):  # fla's layout: [B, T, H, D] and g [B, T, H]
        out = naive_forgetting_attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                    scheme.log_decay(x, tokens).transpose(1, 2), scale=D ** -0.5)
        return out.transpose(1, 2)  # [B, H, T, D]

    ref = attention_and_grads(fla, q, k, v, params)
    got = attention_and_grads(lambda q, k, v: scheme(q, k, v, x, tokens), q, k, v, params)
    assert_all_close(ref, got, f"forget B{B} H{H} T{T} D{D}")


def test_the_forget_comparison_catches_a_gate_off_by_one_position():
    """The comparison is sharp: fla fed the gate one position late (g_{j−1} in place of g_j) fails it."""
    naive_forgetting_attn = import_fla("fla.ops.forgetting_attn.naive").naive_forgetting_attn

    B, H, T, D = 2, 2, 211, 60
    scheme = forget_scheme(H, D)
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    x, tokens = torch.randn(B, T, H * D), torch.zeros(B, T, dtype=torch.long)
    g = scheme.log_decay(x, tokens).detach()
    late = torch.cat([g[..., :1], g[..., :-1]], dim=-1).transpose(1, 2)  # [B, T, H]
    wrong = naive_forgetting_attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), late, scale=D ** -0.5)
    with torch.no_grad():
        ours = scheme(q, k, v, x, tokens)
    with pytest.raises(AssertionError):
        assert_close(wrong.transpose(1, 2), ours, OUT_RTOL, name="late gate")


def fla_rotary(T: int, D: int):
    """fla's RoPE tables: ``RotaryEmbedding(D)``'s cos, sin ``[T, D/2]`` (float32, base 10 000, half-split)."""
    rope = import_fla("fla.modules.rotary.ops").RotaryEmbedding(D)
    rope._update_cos_sin_cache(T, device=torch.device("cpu"), dtype=torch.float32)
    return rope._cos_cached, rope._sin_cached


def fla_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [B, H, n, D]`` rotated by fla's reference with the table rows ``cos, sin [n, D/2]``."""
    reference = import_fla("fla.modules.rotary.ops").rotary_embedding_ref
    return reference(x.transpose(1, 2), cos, sin).transpose(1, 2)  # fla's layout [B, n, H, D], and back


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √D) v over s ≤ t, written out (``[B, H, T, D]``)."""
    T, D = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-1, -2)) * D ** -0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("B, H, T, D", [(2, 2, 211, 64), (1, 3, 100, 60), (2, 1, 7, 16)],
                         ids=["B2-H2-T211-D64", "B1-H3-T100-D60", "B2-H1-T7-D16"])
def test_rope_equals_fla_rotary_reference(B, H, T, D):
    scheme = build(SchemeConfig(rotation="rope"), H * D, H)
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    x, tokens = torch.randn(B, T, H * D), torch.zeros(B, T, dtype=torch.long)
    cos, sin = fla_rotary(T, D)

    def fla(q, k, v):
        return causal_attention(fla_rotate(q, cos, sin), fla_rotate(k, cos, sin), v)

    ref = attention_and_grads(fla, q, k, v, {})
    got = attention_and_grads(lambda q, k, v: scheme(q, k, v, x, tokens), q, k, v, {})
    assert_all_close(ref, got, f"rope B{B} H{H} T{T} D{D}")


def test_rope_decoding_at_an_offset_equals_fla_rotary_at_that_offset():
    """Cached decoding: after a prefill of P tokens, the step at position t rotates its query and key as fla does at
    ``seqlen_offset`` t (fla's table row t); every step's output is the reference attention's at t, and a table
    read one position off is not."""
    B, H, D, P, n = 2, 2, 32, 300, 5
    scheme = build(SchemeConfig(rotation="rope"), H * D, H).eval()
    T = P + n
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    x, tokens = torch.randn(B, T, H * D), torch.zeros(B, T, dtype=torch.long)
    cos, sin = fla_rotary(T + 1, D)
    with torch.no_grad():
        _, cache = scheme.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P], x[:, :P], tokens[:, :P])
        for t in range(P, T):
            got = scheme.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], x[:, t:t + 1],
                              tokens[:, t:t + 1], cache)  # [B, H, 1, D]
            keys = fla_rotate(k[:, :, :t + 1], cos[:t + 1], sin[:t + 1])
            query = fla_rotate(q[:, :, t:t + 1], cos[t:t + 1], sin[t:t + 1])  # fla at seqlen_offset t
            weights = torch.softmax((query @ keys.transpose(-1, -2)) * D ** -0.5, dim=-1)
            assert_close(weights @ v[:, :, :t + 1], got, OUT_RTOL * 10, name=f"decode step at {t}")
            shifted = fla_rotate(q[:, :, t:t + 1], cos[t + 1:t + 2], sin[t + 1:t + 2])  # one position off
            off = torch.softmax((shifted @ keys.transpose(-1, -2)) * D ** -0.5, dim=-1) @ v[:, :, :t + 1]
            with pytest.raises(AssertionError):
                assert_close(off, got, OUT_RTOL * 10, name="offset by one")

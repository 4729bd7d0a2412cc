"""accrot's attention against x-transformers' (lucidrains/x-transformers, a dev dependency) at copied weights, for
the cells both implement: ALiBi (x-transformers' ``AlibiPositionalBias``, its own slopes) and FoX's forget gate
(its ``data_dependent_alibi``: a linear map of the layer input, logsigmoid, cumulative sums), outputs and gradients
through the whole attention layer (the q, k, v and output projections included).

The weights are copied one to one: accrot's fused ``qkv`` rows are q, k, v in that order with heads h-major (row
h·D + i), which is x-transformers' ``(h d)`` split of ``to_q``, ``to_k``, ``to_v``; ``out`` is its ``to_out``; the forget
gate's ``proj`` is its ``to_forget_gates`` linear. Tolerance: both compute in float32; relative 1e-5 on outputs and
1e-4 on gradients, where a slope off by a head or a gate one position late misses by orders more (checked below).
"""

from __future__ import annotations

import pytest
import torch

from accrot.model import Attention, ModelConfig
from accrot.position import SchemeConfig
from tests.helpers.peers import peer
from tests.helpers.tolerance import assert_close

pytestmark = pytest.mark.usefixtures("one_thread")

OUT_RTOL, GRAD_RTOL = 1e-5, 1e-4
# x-transformers decorates a helper with torch.jit.script, which torch 2.13 calls deprecated at import
NOTICES = ((DeprecationWarning, r".*torch\.jit\.script.* is deprecated"),)


@pytest.fixture(scope="module")
def xt():
    return peer("x_transformers.x_transformers", "x-transformers", NOTICES)


def copied(xt, d_model: int, n_heads: int, far_mass: str, seed: int = 0):
    """(accrot's attention layer, x-transformers' ``Attention`` with the same weights, x-transformers' rel_pos or
    None)."""
    torch.manual_seed(seed)
    ours = Attention(ModelConfig(d_model=d_model, n_heads=n_heads, n_layers=1,
                                 scheme=SchemeConfig(far_mass=far_mass, **({"forget_bias_init": 2.0}
                                                                           if far_mass == "forget" else {}))))
    D = d_model // n_heads
    theirs = xt.Attention(d_model, dim_head=D, heads=n_heads, causal=True,
                          data_dependent_alibi=far_mass == "forget")
    with torch.no_grad():
        q, k, v = ours.qkv.weight.chunk(3, dim=0)  # [d_model, d_model] each, rows h-major
        theirs.to_q.weight.copy_(q)
        theirs.to_k.weight.copy_(k)
        theirs.to_v.weight.copy_(v)
        theirs.to_out.weight.copy_(ours.out.weight)
        if far_mass == "forget":
            ours.scheme.far_mass.proj.weight.normal_(0.0, 0.1)  # a gate that depends on x, not the init's constant
            gate = theirs.data_dependent_alibi.to_forget_gates[0]
            gate.weight.copy_(ours.scheme.far_mass.proj.weight)
            gate.bias.copy_(ours.scheme.far_mass.proj.bias)
    rel_pos = xt.AlibiPositionalBias(n_heads) if far_mass == "alibi" else None
    return ours, theirs, rel_pos


def outputs_and_input_grads(layer_call, x: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    x = x.detach().requires_grad_(True)
    out = layer_call(x)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    grads = torch.autograd.grad((out * probe).sum(), [x, *params])
    return [out.detach(), *grads]


# head counts: a power of two and not (ALiBi's slopes interleave then); T odd, past any block size
CASES = [(64, 4, 37), (96, 6, 129), (48, 3, 200)]


@pytest.mark.parametrize("far_mass", ["alibi", "forget"])
@pytest.mark.parametrize("d_model, n_heads, T", CASES, ids=[f"d{d}-H{h}-T{t}" for d, h, t in CASES])
def test_attention_equals_x_transformers_at_copied_weights(xt, far_mass, d_model, n_heads, T):
    ours, theirs, rel_pos = copied(xt, d_model, n_heads, far_mass)
    x = torch.randn(2, T, d_model)
    tokens = torch.zeros(2, T, dtype=torch.long)
    mine = [ours.qkv.weight, ours.out.weight]
    peers = [theirs.to_q.weight, theirs.to_k.weight, theirs.to_v.weight, theirs.to_out.weight]
    ref = outputs_and_input_grads(lambda x: theirs(x, rel_pos=rel_pos), x, peers)
    got = outputs_and_input_grads(lambda x: ours(x, tokens), x, mine)
    assert_close(ref[0], got[0], OUT_RTOL, name=f"{far_mass} out")
    assert_close(ref[1], got[1], GRAD_RTOL, name=f"{far_mass} dx")
    assert_close(torch.cat(ref[2:5]), got[2], GRAD_RTOL, name=f"{far_mass} dqkv")
    assert_close(ref[5], got[3], GRAD_RTOL, name=f"{far_mass} dout")


def test_the_comparison_catches_slopes_in_another_order(xt):
    """x-transformers with its slopes reversed across heads (a plausible layout mistake) does not pass."""
    ours, theirs, rel_pos = copied(xt, 64, 4, "alibi")
    rel_pos.slopes = rel_pos.slopes.flip(0)
    x, tokens = torch.randn(2, 37, 64), torch.zeros(2, 37, dtype=torch.long)
    with torch.no_grad(), pytest.raises(AssertionError):
        assert_close(theirs(x, rel_pos=rel_pos), ours(x, tokens), OUT_RTOL, name="reversed slopes")

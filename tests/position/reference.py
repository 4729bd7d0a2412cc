"""A scheme's attention recomputed from what it exposes and nothing else, by the naive twins: explicit ``[T, T]``
logits ℓ_ts = c_t·D^−1/2 q_tᵀ M_{t,s} k_s + b_ts (c from ``logit_scale``, M from ``angles`` / ``householder``,
b from ``log_decay``), a plain softmax, values transported by the angles where the scheme rotates them, and the output
times ``output_gate``. The independent check of the scheme's explicit twin (``accrot.position.explicit``, which the
other scheme tests compare the fast path with): it shares none of the twin's code, only the exposed quantities."""

from __future__ import annotations

import torch

from accrot.ops.attention import naive_attention, naive_decay_bias
from accrot.ops.path import naive_path_attention_products
from accrot.ops.rotary import naive_rotate_pairs_cs


def naive_scheme_attention(scheme, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor,
                           tokens: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, D]``: the scheme's forward, from its exposed quantities (differentiable: gradients reach q, k, v,
    x and every parameter the exposed quantities depend on)."""
    c = scheme.logit_scale(x, tokens)  # [B, H, T]
    gate = scheme.output_gate(x, tokens)  # [B, H, T, D]
    log_f = scheme.log_decay(x, tokens)  # [B, H, T] (zeros without an additive far mass)
    kind = scheme.rotation.kind
    if kind == "path":
        w, beta = scheme.householder(x, tokens)  # [B, H, T, D], [B, H, T]
        out = naive_path_attention_products(q, k, v, w, beta, log_f, logit_scale=c)
    else:
        values = False
        if kind == "so2":
            theta = scheme.angles(x, tokens)  # [B, H, T, D/2]
            cos, sin = theta.double().cos(), theta.double().sin()
            q, k = naive_rotate_pairs_cs(q, cos, sin), naive_rotate_pairs_cs(k, cos, sin)
            values = scheme.cfg.rotate_values
            if values:
                v = naive_rotate_pairs_cs(v, cos, -sin)  # value of s leaves at −θ_s
        out = naive_attention(q, k, v, naive_decay_bias(log_f), logit_scale=c)
        if values:
            out = naive_rotate_pairs_cs(out, cos, sin)  # ... and arrives at +θ_t
    return out * gate.to(out.dtype)


def inputs(B=2, T=13, H=2, D=8, seed=0, dtype=torch.float64):
    """q, k, v ``[B, H, T, D]``, x ``[B, T, H·D]``, tokens ``[B, T]``."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=gen, dtype=torch.float64).to(dtype) for _ in range(3))
    x = torch.randn(B, T, H * D, generator=gen, dtype=torch.float64).to(dtype)
    tokens = torch.randint(0, 256, (B, T), generator=gen)
    return q, k, v, x, tokens


# every rotation (and increment kind), with settings that make each one do something at tiny shapes
ROTATIONS = {
    "nope": dict(rotation="none"),
    "rope": dict(rotation="rope"),
    "rope+values": dict(rotation="rope", rotate_values=True),
    "accum-random": dict(rotation="accum", increments="random_position", window=6),
    "accum-token+values": dict(rotation="accum", increments="random_token", window=6, rotate_values=True),
    "accum-learned+values": dict(rotation="accum", increments="learned", learned_init_std=0.5, rotate_values=True),
    "path": dict(rotation="path", chunk_size=4),
}

# gradient tolerance per case: learned angles are float32 by contract (their gradient too); the rest is float64
GRAD_RTOL = {"accum-learned+values": 1e-5}

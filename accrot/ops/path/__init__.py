"""PaTH attention: accumulated Householder-like transforms along the path s → t.

    ℓ_ts  = D^−1/2 · q_tᵀ H_t H_{t−1} ⋯ H_{s+1} k_s + b_ts       (s ≤ t; the product is I when s = t)
    H_j   = I − β_j w_j w_jᵀ,  ‖w_j‖ = 1,  β_j ∈ [0, 2]
    b_ts  = Σ_{j=s+1..t} log f_j                                 (far-mass bias, added unscaled; PaTH-FoX)
    out_t = Σ_{s≤t} softmax_s(ℓ_ts) v_s

Implementations (compared on outputs and gradients in ``tests/ops/test_path.py``):

* :func:`path_attention` with ``kernel="chunked"``: the UT/WY chunked algorithm. Per chunk of c tokens the UT
  transform turns the chunk's product into a rank-c update. On the CPU the keys walk forward (each query chunk is
  one fused flash-attention call over all earlier keys carried to its start) with a hand-written backward that
  keeps O(√N) key buffers; elsewhere queries walk earlier key blocks right to left with an online softmax under
  autograd (O(T·c) extra memory). No ``[T, T]`` tensor either way. Derivation: ``accrot/ops/PATH.md``.
* :func:`naive_path_attention_recurrence`: each query walks back one token per step, u ← H_j u, vector ops only
  (``kernel="recurrent"``, for debugging).
* :func:`naive_path_attention_products`: explicit D×D path products and a plain softmax (tiny T only).
* ``kernel="fla"``: the Triton kernel of ``fla`` (``fla-core``, the ops of flash-linear-attention), CUDA only,
  pinned by the ``gpu`` extra (``pip install -e '.[gpu]'``); q, k, v in q's dtype, w, β and the gate in float32
  (as fla asserts); a missing CUDA device, Triton or fla, or an fla that does not import, is one
  :class:`~accrot.errors.ConfigError` line (:func:`fla_problem`).

The Householder math (w, β, transports, UT transform) and the softmax run in float32 or wider whatever the input
dtype (autocast is disabled inside); the output has q's dtype. Cumulative log-decays are summed in float64.

The modules, top to bottom (each imports only from those below it; pyproject.toml's import contracts):

* ``dispatch.py``: :func:`path_attention`, which checks its arguments and picks the implementation;
* ``eval_walk.py``: the grouped evaluation walk (long lengths, no gradient); ``block_walk.py``: the block walk of
  other devices; ``naive.py``: the naive twins; ``fla.py``: the bridge to fla's kernel;
* ``key_walk.py``: the CPU key walk and its hand-written backward; ``chunk.py``: the chunk core (UT transform,
  diagonal blocks, chunk transports);
* ``common.py``: input checks, the work dtype, the chunk-major blocking.

Reference: Yang, Shen, Wen, Tan, Mishra, Ren, Panda, Kim, "PaTH Attention: Position Encoding via Accumulating
Householder Transformations" (2025, arXiv:2505.16381); fla-org/flash-linear-attention ``fla/ops/path_attn``.
"""

from accrot.ops.path.dispatch import path_attention
from accrot.ops.path.fla import FLA_HEAD_DIMS, fla_problem
from accrot.ops.path.naive import (
    householder_product,
    naive_path_attention_products,
    naive_path_attention_recurrence,
)

__all__ = [
    "FLA_HEAD_DIMS",
    "fla_problem",
    "householder_product",
    "naive_path_attention_products",
    "naive_path_attention_recurrence",
    "path_attention",
]

"""The reference implementations' settings per part, the values the config's options left None take: a leaf module,
so that the config and the naming read it without importing each other."""

from __future__ import annotations

from typing import Any

# The reference value of each option left None, per part in use ("learned", "softplus" increments; "path"):
# Selective RoPE's SelectiveRoPE defaults (phi_proj_rank=16, d_conv=4, temp_type="rope", temp_theta=500000),
# fla's PaTHAttention (w_proj rank 32, ShortConvolution(kv_dim, 3)); the softplus ladder's base is RoPE's
# (GRAPE initialises its learnable frequencies from base 10 000, the rope_base default: filled in from rope_base).
REFERENCE: dict[str, dict[str, Any]] = {
    "learned": {"increment_rank": 16, "conv_size": 4, "learned_ladder": True, "ladder_base": 500000.0},
    "softplus": {},
    "path": {"path_rank": 32, "conv_size": 3},
}
REFERENCE_INIT_STD = 0.02  # learned and PaTH projections: the reference implementations' N(0, 0.02)

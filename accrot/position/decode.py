"""Cached decoding through a position scheme: a prefill over a prompt, then one token per step.

A :class:`SchemeCache` holds what one layer's scheme needs to score a new query against every earlier key
without recomputing them, so one step costs O(S·D) per head for S cached keys:

* the keys as the new query pairs with them: rotated by their own angle θ_s (SO(2) rotations, so that
  q_tᵀ R(θ_s − θ_t) k_s = (R(θ_t) q_t)ᵀ (R(θ_s) k_s)), or transported to the newest position by every Householder
  factor since (PaTH: k̃_s = H_t ⋯ H_{s+1} k_s; each step applies the new H_t = I − β_t w_t w_tᵀ to every
  cached key, then appends k_t as it is, as fla's PaTH layer decodes);
* the values, rotated by −θ_s with value transport (the output is rotated by +θ_t after the sum);
* c_s = Σ_{j≤s} log f_j in float64 for every key with an additive far mass (the bias b_ts = c_t − c_s);
* the rotation part's own carry (``rotation``): the running angle sum and the last inputs of a short causal
  convolution (learned increments, PaTH's w), the last token's rate (softplus increments).

Scalable softmax's factor s_h·log(t + 1) and the output gate are functions of the position and the new token, and
keep nothing. The prefill's output is the scheme's own forward (so its logits are exactly the forward's); the
steps reproduce the forward's quantities at each position (in ``eval()``: random increments are then the fixed
function of position the forward reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from accrot.errors import ConfigError
from accrot.ops.rotary import cos_sin, rotate_pairs_cs, rotate_pairs_many


@dataclass
class SchemeCache:
    """One layer's decoding state after ``length`` positions.

    Attributes:
        keys, values: ``[B, H, capacity, D]`` in the work dtype (float32 or wider); the first ``length`` are used.
        decay: ``[B|1, H, capacity]`` float64 c_s = Σ_{j≤s} log f_j per key, or None without an additive far mass.
        rotation: the rotation part's carry (its own keys).
    """

    keys: torch.Tensor
    values: torch.Tensor
    decay: torch.Tensor | None
    length: int
    rotation: dict = field(default_factory=dict)

    @property
    def capacity(self) -> int:
        return self.keys.shape[-2]

    def used(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The cached keys, values and c_s of the ``length`` positions so far: ``[B, H, S, D]`` ×2, ``[B|1, H, S]``."""
        n = self.length
        return self.keys[:, :, :n], self.values[:, :, :n], None if self.decay is None else self.decay[..., :n]

    def append(self, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor | None) -> None:
        """Add one position (``k, v [B, H, 1, D]``, ``c [B|1, H, 1]``), doubling the capacity when it is full."""
        n = self.length
        if n == self.capacity:
            grow = max(1, n)
            self.keys = torch.cat((self.keys, self.keys.new_empty(*self.keys.shape[:2], grow, self.keys.shape[-1])), 2)
            self.values = torch.cat((self.values, self.values.new_empty(*self.values.shape[:2], grow,
                                                                       self.values.shape[-1])), 2)
            if self.decay is not None:
                self.decay = torch.cat((self.decay, self.decay.new_empty(*self.decay.shape[:2], grow)), -1)
        self.keys[:, :, n:n + 1] = k
        self.values[:, :, n:n + 1] = v
        if self.decay is not None:
            self.decay[..., n:n + 1] = c
        self.length = n + 1


def _work(q: torch.Tensor) -> torch.dtype:
    return torch.promote_types(q.dtype, torch.float32)


def _check(scheme) -> None:
    if getattr(scheme.rotation, "scaling", None) is not None:
        raise ConfigError("cached decoding does not take an evaluation-time RoPE extension (its frequencies depend "
                          "on the whole length); decode without --rope_scaling")


def transport_keys(k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """PaTH's keys carried to the last position T − 1: k̃_s = H_{T−1} ⋯ H_{s+1} k_s, ``[B, H, T, D]``.

    One backward walk over the positions keeps P = H_{T−1} ⋯ H_{s+1} as a ``[B, H, D, D]`` matrix (P ← P H_s =
    P − β_s (P w_s) w_sᵀ): O(T·D²), in k's dtype (the work dtype)."""
    B, H, T, D = k.shape
    out = torch.empty_like(k)
    P = torch.eye(D, dtype=k.dtype, device=k.device).expand(B, H, D, D).clone()  # [B, H, D, D]
    for s in range(T - 1, -1, -1):
        out[:, :, s] = (P @ k[:, :, s, :, None])[..., 0]
        Pw = P @ w[:, :, s, :, None]  # [B, H, D, 1]
        P = P - (beta[:, :, s, None, None] * Pw) * w[:, :, s, None, :]
    return out


def prefill(scheme, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor,
            tokens: torch.Tensor) -> tuple[torch.Tensor, SchemeCache]:
    """The scheme's forward over a prompt (``[B, H, T, D]``) and the cache after it."""
    _check(scheme)
    out = scheme(q, k, v, x, tokens)  # [B, H, T, D]: the forward itself
    work = _work(q)
    rotation = scheme.rotation
    state = rotation.decode_state(x, tokens)
    if rotation.kind == "so2":
        cos, sin = cos_sin(scheme.rotation.angles(x, tokens), q.dtype)
        k = rotate_pairs_cs(k, cos, sin)
        if scheme.cfg.rotate_values:
            v = rotate_pairs_cs(v, cos, sin, inverse=True)
    k, v = k.to(work), v.to(work)
    if rotation.kind == "path":
        w, beta = rotation.householder(x, tokens)  # [B, H, T, D], [B, H, T]
        k = transport_keys(k, w.to(work), beta.to(work))
    decay = None
    if scheme.far_mass is not None and scheme.far_mass.additive:
        decay = scheme.far_mass.log_decay(x, tokens).to(torch.float64).cumsum(-1)  # [B|1, H, T]
    cache = SchemeCache(k.contiguous(), v.contiguous(), None if decay is None else decay.contiguous(),
                        tokens.shape[1], state)
    return out, cache


def step(scheme, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
         cache: SchemeCache) -> torch.Tensor:
    """One new position (``q, k, v [B, H, 1, D]``, ``x [B, 1, d_model]``, ``tokens [B, 1]``) against the cache,
    which it extends: the attention output ``[B, H, 1, D]`` the forward gives at that position."""
    _check(scheme)
    t, work, out_dtype = cache.length, _work(q), q.dtype
    rotation, far_mass = scheme.rotation, scheme.far_mass
    cs = None
    if rotation.kind == "so2":
        cs = cos_sin(rotation.decode_angles(x, tokens, t, cache.rotation), q.dtype)  # [B|1, H, 1, P] each
        q, k = rotate_pairs_many((q, k), *cs)
        if scheme.cfg.rotate_values:
            v = rotate_pairs_cs(v, *cs, inverse=True)
    q, k, v = q.to(work), k.to(work), v.to(work)
    c = None
    if cache.decay is not None:
        log_f = far_mass.log_decay(x, tokens).to(torch.float64)  # [B|1, H, 1]
        previous = cache.decay[..., t - 1:t] if t else torch.zeros_like(log_f)
        c = previous + log_f
    if rotation.kind == "path":
        w, beta = (a.to(work) for a in rotation.decode_householder(x, tokens, cache.rotation))  # [B,H,1,D], [B,H,1]
        if t:
            keys = cache.keys[:, :, :t]  # every cached key one factor further: H_t k̃
            keys.sub_((beta[..., None] * (keys @ w.transpose(-1, -2))) * w)
    cache.append(k, v, c)
    keys, values, decay = cache.used()
    row = None if far_mass is None else far_mass.decode_logit_scale(x, tokens, t)  # [B|1, H, 1] or None
    if row is not None:
        q = q * row.unsqueeze(-1).to(work)
    logits = (q @ keys.transpose(-1, -2)) * q.shape[-1] ** -0.5  # [B, H, 1, S]
    if decay is not None:
        logits = logits + (c - decay).unsqueeze(-2).to(work)  # b_ts = c_t − c_s
    out = torch.softmax(logits, dim=-1) @ values  # [B, H, 1, D]
    if cs is not None and scheme.cfg.rotate_values:
        out = rotate_pairs_cs(out, *cs)
    out = out.to(out_dtype)
    if scheme.gate is not None:
        out = out * scheme.gate.gate(x, tokens).to(out.dtype)
    return out

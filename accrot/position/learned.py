"""Learned increments of the accumulated rotation (``increments="learned"`` and ``"softplus"``): δ_j a function of
the layer input x_j, trained with the model, where the random increments of :mod:`accrot.position.accum` are draws.

:mod:`accrot.position.accum`'s docstring says what each parameterisation is and why (Selective RoPE's bounded
projection; GRAPE's contextual phase); the rotation part there builds one of these as its increment source and
adds the optional mixing floor.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from accrot.ops.rotary import accumulate_angles, accumulate_bounded, rope_frequencies
from accrot.position.base import DeviceConstants, IncrementSource, init_weights
from accrot.position.config import SchemeConfig
from accrot.position.scheme import register_increments


@register_increments("learned")
class LearnedIncrements(IncrementSource):
    """δ_j = μ + ℓ · M · tanh(u_j / M), u = proj(x): float32 whatever the autocast or parameter dtype
    (:mod:`accrot.position.accum`'s docstring).

    ``selective`` form (Selective RoPE's ``SelectiveRoPE``): x_j split into its H per-head slices, each L2-normalised,
    a rank-r projection to H·D/2 without bias (``down`` then ``up``), then a causal depthwise convolution of width K
    over time without bias or activation. ``plain``: x_j itself and a zero-initialised bias on ``up``. Rank 0 is one
    full-rank projection (no ``down``), width 0 no convolution. Every weight starts N(0, ``learned_init_std``), as
    the reference models initialise every linear and convolution layer (std 0.02).
    """

    learned = True
    reads = ("increment_mean", "increment_rank", "conv_size", "learned_ladder", "ladder_base", "max_increment",
             "learned_init_std", "learned_form")

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int, head_dim: int) -> None:
        super().__init__()
        self.n_heads, self.P = n_heads, head_dim // 2
        self.input_norm = cfg.learned_form == "selective"
        out = n_heads * self.P
        rank = cfg.increment_rank
        self.down = nn.Linear(d_model, rank, bias=False) if rank else None
        self.up = nn.Linear(rank or d_model, out, bias=cfg.learned_form == "plain")
        # depthwise over time, one filter per output channel [H·P, 1, K]; causal by left padding
        self.conv = nn.Conv1d(out, out, cfg.conv_size, groups=out, bias=False) if cfg.conv_size else None
        init_weights(self, cfg.learned_init_std)
        ladder = rope_frequencies(head_dim, cfg.ladder_base) if cfg.learned_ladder else torch.ones(self.P,
                                                                                                  dtype=torch.float64)
        omega = rope_frequencies(head_dim, cfg.rope_base)  # [P] float64
        mean = omega if cfg.increment_mean == "rope" else torch.zeros_like(omega)
        self.zero_mean = cfg.increment_mean != "rope"
        self.bound = float(cfg.max_increment)
        self.consts = DeviceConstants(
            scale=(cfg.max_increment * ladder).to(torch.float32), mean=mean.to(torch.float32)  # [P] each
        )

    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        """u / M, the tanh's argument, ``[B, H, T, P]`` float32: a view of the projection's ``[B, T, H·P]`` output."""
        B, T, C = x.shape
        with torch.autocast(device_type=x.device.type, enabled=False):
            h = x.float()  # [B, T, d_model]
            if self.input_norm:  # each head's slice of x on the unit sphere
                h = F.normalize(h.view(B, T, self.n_heads, C // self.n_heads), dim=-1, eps=1e-6).view(B, T, C)
            if self.down is not None:
                h = F.linear(h, self.down.weight.float())  # [B, T, r]
            inv = 1.0 / self.bound  # 1/M folded into the last weight (exact when M = 1)
            bias = None if self.up.bias is None else self.up.bias.float()
            if self.conv is None:
                u = F.linear(h, self.up.weight.float() * inv, None if bias is None else bias * inv)  # [B, T, H·P]
            else:
                u = F.linear(h, self.up.weight.float(), bias)  # [B, T, H·P]
                u = causal_depthwise_conv(u, self.conv.weight.float() * inv)  # [B, T, H·P]
            return u.view(B, T, self.n_heads, self.P).permute(0, 2, 1, 3)  # [B, H, T, P]

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        c = self.consts.on(x.device)
        with torch.autocast(device_type=x.device.type, enabled=False):
            delta = torch.tanh(self.pre_activation(x)) * c["scale"]  # [B, H, T, P]
            return delta if self.zero_mean else delta + c["mean"]  # a zero mean costs no pass

    def angles(self, x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        """θ = Σ_{j≤t} (δ_j + extra_j), ``[B, H, T, P]`` float32, as ``accumulate_angles(forward(x) + extra)`` but
        in one autograd node (:func:`~accrot.ops.rotary.accumulate_bounded`: on the CPU the bound, the shifts,
        the sum and the wrap are one pass each way)."""
        c = self.consts.on(x.device)
        with torch.autocast(device_type=x.device.type, enabled=False):
            return accumulate_bounded(self.pre_activation(x), c["scale"], None if self.zero_mean else c["mean"],
                                      extra)

    # cached decoding: the short convolution keeps its last conv_size − 1 inputs
    def _projection(self, x: torch.Tensor) -> torch.Tensor:
        """The convolution's input, ``[B, T, H·P]`` float32: :meth:`pre_activation` before the convolution."""
        B, T, C = x.shape
        h = x.float()
        if self.input_norm:
            h = F.normalize(h.view(B, T, self.n_heads, C // self.n_heads), dim=-1, eps=1e-6).view(B, T, C)
        if self.down is not None:
            h = F.linear(h, self.down.weight.float())  # [B, T, r]
        return F.linear(h, self.up.weight.float(), None if self.up.bias is None else self.up.bias.float())

    def decode_tail(self, x: torch.Tensor) -> torch.Tensor | None:
        """The convolution's last ``conv_size − 1`` inputs after ``x [B, T, d_model]`` (zeros before the start),
        ``[B, conv_size − 1, H·P]``; None without a convolution."""
        if self.conv is None:
            return None
        with torch.autocast(device_type=x.device.type, enabled=False):
            u = F.pad(self._projection(x), (0, 0, self.conv.kernel_size[0] - 1, 0))  # [B, T + K − 1, H·P]
        return u[:, u.shape[1] - (self.conv.kernel_size[0] - 1):]

    def decode_increments(self, x: torch.Tensor, tail: torch.Tensor | None
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(δ [B, H, n, P], the new tail)`` of the new positions ``x [B, n, d_model]`` after the inputs ``tail``
        (:meth:`decode_tail`): the increments :meth:`forward` gives there."""
        if self.conv is None:
            return self.forward(x, None), None
        B, n, _ = x.shape
        K = self.conv.kernel_size[0]
        c = self.consts.on(x.device)
        with torch.autocast(device_type=x.device.type, enabled=False):
            padded = torch.cat((tail, self._projection(x)), 1)  # [B, K − 1 + n, H·P]
            taps = (self.conv.weight.float() * (1.0 / self.bound))[:, 0].T  # [K, H·P]
            u = padded[:, K - 1:] * taps[K - 1]  # the order of causal_depthwise_conv's sum
            for j in range(K - 1):
                u = u + padded[:, j:j + n] * taps[j]
            u = u.view(B, n, self.n_heads, self.P).permute(0, 2, 1, 3)  # [B, H, n, P]
            delta = torch.tanh(u) * c["scale"]
            delta = delta if self.zero_mean else delta + c["mean"]
        return delta, padded[:, padded.shape[1] - (K - 1):]


SOFTPLUS_INIT_OMEGA = 1e-3  # GRAPE's grape_ctx_init_omega: the phase rate every token starts with


@register_increments("softplus")
class SoftplusIncrements(IncrementSource):
    """GRAPE's contextual phase (multiplicative GRAPE, contextual type I): a non-negative phase rate per token,
    ω_j = softplus(w·x_j + b) (one scalar shared by every head and pair), on a learnable ladder θ_i = exp(λ_i)
    initialised to RoPE's frequencies at ``ladder_base``; the angle of pair i at t is θ_i · Σ_{j<t} ω_j (an
    exclusive sum). As increments in the inclusive convention of the contract, δ_{t,i} = θ_i · ω_{t−1} and δ_0 = 0.

    The gate starts as GRAPE's: w = 0 and ω = 10⁻³ for every token, a RoPE slowed a thousandfold. Every increment
    is ≥ 0, a learned drift: a pair mixes only as far as ω varies, and the slow pairs (θ_i ≪ 1) stay coherent far
    past any training length. Computed in float32 whatever the autocast dtype.

    Reference: model-architectures/GRAPE ``model/llama-mha-grape-m-ctx.py`` (``MSGRAPEContextType1``).
    """

    timed_as = "learned"  # one scalar rate per token: a smaller projection than learned, the same rotations

    learned = True
    drifts = True  # ω ≥ 0: every increment has the sign of its pair's frequency
    reads = ("ladder_base",)

    @classmethod
    def regularity(cls, cfg: SchemeConfig) -> str:
        """A drift: the slow pairs stay coherent, the condition fails by construction (without a mixing floor)."""
        return "fails"

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int, head_dim: int) -> None:
        super().__init__()
        self.n_heads, self.P = n_heads, head_dim // 2
        self.gate = nn.Linear(d_model, 1)
        nn.init.zeros_(self.gate.weight)
        nn.init.constant_(self.gate.bias, math.log(math.expm1(SOFTPLUS_INIT_OMEGA)))  # softplus(b) = ω at init
        self.log_freq = nn.Parameter(rope_frequencies(head_dim, cfg.ladder_base).log().to(torch.float32))  # [P]

    def rates(self, x: torch.Tensor) -> torch.Tensor:
        """ω_j = softplus(w·x_j + b), ``[B, T]`` float32."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            z = F.linear(x.float(), self.gate.weight.float(), self.gate.bias.float())  # [B, T, 1]
            return F.softplus(z[..., 0])

    def shared(self, x: torch.Tensor) -> torch.Tensor:
        """δ of every head at once, ``[B, 1, T, P]`` float32: θ_i · ω_{t−1} (0 at t = 0)."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            omega = F.pad(self.rates(x)[:, :-1], (1, 0))  # [B, T] exclusive: token j enters from j + 1
            return omega[:, None, :, None] * self.log_freq.float().exp()  # [B, 1, T, P]

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.shared(x).expand(-1, self.n_heads, -1, -1)  # [B, H, T, P]

    def angles(self, x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        """θ = Σ_{j≤t} (δ_j + extra_j): ``[B, 1, T, P]`` (every head alike) without ``extra``, else ``[B, H, T, P]``."""
        delta = self.shared(x)  # [B, 1, T, P]
        return accumulate_angles(delta if extra is None else delta + extra.detach())


def causal_depthwise_conv(u: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y_t = Σ_{k<K} w[c, k] · u_{t−K+1+k} per channel c (zero before the start): ``F.conv1d`` with K − 1 zeros of left
    padding and ``groups=C``, computed as K shifted multiply-adds in u's own ``[B, T, C]`` layout (no transposes, so
    the result is a row-major ``[B, T, C]`` the fused angle kernel reads as it is). ``weight`` ``[C, 1, K]``."""
    K, T = weight.shape[-1], u.shape[1]
    padded = F.pad(u, (0, 0, K - 1, 0))  # [B, T + K − 1, C]
    taps = weight[:, 0].T  # [K, C]
    y = padded[:, K - 1:] * taps[K - 1]
    for k in range(K - 1):
        y = y + padded[:, k:k + T] * taps[k]
    return y  # [B, T, C]

"""Accumulated SO(2) rotations: RoPE at "positions" θ_t = Σ_{j≤t} δ_j (cf. Selective RoPE; accrot/study/CLAIMS.md).

Each token j adds an angle δ_j (per head and frequency pair) and pair i of q_t, k_t is rotated by θ_t,i, the
inclusive running sum. Rotations in a plane commute, so the pairing of t and s ≤ t is
q_tᵀ R(θ_s − θ_t) k_s: only the increments on the path s+1..t enter. With value transport the value of s
arrives at t as R(θ_t − θ_s) v_s.

Increments (``cfg.increments``):

* ``random_position``: i.i.d. per position, head and pair, δ = μ_i + σ_i·z. μ_i is 0 or RoPE's ω_i
  (``increment_mean``); σ_i is one σ for every pair (``constant``) or the ladder σ_i = σ·ω_i/ω_0 (``ladder``);
  z is standard gaussian or uniform (``increment_family``). ``sigma`` is the standard deviation of δ for both
  families (uniform: δ ∈ [μ − a, μ + a] with a = √3·σ). Alternatively ``window`` W sets σ so that
  |E[e^{iδ}]|^W = ε (``window_eps``): gaussian |φ| = exp(−σ²/2), so σ² = 2 ln(1/ε)/W; uniform
  |φ| = |sin a / a|, solved for a ∈ (0, π) by bisection. With ``ladder`` the window sets pair 0 (σ_0 = σ); the
  others mix more slowly. When neither is set the window is :data:`DEFAULT_WINDOW` = 96 tokens.
  In training with ``resample`` a fresh draw is taken every forward from the module's own stream: draw n of
  layer ℓ is keyed by (seed, ℓ, n), and n is saved with the weights (the module's extra state), so a resumed
  run continues the same sequence and nothing else that draws from torch's global RNG can shift it (the
  backbone sets ℓ, :meth:`RandomPositionIncrements.set_stream`). On the CPU the key seeds a ``torch.Generator``;
  on an accelerator the draw is made on the device by the counter-based SplitMix64 stream of that key
  (:mod:`accrot.ops.counter_rng`: element (row, head, position, pair) is a pure function of the key and its
  index, so nothing crosses from the host, a DDP rank computes only its own rows, and every GPU model draws
  the same bits — a run requeued onto another GPU type continues the same stream). In ``eval()`` (or with
  ``resample=False``) δ is a fixed function of position, ``seed`` and the layer: chunks of
  :data:`POSITION_CHUNK` positions, each from its own CPU generator seeded by (seed, ℓ, chunk index), drawn
  once and cached per device (the increments and their angles), so appending tokens never changes earlier
  angles, ``angles()`` is what forward used, and every device evaluates with the same increments.
* ``random_token``: a frozen table ``[vocab_size, H, D/2]`` (a buffer) drawn from (seed, ℓ) with the same
  distribution options; δ_j = table[token_j].
* ``learned`` (Selective RoPE's parameterisation by default): δ_j = μ_i + ℓ_i · M · tanh(u_j,i / M) with
  u = conv(up(down(norm(x)))): each head's slice of x_j L2-normalised, a rank-16 bottleneck (``increment_rank``),
  a causal depthwise convolution of width 4 over time (``conv_size``), no bias, every weight N(0, 0.02)
  (``learned_init_std``); ℓ_i = b^(−2i/D), RoPE's frequency ladder at b = 500 000 (``learned_ladder``,
  ``ladder_base``), the temperature Selective RoPE multiplies its phases by. The reference is unbounded
  (δ = ℓ·u); M = ``max_increment`` = π keeps its slope 1 at 0, so at init (|u| ~ 10⁻⁴) and wherever |u| ≪ π
  the two agree, while a step never exceeds π on the fastest pair (a larger one is the same rotation as a
  smaller angle). ``learned_form="plain"`` with ``increment_rank=0, conv_size=0, learned_ladder=false,
  max_increment=1`` is accrot's earlier form: one full-rank projection of the raw x_j with a zero-initialised
  bias, bounded to ±1 rad. Computed in float32 whatever the autocast dtype. With ``window`` (or ``sigma``)
  set, a zero-mean ``random_position`` draw of that spread is added (a *mixing floor*): independent noise
  multiplies the characteristic function, |E[e^{i(δ_learned + ξ)}]| ≤ |E[e^{iξ}]|, so every pair provably
  mixes within the window whatever the projection learns — the theory's regularity condition by
  construction. Without it a learned pair may drift coherently far past the training length.
* ``softplus`` (GRAPE's contextual phase): δ_t,i = θ_i · ω_{t−1} with ω_j = softplus(w·x_j + b) ≥ 0 one rate per
  token and θ_i a learnable ladder initialised to RoPE's frequencies (:class:`SoftplusIncrements`): the angles
  are θ_i · Σ_{j<t} ω_j, GRAPE's exclusive sum. Non-negative increments are a drift: a pair mixes only as
  far as ω varies and the slow pairs stay coherent, the learned rotation the regularity condition says should
  not extrapolate. A mixing floor can be added as for ``learned``.

Theory: pair i mixes when ρ_i = |E[e^{iδ_i}]| < 1, with mixing window W_i = log ε / log ρ_i; the
mean μ_i does not change ρ_i. Angles are accumulated in float64 and wrapped to [0, 2π) before the float32 cast,
which keeps them within 1e-3 rad at position 10⁶.

Randomness belongs to the run: ``seed`` follows the run's ``seed_everything`` unless set (the CLI
fills it in; None here means 0), and every layer has its own training stream, evaluation draws and token table,
as independent as different seeds, so seeds are independent replicates and evaluation shows no correlation
across layers that training never had.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from accrot.errors import ConfigError
from accrot.ops import counter_rng
from accrot.ops.rotary import accumulate_angles, accumulate_drawn, rope_frequencies, wrap_angle
from accrot.position.base import DeviceConstants, IncrementSource, SO2Rotation
from accrot.position.config import IncrementFamily, SchemeConfig
from accrot.position.learned import (  # noqa: F401 - callers still import the learned part from here
    SOFTPLUS_INIT_OMEGA,
    LearnedIncrements,
    SoftplusIncrements,
    causal_depthwise_conv,
)
from accrot.position.scheme import INCREMENTS, register_increments, register_rotation

DEFAULT_WINDOW = 96.0  # tokens; the mixing window of random increments when neither window nor sigma is set
POSITION_CHUNK = 256  # positions per independently seeded chunk of fixed random_position increments
_MASK64 = (1 << 64) - 1
_TOKEN_STREAM = 1 << 40  # generator index of the random_token table, disjoint from position chunk indices
_TRAIN_STREAM = 1 << 41  # + layer index: generator indices of the training draws, disjoint from the above
_EVAL_STREAM = 1 << 42  # + layer index: the layer's seed of its fixed (evaluation) position chunks


# -- distribution helpers (used by diagnostics and tests too) -----------------------------------------------
def char_fn_abs(sigma: float | torch.Tensor, family: IncrementFamily = "gaussian") -> torch.Tensor:
    """|E[e^{iδ}]| of an increment with standard deviation σ (any mean): gaussian exp(−σ²/2), uniform |sin a / a|,
    a = √3·σ. Returns float64 with σ's shape."""
    return log_char_fn_abs(sigma, family).exp()


def log_char_fn_abs(sigma: float | torch.Tensor, family: IncrementFamily = "gaussian") -> torch.Tensor:
    """log |E[e^{iδ}]|, exact for tiny σ too (where |φ| rounds to 1): gaussian −σ²/2, uniform log|sin a / a|."""
    s = torch.as_tensor(sigma, dtype=torch.float64)
    if family == "gaussian":
        return -0.5 * s**2
    if family == "uniform":
        a = math.sqrt(3.0) * s.abs()
        series = -(a**2) / 6 - a**4 / 180  # log(sin a / a) near 0, where the direct form loses digits
        safe = torch.where(a > 1e-3, a, torch.ones_like(a))
        direct = torch.log(torch.abs(torch.sin(safe) / safe))
        return torch.where(a > 1e-3, direct, series)
    raise ConfigError(f"increment_family={family!r} is not valid; choose one of 'gaussian', 'uniform'")


def mixing_window(
    sigma: float | torch.Tensor, eps: float = 0.05, family: IncrementFamily = "gaussian"
) -> torch.Tensor:
    """Predicted mixing window W = log ε / log |E[e^{iδ}]| in tokens (inf when |φ| = 1, 0 when φ = 0), float64."""
    log_phi = log_char_fn_abs(sigma, family)
    return torch.where(log_phi < 0, math.log(eps) / log_phi, torch.full_like(log_phi, math.inf))


def unmixable_pairs(cfg: SchemeConfig, head_dim: int, n_tokens: float) -> list[tuple[int, float, float]]:
    """Learned increments whose bound keeps some pairs from mixing within ``n_tokens``, whatever is learned:
    ``(pair, its largest step a_i = ℓ_i·M, the shortest window the bound allows)`` for each such pair.

    A step within a ≤ π/2 of its mean keeps |E[e^{iδ}]| ≥ E[cos(δ − μ)] ≥ cos a, so the pair's window
    log ε / log |E[e^{iδ}]| is at least log ε / log cos a; where that exceeds ``n_tokens`` the pair stays coherent
    over the whole context, which breaks the regularity condition by construction. Empty for every other source,
    and with a mixing floor (whose noise makes every pair mix within its window)."""
    if cfg.increments != "learned" or _has_floor(cfg):
        return []
    P = head_dim // 2
    ladder = (rope_frequencies(head_dim, cfg.ladder_base) if cfg.learned_ladder
              else torch.ones(P, dtype=torch.float64))
    out = []
    for i, a in enumerate((cfg.max_increment * ladder).tolist()):
        if a >= math.pi / 2:
            continue  # the bound alone allows |E[e^{iδ}]| = 0: nothing to say
        shortest = math.log(cfg.window_eps) / math.log(math.cos(a)) if a > 0 else math.inf
        if shortest > n_tokens:
            out.append((i, a, shortest))
    return out


def sigma_for_window(window: float, eps: float = 0.05, family: IncrementFamily = "gaussian") -> float:
    """Standard deviation σ whose increments satisfy |E[e^{iδ}]|^window = ε."""
    target = eps ** (1.0 / window)  # |φ| per step
    if family == "gaussian":
        return math.sqrt(2.0 * math.log(1.0 / eps) / window)
    if family == "uniform":  # sin a / a falls monotonically from 1 to 0 on (0, π): bisect for the half-width a
        lo, hi = 0.0, math.pi
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if math.sin(mid) / mid > target else (lo, mid)
        return 0.5 * (lo + hi) / math.sqrt(3.0)
    raise ConfigError(f"increment_family={family!r} is not valid; choose one of 'gaussian', 'uniform'")


def increment_distribution(cfg: SchemeConfig, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair mean μ_i and standard deviation σ_i of random increments, each ``[D/2]`` float64."""
    omega = rope_frequencies(head_dim, cfg.rope_base)  # [P]
    if cfg.sigma is not None:
        sigma = float(cfg.sigma)
    else:
        window = DEFAULT_WINDOW if cfg.window is None else float(cfg.window)
        sigma = sigma_for_window(window, cfg.window_eps, cfg.increment_family)
    sigmas = sigma * (omega / omega[0] if cfg.increment_spread == "ladder" else torch.ones_like(omega))
    mean = omega.clone() if cfg.increment_mean == "rope" else torch.zeros_like(omega)
    return mean, sigmas


def _run_seed(cfg: SchemeConfig) -> int:
    """The scheme's seed: the run's seed as the CLI resolved it, 0 when the config was built without one."""
    return 0 if cfg.seed is None else int(cfg.seed)


def mix_seed(seed: int, index: int) -> int:
    """SplitMix64 of (seed, index): well-separated generator seeds for neighbouring chunks and seeds."""
    z = ((seed & _MASK64) * 0x9E3779B97F4A7C15 + index + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def _standard_noise(
    shape: tuple[int, ...],
    family: IncrementFamily,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Zero-mean, unit-variance float32 noise: gaussian, or uniform on [−√3, √3]."""
    if family == "gaussian":
        return torch.randn(shape, generator=generator, device=device)
    return (2.0 * torch.rand(shape, generator=generator, device=device) - 1.0) * math.sqrt(3.0)


# -- increment sources ---------------------------------------------------------------------------------------
@register_increments("random_position")
class RandomPositionIncrements(IncrementSource):
    """δ i.i.d. per position: fresh in training (with resample), a fixed function of position otherwise."""

    random = True
    fresh_draws = True  # a new draw per batch: no single draw is the model's transport
    reads = ("increment_mean", "increment_spread", "increment_family", "seed", "resample")

    @classmethod
    def regularity(cls, cfg: SchemeConfig) -> str:
        """A spread on RoPE's ladder (σ_i ∝ ω_i) leaves the slow pairs' windows far past any length: it fails."""
        return "fails" if cfg.increment_spread == "ladder" else "holds"

    @classmethod
    def create(cls, cfg: SchemeConfig, d_model: int, n_heads: int, head_dim: int) -> RandomPositionIncrements:
        return cls(cfg, n_heads, head_dim)

    def law(self) -> tuple[torch.Tensor, torch.Tensor]:
        mean, sigma = increment_distribution(self.cfg, 2 * self.P)  # [P] float64 each
        return char_fn_abs(sigma, self.cfg.increment_family), mean

    def prediction_basis(self) -> str:
        """Exact for zero-mean increments with one spread for every pair; a mean or a spread per pair weights the
        pairs by the model's own q·k, so the prediction assumes isotropic q, k there."""
        exact = self.cfg.increment_mean == "zero" and self.cfg.increment_spread == "constant"
        return "exact" if exact else "isotropic"

    def __init__(self, cfg: SchemeConfig, n_heads: int, head_dim: int) -> None:
        super().__init__()
        self.cfg, self.n_heads, self.P = cfg, n_heads, head_dim // 2
        mean, sigma = increment_distribution(cfg, head_dim)  # [P] float64 each
        self.consts = DeviceConstants(mean=mean, sigma=sigma)
        # per device: fixed angles [1, H, Tc, P] float32 and the float64 carry [H, 1, P] after Tc positions
        self._fixed: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._fixed_delta: dict[torch.device, torch.Tensor] = {}  # per device: fixed increments [1, H, Tc, P]
        self.stream = 0  # which training stream (the layer index, set by the backbone)
        self.draws = 0  # training draws taken so far: part of the state dict (extra state)
        self.shard = (0, 1)  # (rank, world): which rows of the global batch this process holds (DDP)

    @property
    def fresh(self) -> bool:
        """True when forward draws new increments (training with resample)."""
        return self.training and self.cfg.resample

    def set_stream(self, stream: int) -> None:
        """Give this module (layer ``stream``) its own training draws and its own fixed evaluation draws."""
        self.stream = int(stream)
        self._fixed.clear()  # the fixed angles and increments of the previous stream
        self._fixed_delta.clear()

    def set_shard(self, rank: int, world: int) -> None:
        """Under DDP, rank r of W holds rows r, r + W, … of the global batch (``ResumableSampler``'s sharding):
        each training draw is then the global batch's draw, of which this rank keeps its rows, so W ranks draw
        exactly the increments one process would for the same global batch (and W ranks never share a draw)."""
        if not 0 <= rank < world:
            raise ValueError(f"rank={rank} is not in [0, world={world})")
        self.shard = (int(rank), int(world))

    def next_key(self) -> int:
        """The key of the next training draw, a pure function of (seed, stream, draw count); counts the draw."""
        key = mix_seed(mix_seed(_run_seed(self.cfg), _TRAIN_STREAM + self.stream), self.draws)
        self.draws += 1
        return key

    def next_generator(self) -> torch.Generator:
        """The CPU generator of the next training draw, seeded by :meth:`next_key`."""
        return torch.Generator().manual_seed(self.next_key())

    def get_extra_state(self) -> dict:
        return {"draws": self.draws}

    def set_extra_state(self, state: dict) -> None:
        self.draws = int(state["draws"])

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        # weights saved before the draw count was part of the state: start its stream from the beginning
        state_dict.setdefault(prefix + "_extra_state", {"draws": 0})
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def draw(self, shape: tuple[int, ...], generator: torch.Generator | None = None, device=None) -> torch.Tensor:
        return self._increments(_standard_noise(shape, self.cfg.increment_family, generator, device))

    def _increments(self, z: torch.Tensor) -> torch.Tensor:
        """δ = μ + σ·z from standard noise ``z [..., P]``, computed in float64 and rounded to float32."""
        c = self.consts.on(z.device)
        return (c["mean"] + c["sigma"] * z).to(torch.float32)

    def _training_noise(self, B: int, T: int) -> torch.Tensor:
        """Standard noise of the next training draw on the CPU: the global batch's ``[B·W, H, T, P]`` from the
        draw's generator, of which this rank keeps its rows, ``[B, H, T, P]``."""
        rank, world = self.shard
        z = _standard_noise((B * world, self.n_heads, T, self.P), self.cfg.increment_family, self.next_generator())
        return z if world == 1 else z[rank::world]

    def counter_draw(self, key: int, B: int, T: int, device: torch.device | str) -> torch.Tensor:
        """The training draw of key ``key`` for this rank's ``B`` rows, made on ``device``: ``[B, H, T, P]`` float32.

        Element (row g, head h, position t, pair p) of the global batch ``[B·W, H, T, P]`` is output
        ((g·H + h)·T + t)·P + p of the key's SplitMix64 stream; rank r of W holds rows g = r, r + W, … (the
        sampler's sharding), so W ranks together draw exactly what one process draws for the global batch.
        """
        rank, world = self.shard
        H, P = self.n_heads, self.P
        per_row = H * T * P
        rows = torch.arange(B, device=device, dtype=torch.int64) * world + rank  # [B] global rows
        within = torch.arange(per_row, device=device, dtype=torch.int64)  # [H·T·P]
        counter = (rows[:, None] * per_row + within).view(B, H, T, P)  # [B, H, T, P]
        if self.cfg.increment_family == "gaussian":
            z = counter_rng.standard_normal(key, counter)
        else:
            z = counter_rng.standard_uniform(key, counter)
        return self._increments(z)  # δ rounded to float32, as :meth:`draw`

    def fresh_angles(self, B: int, T: int) -> torch.Tensor:
        """θ of the next training draw for this rank's ``B`` rows, on the CPU: ``[B, H, T, P]`` float32, the bits
        of ``accumulate_angles(forward(x, tokens))`` with the map to δ and the sum in one pass
        (:func:`~accrot.ops.rotary.accumulate_drawn`)."""
        c = self.consts.on(torch.device("cpu"))
        return accumulate_drawn(self._training_noise(B, T), c["mean"], c["sigma"])  # [B, H, T, P]

    def fixed_chunks(self, first: int, stop: int) -> torch.Tensor:
        """Fixed increments of chunks ``first..stop-1``, ``[n, H, POSITION_CHUNK, P]`` float32 on the CPU."""
        chunks = []
        layer_seed = mix_seed(_run_seed(self.cfg), _EVAL_STREAM + self.stream)
        for index in range(first, stop):
            gen = torch.Generator().manual_seed(mix_seed(layer_seed, index))
            chunks.append(self.draw((self.n_heads, POSITION_CHUNK, self.P), generator=gen))
        return torch.stack(chunks) if chunks else torch.empty(0, self.n_heads, POSITION_CHUNK, self.P)

    def fixed_angles(self, T: int, device: torch.device) -> torch.Tensor:
        """θ of the fixed increments, ``[1, H, T, P]`` float32; grown chunk by chunk, so any prefix is exact."""
        if T == 0:
            return torch.zeros(1, self.n_heads, 0, self.P, device=device)
        theta, carry = self._fixed.get(device, (None, torch.zeros(self.n_heads, 1, self.P, dtype=torch.float64)))
        have = 0 if theta is None else theta.shape[-2] // POSITION_CHUNK
        need = -(-T // POSITION_CHUNK)
        if need > have:
            delta = self.fixed_chunks(have, need).to(torch.float64)  # [n, H, C, P]
            local = delta.cumsum(dim=-2)  # [n, H, C, P] sums within each chunk
            carry = carry.cpu()
            starts = []
            for total in local[:, :, -1:]:  # chunk by chunk, so the carry never depends on how many are built
                starts.append(carry)
                carry = wrap_angle(carry + total)  # [H, 1, P]
            new = wrap_angle(torch.stack(starts) + local).to(torch.float32)  # [n, H, C, P]
            new = new.permute(1, 0, 2, 3).reshape(1, self.n_heads, -1, self.P).to(device)  # [1, H, n·C, P]
            theta = new if theta is None else torch.cat((theta, new), dim=-2)
            self._fixed[device] = (theta, carry)
        return theta[:, :, :T]

    def fixed_increments(self, T: int, device: torch.device) -> torch.Tensor:
        """The fixed increments of positions 0..T−1, ``[1, H, T, P]`` float32, drawn on the CPU once per chunk and
        cached on ``device`` (grown chunk by chunk: no host-to-device copy once the length has been seen)."""
        if T == 0:
            return torch.zeros(1, self.n_heads, 0, self.P, device=device)
        have = self._fixed_delta.get(device)
        n_have = 0 if have is None else have.shape[-2] // POSITION_CHUNK
        need = -(-T // POSITION_CHUNK)
        if need > n_have:
            new = self.fixed_chunks(n_have, need)  # [n, H, C, P] on the CPU
            new = new.permute(1, 0, 2, 3).reshape(1, self.n_heads, -1, self.P).to(device)  # [1, H, n·C, P]
            have = new if have is None else torch.cat((have, new), dim=-2)
            self._fixed_delta[device] = have
        return have[:, :, :T]

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        B, T = tokens.shape
        if not self.fresh:
            return self.fixed_increments(T, x.device)  # [1, H, T, P]
        if x.device.type != "cpu":  # drawn where x lives, only this rank's rows
            return self.counter_draw(self.next_key(), B, T, x.device)  # [B, H, T, P]
        return self._increments(self._training_noise(B, T))  # [B, H, T, P] this rank's rows


@register_increments("random_token")
class RandomTokenIncrements(IncrementSource):
    """δ_j = table[token_j] from a frozen random table ``[vocab_size, H, P]`` (a buffer, saved with the model)."""

    random = True
    reads = ("increment_mean", "increment_spread", "increment_family", "seed", "vocab_size")
    timed_as = "random_position"  # a table lookup in place of a draw, then the same rotation kernels
    law = RandomPositionIncrements.law  # the same distribution options

    @classmethod
    def regularity(cls, cfg: SchemeConfig) -> str:
        return RandomPositionIncrements.regularity(cfg)

    @classmethod
    def create(cls, cfg: SchemeConfig, d_model: int, n_heads: int, head_dim: int) -> RandomTokenIncrements:
        return cls(cfg, n_heads, head_dim)

    def prediction_basis(self) -> str:
        """Approximate: the draws on a path are i.i.d. only over distinct tokens."""
        return "approximate"

    def __init__(self, cfg: SchemeConfig, n_heads: int, head_dim: int) -> None:
        super().__init__()
        self.cfg, self.n_heads, self.P = cfg, n_heads, head_dim // 2
        self.vocab_size = cfg.vocab_size
        self.register_buffer("table", self._draw_table(0))
        self._checked_on: set[torch.device] = set()  # accelerators whose token ids were checked once

    def _draw_table(self, layer: int) -> torch.Tensor:
        """The table of layer ``layer``: ``[vocab_size, H, P]`` float32 from the generator of (seed, layer)."""
        mean, sigma = increment_distribution(self.cfg, 2 * self.P)  # [P] float64 each
        gen = torch.Generator().manual_seed(mix_seed(_run_seed(self.cfg), _TOKEN_STREAM + layer))
        z = _standard_noise((self.vocab_size, self.n_heads, self.P), self.cfg.increment_family, gen)  # [V, H, P]
        return (mean + sigma * z).to(torch.float32)

    def set_stream(self, stream: int) -> None:
        """Layer ``stream`` draws its own table (a checkpoint's saved table still loads over it)."""
        self.table = self._draw_table(int(stream)).to(self.table.device)

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        # token ids outside the table: one line naming vocab_size. On the CPU the check is free; on an accelerator
        # it costs a device sync, so it runs on the first batch only (the backbone's embedding indexes the same
        # ids with the same vocabulary every step, so a later bad id cannot slip past both)
        device = tokens.device
        if tokens.numel() and (device.type == "cpu" or (device.type != "meta" and device not in self._checked_on)):
            lo, hi = torch.stack(torch.aminmax(tokens)).tolist()  # one device sync
            if lo < 0 or hi >= self.vocab_size:
                raise ValueError(
                    f"token ids span [{lo}, {hi}] but the random_token table has vocab_size={self.vocab_size}; "
                    "set vocab_size to the tokenizer's vocabulary size"
                )
            if device.type != "cpu":
                self._checked_on.add(device)
        return self.table[tokens].to(torch.float32).permute(0, 2, 1, 3)  # [B, T, H, P] -> [B, H, T, P]


def _has_floor(cfg: SchemeConfig) -> bool:
    """A mixing floor: learned increments with a window (or spread) set get zero-mean random draws added."""
    return INCREMENTS[cfg.increments].learned and (cfg.window is not None or cfg.sigma is not None)


def _check_options(cfg: SchemeConfig) -> None:
    """Reject options that do nothing for the chosen increment kind (a silent no-op would mislabel a run)."""
    if cfg.increments in ("learned", "softplus"):
        if cfg.increment_spread != "constant":
            raise ConfigError(f"increment_spread='ladder' is for random increments, not increments={cfg.increments!r}"
                              + ("; use learned_ladder=true instead" if cfg.increments == "learned" else ""))
        if cfg.increment_family != "gaussian":
            raise ConfigError(
                f"increment_family={cfg.increment_family!r} is for random increments, not increments={cfg.increments!r}"
            )
    if cfg.increments == "softplus" and cfg.increment_mean != "zero":
        raise ConfigError("increment_mean='rope' is for random and learned increments; softplus increments drift "
                          "by construction (ω ≥ 0 on a ladder)")
    if cfg.increments != "learned":
        for name in ("increment_rank", "conv_size", "learned_ladder"):
            value = getattr(cfg, name)
            if value is not None and value is not False and value != 0:
                raise ConfigError(f"{name}={value!r} needs increments='learned' (got increments={cfg.increments!r})")
    if cfg.increments in ("random_position", "random_token") and cfg.ladder_base is not None:
        raise ConfigError(f"ladder_base={cfg.ladder_base!r} is for learned and softplus increments, not "
                          f"increments={cfg.increments!r} (random increments: increment_spread=ladder)")


@register_rotation("accum")
class AccumulatedRotation(SO2Rotation):
    """Accumulated SO(2) rotation: ``angles(x, tokens) -> [B|1, H, T, D/2]`` float32, θ_t = Σ_{j≤t} δ_j.

    ``increments(x, tokens) -> [B|1, H, T, D/2]`` float32 exposes the δ_j that define it (in ``eval()`` the
    same ones forward uses), so tests and diagnostics can rebuild the path products independently.
    """

    kind = "so2"
    takes_increments = True  # its δ_j come from an increment source (INCREMENTS, cfg.increments)
    accumulates = True  # θ_t − θ_s = Σ_{j=s+1..t} δ_j: a product of per-token rotations
    reads = ("rope_base", "window", "sigma", "window_eps")  # the window (or spread) of the draws or the floor

    @classmethod
    def declared(cls, cfg: SchemeConfig) -> dict:
        """The increment source's facts; a mixing floor on learned increments adds draws (``random``) and makes
        every pair mix by construction."""
        source = INCREMENTS[cfg.increments]
        floor = _has_floor(cfg)
        return {"random": source.random or floor, "learned": source.learned, "drifts": source.drifts,
                "fresh_draws": source.fresh_draws, "regularity": "holds" if floor else source.regularity(cfg),
                "parts": (cls, source, *((RandomPositionIncrements,) if floor else ()))}

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int) -> None:
        super().__init__(cfg, d_model, n_heads)
        _check_options(cfg)
        self.source: IncrementSource = INCREMENTS[cfg.increments].create(cfg, d_model, n_heads, self.head_dim)
        self.floor: RandomPositionIncrements | None = None
        if _has_floor(cfg):
            noise = dataclasses.replace(cfg, increments="random_position", increment_mean="zero")
            self.floor = RandomPositionIncrements(noise, n_heads, self.head_dim)

    def predicted_coherence(self, distances: torch.Tensor) -> torch.Tensor | None:
        """mean_i |φ_i|^Δ cos(Δ μ_i) of random increments (|φ_i| = |E[e^{iδ_i}]|); with a mixing floor the floor's
        envelope mean_i |φ_i|^Δ, an upper bound (the learned part can only lower it); None otherwise."""
        law = self.floor.law() if self.floor is not None else self.source.law()
        if law is None:
            return None
        rho, mean = law
        if self.floor is not None:
            mean = torch.zeros_like(rho)
        return (rho.pow(distances) * torch.cos(distances * mean)).mean(-1)  # [n]

    def prediction_basis(self) -> str:
        return "upper bound" if self.floor is not None else self.source.prediction_basis()

    def set_stream(self, layer: int) -> None:
        for source in (self.source, self.floor):
            if isinstance(source, (RandomPositionIncrements, RandomTokenIncrements)):
                source.set_stream(layer)

    def set_data_shard(self, rank: int, world: int) -> None:
        for source in (self.source, self.floor):  # a token table is drawn once, not per row: nothing to shard
            if isinstance(source, RandomPositionIncrements):
                source.set_shard(rank, world)

    def increments(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """δ_j, ``[B|1, H, T, D/2]`` float32 (training with resample: a fresh draw per call)."""
        delta = self.source(x, tokens)
        return delta if self.floor is None else delta + self.floor(x, tokens)  # [B, H, T, P]

    def angles(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        if isinstance(self.source, RandomPositionIncrements):
            if not self.source.fresh:
                return self.source.fixed_angles(tokens.shape[1], x.device)  # [1, H, T, P] cached
            if x.device.type == "cpu":  # a fresh draw, mapped and summed in one pass
                return self.source.fresh_angles(*tokens.shape)  # [B, H, T, P]
        if self.learned:  # learned: the bound, the floor and the sum in one node
            return self.source.angles(x, None if self.floor is None else self.floor(x, tokens))  # [B, H|1, T, P]
        return accumulate_angles(self.increments(x, tokens))  # [B|1, H, T, P]

    @property
    def learned(self) -> bool:
        """True when the increments are a learned function of x (learned, softplus)."""
        return self.source.learned

    @property
    def random(self) -> bool:
        """True when the increments are drawn from a known distribution (random_position, random_token)."""
        return self.source.random

    def independent_angles(self, tokens: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """θ of a fresh, independent draw of the increment distribution, ``[B, H, T, P]`` float32 (diagnostics).

        random_position: new i.i.d. increments per position and block; random_token: a new table, indexed by
        the tokens. The draws are independent of the model's q and k, which makes the i.i.d. prediction of the
        coherence exact in expectation; averaging over independent draws gives an honest error bar.
        """
        if not self.random:
            raise ValueError(f"increments={self.cfg.increments!r} are not drawn from a known distribution")
        B, T = tokens.shape
        H, P = self.n_heads, self.head_dim // 2
        if isinstance(self.source, RandomPositionIncrements):
            delta = self.source.draw((B, H, T, P), generator=generator)  # [B, H, T, P]
        else:
            mean, sigma = increment_distribution(self.cfg, self.head_dim)  # [P] each
            z = _standard_noise((self.cfg.vocab_size, H, P), self.cfg.increment_family, generator)  # [V, H, P]
            table = (mean + sigma * z).to(torch.float32)
            delta = table[tokens.cpu()].permute(0, 2, 1, 3)  # [B, T, H, P] -> [B, H, T, P]
        return accumulate_angles(delta).to(tokens.device)

    def describe(self) -> dict:
        cfg = self.cfg
        info: dict = {"increments": cfg.increments}
        if self.learned:
            if cfg.increments == "learned":
                info.update(learned_form=cfg.learned_form, increment_rank=cfg.increment_rank, conv_size=cfg.conv_size,
                            learned_ladder=cfg.learned_ladder, max_increment=cfg.max_increment)
            else:  # the ladder as trained so far
                info["softplus_ladder"] = self.source.log_freq.detach().double().exp().tolist()
            if cfg.learned_ladder or cfg.increments == "softplus":
                info["ladder_base"] = cfg.ladder_base
            if self.floor is None:
                info["mixing_window"] = "measured by diagnostics"
                return info
            floor = self.floor.consts.on(torch.device("cpu"))["sigma"].double()
            # an upper bound: the learned part can only shorten the window
            info["mixing_window"] = mixing_window(floor, cfg.window_eps, cfg.increment_family).tolist()
            info["mixing_floor_sigma"] = floor.tolist()
            info["window_eps"] = cfg.window_eps
            return info
        mean, sigma = increment_distribution(cfg, self.head_dim)
        info.update(
            increment_family=cfg.increment_family,
            increment_mean=cfg.increment_mean,  # the mean does not change |φ| or the window
            increment_spread=cfg.increment_spread,  # a ladder breaks the regularity condition
            increment_sigma=sigma.tolist(),
            increment_char_fn=char_fn_abs(sigma, cfg.increment_family).tolist(),
            mixing_window=mixing_window(sigma, cfg.window_eps, cfg.increment_family).tolist(),
            window_eps=cfg.window_eps,
        )
        return info

    # cached decoding: the running angle sum (float64, unwrapped, as the forward's cumulative sum) and the sources'
    # own carries; fixed random_position angles are read off their table at the position
    def _check_decodable(self) -> None:
        for source in (self.source, self.floor):
            if isinstance(source, RandomPositionIncrements) and source.fresh:
                raise ConfigError("cached decoding reads the fixed (evaluation) random increments, a function of "
                                  "position: put the model in eval() mode first")

    def decode_state(self, x: torch.Tensor, tokens: torch.Tensor) -> dict:
        """The carry after a prompt: ``theta`` ``[B|1, H, 1, P]`` float64 (the unwrapped sum of its increments), a
        learned source's convolution ``tail``, a softplus source's last ``rate`` ``[B, 1]``."""
        self._check_decodable()
        state: dict = {}
        if isinstance(self.source, RandomPositionIncrements):
            return state  # the fixed angles are a table of position
        if isinstance(self.source, LearnedIncrements):
            state["tail"] = self.source.decode_tail(x)
        elif isinstance(self.source, SoftplusIncrements):
            state["rate"] = self.source.rates(x)[:, -1:]  # [B, 1] ω_{T−1}, the next position's rate
        state["theta"] = self.increments(x, tokens).to(torch.float64).sum(-2, keepdim=True)  # [B|1, H, 1, P]
        return state

    def decode_angles(self, x: torch.Tensor, tokens: torch.Tensor, start: int, state: dict) -> torch.Tensor:
        """θ of positions ``start..start+n−1`` (``x [B, n, d_model]``), ``[B|1, H, n, P]`` float32."""
        self._check_decodable()
        n = tokens.shape[1]
        if isinstance(self.source, RandomPositionIncrements):
            return self.source.fixed_angles(start + n, x.device)[:, :, start:]  # [1, H, n, P]
        if isinstance(self.source, LearnedIncrements):
            delta, state["tail"] = self.source.decode_increments(x, state.get("tail"))  # [B, H, n, P]
        elif isinstance(self.source, SoftplusIncrements):
            rates = self.source.rates(x)  # [B, n]
            omega = torch.cat((state["rate"], rates[:, :-1]), 1)  # [B, n] exclusive: ω_{t−1}
            state["rate"] = rates[:, -1:]
            delta = (omega[:, None, :, None] * self.source.log_freq.float().exp()).expand(-1, self.n_heads, -1, -1)
        else:
            delta = self.source(x, tokens)  # [B, H, n, P] the token table's rows
        if self.floor is not None:
            delta = delta + self.floor.fixed_increments(start + n, x.device)[:, :, start:]
        theta = state["theta"] + delta.to(torch.float64).cumsum(-2)  # [B|1, H, n, P]
        state["theta"] = theta[..., -1:, :]
        return wrap_angle(theta).to(torch.float32)

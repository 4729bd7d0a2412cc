"""The composed position scheme: one ``nn.Module`` per attention layer.

A scheme is ``rotation × far_mass × rotate_values`` (× an optional output gate). :class:`PositionScheme` owns one
rotation part, one far-mass part and the gate, exposes what defines them (``angles``, ``householder``,
``log_decay``, ``logit_scale``, ``output_gate``) and dispatches the attention to the matching kernel in
:mod:`accrot.ops`:

* rotation ∈ {none, rope, accum}: rotate q, k (and v / out) by the absolute angles θ_t, then fused
  causal SDPA (far_mass = none or ssmax, whose per-row logit factor is folded into q) or the blockwise biased
  kernel (alibi / forget);
* rotation = path: the chunked PaTH kernel, with the far-mass bias folded in (ssmax: into q);
* the output gate, if any, multiplies the result.

Parts are small modules with one job each:

* a rotation part implements ``angles(x, tokens) -> [B, H, T, D/2]`` (SO(2) kinds) or
  ``householder(x, tokens) -> (w [B, H, T, D], beta [B, H, T])`` (path);
* a far-mass part implements ``log_decay(x, tokens) -> [B, H, T]`` (log f_j ≤ 0, float32), or, where it is not
  additive (scalable softmax), ``logit_scale(x, tokens) -> [B, H, T]`` (a factor on every logit of row t) and no bias;
* an output gate implements ``gate(x, tokens) -> [B, H, T, D]`` (in (0, 1), multiplying the attention output).

Each part also gives its own term of the scheme's attention written out (:mod:`accrot.position.explicit`, the
explicit twin of the fast path), so nothing outside the parts needs to know what a family does:

* a rotation part gives ``transported_scores(q, k, x, tokens, rows) -> [B, H, R, T]`` float64, the scores
  D^−1/2 q_tᵀ M_{t,s} k_s of query ``rows`` over every key (the default: M = I), ``transported_values(a, v, x,
  tokens, rows) -> [B, H, R, D]``, Σ_s a_ts M^v_{t,s} v_s (the default: no value transport), and
  ``logit_scale(T) -> float``, a factor on every logit of a forward of length T (the default: 1; RoPE's
  evaluation-time temperature). SO(2) parts derive from :class:`SO2Rotation`, which gives all three from ``angles``;
* a far-mass part gives ``logit_bias(x, tokens, rows) -> [B|1, H, R, T]`` float64, b_ts = Σ_{j=s+1..t} log f_j from
  ``log_decay`` (None for a part that is not ``additive``), beside its row factor ``logit_scale``;
* an output gate's factor is its ``gate``.
"""

from __future__ import annotations

import torch
from torch import nn

from accrot.ops.rotary import rotate_pairs
from accrot.position.config import SchemeConfig


class RotationPart(nn.Module):
    """Base of rotation parts. ``kind`` is ``"so2"`` (angles), ``"path"`` (Householder) or ``"none"``.

    What the part is, declared for readers that never build it (:func:`accrot.position.facts`):

    * ``accumulates``: M_{t,s} is a product of per-token factors along the path s+1..t, taken from the data or
      drawn (accum, PaTH); RoPE's R(ω)^{t−s} and no rotation do not.
    * ``commutes``: the factors commute (SO(2) rotations in fixed planes, and no rotation); PaTH's Householder
      products do not.
    * ``random`` / ``learned``: the factors are drawn from a known distribution / are a learned function of x
      (for the accumulated rotation: its increment source's, :class:`IncrementSource`).
    * ``reads``: the :class:`~accrot.position.config.SchemeConfig` options the part reads; ``unread``: options
      of the other parts it makes unused (PaTH's walk replaces the far-mass kernel and its ``block_size``).
    """

    kind = "none"
    takes_increments = False  # True where the rotation's steps come from an accum increment source (INCREMENTS)
    accumulates = False
    commutes = True
    random = False
    learned = False
    reads: tuple[str, ...] = ()
    unread: tuple[str, ...] = ()

    @classmethod
    def declared(cls, cfg: SchemeConfig) -> dict:
        """This part's facts for ``cfg`` (the class attributes; the accumulated rotation's come from its increment
        source): ``random``, ``learned``, ``drifts``, ``fresh_draws``, ``regularity`` and ``parts``, the classes
        whose ``reads`` this rotation brings (itself, its increment source, a mixing floor).

        ``regularity`` is where the part stands on the theory's condition that every pair mixes: ``"holds"`` by
        construction, ``"may hold"`` (a learned transport, which training decides), ``"fails"`` by construction, or
        None where nothing accumulates."""
        return {"random": cls.random, "learned": cls.learned, "drifts": False, "fresh_draws": False,
                "regularity": "may hold" if cls.accumulates else None, "parts": (cls,)}

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.cfg, self.d_model, self.n_heads = cfg, d_model, n_heads
        self.head_dim = d_model // n_heads

    def describe(self) -> dict:
        """Facts worth logging at construction (e.g. predicted mixing windows)."""
        return {}

    def predicted_coherence(self, distances: torch.Tensor) -> torch.Tensor | None:
        """The i.i.d. prediction of the coherence c(Δ) at ``distances [n, 1]`` (float64), ``[n]``, or None where the
        theory gives none (a learned transport without a mixing floor). See :meth:`prediction_basis`."""
        return None

    def prediction_basis(self) -> str:
        """How :meth:`predicted_coherence` relates to a measurement: ``exact`` (in expectation, any q, k),
        ``isotropic`` (assumes isotropic q, k), ``approximate``, ``upper bound`` or ``none``."""
        return "none"

    # what the backbone tells a scheme: a rotation with no randomness of its own has nothing to do with it
    def set_stream(self, layer: int) -> None:
        """This part belongs to layer ``layer`` of the model: parts that draw randomness take that layer's own
        draws, so no two layers share one."""

    def set_data_shard(self, rank: int, world: int) -> None:
        """Under DDP this process trains on rows ``rank``, ``rank + world``, … of the global batch: parts that draw
        per row keep the global batch's draws of those rows."""

    # -- its term of the explicit attention (accrot.position.explicit) -----------------------------------------
    def transported_scores(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
                           rows: torch.Tensor) -> torch.Tensor:
        """The scores D^−1/2 q_tᵀ M_{t,s} k_s of query ``rows [R]`` over every key s, ``[B, H, R, T]`` float64,
        without a far-mass bias or a row factor (entries s > t are meaningless: callers mask them).

        q, k: ``[B, H, T, D]``; x ``[B, T, d_model]``, tokens ``[B, T]`` (what the part's transport is computed
        from). The products run in q's precision, float32 or wider. Without a rotation M_{t,s} = I: plain q·k."""
        q, k = _working(q), _working(k)
        return (q[:, :, rows] @ k.transpose(-1, -2)).double() * q.shape[-1] ** -0.5  # [B, H, R, T]

    def factored_pairs(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
                       theta: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(q', k')`` whose plain dot products are the transported pairings q_tᵀ M_{t,s} k_s (unscaled), where the
        transport factors into one transform per position; None where it does not (PaTH: :meth:`walked_pairs`).
        Without a rotation q and k themselves (the same objects). ``theta``: SO(2) angles to transport with instead
        of the part's own (fresh draws, draw-major rows)."""
        return q, k

    def walked_pairs(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
                     rows: torch.Tensor, max_distance: int, wanted: set[int] | None = None):
        """For a transport that does not factor per position: ``(Δ, start, ℓ [B, H, R − start])`` per distance Δ ≤
        ``max_distance``, ℓ the unscaled pairing of query ``rows[start:]`` with the key Δ before it
        (:func:`accrot.position.walk.path_walk`)."""
        raise NotImplementedError(f"{type(self).__name__}'s transport factors per position: use factored_pairs")

    def transported_values(self, a: torch.Tensor, v: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
                           rows: torch.Tensor) -> torch.Tensor:
        """Σ_s a_ts M^v_{t,s} v_s for query ``rows [R]``: attention weights ``a [B, H, R, T]`` and values
        ``v [B, H, T, D]`` -> ``[B, H, R, D]`` in a's dtype. Without value transport M^v = I."""
        return a @ v.to(a.dtype)  # [B, H, R, D]

    def logit_scale(self, T: int) -> float:
        """What multiplies every attention logit of a forward of length T: 1 (a rotation with an evaluation-time
        temperature, RoPE's YaRN extension, overrides it)."""
        return 1.0

    # cached decoding (accrot.position.decode): what a part carries from one position to the next
    def decode_state(self, x: torch.Tensor, tokens: torch.Tensor) -> dict:
        """The carry after a prompt (``x [B, T, d_model]``, ``tokens [B, T]``) that the decoding steps read; a part
        whose quantities at a position depend on that position's input alone carries nothing."""
        return {}

    def decode_angles(self, x: torch.Tensor, tokens: torch.Tensor, start: int, state: dict) -> torch.Tensor:
        """θ of the new positions ``start..start+n−1`` (``x [B, n, d_model]``), ``[B|1, H, n, D/2]`` float32, the bits
        the forward gives there; updates ``state`` (SO(2) kinds)."""
        raise NotImplementedError(f"{type(self).__name__} has no angles")

    def decode_householder(self, x: torch.Tensor, tokens: torch.Tensor, state: dict
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(w [B, H, n, D], beta [B, H, n])`` of the new positions; updates ``state`` (path)."""
        raise NotImplementedError(f"{type(self).__name__} has no Householder factors")


class SO2Rotation(RotationPart):
    """Base of the SO(2) rotation parts (``kind = "so2"``): a subclass implements ``angles(x, tokens) ->
    [B|1, H|1, T, D/2]`` (float32) and this gives its terms of the explicit attention from them: M_{t,s} = R(θ_s −
    θ_t) on the scores, and with ``rotate_values`` the value of s arriving at t as R(θ_t − θ_s) v_s.

    In training a part that redraws its increments per call gives each call its own draw; the explicit attention
    is defined in ``eval()``, where the angles are a fixed function of the input (as ``angles`` is)."""

    kind = "so2"

    def angles(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def transported_scores(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
                           rows: torch.Tensor) -> torch.Tensor:
        theta = self.angles(x, tokens)  # [B|1, H|1, T, P]
        # (R(θ_t) q_t)·(R(θ_s) k_s) = q_tᵀ R(θ_s − θ_t) k_s
        q, k = rotate_pairs(_working(q), theta), rotate_pairs(_working(k), theta)  # [B, H, T, D] each
        return super().transported_scores(q, k, x, tokens, rows)

    def factored_pairs(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
                       theta: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        theta = self.angles(x, tokens) if theta is None else theta  # [B|1 or draws·B, H, T, P]
        B = q.shape[0]
        if theta.shape[0] > B:  # several draws at once, draw-major: replicate r = d·B + b pairs θ_d with block b
            if theta.shape[0] % B:
                raise ValueError(f"theta has {theta.shape[0]} rows, not a multiple of the batch {B}")
            draws = theta.shape[0] // B
            q, k = q.repeat(draws, 1, 1, 1), k.repeat(draws, 1, 1, 1)
        return rotate_pairs(q, theta), rotate_pairs(k, theta)  # (R(θ_t) q_t)·(R(θ_s) k_s) = q_tᵀ M_ts k_s

    def transported_values(self, a: torch.Tensor, v: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor,
                           rows: torch.Tensor) -> torch.Tensor:
        if not self.cfg.rotate_values:
            return super().transported_values(a, v, x, tokens, rows)
        theta = self.angles(x, tokens)  # [B|1, H|1, T, P]
        back = rotate_pairs(v.to(a.dtype), -theta)  # [B, H, T, D] value of s leaves at −θ_s ...
        return rotate_pairs(a @ back, theta[:, :, rows])  # [B, H, R, D] ... and arrives at t rotated by +θ_t


class FarMassPart(nn.Module):
    """Base of far-mass parts: ``log_decay(x, tokens)`` gives per-step log f_j, ``[B, H, T]`` float32.

    ``additive`` parts (ALiBi, forget gate) add the bias b_ts = Σ_{j=s+1..t} log f_j; the others (scalable softmax)
    have no bias (``log_decay`` is 0) and scale each query row's logits by ``logit_scale(x, tokens)``.

    Declared facts (:func:`accrot.position.facts`): ``controls_far_mass``, a term on the logits that grows with the
    distance t − s (the far-mass lower bound's meaning of control: ALiBi, the forget gate); ``scales_logits``, a
    factor on a row's logits that grows with the number of keys, not with distance (scalable softmax); ``reads``,
    the options the part reads."""

    additive = True
    controls_far_mass = True
    scales_logits = False
    reads: tuple[str, ...] = ()

    def __init__(self, cfg: SchemeConfig, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.cfg, self.d_model, self.n_heads = cfg, d_model, n_heads

    def log_decay(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def logit_scale(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor | None:
        """The factor on row t's logits, ``[B|1, H, T]`` float32, or None for none (the additive parts)."""
        return None

    def decode_logit_scale(self, x: torch.Tensor, tokens: torch.Tensor, start: int) -> torch.Tensor | None:
        """:meth:`logit_scale` of the new positions ``start..start+n−1`` alone, ``[B|1, H, n]``, or None (cached
        decoding; ``log_decay`` of a position depends on its own input only, so decoding reads it as it is)."""
        return None

    def describe(self) -> dict:
        return {}

    # -- its term of the explicit attention (accrot.position.explicit) -----------------------------------------
    def logit_bias(self, x: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        """The additive bias b_ts = Σ_{j=s+1..t} log f_j of query ``rows [R]`` over every key s,
        ``[B|1, H, R, T]`` float64 (the running sum of ``log_decay`` in float64; entries s > t are meaningless), or
        None for a part that adds none (not ``additive``)."""
        if not self.additive:
            return None
        c = self.log_decay(x, tokens).double().cumsum(-1)  # [B|1, H, T] c_t = Σ_{j≤t} log f_j
        return c[:, :, rows, None] - c[:, :, None, :]  # [B|1, H, R, T] b_ts = c_t − c_s


class OutputGatePart(nn.Module):
    """Base of output gates: ``gate(x, tokens) -> [B, H, T, D]`` in (0, 1), multiplying the attention output.

    A gate can switch a head's output off, but it leaves the attention weights, and so the far mass, as they are:
    it is no far-mass control (``gates_output`` is its fact; ``reads``: the options it reads)."""

    gates_output = True
    reads: tuple[str, ...] = ()


class IncrementSource(nn.Module):
    """Base of the accumulated rotation's increment sources (``increments=...``, registered by
    :func:`~accrot.position.scheme.register_increments`): ``forward(x, tokens) -> δ [B|1, H, T, D/2]`` float32.

    Declared facts (:func:`accrot.position.facts`):

    * ``random``: δ is drawn from a known distribution (random_position, random_token);
    * ``learned``: δ is a learned function of x (learned, softplus);
    * ``drifts``: δ is non-negative by construction (softplus), a drift whose slow pairs stay coherent;
    * ``fresh_draws``: δ is drawn anew per position, so no one draw is the model's transport and its coherence is
      measured under fresh draws of the distribution (random_position: a calibration of the instrument);
    * ``reads``: the options the source reads beyond the rotation's own;
    * :meth:`regularity`: where it stands on the condition that every pair mixes;
    * ``timed_as``: another source whose cost stands for this one's in ``accrot bench`` (the same kernels and a
      projection of the same size), or None: the bench times every cell of this source itself.
    """

    random = False
    learned = False
    drifts = False
    fresh_draws = False
    reads: tuple[str, ...] = ()
    timed_as: str | None = None

    @classmethod
    def create(cls, cfg: SchemeConfig, d_model: int, n_heads: int, head_dim: int) -> IncrementSource:
        """The source of ``cfg``'s accumulated rotation (the sources that read no input override it)."""
        return cls(cfg, d_model, n_heads, head_dim)

    @classmethod
    def regularity(cls, cfg: SchemeConfig) -> str:
        """``"holds"`` (every pair mixes by construction), ``"may hold"`` (learning decides) or ``"fails"``."""
        return "holds" if cls.random else "may hold"

    def law(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(|E[e^{iδ_i}]|, E[δ_i]) per pair, ``[D/2]`` float64 each, where the distribution is known; None otherwise."""
        return None

    def prediction_basis(self) -> str:
        """How the coherence the :meth:`law` predicts relates to a measurement (:meth:`RotationPart.prediction_basis`)."""
        return "none"


def init_weights(module: nn.Module, std: float | None) -> None:
    """Every linear and convolution weight of ``module`` N(0, std), every bias 0 (as the reference models' own
    ``_init_weights``); PyTorch's default init where ``std`` is None."""
    if std is None:
        return
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv1d)):
            nn.init.normal_(layer.weight, std=std)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


def _working(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 or wider (its own dtype when wider), contiguous: the precision the explicit scores run in."""
    return t.to(torch.promote_types(t.dtype, torch.float32)).contiguous()


class DeviceConstants:
    """Small float tensors kept on the CPU in full precision (never cast by ``Module.to``) and copied once per
    device, so a forward pass on an accelerator does no host-to-device copy."""

    def __init__(self, **tensors: torch.Tensor) -> None:
        self._by_device: dict[torch.device, dict[str, torch.Tensor]] = {torch.device("cpu"): tensors}

    def on(self, device: torch.device) -> dict[str, torch.Tensor]:
        if device not in self._by_device:
            self._by_device[device] = {k: t.to(device) for k, t in self._by_device[torch.device("cpu")].items()}
        return self._by_device[device]

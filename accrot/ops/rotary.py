"""SO(2) rotations in the half-split layout: coordinate i pairs with i + D/2.

RoPE (Su et al., 2021) rotates pair i of q_t and k_t by θ_t,i = t·ω_i; accumulated rotations use
θ_t = Σ_{j≤t} δ_j instead. Either way the logit is (R(θ_t) q_t)·(R(θ_s) k_s) = q_tᵀ R(θ_s − θ_t) k_s, and with
value transport out_t = Σ_s a_ts R(θ_t − θ_s) v_s.

:func:`naive_so2_attention` is the test twin of the whole SO(2) path: it never sees absolute angles, only
the increments δ_j, and builds every M_{t,s} = R(δ_t) ⋯ R(δ_{s+1}) as a product of 2×2 matrices.
"""

from __future__ import annotations

import math

import torch

from accrot.ops import cpu_kernels, gpu_kernels

TWO_PI = 2.0 * math.pi


def rotate_pairs(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_i, x_{i+D/2}) by θ_i: (a, b) → (a cos θ − b sin θ, a sin θ + b cos θ).

    Args:
        x: ``[B, H, T, D]`` any float dtype.
        theta: ``[B|1, H|1, T, D/2]`` angles (float32 or wider; broadcast over batch / heads).
    Returns:
        ``[B, H, T, D]`` in x's dtype; the rotation itself runs in float32 or wider (float64 for float64 x).
    """
    cos, sin = cos_sin(theta, x.dtype)
    return rotate_pairs_cs(x, cos, sin)


def cos_sin(theta: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos θ, sin θ)`` in float32 or wider (float64 when θ or ``dtype``, the rotated tensors' dtype, is), to
    share one evaluation across q, k, v and the output."""
    theta = theta.to(torch.promote_types(torch.promote_types(theta.dtype, dtype), torch.float32))
    return theta.cos(), theta.sin()


def wrap_angle(theta: torch.Tensor) -> torch.Tensor:
    """θ reduced to [−π, π) (differentiable, gradient 1). Centred so that small angles stay exactly small."""
    return torch.remainder(theta + math.pi, TWO_PI) - math.pi


def rotate_pairs_cs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False,
                    theta: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`rotate_pairs` from precomputed ``cos, sin`` (``[B|1, H|1, T, D/2]``); ``inverse`` rotates by −θ
    (as passing ``-sin`` would, without the negation).

    With ``theta`` (the angles ``cos, sin`` were computed from, detached), the angle gradient goes to ``theta``
    directly, from the output: dθ = ±(y_a g_b − y_b g_a), two passes instead of d cos, d sin and the backward
    of cos/sin. The scheme uses this; without it, gradients flow through ``cos`` and ``sin``.

    One fused autograd node (:class:`_Rotate`): four multiply-adds into the two output halves forward, the
    inverse rotation of the gradient backward, and the angle gradient only when ``cos``/``sin`` need one
    (learned increments). Autograd through the elementwise formula (:func:`naive_rotate_pairs_cs`, the test
    twin) records seven nodes and a concatenation per call, which cost the rotation schemes ~5% of a tiny
    training step. On the CPU each direction is one pass of a compiled kernel (:mod:`accrot.ops.cpu_kernels`)
    instead of four to six eager ones; on CUDA, one ``torch.compile``-fused kernel (:mod:`accrot.ops.gpu_kernels`).
    """
    return rotate_pairs_many((x,), cos, sin, inverse=inverse, theta=theta)[0]


def rotate_pairs_many(xs: tuple[torch.Tensor, ...] | list[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
                      inverse: bool = False, theta: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """:func:`rotate_pairs_cs` of several tensors of one shape by the same angles (q and k), as one autograd node.

    On the CPU one kernel pass rotates them all forward (cos and sin are read once), and one pass backward gives
    every input gradient and the angle gradient already summed over the tensors (one ``[B, H, T, D/2]`` dθ
    instead of one per tensor plus their sum). Elsewhere the tensors go through the one-tensor kernels in turn.
    """
    xs = tuple(xs)
    if not xs:
        return ()
    work = torch.promote_types(torch.promote_types(xs[0].dtype, cos.dtype), torch.float32)
    outs = _Rotate.apply(cos.to(work), sin.to(work), -1.0 if inverse else 1.0, theta, *(x.to(work) for x in xs))
    return tuple(y.to(x.dtype) for x, y in zip(xs, outs))


def naive_rotate_pairs_cs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Test twin of :func:`rotate_pairs_cs`: the elementwise formula, differentiated by autograd."""
    work = torch.promote_types(torch.promote_types(x.dtype, cos.dtype), torch.float32)
    a, b = x.to(work).chunk(2, dim=-1)  # [B, H, T, D/2] each
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1).to(x.dtype)  # [B, H, T, D]


def _rotate_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 sign: float = 1.0) -> None:
    """out = [a cos − s b sin, s a sin + b cos] (s = ``sign``: +1 rotates by θ, −1 by −θ without negating
    ``sin``) written into the two halves of ``out`` (no concatenation)."""
    oa, ob = out.chunk(2, dim=-1)
    torch.mul(a, cos, out=oa)
    oa.addcmul_(b, sin, value=-sign)
    torch.mul(b, cos, out=ob)
    ob.addcmul_(a, sin, value=sign)


def _kernels(*tensors: torch.Tensor):
    """The fused kernels for these tensors (4-d, float32/float64, all on one device type), else None: the compiled
    C++ kernels for CPU tensors (:mod:`accrot.ops.cpu_kernels`, never given an accelerator tensor), their
    ``torch.compile`` fusion for CUDA tensors (:mod:`accrot.ops.gpu_kernels`)."""
    if not all(t.dim() == 4 and t.dtype in (torch.float32, torch.float64) for t in tensors):
        return None
    kinds = {t.device.type for t in tensors}
    if kinds == {"cpu"}:
        return cpu_kernels.ops()
    if kinds == {"cuda"}:
        return gpu_kernels.ops()
    return None


def _dense(t: torch.Tensor) -> bool:
    """True when ``t`` covers its storage without gaps or overlaps in some dimension order (a permuted
    contiguous tensor), so ``torch.empty_strided(t.shape, t.stride())`` is a valid fresh tensor."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _last_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


class _Rotate(torch.autograd.Function):
    """y_i = R(sθ) x_i per pair from (cos, sin ``[B|1, H|1, T, D/2]``, s = ±1, θ or None, x_1 … x_n ``[B, H, T, D]``),
    one dtype and shape.

    Backward: dx_i = R(−sθ) dy_i; with (a, b) the halves of x_i and (g_a, g_b) of dy_i, d cos = Σ_i a g_a + b g_b
    and d sin = s Σ_i (a g_b − b g_a); with ``theta`` given, dθ = s Σ_i (y_a g_b − y_b g_a) from the outputs. Each
    is summed over the dimensions the angles were broadcast along. On the CPU, the ys and (dxs, dθ) each come
    from one kernel pass over all the tensors; d cos and d sin (asked for only when a caller differentiates
    through cos/sin) stay eager.
    """

    @staticmethod
    def forward(ctx, cos, sin, sign, theta, *xs):
        kernels = _kernels(*xs, cos, sin)
        if kernels is not None and hasattr(kernels, "rotate_many"):
            outs = kernels.rotate_many([_last_contiguous(x) for x in xs], _last_contiguous(cos),
                                       _last_contiguous(sin), sign)
        elif kernels is not None:
            outs = [kernels.rotate(_last_contiguous(x), _last_contiguous(cos), _last_contiguous(sin), sign)
                    for x in xs]
        else:
            outs = []
            for x in xs:
                out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
                a, b = x.chunk(2, dim=-1)
                _rotate_into(out, a, b, cos, sin, sign)
                outs.append(out)
        want_cs = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        want_theta = theta is not None and ctx.needs_input_grad[3]
        ctx.n = len(xs)
        ctx.save_for_backward(cos, sin, *(xs if want_cs else ()), *(outs if want_theta else ()))
        ctx.want_cs, ctx.want_theta = want_cs, want_theta
        ctx.sign = sign
        ctx.theta_shape = None if theta is None else (theta.shape, theta.dtype)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        cos, sin, *rest = ctx.saved_tensors
        n = ctx.n
        xs = rest[:n] if ctx.want_cs else None
        ys = (rest[n:] if ctx.want_cs else rest) if ctx.want_theta else None
        want_dx = [ctx.needs_input_grad[4 + i] for i in range(n)]
        dxs: list[torch.Tensor | None] = [None] * n
        dcos = dsin = dtheta = None
        kernels = _kernels(*grads, cos, sin)
        if kernels is not None and hasattr(kernels, "rotate_many") and (any(want_dx) or ys is not None):
            got, dtheta = kernels.rotate_many_backward([_last_contiguous(g) for g in grads], list(ys or ()),
                                                       _last_contiguous(cos), _last_contiguous(sin), ctx.sign,
                                                       any(want_dx))
            dxs = [d if w else None for d, w in zip(got, want_dx)] if any(want_dx) else dxs
            dtheta = dtheta if ys is not None else None
        else:
            for i, grad in enumerate(grads):
                dxs[i], dth = _rotate_backward_one(kernels, grad, ys[i] if ys is not None else None, cos, sin,
                                                   ctx.sign, want_dx[i])
                if dth is not None:
                    dtheta = dth if dtheta is None else dtheta + dth
        if xs is not None:
            for x, grad in zip(xs, grads):
                a, b = x.chunk(2, dim=-1)
                ga, gb = grad.chunk(2, dim=-1)
                if ctx.needs_input_grad[0]:
                    dc = torch.addcmul(a * ga, b, gb).sum_to_size(cos.shape)
                    dcos = dc if dcos is None else dcos + dc
                if ctx.needs_input_grad[1]:
                    ds = torch.addcmul(a * gb, b, ga, value=-1.0)
                    ds = (ds if ctx.sign > 0 else -ds).sum_to_size(sin.shape)
                    dsin = ds if dsin is None else dsin + ds
        if dtheta is not None:
            shape, dtype = ctx.theta_shape
            dtheta = dtheta.sum_to_size(shape).to(dtype)
        return dcos, dsin, None, dtheta, *dxs


def _rotate_backward_one(kernels, grad: torch.Tensor, y: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                         sign: float, want_dx: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(dx, dθ)`` of one rotated tensor: the one-tensor kernels (CUDA) or the eager formulas; None where not asked
    for (dθ is asked for by passing the output ``y``)."""
    if kernels is not None and (want_dx or y is not None):
        dx, dth = kernels.rotate_backward(_last_contiguous(grad), y, _last_contiguous(cos), _last_contiguous(sin),
                                          sign, want_dx)
        return (dx if want_dx else None), (dth if y is not None else None)
    dx = dth = None
    ga, gb = grad.chunk(2, dim=-1)
    if want_dx:
        dx = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
        _rotate_into(dx, ga, gb, cos, sin, -sign)  # R(−sθ) dy
    if y is not None:
        ya, yb = y.chunk(2, dim=-1)
        dth = torch.addcmul(ya * gb, yb, ga, value=-1.0)
        dth = dth if sign > 0 else -dth
    return dx, dth


def accumulate_angles(delta: torch.Tensor, offset: torch.Tensor | None = None) -> torch.Tensor:
    """θ_t = offset + Σ_{j≤t} δ_j (inclusive), accumulated in float64 and wrapped to [−π, π), as float32.

    Args:
        delta: ``[..., T, P]`` increments (any float dtype).
        offset: ``[..., 1, P]`` angle carried in from earlier positions (float64 keeps chunked sums exact).
    Returns:
        ``[..., T, P]`` float32; differentiable w.r.t. delta and offset (the wrap has gradient 1).

    One autograd node (:class:`_AccumulateWrap`): the float64 sum and the wrap run in place (on the CPU, one
    kernel pass), and the backward pass is a reverse cumulative sum of the gradient.
    :func:`naive_accumulate_angles` (the same formula through autograd, five nodes and their float64
    copies) is its test twin.
    """
    return _AccumulateWrap.apply(delta, offset)


def accumulate_drawn(z: torch.Tensor, mean: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """θ of drawn increments δ = mean + sigma·z: ``accumulate_angles((mean + sigma * z).to(float32))`` to the bit,
    without a gradient (``z [B, H, T, P]`` float32, ``mean, sigma [P]`` float64). On the CPU one kernel pass: the
    map, the float32 rounding, the float64 sum and the wrap, where the eager form makes float64 temporaries of
    the whole draw in three passes before the sum."""
    kernels = _kernels(z) if z.device.type == "cpu" and z.dtype == torch.float32 else None
    if kernels is not None:
        return kernels.accumulate_drawn(z, mean, sigma)
    return accumulate_angles((mean + sigma * z).to(torch.float32))


def naive_accumulate_angles(delta: torch.Tensor, offset: torch.Tensor | None = None) -> torch.Tensor:
    """Test twin of :func:`accumulate_angles`, differentiated by autograd."""
    theta = delta.to(torch.float64).cumsum(dim=-2)  # [..., T, P]
    if offset is not None:
        theta = theta + offset.to(torch.float64)
    return wrap_angle(theta).to(torch.float32)


def _wrapped_cumsum(delta: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    """The forward of :class:`_AccumulateWrap`: one kernel pass where there is one, else the eager formula."""
    kernels = _kernels(delta)
    if kernels is not None and (offset is None or torch.broadcast_shapes(offset.shape, delta.shape) == delta.shape):
        return kernels.accumulate_wrap(delta, offset)  # [..., T, P] float32, one pass
    theta = delta.to(torch.float64).cumsum(dim=-2)  # [..., T, P] a fresh float64 buffer
    if offset is not None:
        theta = theta + offset.to(torch.float64)
    return theta.add_(math.pi).remainder_(TWO_PI).sub_(math.pi).to(torch.float32)


class _AccumulateWrap(torch.autograd.Function):
    """forward: float64 cumsum (+ offset), wrapped to [−π, π) in place, cast to float32.
    backward: d delta_j = Σ_{t≥j} dθ_t; d offset = Σ_t dθ_t (over the dimensions it was broadcast along)."""

    @staticmethod
    def forward(ctx, delta, offset):
        theta = _wrapped_cumsum(delta, offset)
        ctx.delta_dtype = delta.dtype
        ctx.delta_strides = delta.stride() if _dense(delta) else None
        ctx.offset_shape = None if offset is None else (offset.shape, offset.dtype)
        return theta

    @staticmethod
    def backward(ctx, grad):
        d_delta = d_offset = None
        if ctx.needs_input_grad[0]:
            kernels = _kernels(grad)
            if kernels is not None:  # in delta's own layout: the increments' backward then needs no copy
                strides = ctx.delta_strides if ctx.delta_strides and ctx.delta_strides[-1] == 1 else None
                suffix = kernels.suffix_sum(grad, strides)
            else:
                suffix = grad.flip(-2).cumsum(-2).flip(-2)
            d_delta = suffix.to(ctx.delta_dtype)  # suffix sums
        if ctx.offset_shape is not None and ctx.needs_input_grad[1]:
            shape, dtype = ctx.offset_shape
            d_offset = grad.sum(-2, keepdim=True).sum_to_size(shape).to(dtype)
        return d_delta, d_offset


def accumulate_bounded(u: torch.Tensor, scale: torch.Tensor, mean: torch.Tensor | None = None,
                       extra: torch.Tensor | None = None) -> torch.Tensor:
    """θ = :func:`accumulate_angles` of δ = scale · tanh(u) (+ mean) (+ extra): learned increments' angles in one node.

    Args:
        u: ``[B, H, T, P]`` float32 pre-activations (any strides; the projection's ``[B, T, H, P]`` view).
        scale, mean: ``[P]`` float32 (max_increment · ladder; the increments' mean, or None for zero).
        extra: ``[B|1, H, T, P]`` float32 increments added without a gradient (a mixing floor's draw), or None.
    Returns:
        ``[B, H, T, P]`` float32 angles; differentiable w.r.t. u only.

    On the CPU (:class:`_AccumulateBounded`) torch's vectorised tanh is the one extra pass forward: the scale, the
    shifts, the float64 running sum and the wrap are one kernel pass, and the backward pass is one more (the
    suffix sums times scale·(1 − tanh²)), in u's layout. Eager, it is the autograd formula of
    :func:`naive_accumulate_bounded`, its test twin.
    """
    return _AccumulateBounded.apply(u, scale, mean, extra)


def naive_accumulate_bounded(u: torch.Tensor, scale: torch.Tensor, mean: torch.Tensor | None = None,
                             extra: torch.Tensor | None = None) -> torch.Tensor:
    """Test twin of :func:`accumulate_bounded`: δ rounded to float32 step by step, then
    :func:`naive_accumulate_angles`."""
    delta = torch.tanh(u) * scale
    if mean is not None:
        delta = delta + mean
    if extra is not None:
        delta = delta + extra.detach()
    return naive_accumulate_angles(delta)


class _AccumulateBounded(torch.autograd.Function):
    """forward: t = tanh(u); θ = wrap(cumsum(scale·t + mean + extra)) (one kernel pass on the CPU).
    backward: du = scale · (1 − t²) · suffix sums of dθ."""

    @staticmethod
    def forward(ctx, u, scale, mean, extra):
        t = torch.tanh(u)  # [B, H, T, P] in u's layout
        kernels = _kernels(t)
        if kernels is not None and hasattr(kernels, "accumulate_bounded") and t.dtype == torch.float32 \
                and t.stride(-1) == 1 and (extra is None or extra.dim() == 4):
            theta = kernels.accumulate_bounded(t, scale, mean, extra)
            ctx.fused = True
        else:
            delta = t * scale
            if mean is not None:
                delta = delta + mean
            if extra is not None:
                delta = delta + extra
            theta = _wrapped_cumsum(delta, None)
            ctx.fused = False
        ctx.save_for_backward(t, scale)
        return theta

    @staticmethod
    def backward(ctx, grad):
        t, scale = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        kernels = _kernels(grad, t)
        if ctx.fused and kernels is not None:
            du = kernels.accumulate_bounded_backward(grad, t, scale)
        else:
            suffix = grad.flip(-2).cumsum(-2).flip(-2) if kernels is None else kernels.suffix_sum(grad, None)
            du = suffix.to(t.dtype) * (scale * (1.0 - t * t))
        return du, None, None, None


def naive_so2_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    increments: torch.Tensor | None = None,
    log_decay: torch.Tensor | None = None,
    rotate_values: bool = False,
) -> torch.Tensor:
    """Test twin of SO(2) attention, from the increments alone, by explicit 2×2 path products. O(T²) steps.

    For each query t it walks s = t, t−1, ..., 0 keeping M_{t,s} = R(δ_t) ⋯ R(δ_{s+1}) (per pair, as 2×2 matrices)
    and b_ts = Σ_{j=s+1..t} log f_j, then

        ℓ_ts = D^−1/2 q_tᵀ M_{t,s}ᵀ k_s + b_ts      ( = (R(θ_t) q_t)·(R(θ_s) k_s) )
        out_t = Σ_s softmax_s(ℓ_ts) · (M_{t,s} v_s if rotate_values else v_s).

    Args:
        q, k, v: ``[B, H, T, D]`` with pair i = (i, i + D/2).
        increments: ``[B|1, H, T, D/2]`` δ_j (δ_0 never enters a path), or None (no rotation).
        log_decay: ``[B|1, H, T]`` log f_j, or None.
        rotate_values: transport values along the path too.
    Returns:
        ``[B, H, T, D]`` in float64.
    """
    B, H, T, D = q.shape
    P = D // 2
    q2, k2, v2 = (z.to(torch.float64).unflatten(-1, (2, P)).transpose(-1, -2) for z in (q, k, v))  # [B, H, T, P, 2]
    if increments is not None:
        d = increments.to(torch.float64)
        c, s_ = d.cos(), d.sin()
        G = torch.stack((torch.stack((c, -s_), -1), torch.stack((s_, c), -1)), -2)  # [B|1, H, T, P, 2, 2] R(δ_j)
    eye = torch.eye(2, dtype=torch.float64, device=q.device)
    outs = []
    for t in range(T):
        M = eye.expand(B, H, P, 2, 2)  # M_{t,t} = I
        bias = q.new_zeros(B, H, dtype=torch.float64)
        logits, values = [], []
        for s in range(t, -1, -1):
            if s < t:
                if increments is not None:
                    M = M @ G[:, :, s + 1]  # M_{t,s} = M_{t,s+1} R(δ_{s+1})
                if log_decay is not None:
                    bias = bias + log_decay[:, :, s + 1].to(torch.float64)
            k_ts = (M.transpose(-1, -2) @ k2[:, :, s].unsqueeze(-1)).squeeze(-1)  # [B, H, P, 2]  M_{t,s}ᵀ k_s
            logits.append((q2[:, :, t] * k_ts).sum((-1, -2)) * D**-0.5 + bias)  # [B, H]
            v_ts = (M @ v2[:, :, s].unsqueeze(-1)).squeeze(-1) if rotate_values else v2[:, :, s]  # [B, H, P, 2]
            values.append(v_ts)
        a = torch.stack(logits, -1).softmax(-1)  # [B, H, t+1]
        out = (a[..., None, None] * torch.stack(values, 2)).sum(2)  # [B, H, P, 2]
        outs.append(out.transpose(-1, -2).flatten(-2))  # [B, H, D]
    return torch.stack(outs, 2)  # [B, H, T, D]


def rope_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """ω_i = base^(−i/(D/2)) for i = 0..D/2−1, ``[D/2]`` float64 (ω_0 = 1)."""
    P = head_dim // 2
    return float(base) ** (-torch.arange(P, dtype=torch.float64) / P)

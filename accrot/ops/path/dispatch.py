"""The public entry point, :func:`path_attention`: it checks its arguments and picks the implementation (fla's
kernel, the recurrence, on the CPU the key walk or at long evaluations the grouped walk, elsewhere the block
walk)."""

from __future__ import annotations

import math
from typing import Literal

import torch

from accrot.ops.attention import _CPU_BWD, _CPU_FWD  # ATen's fused CPU flash attention and its backward
from accrot.ops.path.block_walk import _path_chunked
from accrot.ops.path.chunk import _core_operands
from accrot.ops.path.common import _check_inputs, _unblock
from accrot.ops.path.eval_walk import _eval_levels, _grouped_walk
from accrot.ops.path.fla import _path_fla
from accrot.ops.path.key_walk import _PathWalk, _walk_forward
from accrot.ops.path.naive import naive_path_attention_recurrence

Kernel = Literal["chunked", "recurrent", "fla"]
KERNELS: tuple[str, ...] = ("chunked", "recurrent", "fla")


def path_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    chunk_size: int = 32,
    kernel: Kernel = "chunked",
    scale: float | None = None,
) -> torch.Tensor:
    """Causal PaTH attention (optionally PaTH-FoX), ``[B, H, T, Dv]`` in q's dtype.

    Args:
        q, k: ``[B, H, T, D]``; v: ``[B, H, T, Dv]``.
        w: ``[B, H, T, D]`` unit rows; beta: ``[B, H, T]`` in [0, 2] (H_j = I − β_j w_j w_jᵀ).
        log_decay: ``[B|1, H, T]`` per-step log f_j ≤ 0 or None; b_ts = Σ_{j=s+1..t} log f_j is added to the
            logit after the D^−1/2 scaling.
        chunk_size: chunk length c of the chunked kernel (any positive int; c ≥ T means one chunk).
        kernel: ``"chunked"`` (default), ``"recurrent"`` (the naive recurrence, for debugging) or ``"fla"``
            (fla's Triton kernel: CUDA tensors, Triton and the pinned ``fla`` of the ``gpu`` extra needed; what is
            missing is one :class:`~accrot.errors.ConfigError` line, :func:`fla_problem`).
        scale: logit scale, default D^−1/2.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} is not valid; choose one of {', '.join(map(repr, KERNELS))}")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} is not valid; it must be a positive integer")
    _check_inputs(q, k, v, w, beta, log_decay)
    B, H, T, D = q.shape
    scale = D**-0.5 if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale={scale!r} is not valid; it must be finite")
    if T == 0:
        return q.new_zeros(B, H, 0, v.shape[-1])
    with torch.autocast(device_type=q.device.type, enabled=False):  # Householder math stays ≥ float32
        if kernel == "fla":
            return _path_fla(q, k, v, w, beta, log_decay, scale)
        if kernel == "recurrent":
            return naive_path_attention_recurrence(q, k, v, w, beta, log_decay, scale=scale)
        if _flash_walk_applies(q, k, v, w, beta, log_decay):
            return _path_walk(q, k, v, w, beta, log_decay, chunk_size, scale)
        return _path_chunked(q, k, v, w, beta, log_decay, chunk_size, scale)


def _path_walk(q, k, v, w, beta, log_decay, chunk_size: int, scale: float) -> torch.Tensor:
    """The chunked kernel on the CPU: the UT transform and diagonal blocks (:class:`_ChunkCore`), every block pair
    by the key walk (:func:`_walk_forward`, with :class:`_PathWalk`'s backward when a gradient is needed), both
    with hand-written backwards; the in-chunk bias and the blocking stay with autograd. Without a gradient, at the
    lengths of :func:`_eval_levels`, the walk on several levels of :func:`_grouped_walk`."""
    B, H, T, D = q.shape
    grad = _needs_grad(q, k, v, w, beta, log_decay)
    levels = () if grad else _eval_levels(T, min(chunk_size, T))
    if levels:
        return _grouped_walk(q, k, v, w, beta, log_decay, chunk_size, scale, levels)
    _, _, _, (s_diag, q_start, k_end, Pt, vb), (G, R, a) = _core_operands(q, k, v, w, beta, log_decay, chunk_size,
                                                                          scale)
    split = (G, None, None) if a is None else (G, R.detach(), a.detach())  # G alone carries the bias's gradient
    if grad:
        out = _PathWalk.apply(q_start, k_end, Pt, s_diag, vb, *split)
    else:
        out = _walk_forward(q_start, k_end, Pt, s_diag, vb, *split)[0]
    return _unblock(out, B, H, T).to(q.dtype)


def _flash_walk_applies(*tensors: torch.Tensor | None) -> bool:
    """The key walk (forward and backward by ATen's fused CPU flash ops) serves CPU tensors where both ops exist."""
    return (_CPU_FWD is not None and _CPU_BWD is not None
            and all(t.device.type == "cpu" for t in tensors if t is not None))


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)

"""The bridge to fla's Triton PaTH kernel (``kernel="fla"``, CUDA only): whether it can run, as one line
(:func:`fla_problem`), and the call in fla's layout and dtypes."""

from __future__ import annotations

import torch

from accrot.errors import ConfigError

FLA_HEAD_DIMS = (16, 32, 64)  # what fla's PaTH kernels support
FLA_INSTALL = "pip install -e '.[gpu]'"


def fla_problem(device: torch.device | str | None = None) -> str | None:
    """Why ``kernel='fla'`` cannot run (on ``device``, when given), as one line; None when it can.

    Checked in order: a CUDA device, Triton, then fla's PaTH kernel itself (``find_spec`` first, so a missing
    package never costs an import)."""
    import importlib.util

    if device is not None and torch.device(device).type != "cuda":
        return (f"kernel='fla' needs CUDA tensors (got device {torch.device(device).type!r}); use "
                "kernel='chunked' on the CPU")
    if importlib.util.find_spec("triton") is None:
        return (f"kernel='fla' needs Triton, which is not installed (it comes with torch's CUDA wheels and with "
                f"{FLA_INSTALL}); use kernel='chunked'")
    if importlib.util.find_spec("fla") is None:
        return (f"kernel='fla' needs the optional flash-linear-attention package, which is not installed "
                f"({FLA_INSTALL}); use kernel='chunked'")
    try:
        from fla.ops.path_attn.parallel import parallel_path_attention  # noqa: F401
    except Exception as err:  # noqa: BLE001 - an fla that does not import (Triton too old or too new) is the reason
        text = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        return (f"kernel='fla' could not import fla's PaTH kernel ({type(err).__name__}: {text}); install the "
                f"pinned version ({FLA_INSTALL}) or use kernel='chunked'")
    return None


def _path_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    log_decay: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """fla's Triton PaTH (``parallel_path_attention``, ``[B, T, H, D]`` layout): q, k, v and w in q's dtype (its
    matmuls want one dtype), β and the gate in float32 (β near 0 and near 2 must not round: H_j is a reflection
    at exactly 2)."""
    problem = fla_problem(q.device)
    if problem is not None:
        raise ConfigError(problem)
    D, Dv = q.shape[-1], v.shape[-1]
    if D not in FLA_HEAD_DIMS or Dv not in FLA_HEAD_DIMS:
        got = f"{D}" if D == Dv else f"{D} for q, k and {Dv} for v"
        raise ConfigError(f"kernel='fla' supports head dims {', '.join(map(str, FLA_HEAD_DIMS))} (got {got}); change "
                          "d_model / n_heads or use kernel='chunked'")
    from fla.ops.path_attn.parallel import parallel_path_attention

    B = q.shape[0]
    g = None
    if log_decay is not None:
        # fla adds its gate before multiplying by the softmax scale; ours is added after, so pre-divide.
        g = (log_decay.float().expand(B, -1, -1) / scale).transpose(1, 2).contiguous()  # [B, T, H] float32
    o, _ = parallel_path_attention(
        q=q.transpose(1, 2),  # fla is [B, T, H, D]
        k=k.to(q.dtype).transpose(1, 2),
        v=v.to(q.dtype).transpose(1, 2),
        w=w.to(q.dtype).transpose(1, 2),
        beta=beta.float().transpose(1, 2),  # [B, T, H] float32
        g=g,
        scale=scale,
    )
    return o.transpose(1, 2).to(q.dtype)  # [B, H, T, Dv]

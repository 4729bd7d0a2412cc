"""PaTH against its public peer (``accrot bench path``): fla's own PyTorch reference, ``naive_path_attn``.

``fla/ops/path_attn/naive.py`` of flash-linear-attention is the only other CPU implementation of PaTH: a chunked UT
transform like ours, but a Python loop over every (query chunk, key chunk) pair that fills a dense ``[T, T]``
score matrix, then one softmax. The fla package itself imports Triton, so the bench installs the pinned release
into a folder of its own (``pip install --no-deps --target``, once, into a temporary folder renamed into place, so
an interrupted install leaves nothing half-written) and loads that one file by path, with einops from the same
folder. Where it cannot be installed (no package index) the peer is skipped with a one-line reason.

Both kernels see the same inputs (fla's ``[B, T, H, D]`` layout is a transpose of ours; no forget gate: fla's
``g`` is zeros), are checked to agree at the shortest length, and are timed alternately; the peak of live tensors
per call comes from the profiler's allocation events (:func:`accrot.bench.memory._live_tensor_peak`). NoPE's fused
attention on the same shapes is timed beside them: it is the floor no PaTH kernel can go under, so it bounds
the speed-up any kernel can show against the peer (``peer_over_nope``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

PEER_PACKAGES = ("flash-linear-attention==0.6.0", "fla-core==0.6.0", "einops==0.8.2")
PEER_FILE = "fla/ops/path_attn/naive.py"
PEER_NAME = "fla 0.6.0 naive_path_attn (fla/ops/path_attn/naive.py)"


def peer_directory() -> Path:
    """Where the peer is installed: ``ACCROT_PEER_DIR``, else ``<venv>/accrot-peers/fla-0.6.0``."""
    return Path(os.environ.get("ACCROT_PEER_DIR") or Path(sys.prefix) / "accrot-peers" / "fla-0.6.0")


def _install(folder: Path) -> str | None:
    """pip-install the peer into ``folder`` (atomically); None on success, else the one-line reason."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".installing-", dir=folder.parent))
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                               "--no-deps", "--target", str(staging), *PEER_PACKAGES],
                              capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0 or not (staging / PEER_FILE).exists():
            lines = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
            return (lines[-1] if lines else f"pip exited with status {done.returncode}")[:200]
        staging.rename(folder)
        return None
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{type(err).__name__}: {err}"[:200]
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_peer(log=print) -> tuple[Callable | None, str]:
    """``(naive_path_attn, what it is)``, installing it first if needed, or ``(None, why it is skipped)``."""
    folder = peer_directory()
    if not (folder / PEER_FILE).exists():
        log(f"path: installing the peer ({', '.join(PEER_PACKAGES)}) into {folder}")
        problem = _install(folder)
        if problem is not None:
            return None, f"peer skipped: {' '.join(PEER_PACKAGES)} could not be installed ({problem})"
    try:
        if str(folder) not in sys.path:
            sys.path.append(str(folder))  # einops; appended, so the venv's own packages still win
        spec = importlib.util.spec_from_file_location("accrot_bench_fla_naive", folder / PEER_FILE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.naive_path_attn, PEER_NAME
    except Exception as err:  # noqa: BLE001 - a broken install is a reason to skip, not to crash the bench
        return None, f"peer skipped: {folder / PEER_FILE} does not load ({type(err).__name__}: {str(err)[:150]})"


def _inputs(B: int, H: int, T: int, D: int, seed: int, grad: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed + T)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))  # [B, H, T, D]
    w = F.normalize(torch.randn(B, H, T, D, generator=g), dim=-1)
    beta = 2 * torch.rand(B, H, T, generator=g)  # [B, H, T]
    return [x.requires_grad_(grad) for x in (q, k, v, w, beta)]


PEER_CHUNK = 64  # naive_path_attn's own default chunk_size: the peer as its authors ship it


def _calls(peer: Callable, ins: list[torch.Tensor], chunk: int) -> dict[str, Callable[[], torch.Tensor]]:
    """One zero-argument call per kernel, each returning ``[B, H, T, D]`` (the peer's output transposed back).
    ``chunk`` is accrot's chunk length; the peer runs at its own default, :data:`PEER_CHUNK`."""
    from accrot.ops.path import path_attention

    q, k, v, w, beta = ins
    B, H, T, D = q.shape

    def fla() -> torch.Tensor:
        bt = [x.transpose(1, 2) for x in (q, k, v, w)]  # [B, T, H, D]: fla's layout (views, as a caller would pass)
        out = peer(*bt, beta.transpose(1, 2), q.new_zeros(B, T, H), D**-0.5, chunk_size=PEER_CHUNK)
        return out.transpose(1, 2)

    return {"accrot": lambda: path_attention(q, k, v, w, beta, chunk_size=chunk),
            "fla": fla,
            "nope": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)}


def _run(call: Callable[[], torch.Tensor], ins: list[torch.Tensor], backward: bool) -> float:
    for x in ins:
        x.grad = None
    t0 = time.perf_counter()
    if backward:
        call().sum().backward()
    else:
        with torch.no_grad():
            call()
    return time.perf_counter() - t0


def _measure(calls: dict[str, Callable[[], torch.Tensor]], ins: list[torch.Tensor], backward: bool, repeats: int,
             n_peer: int) -> dict[str, Any]:
    """Median seconds per kernel (after one warm-up call each, alternating) and peak live-tensor MiB of each PaTH."""
    from accrot.bench.memory import _live_tensor_peak

    for name in calls:  # warm-up
        _run(calls[name], ins, backward)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(repeats):  # alternate, so a slow phase of the machine hits every kernel alike
        for name in calls:
            if name != "fla" or i < n_peer:
                times[name].append(_run(calls[name], ins, backward))
    row: dict[str, Any] = {f"{name}_s": statistics.median(times[name]) for name in calls}
    row["speedup"] = row["fla_s"] / row["accrot_s"]
    row["peer_over_nope"] = row["fla_s"] / row["nope_s"]  # the most any kernel could show

    def once(call: Callable[[], torch.Tensor]) -> None:
        with torch.set_grad_enabled(backward):
            out = call()
            if backward:
                out.sum().backward()

    for name in ("accrot", "fla"):
        peak = _live_tensor_peak(lambda call=calls[name]: once(call))
        row[f"{name}_peak_mib"] = None if peak is None else peak / 2**20
    return row


def _growth(rows: list[dict[str, Any]]) -> None:
    """Each row's memory growth against the shortest length of its mode."""
    for mode in ("fwd", "fwd+bwd"):
        mine = [r for r in rows if r["mode"] == mode]
        for r in mine:
            r["length_ratio"] = r["T"] / mine[0]["T"]
            for name in ("accrot", "fla"):
                base, value = mine[0][f"{name}_peak_mib"], r[f"{name}_peak_mib"]
                r[f"{name}_mem_growth"] = None if not base or value is None else value / base


def bench_peer(lengths: Sequence[int], backward_lengths: Sequence[int], B: int, H: int, D: int, chunk: int,
               log=print, seed: int = 0, repeats: int = 3, peer_repeats_from: int = 16384) -> dict[str, Any]:
    """accrot's chunked PaTH against fla's ``naive_path_attn``: time and peak live-tensor memory per (T, mode),
    and NoPE's time beside them. Returns ``{"peer", "rows"}`` (``rows`` empty when the peer is skipped)."""
    peer, what = load_peer(log)
    if peer is None:
        log(f"path: {what}")
        return {"peer": what, "rows": []}
    rows = []
    for T, mode in [(T, "fwd") for T in lengths] + [(T, "fwd+bwd") for T in backward_lengths]:
        backward = mode == "fwd+bwd"
        ins = _inputs(B, H, T, D, seed, backward)
        calls = _calls(peer, ins, chunk)
        log(f"path vs peer: T {T} {mode}")
        row: dict[str, Any] = {"T": T, "mode": mode}
        if T == min(lengths) and not backward:  # the two compute one function
            with torch.no_grad():
                row["max_abs_diff"] = float((calls["accrot"]() - calls["fla"]()).abs().max())
        # the peer's median too: one sample of it moved its ratio to NoPE from 25.8 to 30.2 between two runs at
        # 8192 (2.5 s a call, so three cost 5 s more); only from 16384 (10 s and 12 GB a call) one sample
        n_peer = 1 if T >= peer_repeats_from or (backward and T > 2048) else repeats
        row["peer_samples"] = n_peer
        row.update(_measure(calls, ins, backward, repeats, n_peer))
        rows.append(row)
    _growth(rows)
    return {"peer": what, "rows": rows}

"""The bridge to fla's PaTH kernel on the CPU, where the Triton kernel cannot run: fla's own wrapper
(``parallel_path_attn``, its dtype, head-dim and layout asserts) is called with its Triton autograd function
replaced by fla's PyTorch reference ``naive_path_attn``, so the bridge's arguments — the layout, w and β in float32,
the gate divided by the scale — go through fla's own code and are compared with the chunked PaTH(-FoX); and fla is
imported under the suite's own warning filters (warnings are errors), where an fla that works must be found
usable and one that does not must be named, never turned into a skip.

Without fla-core installed the tests that need it skip with one reason line (tests/helpers/fla.py); the ones
that build a stand-in fla package run everywhere.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import textwrap

import pytest
import torch

from accrot.errors import ConfigError
from accrot.ops.path import fla as bridge
from accrot.ops.path import path_attention
from tests.helpers import fla as fla_helpers
from tests.helpers.fla import needs_fla
from tests.ops.test_path import assert_match, make_inputs, outputs_and_grads

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py


# -- a stand-in fla package: how the bridge treats an fla that warns, or fails, while it imports -------------------
@pytest.fixture
def stand_in_fla(tmp_path, monkeypatch):
    """Write a package named ``fla`` whose ``fla/ops/__init__.py`` runs ``ops_init`` (what the real one does at
    import: warn about parts accrot does not use, or fail) and put it first on the path, with Triton reported as
    installed; the real fla, if any, is out of sys.modules for the test and back after it."""
    saved = {name: mod for name, mod in sys.modules.items() if name == "fla" or name.startswith("fla.")}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "triton" else real_find_spec(name, *a))

    def write(ops_init: str) -> None:
        files = {"fla/__init__.py": "", "fla/ops/__init__.py": ops_init, "fla/ops/path_attn/__init__.py": "",
                 "fla/ops/path_attn/parallel.py": "def parallel_path_attention(**kwargs):\n    raise NotImplementedError\n"}
        for rel, text in files.items():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(textwrap.dedent(text))
        monkeypatch.syspath_prepend(str(tmp_path))
        importlib.invalidate_caches()

    yield write
    for name in [n for n in sys.modules if n == "fla" or n.startswith("fla.")]:
        del sys.modules[name]  # the stand-in's modules; monkeypatch puts the real ones back


# what fla 0.6.0 prints while it imports, on a GPU node without flash-attn and on a machine without a GPU
FLA_NOTICES = """
    import warnings
    warnings.warn("Flash Attention is not installed. Please install it via `pip install flash-attn`", ImportWarning)
    warnings.warn("Triton is not supported on current platform, roll back to CPU.", UserWarning)
"""


@pytest.mark.filterwarnings("error")
def test_an_fla_that_warns_while_importing_is_usable_under_warnings_as_errors(stand_in_fla):
    """fla's import-time notices about its NSA kernels and its CPU fallback do not make a working fla unusable
    where warnings are errors (this suite): fla_problem finds nothing wrong."""
    stand_in_fla(FLA_NOTICES)
    assert bridge.fla_problem("cuda") is None


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("ops_init, error", [
    ("raise ImportError('triton 9.0 is not supported')", "ImportError: triton 9.0 is not supported"),
    (FLA_NOTICES + "    warnings.warn('some other notice', DeprecationWarning)\n", "DeprecationWarning: some other"),
], ids=["import-error", "other-warning"])
def test_an_fla_that_does_not_import_is_named_and_its_tests_fail(stand_in_fla, ops_init, error):
    """An installed fla that does not import is one line naming the error (only fla's three known notices are
    ignored), and the fla tests' skip condition does not fire for it: they run, and fail."""
    stand_in_fla(ops_init)
    problem = bridge.fla_problem("cuda")
    assert problem is not None and "\n" not in problem
    assert problem.startswith("kernel='fla' could not import fla's PaTH kernel") and error in problem
    assert fla_helpers.fla_missing() is None  # installed: not a skip


def test_only_a_missing_fla_skips_its_tests_and_never_under_ci(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fla" else real_find_spec(name, *a))
    monkeypatch.delenv("CI", raising=False)
    reason = fla_helpers.fla_missing()
    assert reason is not None and "\n" not in reason and bridge.FLA_PACKAGE in reason and ".[gpu]" in reason
    monkeypatch.setenv("CI", "true")  # CI installs fla: there a missing one must fail its tests, not skip them
    assert fla_helpers.fla_missing() is None


# -- the real fla, its Triton kernel replaced by its own reference ---------------------------------------------------
@needs_fla
@pytest.mark.filterwarnings("error")
def test_installed_fla_imports_under_the_suites_warning_filters():
    """The installed fla is usable under warnings-as-errors (fla_problem checks everything but the device)."""
    assert bridge.fla_problem("cuda") is None


@pytest.fixture
def fla_reference_kernel(monkeypatch) -> list[dict]:
    """fla's ``parallel_path_attn`` with its Triton autograd function replaced by fla's ``naive_path_attn`` (same
    arguments; differentiable by autograd), and the bridge's device check passed: the wrapper's own asserts run on
    CPU tensors. Returns the list of the arguments each call gave the kernel."""
    parallel = bridge.import_fla_path()
    from fla.ops.path_attn.naive import naive_path_attn

    calls: list[dict] = []

    class ReferenceKernel:
        @staticmethod
        def apply(q, k, v, w, beta, g, scale, cu_seqlens, use_cache):
            calls.append(dict(q=q, k=k, v=v, w=w, beta=beta, g=g, scale=scale))
            gate = torch.zeros(q.shape[:3], dtype=torch.float32) if g is None else g  # [B, T, H]
            return naive_path_attn(q, k, v, w, beta, gate, scale), None

    monkeypatch.setattr(parallel, "ParallelPATHAttentionFunction", ReferenceKernel)
    monkeypatch.setattr(bridge, "fla_problem", lambda device=None: None)
    return calls


# (B, H, T, D, fox, dtype): T = 1, T not a multiple of fla's 64-token chunk, head dim 128; bf16 as in training
FLA_CASES = [(1, 1, 1, 16, True, torch.float32), (2, 2, 100, 32, True, torch.float32),
             (2, 2, 100, 32, False, torch.float32), (1, 2, 64, 128, True, torch.float32),
             (2, 2, 70, 16, True, torch.bfloat16), (1, 2, 70, 32, False, torch.bfloat16)]
FLA_RTOL_REFERENCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}  # fla's reference runs in float32; bf16 rounds its output


@needs_fla
@pytest.mark.parametrize("B, H, T, D, fox, dtype", [
    pytest.param(*c, id=f"B{c[0]}-H{c[1]}-T{c[2]}-D{c[3]}{'-fox' if c[4] else ''}-{str(c[5])[6:]}") for c in FLA_CASES])
def test_bridge_through_fla_reference_matches_chunked(B, H, T, D, fox, dtype, fla_reference_kernel):
    """kernel='fla' with q, k, v in ``dtype`` and w, β, the gate in float32 (as the scheme makes them) passes fla's
    asserts, and through fla's reference gives the chunked kernel's output and gradients on the same values."""
    inputs = {k: v.float() for k, v in make_inputs(B, H, T, D, beta="uniform", fox=fox, seed=7).items()}
    low = {k: (v.to(dtype) if k in ("q", "k", "v") else v) for k, v in inputs.items()}
    fast = outputs_and_grads(path_attention, low, kernel="fla")
    same = {k: v.float() for k, v in low.items()}  # the chunked kernel on the values fla saw
    ref = outputs_and_grads(path_attention, same, chunk_size=16)
    assert_match(ref, fast, FLA_RTOL_REFERENCE[dtype])
    call = fla_reference_kernel[-1]
    assert call["w"].dtype == call["beta"].dtype == torch.float32 and call["q"].dtype == dtype
    assert call["q"].shape == (B, T, H, D) and call["beta"].shape == (B, T, H)
    assert (call["g"] is None) == (not fox) and (call["g"] is None or call["g"].dtype == torch.float32)


@needs_fla
def test_bridge_refuses_what_fla_cannot_run_before_calling_it(fla_reference_kernel):
    with pytest.raises(ConfigError, match=r"supports head dims 16, 32, 64, 128 \(got 256\)"):
        path_attention(**make_inputs(1, 1, 8, 256), kernel="fla")
    assert not fla_reference_kernel


# -- the bounds the GPU comparison uses, against fla's arithmetic simulated on the CPU ------------------------------
def tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32's 10-bit mantissa (round to nearest on the dropped 13 bits; exponent kept)."""
    if t.dtype != torch.float32:
        return t
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


class TF32Dots(torch.overrides.TorchFunctionMode):
    """Every float32 matrix product made from Python inside the mode takes TF32-rounded operands, as a tensor core
    does with fla's float32 dots."""

    DOTS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.bmm,
            torch.mm, torch.einsum, torch.baddbmm}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.DOTS:
            args = tuple(tf32(a) if isinstance(a, torch.Tensor) else
                         [tf32(x) if isinstance(x, torch.Tensor) else x for x in a] if isinstance(a, (list, tuple))
                         else a for a in args)
        return func(*args, **(kwargs or {}))


def fla_arithmetic(q, k, v, w, beta, log_decay=None, gate_scale: float = 1.0):
    """The chunked kernel with fla's roundings: the transports on a float16 copy of w (straight through: the
    gradient reaches the float32 w), the float32 dots in TF32. ``gate_scale`` ≠ 1 is a deliberately wrong kernel:
    the gate scaled as fla's would be without the bridge's division by the softmax scale."""
    w16 = w + (w.half().float() - w).detach()
    with TF32Dots():
        return path_attention(q, k, v, w16, beta, log_decay=None if log_decay is None else gate_scale * log_decay,
                              chunk_size=64)


@pytest.mark.parametrize("fox", [True, False], ids=["fox", "nofox"])
def test_the_fla_bounds_allow_fla_arithmetic_and_catch_a_wrong_kernel(fox, monkeypatch):
    """The case of the CUDA comparison (B 2, H 2, T 300, D 32, float32 inputs) with fla's float16 transports and TF32
    dots simulated: within :data:`FLA_RTOL` on every tensor, where accrot's earlier single bar of 2e-3 fails the
    gate's gradient (PaTH-FoX); the same arithmetic with the gate not divided by the softmax scale fails the
    bounds. (The rounding errors are deterministic here: fixed inputs on the CPU, the eager kernel.)"""
    from tests.helpers.tolerance import FLA_RTOL, FLOAT32_RTOL_BEFORE_FLA, fla_mismatches

    monkeypatch.setenv("ACCROT_CPU_KERNELS", "off")  # the eager walk: its dots are made from Python
    inputs = {k: v.float() for k, v in make_inputs(2, 2, 300, 32, beta="uniform", fox=fox, seed=13).items()}
    ref = outputs_and_grads(path_attention, inputs, chunk_size=64)
    with TF32Dots():  # the backward's Python-level dots too
        fla_like = outputs_and_grads(fla_arithmetic, inputs)
    assert not fla_mismatches(ref, fla_like), fla_mismatches(ref, fla_like)
    old = fla_mismatches(ref, fla_like, rtol=dict.fromkeys(FLA_RTOL, FLOAT32_RTOL_BEFORE_FLA))
    if fox:
        assert [m.split(":")[0] for m in old] == ["dlog_decay"]
        with TF32Dots():
            wrong = outputs_and_grads(lambda **x: fla_arithmetic(**x, gate_scale=32 ** -0.5), inputs)
        assert {m.split(":")[0] for m in fla_mismatches(ref, wrong)} >= {"out", "dlog_decay"}
    else:  # without a gate the rounding stays inside the old bar too; a β 2 % off does not stay inside the bounds
        assert not old
        with TF32Dots():
            wrong = outputs_and_grads(lambda beta, **x: fla_arithmetic(beta=0.98 * beta, **x), inputs)
        assert fla_mismatches(ref, wrong)

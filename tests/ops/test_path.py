"""PaTH attention (accrot/ops/path/): the chunked UT/WY kernel against its naive twins on outputs and on every
gradient (q, k, v, w, β, log_decay), plus properties that follow from the math."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from accrot.errors import ConfigError
from accrot.ops.path import (
    fla_problem,
    householder_product,
    naive_path_attention_products,
    naive_path_attention_recurrence,
    path_attention,
)
from accrot.ops.path.block_walk import _path_chunked
from accrot.ops.path.chunk import _chunk_core, _ChunkCore
from tests.helpers.fla import needs_fla
from tests.helpers.kernels import kernels_or_skip
from tests.helpers.tolerance import assert_close, fla_mismatches, within

TOL = {torch.float64: 1e-10, torch.float32: 1e-4}
DTYPE_ID = {torch.float64: "f64", torch.float32: "f32"}


pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py


def make_inputs(
    B: int,
    H: int,
    T: int,
    D: int,
    dtype: torch.dtype = torch.float64,
    beta: str = "mixed",
    fox: bool = False,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Inputs in the ranges the model produces: unit w; β near 0 ("low"), near 2 ("high"), a per-token mix of both
    ("mixed") or uniform on (0, 2); log f_j = logsigmoid(·) < 0, shared over the batch ([1, H, T])."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=dtype) for _ in range(3))
    w = F.normalize(torch.randn(B, H, T, D, generator=g, dtype=dtype), dim=-1)
    u = torch.rand(B, H, T, generator=g, dtype=dtype)
    low, high = 0.05 * u, 2 - 0.05 * u
    beta_t = {
        "low": low,
        "high": high,
        "mixed": torch.where(torch.rand(B, H, T, generator=g) < 0.5, low, high).to(dtype),
        "uniform": 2 * u,
    }[beta]
    out = {"q": q, "k": k, "v": v, "w": w, "beta": beta_t}
    if fox:
        out["log_decay"] = F.logsigmoid(torch.randn(1, H, T, generator=g, dtype=dtype) + 1.0)
    return out


def outputs_and_grads(fn, inputs: dict[str, torch.Tensor], **kwargs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    leaves = {name: x.detach().clone().requires_grad_(True) for name, x in inputs.items()}
    out = fn(**leaves, **kwargs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(123), dtype=out.dtype).to(out.device)
    grads = torch.autograd.grad(out, list(leaves.values()), g, materialize_grads=True)  # T = 1 leaves w unused
    return out.detach(), dict(zip(leaves, grads))


def assert_match(ref, fast, tol: float) -> None:
    (out_ref, grads_ref), (out_fast, grads_fast) = ref, fast
    pairs = {"out": (out_ref, out_fast), **{f"d{name}": (grads_ref[name], grads_fast[name]) for name in grads_ref}}
    bad = []
    for name, (a, b) in pairs.items():  # every tensor checked, every failure named (dq, dk are 0 at T = 1)
        try:
            assert_close(a, b, tol, name)
        except AssertionError as exc:
            bad.append(str(exc))
    assert not bad, "; ".join(bad)


# -- chunked vs the recurrence twin -----------------------------------------------------------------
# (B, T, H, D, c, beta, fox): T in {1, 7, 64, 257}; c = 1, c ∤ T, c = T, c > T; D > 2c takes the rank-c transport.
CASES = [
    (1, 1, 1, 8, 1, "mixed", True),
    (2, 7, 2, 8, 1, "high", False),
    (2, 7, 2, 8, 3, "mixed", True),
    (2, 7, 2, 8, 16, "low", True),
    (1, 64, 2, 16, 16, "high", True),
    (2, 64, 2, 16, 64, "mixed", False),
    (1, 64, 1, 40, 8, "uniform", True),
    (2, 257, 2, 16, 16, "mixed", True),
    (1, 257, 1, 16, 64, "high", False),
    (1, 257, 1, 8, 1, "low", True),
    (1, 257, 2, 16, 300, "mixed", True),
]


def case_id(B, T, H, D, c, beta, fox, dtype) -> str:
    return f"B{B}-T{T}-H{H}-D{D}-c{c}-{beta}{'-fox' if fox else ''}-{DTYPE_ID[dtype]}"


CASE_PARAMS = [pytest.param(*case, dtype, id=case_id(*case, dtype))
               for dtype in (torch.float64, torch.float32) for case in CASES]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]


def outputs_and_grads_on(device: str, fn, inputs: dict[str, torch.Tensor], dtype: torch.dtype, **kwargs):
    """:func:`outputs_and_grads` of ``inputs`` cast to ``dtype`` and run on ``device``, with the output gradient
    drawn in float64 first (so a float32 run and its float64 twin see the same values); results on the CPU."""
    leaves = {name: x.detach().to(device, dtype).requires_grad_(True) for name, x in inputs.items()}
    out = fn(**leaves, **kwargs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(123), dtype=torch.float64)
    grads = torch.autograd.grad(out, list(leaves.values()), g.to(device, out.dtype), materialize_grads=True)
    return out.detach().cpu(), {name: gr.cpu() for name, gr in zip(leaves, grads)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "B, T, H, D, c, beta, fox, dtype",
    CASE_PARAMS,
)
def test_chunked_matches_recurrence(B, T, H, D, c, beta, fox, dtype, device, kernels_mode):
    """On the CPU against the recurrence in the same dtype (the key walk's loop compiled and eager); on CUDA against
    the float64 CPU recurrence."""
    inputs = make_inputs(B, H, T, D, dtype, beta=beta, fox=fox)
    if device == "cpu":
        ref = outputs_and_grads(naive_path_attention_recurrence, inputs)
        fast = outputs_and_grads(path_attention, inputs, chunk_size=c)
    else:
        ref = outputs_and_grads_on("cpu", naive_path_attention_recurrence, inputs, torch.float64)
        fast = outputs_and_grads_on(device, path_attention, inputs, dtype, chunk_size=c)
    assert fast[0].dtype == dtype and fast[0].shape == (B, H, T, D)
    assert_match(ref, fast, TOL[dtype])


@pytest.mark.parametrize(
    "B, T, H, D, c, beta, fox, dtype",
    CASE_PARAMS,
)
def test_autograd_walk_matches_recurrence(B, T, H, D, c, beta, fox, dtype):
    """The query walk under autograd (the kernel off the CPU, and on a CPU build without ATen's flash ops) is called
    directly here, since the CPU dispatch takes the key walk: outputs and every gradient against the twin."""
    inputs = make_inputs(B, H, T, D, dtype, beta=beta, fox=fox)
    ref = outputs_and_grads(naive_path_attention_recurrence, inputs)

    def query_walk(q, k, v, w, beta, log_decay=None):
        return _path_chunked(q, k, v, w, beta, log_decay, chunk_size=c, scale=D**-0.5)

    fast = outputs_and_grads(query_walk, inputs)
    assert_match(ref, fast, TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("N, BH, c, D", [(1, 1, 1, 4), (3, 2, 7, 5), (2, 3, 4, 16), (4, 2, 16, 8)])
def test_chunk_core_backward_matches_autograd(N, BH, c, D, dtype, kernels_mode):
    """The CPU chunk core (compiled, and its eager twin) with its hand-written backward against autograd through
    the plain ops it replaces (:func:`_chunk_core` plus P = I − Wᵀ U): all four outputs and the gradients of q, k,
    w and β. The shapes include D > c, D < c and a single token per chunk."""
    g = torch.Generator().manual_seed(N * 100 + c)
    q, k = (torch.randn(N, BH, c, D, generator=g, dtype=dtype) for _ in range(2))
    w = F.normalize(torch.randn(N, BH, c, D, generator=g, dtype=dtype), dim=-1)
    b = 2 * torch.rand(N, BH, c, generator=g, dtype=dtype)

    def plain(q, k, w, b):
        s, q_start, k_end, U = _chunk_core(q, k, w, b, None)
        return s, q_start, k_end, (torch.eye(D, dtype=dtype) - w.mT @ U).mT

    grads_out = [torch.randn(shape, generator=g, dtype=dtype) for shape in
                 ((N, BH, c, c), (N, BH, c, D), (N, BH, c, D), (N, BH, D, D))]
    results = []
    for fn in (plain, _ChunkCore.apply):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, w, b)]
        outs = fn(*leaves)
        finite = [o.masked_fill(o.isinf(), 0.0) for o in outs]  # −inf above the diagonal, in both
        assert torch.equal(outs[0].isinf(), torch.ones(c, c, dtype=torch.bool).triu(1).expand(N, BH, c, c))
        grads = torch.autograd.grad(finite, leaves, grads_out)
        results.append(([o.detach() for o in finite], grads))
    (ref_out, ref_grad), (out, grad) = results
    for name, a, b_ in zip(("s", "q_start", "k_end", "Pt", "dq", "dk", "dw", "dβ"), ref_out + list(ref_grad),
                           out + list(grad)):
        assert_close(a, b_, TOL[dtype], name)


@pytest.mark.parametrize("fox", [False, True], ids=["path", "fox"])
def test_training_walk_runs_the_fused_backward(fox, kernels_mode):
    """With a gradient the CPU kernel takes the key walk with its own backward: ATen's fused flash forward and
    backward once per query chunk after the first, the query walk's tile loop not at all, and the chunk loop in
    C++ exactly when the kernels are on."""
    inputs = make_inputs(1, 2, 100, 8, beta="mixed", fox=fox, seed=7)
    leaves = {name: x.clone().requires_grad_(True) for name, x in inputs.items()}
    with torch.autograd.profiler.profile() as prof:
        out = path_attention(**leaves, chunk_size=16)
        out.square().sum().backward()
    names = [e.name for e in prof.function_events]
    assert names.count("aten::_scaled_dot_product_flash_attention_for_cpu") == 6  # ⌈100/16⌉ − 1
    assert names.count("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == 6
    compiled = kernels_mode == "compiled"
    assert names.count("accrot_cpu::path_walk_forward") == names.count("accrot_cpu::path_walk_backward") == compiled
    assert names.count("accrot_cpu::path_core_forward") == names.count("accrot_cpu::path_core_backward") == compiled
    assert all(leaf.grad is not None and leaf.grad.abs().sum() > 0 for leaf in leaves.values())


# -- the CPU key walk (keys carried forward, one fused flash call per query chunk); no gradient here ------------
@pytest.mark.parametrize(
    "B, T, H, D, c, beta, fox, dtype",
    CASE_PARAMS,
)
def test_evaluation_walk_matches_recurrence(B, T, H, D, c, beta, fox, dtype, kernels_mode):
    """Under no_grad the CPU kernel takes the evaluation walk: the same outputs as the recurrence twin, and it is the
    walk that ran (ATen's flash op, once per query chunk after the first)."""
    inputs = {k: v.to(dtype) for k, v in make_inputs(B, H, T, D, dtype, beta=beta, fox=fox).items()}
    ref = naive_path_attention_recurrence(**inputs)
    with torch.no_grad(), torch.autograd.profiler.profile() as prof:
        fast = path_attention(**inputs, chunk_size=c)
    calls = sum(e.name == "aten::_scaled_dot_product_flash_attention_for_cpu" for e in prof.function_events)
    assert calls == -(-T // min(c, T)) - 1
    assert fast.dtype == dtype and fast.shape == (B, H, T, D)
    assert_close(ref, fast, TOL[dtype], "out")


@pytest.mark.parametrize(
    "B, T, H, D, c, beta, fox, dtype",
    CASE_PARAMS,
)
def test_grouped_evaluation_walk_matches_recurrence(B, T, H, D, c, beta, fox, dtype, kernels_mode, monkeypatch):
    """Long evaluations walk on several levels: chunks inside groups of 3 chunks from T = 6c, and those inside
    groups of 9 chunks from T = 18c (ragged: the tail is padded to whole groups). The same outputs as the
    recurrence twin, in (3 − 1) + (9/3 − 1) + (groups − 1) flash calls, one per walk step of each level."""
    from accrot.ops.path import dispatch

    def levels(T: int, c: int) -> tuple[int, ...]:
        return tuple(g for g in (3, 9) if T >= 2 * g * c)

    monkeypatch.setattr(dispatch, "_eval_levels", levels)  # where path_attention looks it up
    inputs = {k: v.to(dtype) for k, v in make_inputs(B, H, T, D, dtype, beta=beta, fox=fox).items()}
    ref = naive_path_attention_recurrence(**inputs)
    with torch.no_grad(), torch.autograd.profiler.profile() as prof:
        fast = path_attention(**inputs, chunk_size=c)
    calls = sum(e.name == "aten::_scaled_dot_product_flash_attention_for_cpu" for e in prof.function_events)
    chunks, chosen = -(-T // min(c, T)), levels(T, min(c, T))
    if chosen:
        steps = [chosen[0] - 1] + [hi // lo - 1 for lo, hi in zip(chosen, chosen[1:])]
        assert calls == sum(steps) + -(-chunks // chosen[-1]) - 1
    else:
        assert calls == chunks - 1
    assert fast.dtype == dtype and fast.shape == (B, H, T, D)
    assert_close(ref, fast, TOL[dtype], "out")


def test_evaluation_levels_by_length():
    """One level below 4096 tokens (groups do not pay there), groups of 256 tokens from 4096 and of 1024 from 8192
    (measured, PATH.md §6); a chunk too long for two per group keeps one level."""
    from accrot.ops.path.eval_walk import _eval_levels

    assert _eval_levels(512, 32) == () and _eval_levels(4095, 32) == ()
    assert _eval_levels(4096, 32) == (8,) and _eval_levels(8191, 32) == (8,)
    assert _eval_levels(8192, 32) == (32,) and _eval_levels(65536, 16) == (64,)
    assert _eval_levels(65536, 200) == ()


@pytest.mark.parametrize("levels", [(), (2,), (2, 4)], ids=["one-level", "two-levels", "three-levels"])
@pytest.mark.parametrize("Dv", [3, 8, 9, 13])
@pytest.mark.parametrize("fox", [False, True], ids=["path", "fox"])
def test_evaluation_walk_with_another_value_width(Dv, fox, levels, kernels_mode, monkeypatch):
    """Values narrower or wider than the keys (the fused op wants one head size: the walk pads the narrower side),
    on one level, two (groups of 2 chunks) and three (those in groups of 4)."""
    from accrot.ops.path import dispatch

    monkeypatch.setattr(dispatch, "_eval_levels", lambda T, c: levels)
    inputs = make_inputs(2, 2, 70, 8, beta="mixed", fox=fox, seed=3)
    inputs["v"] = torch.randn(2, 2, 70, Dv, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with torch.no_grad():
        fast = path_attention(**inputs, chunk_size=16)
    assert fast.shape == (2, 2, 70, Dv)
    assert_close(naive_path_attention_recurrence(**inputs), fast, 1e-10, "out")


def test_evaluation_walk_and_training_kernel_agree(kernels_mode):
    """The same inputs with and without a gradient: the two CPU paths give one answer (float32 rounding apart)."""
    inputs = {k: v.float() for k, v in make_inputs(1, 2, 300, 16, beta="uniform", fox=True, seed=5).items()}
    with torch.no_grad():
        walk = path_attention(**inputs, chunk_size=32)
    trained = path_attention(**{k: v.clone().requires_grad_() for k, v in inputs.items()}, chunk_size=32)
    assert_close(walk, trained.detach(), 1e-5, "out")


@pytest.mark.parametrize("grad", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("fox", [False, True], ids=["path", "fox"])
def test_compiled_walk_loop_is_the_eager_loop(grad, fox, monkeypatch):
    """The C++ chunk loop makes the eager loop's ATen calls in the same order, so over the same chunk core the two
    agree to the bit: 33 chunks (so the backward rebuilds segments between checkpoints), values narrower than the
    keys, float32."""
    from accrot.ops.path import chunk

    monkeypatch.setenv("ACCROT_CPU_KERNELS", "on")
    core = kernels_or_skip()
    monkeypatch.setattr(chunk, "_core_kernels", lambda: core)  # the compiled core both times
    inputs = {k: v.float() for k, v in make_inputs(2, 2, 257, 8, beta="uniform", fox=fox, seed=11).items()}
    inputs["v"] = torch.randn(2, 2, 257, 5, generator=torch.Generator().manual_seed(12))
    results = []
    for mode in ("on", "off"):
        monkeypatch.setenv("ACCROT_CPU_KERNELS", mode)
        if grad:
            out, grads = outputs_and_grads(path_attention, inputs, chunk_size=8)
            results.append([out, *grads.values()])
        else:
            with torch.no_grad():
                results.append([path_attention(**inputs, chunk_size=8)])
    for name, a, b in zip(["out", *(f"d{k}" for k in inputs)], *results):
        assert torch.equal(a, b), name


# -- both fast forms vs the explicit products twin (tiny T) -------------------------------------------
@pytest.mark.parametrize(
    "T, c, fox",
    [
        pytest.param(T, c, fox, id=f"B2-T{T}-H2-D6-c{c}{'-fox' if fox else ''}")
        for T, c in ((1, 1), (7, 1), (7, 3), (7, 7), (7, 16))
        for fox in (False, True)
    ],
)
def test_chunked_and_recurrence_match_products(T, c, fox):
    inputs = make_inputs(2, 2, T, 6, torch.float64, beta="uniform", fox=fox, seed=1)
    ref = outputs_and_grads(naive_path_attention_products, inputs)
    assert_match(ref, outputs_and_grads(path_attention, inputs, chunk_size=c), 1e-10)
    assert_match(ref, outputs_and_grads(naive_path_attention_recurrence, inputs), 1e-10)


@pytest.mark.parametrize("name", ["q", "v", "w", "log_decay"])
def test_gradient_of_one_input_alone(name):
    """The forward takes in-place shortcuts where nothing needs the logits; one input requiring grad must still
    get exactly the gradient it gets when all do."""
    inputs = make_inputs(1, 2, 50, 8, beta="uniform", fox=True, seed=14)
    _, all_grads = outputs_and_grads(path_attention, inputs, chunk_size=8)
    leaf = inputs[name].clone().requires_grad_(True)
    out = path_attention(**dict(inputs, **{name: leaf}), chunk_size=8)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(123), dtype=out.dtype)
    (grad,) = torch.autograd.grad(out, leaf, g)
    assert_close(all_grads[name], grad, 1e-12, name)


def test_householder_product_matches_explicit_product():
    inputs = make_inputs(2, 3, 9, 5, beta="uniform", seed=2)
    w, beta = inputs["w"], inputs["beta"]
    eye = torch.eye(5, dtype=torch.float64)
    explicit = eye.expand(2, 3, 5, 5)
    for j in range(9):  # H_9 ⋯ H_1: later factors on the left
        H_j = eye - beta[..., j, None, None] * w[..., j, :, None] * w[..., j, None, :]  # [B, H, D, D]
        explicit = H_j @ explicit
    assert_close(explicit, householder_product(w, beta), 1e-12)


# -- properties from the math ---------------------------------------------------------------------
@pytest.mark.parametrize("kernel", ["chunked", "recurrent"])
def test_beta_zero_is_nope(kernel):
    """β = 0 makes every H_j the identity: plain causal softmax attention, whatever w is."""
    inputs = make_inputs(2, 2, 100, 16, seed=3)
    inputs["beta"] = torch.zeros_like(inputs["beta"])
    out = path_attention(**inputs, chunk_size=16, kernel=kernel)
    nope = F.scaled_dot_product_attention(inputs["q"], inputs["k"], inputs["v"], is_causal=True)
    assert_close(nope, out, 1e-12)


def test_reflection_has_period_two():
    """A fixed w with β = 2 is a reflection: H² = I, so the path product depends only on the parity of t − s."""
    w = F.normalize(torch.randn(3, 8, dtype=torch.float64), dim=-1)  # [H, D]
    H = torch.eye(8, dtype=torch.float64) - 2 * w[:, :, None] * w[:, None, :]  # [H, D, D]
    for length in (2, 4, 6):
        P = householder_product(w[:, None].expand(3, length, 8), torch.full((3, length), 2.0, dtype=torch.float64))
        assert torch.allclose(P, torch.eye(8, dtype=torch.float64).expand(3, 8, 8), atol=1e-12)
    for length in (1, 3, 5):
        P = householder_product(w[:, None].expand(3, length, 8), torch.full((3, length), 2.0, dtype=torch.float64))
        assert torch.allclose(P, H, atol=1e-12)

    # logits through the recurrence: q_tᵀ H^{t−s} k_s = (H^{t mod 2} q_t)ᵀ (H^{s mod 2} k_s), so PaTH equals plain
    # causal attention on parity-reflected queries and keys, for every chunking
    B, T, D = 2, 50, 8
    inputs = make_inputs(B, 3, T, D, seed=4)
    inputs["w"] = w[None, :, None].expand(B, 3, T, D)
    inputs["beta"] = torch.full((B, 3, T), 2.0, dtype=torch.float64)
    odd = (torch.arange(T) % 2 == 1)[:, None]  # [T, 1]
    reflect = lambda x: torch.where(odd, torch.einsum("hde,bhte->bhtd", H, x), x)  # noqa: E731
    expected = F.scaled_dot_product_attention(reflect(inputs["q"]), reflect(inputs["k"]), inputs["v"], is_causal=True)
    assert_close(expected, naive_path_attention_recurrence(**inputs), 1e-12)
    for c in (1, 4, 7, 64):
        assert_close(expected, path_attention(**inputs, chunk_size=c), 1e-12)


def test_pathfox_is_path_plus_forget_bias():
    """PaTH-FoX adds b_ts = Σ_{j=s+1..t} log f_j to PaTH's logit, unscaled (after the D^−1/2 scaling)."""
    inputs = make_inputs(2, 2, 40, 8, beta="uniform", fox=True, seed=5)
    log_f = inputs["log_decay"]  # [1, H, T]
    # with β = 0 the PaTH logits are plain q·k/√D, so FoX must equal SDPA with the explicit additive bias
    nope_in = dict(inputs, beta=torch.zeros_like(inputs["beta"]))
    T = 40
    bias = torch.full((1, 2, T, T), float("-inf"), dtype=torch.float64)
    for t in range(T):
        for s in range(t + 1):
            bias[..., t, s] = log_f[..., s + 1 : t + 1].sum(-1)
    expected = F.scaled_dot_product_attention(inputs["q"], inputs["k"], inputs["v"], attn_mask=bias)
    for c in (1, 6, 64):
        assert_close(expected, path_attention(**nope_in, chunk_size=c), 1e-12)
    # with β > 0: FoX − PaTH is exactly the bias, seen on the twin built from explicit products and sums
    small = {k: (v[:, :, :9] if v.dim() == 4 else v[..., :9]) for k, v in inputs.items()}
    ref = naive_path_attention_products(**small)
    assert_close(ref, path_attention(**small, chunk_size=4), 1e-12)
    assert not within(ref, path_attention(**dict(small, log_decay=None), chunk_size=4), 1e-3)


def test_forget_bias_broadcasts_over_batch():
    inputs = make_inputs(3, 2, 30, 8, fox=True, seed=6)
    per_batch = dict(inputs, log_decay=inputs["log_decay"].expand(3, -1, -1).clone())
    assert torch.equal(path_attention(**per_batch, chunk_size=8), path_attention(**inputs, chunk_size=8))


def test_long_bias_keeps_float32_precision():
    """Cumulative log-decays far from zero (|G| ≫ 1) must not cost float32 accuracy: b_ts is formed in float64."""
    inputs = make_inputs(1, 2, 600, 16, beta="uniform", fox=True, seed=7)
    inputs["log_decay"] = inputs["log_decay"] * 0.02 - 0.5  # G reaches ≈ −300 while neighbours stay correlated
    ref = path_attention(**inputs, chunk_size=32)
    fast = path_attention(**{k: v.float() for k, v in inputs.items()}, chunk_size=32)
    assert_close(ref, fast, 1e-5)


def test_appending_tokens_never_changes_earlier_outputs():
    inputs = make_inputs(2, 2, 100, 8, beta="mixed", fox=True, seed=8)
    full = path_attention(**inputs, chunk_size=16)
    for T in (1, 37, 64, 99):
        prefix = {k: (v[:, :, :T] if v.dim() == 4 else v[..., :T]) for k, v in inputs.items()}
        assert_close(full[:, :, :T], path_attention(**prefix, chunk_size=16), 1e-12)


def test_any_chunk_size_gives_the_same_answer():
    inputs = make_inputs(1, 2, 90, 8, beta="uniform", fox=True, seed=9)
    ref = path_attention(**inputs, chunk_size=1)
    for c in (2, 5, 8, 32, 89, 90, 91, 1000):
        assert_close(ref, path_attention(**inputs, chunk_size=c), 1e-12)


def test_bf16_inputs_run_in_float32_and_return_bf16():
    inputs = make_inputs(2, 2, 70, 16, dtype=torch.float32, fox=True, seed=10)
    low = dict(inputs, q=inputs["q"].bfloat16(), k=inputs["k"].bfloat16(), v=inputs["v"].bfloat16())
    out = path_attention(**low, chunk_size=16)
    assert out.dtype == torch.bfloat16
    expected = path_attention(**{k: v.float() for k, v in low.items()}, chunk_size=16).bfloat16()
    assert torch.equal(out, expected)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast must not leak into the Householder math
        assert torch.equal(path_attention(**low, chunk_size=16), expected)
        out32 = path_attention(**inputs, chunk_size=16)
    assert out32.dtype == torch.float32
    assert torch.equal(path_attention(**inputs, chunk_size=16), out32)


def test_kernel_recurrent_is_the_twin():
    inputs = make_inputs(1, 2, 20, 8, fox=True, seed=11)
    assert torch.equal(path_attention(**inputs, kernel="recurrent"), naive_path_attention_recurrence(**inputs))


def test_scale_argument():
    inputs = make_inputs(1, 1, 12, 8, beta="uniform", seed=12)
    ref = naive_path_attention_products(**inputs, scale=0.1)
    assert_close(ref, path_attention(**inputs, chunk_size=5, scale=0.1), 1e-12)
    assert_close(ref, naive_path_attention_recurrence(**inputs, scale=0.1), 1e-12)


def test_empty_sequence():
    inputs = make_inputs(2, 2, 0, 8)
    assert path_attention(**inputs).shape == (2, 2, 0, 8)


@pytest.mark.parametrize("chunk_size", [0, -3, 2.5, True, None])
def test_bad_chunk_size(chunk_size):
    with pytest.raises(ValueError, match="chunk_size"):
        path_attention(**make_inputs(1, 1, 4, 4), chunk_size=chunk_size)


def test_bad_arguments():
    inputs = make_inputs(2, 2, 6, 4, fox=True)
    with pytest.raises(ValueError, match="kernel='triton'"):
        path_attention(**inputs, kernel="triton")
    with pytest.raises(ValueError, match="beta must be"):
        path_attention(**dict(inputs, beta=inputs["beta"][..., :5]))
    with pytest.raises(ValueError, match="w must have"):
        path_attention(**dict(inputs, w=inputs["w"][..., :3]))
    with pytest.raises(ValueError, match="log_decay must be"):
        path_attention(**dict(inputs, log_decay=inputs["log_decay"][0]))
    with pytest.raises(ValueError, match="q must be"):
        path_attention(**dict(inputs, q=inputs["q"][0]))


def test_fla_kernel_on_cpu_is_a_clear_error():
    with pytest.raises(ConfigError, match="kernel='fla' needs CUDA") as err:
        path_attention(**make_inputs(1, 1, 8, 16), kernel="fla")
    assert "\n" not in str(err.value) and "kernel='chunked'" in str(err.value)


def test_fla_head_dims_it_cannot_run_are_one_line(monkeypatch):
    """fla's PaTH supports head dims 16, 32, 64 and 128; any other is named before fla is called."""
    from accrot.ops.path import fla

    monkeypatch.setattr(fla, "fla_problem", lambda device=None: None)  # as if CUDA, Triton and fla were here
    with pytest.raises(ConfigError, match=r"supports head dims 16, 32, 64, 128 \(got 8\)"):
        path_attention(**make_inputs(1, 1, 8, 8), kernel="fla")


@pytest.mark.parametrize("missing", ["triton", "fla"])
def test_missing_fla_or_triton_is_one_line(missing, monkeypatch):
    """Without Triton, or without fla, kernel='fla' says which one is missing and how to get it, in one line."""
    import importlib.util as util

    present = {"triton", "fla"} - {missing}  # whatever this machine has installed
    monkeypatch.setattr(util, "find_spec", lambda name, *a: object() if name in present else None)
    problem = fla_problem("cuda")
    assert problem is not None and "\n" not in problem
    assert ("needs Triton" if missing == "triton" else "flash-linear-attention") in problem
    assert ".[gpu]" in problem and "kernel='chunked'" in problem
    if not torch.cuda.is_available():  # on a CPU the device is the first reason
        assert "needs CUDA" in fla_problem("cpu")


# -- the CUDA kernel of fla, where there is one (its bridge on the CPU: tests/ops/test_path_fla.py) --------------
@pytest.mark.parametrize(
    "fox, dtype",
    [
        pytest.param(
            fox,
            dtype,
            id=f"B2-T300-H2-D32-fla{'-fox' if fox else ''}-{'bf16' if dtype == torch.bfloat16 else 'f32'}",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"), needs_fla],
        )
        for fox in (False, True)
        for dtype in (torch.bfloat16, torch.float32)
    ],
)
def test_fla_matches_chunked(fox, dtype):
    """fla's Triton PaTH (and PaTH-FoX) against the chunked kernel on the same GPU, outputs and every gradient, to
    fla's own bounds (:data:`FLA_RTOL`): q, k, v in bf16 (the training dtype) or float32, w, β and the gate float32
    as the scheme makes them; the chunked kernel sees the same values in float32. An fla that is installed and
    does not import or run fails here (only a missing fla skips)."""
    inputs = {k: v.float().cuda() for k, v in make_inputs(2, 2, 300, 32, beta="uniform", fox=fox, seed=13).items()}
    low = {k: (v.to(dtype) if k in ("q", "k", "v") else v) for k, v in inputs.items()}
    ref = outputs_and_grads(path_attention, {k: v.float() for k, v in low.items()}, chunk_size=64)
    fast = outputs_and_grads(path_attention, low, kernel="fla")
    bad = fla_mismatches(ref, fast)
    assert not bad, "; ".join(bad)


def test_bench_smoke():
    from accrot.bench.path import bench_kernels

    rows = bench_kernels(lengths=(48,), backward_lengths=(48,), B=1, H=1, D=8, chunk=16, repeats=1)
    assert [(r["T"], r["mode"]) for r in rows] == [(48, "fwd"), (48, "fwd+bwd")]
    assert all(r["chunked_s"] > 0 and r["recurrent_s"] > 0 and r["speedup"] > 0 for r in rows)

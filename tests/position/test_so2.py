"""SO(2) schemes (none / rope / accum) × far mass × value transport against an independent naive twin,
plus the properties that follow from the math."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from accrot.ops.attention import causal_attention
from accrot.ops.counter_rng import naive_standard_normal, naive_standard_uniform
from accrot.ops.rotary import TWO_PI, naive_so2_attention, rotate_pairs
from accrot.position import ConfigError, SchemeConfig, build
from accrot.position.accum import (
    DEFAULT_WINDOW,
    POSITION_CHUNK,
    RandomPositionIncrements,
    char_fn_abs,
    increment_distribution,
    mixing_window,
    sigma_for_window,
)
from accrot.position.rope import rope_frequencies
from tests.helpers.tolerance import assert_close

H, D = 2, 8
DM = H * D
LEARNED = dict(learned_init_std=0.5, conv_size=3, increment_rank=6)  # non-trivial learned increments


pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py


def wrap(theta: torch.Tensor) -> torch.Tensor:
    return torch.remainder(theta + math.pi, TWO_PI) - math.pi


def inputs(B=2, T=12, n_heads=H, head_dim=D, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, n_heads, T, head_dim, generator=gen, dtype=dtype) for _ in range(3))
    x = torch.randn(B, T, n_heads * head_dim, generator=gen, dtype=dtype)
    tokens = torch.randint(0, 256, (B, T), generator=gen)
    return q, k, v, x, tokens


def config(rotation, increments, far_mass, values, **extra):
    kw = dict(rotation=rotation, far_mass=far_mass, rotate_values=values, block_size=5, **extra)
    if increments is not None:
        kw["increments"] = increments
    if increments == "learned":
        kw.update(LEARNED)
    return SchemeConfig(**kw)


ROTATIONS = [
    ("none", None),
    ("rope", None),
    ("accum", "random_position"),
    ("accum", "random_token"),
    ("accum", "learned"),
    ("accum", "softplus"),
]
CELLS = [
    pytest.param(rot, inc, fm, values, id=f"{inc or rot}-{fm}-{'values' if values else 'qk'}")
    for rot, inc in ROTATIONS
    for fm in ("none", "alibi", "forget")
    for values in ((False, True) if rot != "none" else (False,))
]


def twin_increments(scheme, x, tokens, T):
    """δ_j that define the rotation, never the fast code's angles: ω for RoPE, the part's own δ for accum."""
    rotation = scheme.cfg.rotation
    if rotation == "none":
        return None
    if rotation == "rope":
        return rope_frequencies(D, scheme.cfg.rope_base).view(1, 1, 1, -1).expand(1, H, T, -1)
    return scheme.rotation.increments(x, tokens)


def perturb_forget_gate(scheme):
    """Data-dependent gates where the init has none: the forget gate's weight, and the softplus increments' gate
    (GRAPE's init gives every token the same rate) and ladder, so the twin sees token-dependent increments."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        if scheme.cfg.far_mass == "forget":
            scheme.far_mass.proj.weight.normal_(std=0.2, generator=gen)
        if scheme.cfg.increments == "softplus":
            source = scheme.rotation.source
            source.gate.weight.normal_(std=0.3, generator=gen)
            source.gate.bias.fill_(0.5)
            source.log_freq.add_(torch.randn(source.log_freq.shape, generator=gen, dtype=source.log_freq.dtype))


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rotation, increments, far_mass, values", CELLS)
def test_cell_matches_naive_twin(rotation, increments, far_mass, values, device):
    """Outputs and gradients (q, k, v, x) of every cell against explicit 2×2 path products. On CUDA the cell runs on
    the GPU (a copy of the same module) and the twin stays in float64 on the CPU."""
    scheme = build(config(rotation, increments, far_mass, values), DM, H).eval()
    perturb_forget_gate(scheme)
    q, k, v, x, tokens = inputs()
    for t in (q, k, v, x):
        t.requires_grad_()
    fast_scheme = scheme if device == "cpu" else copy.deepcopy(scheme).to(device)
    fast_in = (q, k, v, x) if device == "cpu" else tuple(t.detach().to(device).requires_grad_() for t in (q, k, v, x))
    out = fast_scheme(*fast_in, tokens.to(device))
    log_f = None if far_mass == "none" else scheme.far_mass.log_decay(x, tokens)
    ref = naive_so2_attention(q, k, v, twin_increments(scheme, x, tokens, q.shape[2]), log_f, values)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device.type == device
    assert_close(ref, out, 1e-5)  # angles are float32 by contract; everything else is float64
    g = torch.randn_like(ref)
    g_fast = torch.autograd.grad(out, fast_in, g.to(device), allow_unused=True)
    g_ref = torch.autograd.grad(ref, (q, k, v, x), g, allow_unused=True)
    for name, a, b in zip("q k v x".split(), g_ref, g_fast):
        if a is None:  # x feeds nothing in this cell
            assert b is None or b.abs().max() == 0, name
            continue
        assert_close(a, b, 1e-5, name)


@pytest.mark.parametrize("rotation, increments, far_mass, values", CELLS)
def test_cell_prefix_invariance(rotation, increments, far_mass, values):
    """Appending tokens never changes earlier outputs (eval mode), across a random_position chunk boundary."""
    scheme = build(config(rotation, increments, far_mass, values), DM, H).eval()
    perturb_forget_gate(scheme)
    T_long, T_short = POSITION_CHUNK + 40, POSITION_CHUNK - 50
    q, k, v, x, tokens = inputs(B=1, T=T_long)
    with torch.no_grad():
        short = scheme(q[:, :, :T_short], k[:, :, :T_short], v[:, :, :T_short], x[:, :T_short], tokens[:, :T_short])
        long = scheme(q, k, v, x, tokens)
    assert_close(short, long[:, :, :T_short], 1e-6)


@pytest.mark.parametrize(
    "rotation, increments",
    [pytest.param(rot, inc, id=inc or rot) for rot, inc in ROTATIONS if rot != "none"],
)
def test_angles_are_what_forward_used(rotation, increments):
    scheme = build(config(rotation, increments, "alibi", True), DM, H).eval()
    q, k, v, x, tokens = inputs(T=30)
    theta = scheme.angles(x, tokens)
    assert theta.shape == (2, H, 30, D // 2) and theta.dtype == torch.float32
    log_f = scheme.log_decay(x, tokens)
    manual = causal_attention(rotate_pairs(q, theta), rotate_pairs(k, theta), rotate_pairs(v, -theta), log_f)
    manual = rotate_pairs(manual, theta)
    assert_close(manual, scheme(q, k, v, x, tokens), 1e-14)


# -- RoPE ----------------------------------------------------------------------------------------------------
def test_rope_angles_and_cache():
    scheme = build(SchemeConfig(rotation="rope"), DM, H)
    _, _, _, x, tokens = inputs(T=20)
    theta = scheme.rotation.angles(x, tokens)
    assert theta.shape == (1, H, 20, D // 2) and theta.dtype == torch.float32
    omega = rope_frequencies(D)
    assert omega[0] == 1.0 and omega[1] == pytest.approx(10000 ** (-1 / 4))
    expect = torch.arange(20, dtype=torch.float64)[:, None] * omega  # [T, P]
    assert bool((theta.abs() <= math.pi).all())  # wrapped to [−π, π)
    torch.testing.assert_close(wrap(theta[0, 0].double() - expect), torch.zeros_like(expect), rtol=0, atol=1e-6)
    longer = scheme.rotation.angles(torch.zeros(1, 50, DM), torch.zeros(1, 50, dtype=torch.long))
    assert torch.equal(longer[:, :, :20], theta)
    again = scheme.rotation.angles(x, tokens)
    assert again.data_ptr() == longer.data_ptr()  # served from the cached table
    assert scheme.describe()["rope_frequencies"] == pytest.approx(omega.tolist())


def test_rope_angle_precision_at_a_million():
    scheme = build(SchemeConfig(rotation="rope"), d_model=8, n_heads=1)
    T = 1_000_001
    theta = scheme.rotation.angles(torch.zeros(1, 1, 8), torch.zeros(1, T, dtype=torch.long))[0, 0, -1].double()
    exact = torch.tensor([math.fmod(1_000_000 * w, TWO_PI) for w in rope_frequencies(8).tolist()], dtype=torch.float64)
    assert wrap(theta - exact).abs().max() < 1e-3


def test_rope_logits_depend_only_on_the_offset():
    scheme = build(SchemeConfig(rotation="rope"), DM, H)
    gen = torch.Generator().manual_seed(3)
    q0, k0 = torch.randn(H, D, generator=gen), torch.randn(H, D, generator=gen)
    T = 25
    q, k = q0[None, :, None].expand(1, H, T, D), k0[None, :, None].expand(1, H, T, D)  # same content everywhere
    _, _, _, x, tokens = inputs(B=1, T=T)
    theta = scheme.angles(x.float(), tokens)
    logits = rotate_pairs(q, theta) @ rotate_pairs(k, theta).transpose(-1, -2)  # [1, H, T, T]
    for offset in range(-T + 1, T):
        diag = torch.diagonal(logits, offset=offset, dim1=-2, dim2=-1)
        assert (diag - diag[..., :1]).abs().max() < 1e-4, offset


# -- accumulated rotations: properties -------------------------------------------------------------------
@pytest.mark.parametrize("values", [False, True], ids=["qk", "values"])
@pytest.mark.parametrize(
    "extra",
    [dict(increments="learned", learned_init_std=0.0), dict(increments="random_position", sigma=1e-30)],
    ids=["learned-zero", "random-zero"],
)
def test_zero_increments_are_nope(extra, values):
    scheme = build(SchemeConfig(rotation="accum", rotate_values=values, **extra), DM, H).eval()
    nope = build(SchemeConfig(), DM, H)
    q, k, v, x, tokens = inputs(T=31)
    assert_close(nope(q, k, v, x, tokens), scheme(q, k, v, x, tokens), 1e-12)


@pytest.mark.parametrize("values", [False, True], ids=["qk", "values"])
@pytest.mark.parametrize("increments", ["random_position", "random_token"])
def test_constant_rope_increments_are_rope(increments, values):
    """δ_j ≡ ω_i (mean RoPE, vanishing spread): θ_t = (t + 1)ω, a constant shift of RoPE's tω, so equal outputs."""
    cfg = SchemeConfig(rotation="accum", increments=increments, increment_mean="rope", sigma=1e-30, rotate_values=values)
    scheme = build(cfg, DM, H).eval()
    rope = build(SchemeConfig(rotation="rope", rotate_values=values), DM, H)
    q, k, v, x, tokens = inputs(T=40)
    assert_close(rope(q, k, v, x, tokens), scheme(q, k, v, x, tokens), 1e-5)


def test_value_transport_with_zero_angles_is_plain_attention():
    scheme = build(SchemeConfig(rotation="accum", increments="learned", learned_init_std=0.0, rotate_values=True), DM, H)
    q, k, v, x, tokens = inputs(T=18)
    assert_close(causal_attention(q, k, v), scheme(q, k, v, x, tokens), 1e-12)


def test_rotations_preserve_norms():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 17, 10, generator=gen, dtype=torch.float64)
    theta = 100 * torch.randn(1, 3, 17, 5, generator=gen)
    y = rotate_pairs(x, theta)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)
    torch.testing.assert_close(rotate_pairs(y, -theta), x, rtol=0, atol=1e-12)  # R(−θ) undoes R(θ)


def test_accum_logits_depend_only_on_the_path():
    """random_token: the logit of (t, s) depends on the tokens s+1..t only, not on what precedes s or on t."""
    scheme = build(SchemeConfig(rotation="accum", increments="random_token"), DM, H)
    gen = torch.Generator().manual_seed(4)
    segment = torch.randint(0, 256, (10,), generator=gen)
    q0, k0 = torch.randn(H, D, generator=gen), torch.randn(H, D, generator=gen)
    logits = []
    for prefix_len in (3, 11):
        tokens = torch.cat((torch.randint(0, 256, (prefix_len,), generator=gen), segment))[None]  # [1, T]
        T = tokens.shape[1]
        theta = scheme.angles(torch.zeros(1, T, DM), tokens)[:, :, -10:]  # [1, H, 10, P]
        q = rotate_pairs(q0[None, :, None].expand(1, H, 10, D), theta)
        k = rotate_pairs(k0[None, :, None].expand(1, H, 10, D), theta)
        logits.append((q @ k.transpose(-1, -2)).tril())
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=1e-4)


def test_random_position_angle_precision_at_a_million():
    """The angle at 10⁶ (about 10⁶ rad: RoPE-mean drift plus a random walk) against a float64 running sum."""
    cfg = SchemeConfig(rotation="accum", increments="random_position", increment_mean="rope", window=8.0)
    scheme = build(cfg, d_model=2, n_heads=1).eval()
    T = 1_000_001
    x, tokens = torch.zeros(1, 1, 2), torch.zeros(1, T, dtype=torch.long)
    theta = scheme.angles(x, tokens)  # [1, 1, T, 1] float32
    delta = scheme.rotation.increments(x, tokens)  # the same increments, float32
    assert theta.dtype == delta.dtype == torch.float32 and theta.shape == delta.shape == (1, 1, T, 1)
    reference = delta.double().cumsum(dim=-2)  # [1, 1, T, 1] float64, unwrapped
    assert abs(reference[0, 0, -1, 0].item()) > 5e5
    err = wrap(theta.double() - reference)
    assert err.abs().max() < 1e-3
    assert err[0, 0, -1].abs() < 1e-5


def test_random_position_fixed_draw_is_independent_of_build_order():
    cfg = SchemeConfig(rotation="accum", increments="random_position", seed=7)
    a, b = build(cfg, DM, H).eval(), build(cfg, DM, H).eval()
    x = torch.zeros(1, 1, DM)
    T = 3 * POSITION_CHUNK + 5

    def tok(n):
        return torch.zeros(1, n, dtype=torch.long)

    for n in (10, POSITION_CHUNK + 1, T):  # grown in steps ...
        a.angles(x, tok(n))
    whole = b.angles(x, tok(T))  # ... or at once
    assert torch.equal(a.angles(x, tok(T)), whole)
    other = build(SchemeConfig(rotation="accum", increments="random_position", seed=8), DM, H).eval()
    assert not torch.equal(other.angles(x, tok(T)), whole)


def test_resample_draws_fresh_increments_in_training_only():
    cfg = SchemeConfig(rotation="accum", increments="random_position", resample=True)
    scheme = build(cfg, DM, H)
    q, k, v, x, tokens = inputs(T=16)
    scheme.train()
    first, second = scheme.angles(x, tokens), scheme.angles(x, tokens)
    assert first.shape == (2, H, 16, D // 2) and not torch.equal(first, second)
    assert not torch.equal(first[0], first[1])  # one draw per sequence of the batch
    state = scheme.state_dict()  # the draw count is part of it: restoring it replays the next draw
    torch.manual_seed(123)
    out = scheme(q, k, v, x, tokens)
    torch.rand(7)  # the global RNG plays no part
    scheme.load_state_dict(state)
    delta = scheme.rotation.increments(x, tokens)
    assert_close(naive_so2_attention(q, k, v, delta), out, 1e-5)
    scheme.eval()
    assert torch.equal(scheme.angles(x, tokens), scheme.angles(x, tokens))
    fixed = build(SchemeConfig(rotation="accum", increments="random_position", resample=False), DM, H).train()
    assert torch.equal(fixed.angles(x, tokens), scheme.angles(x, tokens))  # resample off: the eval draw


def test_random_increment_statistics():
    for family in ("gaussian", "uniform"):
        for mean in ("zero", "rope"):
            cfg = SchemeConfig(rotation="accum", increment_family=family, increment_mean=mean, sigma=0.3)
            scheme = build(cfg, d_model=8, n_heads=1).eval()
            delta = scheme.rotation.increments(torch.zeros(1, 1, 8), torch.zeros(1, 20000, dtype=torch.long))[0, 0]
            mu = rope_frequencies(8) if mean == "rope" else torch.zeros(4, dtype=torch.float64)
            torch.testing.assert_close(delta.double().mean(0), mu, rtol=0, atol=0.02)
            torch.testing.assert_close(delta.double().std(0), torch.full((4,), 0.3, dtype=torch.float64), rtol=0.03, atol=0)
            if family == "uniform":
                assert (delta.double() - mu).abs().max() <= 0.3 * math.sqrt(3) + 1e-6
    ladder = build(SchemeConfig(rotation="accum", increment_spread="ladder", sigma=0.5), d_model=8, n_heads=1)
    sig = torch.tensor(ladder.describe()["increment_sigma"], dtype=torch.float64)
    torch.testing.assert_close(sig, 0.5 * rope_frequencies(8))


def test_random_token_table():
    scheme = build(SchemeConfig(rotation="accum", increments="random_token", vocab_size=300), DM, H)
    table = scheme.rotation.source.table
    assert table.shape == (300, H, D // 2) and not table.requires_grad
    assert "rotation.source.table" in scheme.state_dict() and not list(scheme.parameters())
    again = build(SchemeConfig(rotation="accum", increments="random_token", vocab_size=300), DM, H)
    assert torch.equal(table, again.rotation.source.table)  # a function of the seed
    tokens = torch.tensor([[0, 299, 5]])
    delta = scheme.rotation.increments(torch.zeros(1, 3, DM), tokens)
    assert torch.equal(delta[0, :, 1], table[299])
    with pytest.raises(ValueError, match="vocab_size=300"):
        scheme.rotation.increments(torch.zeros(1, 2, DM), torch.tensor([[3, 300]]))


@pytest.mark.parametrize("form", ["selective", "plain"])
def test_learned_increments_are_bounded_and_laddered(form):
    """|δ_i| ≤ M·ℓ_i with ℓ the ladder at the default base 500 000, and large projections saturate at it."""
    cfg = SchemeConfig(rotation="accum", increments="learned", learned_init_std=5.0, max_increment=0.7,
                       learned_form=form)
    scheme = build(cfg, DM, H)
    _, _, _, x, tokens = inputs(T=50)
    delta = scheme.rotation.increments(x, tokens)  # [B, H, T, P]
    bound = (0.7 * rope_frequencies(D, 500000.0)).float()
    assert bool((delta.abs() <= bound + 1e-7).all())
    assert (delta.abs().amax(dim=(0, 1, 2)) > 0.5 * bound).all()  # saturates near the per-pair bound


@pytest.mark.parametrize(
    "rotation, increments, far_mass",
    [("accum", "learned", "forget"), ("accum", "random_position", "alibi"), ("rope", None, "forget")],
    ids=["learned-forget", "random_position-alibi", "rope-forget"],
)
def test_bf16_autocast_keeps_angles_and_decay_float32(rotation, increments, far_mass):
    scheme = build(config(rotation, increments, far_mass, True), DM, H).eval()
    perturb_forget_gate(scheme)
    q, k, v, x, tokens = inputs(T=21, dtype=torch.float32)
    ref_theta, ref_decay = scheme.angles(x, tokens), scheme.log_decay(x, tokens)
    ref_out = scheme(q, k, v, x, tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        xb = x.bfloat16()
        theta, log_f = scheme.angles(xb, tokens), scheme.log_decay(xb, tokens)
        out = scheme(q.bfloat16(), k.bfloat16(), v.bfloat16(), xb, tokens)
    assert theta.dtype == torch.float32 and log_f.dtype == torch.float32
    assert torch.allclose(theta, ref_theta, atol=0.05)  # only x's bf16 rounding differs
    assert torch.allclose(log_f, ref_decay, atol=0.05)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        exact_theta = scheme.angles(x, tokens)  # float32 x under autocast: bit-identical to no autocast
    assert torch.equal(exact_theta, ref_theta)
    assert out.dtype == torch.bfloat16
    assert_close(ref_out, out, 5e-2)


# -- windows -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["gaussian", "uniform"])
@pytest.mark.parametrize("window", [4.0, 96.0, 5000.0])
def test_sigma_from_window_meets_eps(family, window):
    eps = 0.05
    sigma = sigma_for_window(window, eps, family)
    assert char_fn_abs(sigma, family).item() ** window == pytest.approx(eps, rel=1e-9)
    assert mixing_window(sigma, eps, family).item() == pytest.approx(window, rel=1e-9)
    if family == "gaussian":
        assert sigma**2 == pytest.approx(2 * math.log(1 / eps) / window)


def test_describe_reports_windows():
    cfg = SchemeConfig(rotation="accum", window=64.0, window_eps=0.1)
    info = build(cfg, DM, H).describe()
    assert info["mixing_window"] == pytest.approx([64.0] * (D // 2))
    assert info["increment_char_fn"][0] ** 64 == pytest.approx(0.1)
    default = build(SchemeConfig(rotation="accum"), DM, H).describe()
    assert default["mixing_window"] == pytest.approx([DEFAULT_WINDOW] * (D // 2))
    drift = build(SchemeConfig(rotation="accum", increment_mean="rope"), DM, H).describe()
    assert drift["mixing_window"] == default["mixing_window"]  # the mean does not change |φ|
    ladder = build(SchemeConfig(rotation="accum", increment_spread="ladder", window=64.0), DM, H).describe()
    windows = ladder["mixing_window"]
    assert windows[0] == pytest.approx(64.0) and all(b > a for a, b in zip(windows, windows[1:]))
    uniform = build(SchemeConfig(rotation="accum", increment_family="uniform", window=30.0), DM, H).describe()
    assert uniform["mixing_window"] == pytest.approx([30.0] * (D // 2))
    learned = build(SchemeConfig(rotation="accum", increments="learned"), DM, H).describe()
    assert learned["mixing_window"] == "measured by diagnostics"
    assert mixing_window(0.0).item() == math.inf


# -- configuration errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(rotation="rope", increments="learned"), "increments"),
        (dict(rotation="none", rotate_values=True), "rotate_values"),
        (dict(rotation="path", rotate_values=True), "rotate_values"),
        (dict(rotation="accum", sigma=-0.1), "sigma"),
        (dict(rotation="accum", window=-3.0), "window"),
        (dict(rotation="accum", increments="learned", max_increment=-1.0), "max_increment"),
        (dict(rotation="rope", rope_base=-10.0), "rope_base"),
        (dict(rotation="accum", increments="random_token", vocab_size=0), "vocab_size"),
        (dict(rotation="accum", window=10.0, sigma=0.1), "window"),
        (dict(rotation="accum", increments="learned", increment_rank=-1), "increment_rank"),
        (dict(rotation="accum", increments="learned", learned_form="tanh"), "learned_form"),
        (dict(rotation="accum", increments="learned", ladder_base=0.0), "ladder_base"),
        (dict(rotation="accum", increments="learned", learned_init_std=-0.1), "learned_init_std"),
        (dict(far_mass="forget", forget_init="zero"), "forget_init"),
    ],
    ids=lambda p: p if isinstance(p, str) else "-".join(f"{k}={v}" for k, v in p.items()),
)
def test_bad_config_names_the_option(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        SchemeConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(rotation="accum", increments="learned", increment_spread="ladder"), "learned_ladder"),
        (dict(rotation="accum", increments="random_position", conv_size=4), "conv_size"),
        (dict(rotation="accum", increments="random_token", increment_rank=4), "increment_rank"),
        (dict(rotation="accum", increments="random_position", learned_ladder=True), "learned_ladder"),
        (dict(rotation="accum", increments="softplus", conv_size=4), "conv_size"),
        (dict(rotation="accum", increments="softplus", increment_rank=16), "increment_rank"),
        (dict(rotation="accum", increments="softplus", increment_mean="rope"), "increment_mean"),
        (dict(rotation="accum", increments="softplus", increment_spread="ladder"), "increment_spread"),
        (dict(rotation="accum", increments="random_position", ladder_base=500.0), "ladder_base"),
    ],
    ids=lambda p: p if isinstance(p, str) else "-".join(f"{k}={v}" for k, v in p.items() if k != "rotation"),
)
def test_options_that_do_nothing_are_rejected_at_build(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        build(SchemeConfig(**kwargs), DM, H)


@pytest.mark.parametrize("rotation", ["rope", "accum"])
def test_odd_head_dim_is_rejected(rotation):
    with pytest.raises(ConfigError, match="odd"):
        build(SchemeConfig(rotation=rotation), d_model=12, n_heads=4)  # head dim 3


def test_learned_mixing_floor_adds_the_random_position_draw():
    """learned + window: with the learned part switched off the angles are random_position's exactly, and the
    reported window is the floor's (an upper bound whatever the projection learns)."""
    torch.manual_seed(0)
    x, tokens = torch.randn(2, 300, DM), torch.randint(0, 256, (2, 300))
    floor = build(SchemeConfig(rotation="accum", increments="learned", window=40.0, learned_init_std=0.0), DM, H)
    plain = build(SchemeConfig(rotation="accum", increments="random_position", window=40.0), DM, H)
    floor.eval(), plain.eval()
    torch.testing.assert_close(floor.angles(x, tokens), plain.angles(x, tokens).expand(2, -1, -1, -1),
                               rtol=0, atol=1e-5)
    assert floor.describe()["mixing_window"] == pytest.approx([40.0] * (DM // H // 2))
    learned = build(SchemeConfig(rotation="accum", increments="learned", window=40.0, learned_init_std=0.5), DM, H)
    learned.eval()
    delta = learned.rotation.increments(x, tokens).double()  # [B, H, T, P]
    noise_only = plain.rotation.increments(x, tokens).double()
    assert not torch.allclose(delta, noise_only.expand_as(delta))  # the learned part is there too
    train = learned.train()
    assert not torch.equal(train.angles(x, tokens), train.angles(x, tokens))  # the floor is redrawn in training


@pytest.mark.parametrize("kind", ["random_position", "random_token"])
def test_random_draws_are_a_function_of_seed_and_layer(kind):
    """Randomness belongs to the run: two seeds differ, two layers of one model differ, and the same (seed,
    layer) gives the same draws again — evaluation draws and token tables as much as training streams."""
    from accrot.model import ModelConfig, Transformer
    from accrot.position.accum import RandomPositionIncrements, RandomTokenIncrements

    tokens = torch.randint(0, 256, (1, 300), generator=torch.Generator().manual_seed(1))

    def per_layer(seed: int, train: bool = False) -> list[torch.Tensor]:
        cfg = ModelConfig(d_model=DM, n_layers=2, n_heads=H,
                          scheme=SchemeConfig(rotation="accum", increments=kind, seed=seed))
        model = Transformer(cfg).train(train)
        sources = [m for m in model.modules() if isinstance(m, (RandomPositionIncrements, RandomTokenIncrements))]
        assert len(sources) == 2
        return [m(torch.zeros(1, 300, DM), tokens) for m in sources]  # [1, H, T, P] each

    seed0, seed1 = per_layer(0), per_layer(1)
    assert not torch.equal(seed0[0], seed0[1])  # layers
    assert not torch.equal(seed0[0], seed1[0]) and not torch.equal(seed0[1], seed1[1])  # seeds
    assert all(torch.equal(a, b) for a, b in zip(seed0, per_layer(0)))  # a pure function of (seed, layer)
    if kind == "random_position":  # training draws too: per layer and per seed
        train0, train1 = per_layer(0, train=True), per_layer(1, train=True)
        assert not torch.equal(train0[0], train0[1]) and not torch.equal(train0[0], train1[0])
    # the evaluation draws of different layers are uncorrelated, as independent as different seeds
    a, b = seed0[0].flatten().double(), seed0[1].flatten().double()
    corr = float(((a - a.mean()) * (b - b.mean())).mean() / (a.std() * b.std()))
    assert abs(corr) < 4 / math.sqrt(a.numel())


def test_the_backbone_sets_layer_and_shard_through_the_scheme():
    """A scheme takes its layer's stream and its process's rows of the global batch through its own methods (what
    the backbone calls): a built scheme told layer 1 draws what a model's layer 1 draws, rank r of W draws rows
    r, r + W, … of the whole batch's draw, and a scheme without random increments accepts both and ignores them."""
    from accrot.model import ModelConfig, Transformer

    cfg = SchemeConfig(rotation="accum", increments="random_position", seed=4, window=20)
    tokens = torch.randint(0, 256, (6, 300), generator=torch.Generator().manual_seed(2))
    x = torch.zeros(6, 300, DM)
    model = Transformer(ModelConfig(d_model=DM, n_layers=2, n_heads=H, scheme=cfg)).eval()
    scheme = build(cfg, DM, H).eval()
    assert not torch.equal(scheme.angles(x, tokens), model.schemes()[1].angles(x, tokens))  # stream 0 until told
    scheme.set_stream(1)
    assert torch.equal(scheme.angles(x, tokens), model.schemes()[1].angles(x, tokens))
    whole = build(cfg, DM, H).train()
    full = whole.angles(x, tokens)  # [6, H, T, P]
    for rank in range(3):
        part = build(cfg, DM, H).train()
        part.set_data_shard(rank, 3)
        assert torch.equal(part.angles(x[rank::3], tokens[rank::3]), full[rank::3])
    for plain in (SchemeConfig(rotation="rope"), SchemeConfig(rotation="path"), SchemeConfig(rotation="none")):
        other = build(plain, DM, H)
        other.set_stream(3)
        other.set_data_shard(1, 2)


def test_scheme_seed_follows_the_run_seed(tmp_path):
    """``accrot fit --seed_everything=N``: the scheme's seed (unset) becomes N, recorded in the run's hparams, so a
    sweep's seeds are independent realisations of the random increments; an explicit scheme seed is kept."""
    import json

    from accrot.cli import main

    for name, seed, extra, expect in (("s3", 3, [], 3), ("s4", 4, [], 4), ("x", 3, ["--model.scheme.seed=11"], 11)):
        rc = main(["fit", "--config", "tiny", f"--seed_everything={seed}", "--model.scheme.rotation=accum",
                   "--model.scheme.increments=random_token", "--trainer.fast_dev_run=true", f"--root={tmp_path}",
                   f"--name={name}", "--extrapolation.multipliers=[1]", "--trainer.limit_val_batches=1",
                   "--data.init_args.batch_size=2", "--trainer.enable_progress_bar=false", "--wandb=disabled",
                   "--extrapolation.budget_tokens=1024", *extra])
        assert rc == 0
        (run,) = list((tmp_path / name).glob("version_*"))
        assert json.loads((run / "run.json").read_text())["hparams"]["scheme"]["seed"] == expect


# -- random increments on an accelerator: drawn on the device, cached there -----------------------------------
def random_source(family="gaussian", seed=3, mean="zero") -> RandomPositionIncrements:
    cfg = SchemeConfig(rotation="accum", increments="random_position", increment_family=family, seed=seed,
                       increment_mean=mean, sigma=0.4)
    scheme = build(cfg, DM, H).train()
    return scheme.rotation.source


@pytest.mark.parametrize("family", ["gaussian", "uniform"])
def test_device_training_draw_is_the_counter_stream(family):
    """The accelerator's training draw, computed here on CPU tensors: element (b, h, t, p) is μ_p + σ_p·z with z
    the reference SplitMix64 draw of counter ((b·H + h)·T + t)·P + p under the draw's key."""
    source = random_source(family, mean="rope")
    B, T, P = 2, 5, D // 2
    key = source.next_key()
    delta = source.counter_draw(key, B, T, "cpu")  # [B, H, T, P]
    assert delta.shape == (B, H, T, P) and delta.dtype == torch.float32
    mean, sigma = increment_distribution(source.cfg, D)
    ref_fn = naive_standard_normal if family == "gaussian" else naive_standard_uniform
    for b, h, t, p in [(0, 0, 0, 0), (1, 1, 4, 3), (0, 1, 2, 1), (1, 0, 3, 2)]:
        z = torch.tensor(ref_fn(key, ((b * H + h) * T + t) * P + p), dtype=torch.float64).float()
        expect = (mean[p] + sigma[p] * z.double()).float()
        assert float(delta[b, h, t, p]) == pytest.approx(float(expect), rel=1e-6, abs=1e-7)
    assert source.draws == 1 and not torch.equal(delta, source.counter_draw(source.next_key(), B, T, "cpu"))


def test_device_training_draw_shards_the_global_batch_and_resumes():
    """Rank r of W computes rows r, r + W, … of the global draw (and nothing else); the draw count in the state
    dict replays the stream after a restart; the global RNG plays no part."""
    whole = random_source()
    key = whole.next_key()
    full = whole.counter_draw(key, 6, 9, "cpu")  # [6, H, 9, P]
    for rank in range(3):
        part = random_source()
        part.set_shard(rank, 3)
        assert torch.equal(part.counter_draw(key, 2, 9, "cpu"), full[rank::3])
    state = whole.get_extra_state()
    torch.manual_seed(99)
    first = whole.counter_draw(whole.next_key(), 2, 9, "cpu")
    whole.set_extra_state(state)
    assert torch.equal(whole.counter_draw(whole.next_key(), 2, 9, "cpu"), first)


def test_an_accelerator_forward_draws_on_the_device_of_x():
    """Training on a non-CPU device takes the counter path where x lives (meta here: shapes only), never a CPU
    generator and a copy; each forward is one draw of the stream."""
    source = random_source()
    x, tokens = torch.empty(2, 7, DM, device="meta"), torch.empty(2, 7, dtype=torch.long, device="meta")
    delta = source(x, tokens)
    assert delta.device.type == "meta" and delta.shape == (2, H, 7, D // 2) and source.draws == 1


def test_fixed_increments_are_cached_per_device():
    """Evaluation (and resample=False) increments are drawn once and served from a per-device cache: no new
    draw, no copy to the device, and a longer length extends the same values."""
    scheme = build(SchemeConfig(rotation="accum", increments="random_position", seed=5), DM, H).eval()
    x = torch.zeros(1, 1, DM)
    short = scheme.rotation.increments(x, torch.zeros(1, 40, dtype=torch.long))
    again = scheme.rotation.increments(x, torch.zeros(1, 40, dtype=torch.long))
    assert again.data_ptr() == short.data_ptr()  # served from the cache
    longer = scheme.rotation.increments(x, torch.zeros(1, POSITION_CHUNK + 9, dtype=torch.long))
    assert torch.equal(longer[:, :, :40], short)
    fresh = build(SchemeConfig(rotation="accum", increments="random_position", seed=5), DM, H).eval()
    assert torch.equal(fresh.rotation.source.fixed_chunks(0, 2).permute(1, 0, 2, 3).reshape(1, H, -1, D // 2)
                       [:, :, : POSITION_CHUNK + 9], longer)  # the same draws as before the cache


@pytest.mark.parametrize("device", DEVICES)
def test_random_token_ids_are_checked_once_per_accelerator(device, monkeypatch):
    """The token-id check costs an accelerator a device sync, so it runs on its first batch only (a bad id on it
    still fails with the one line); on the CPU, where it is free, it runs every time."""
    scheme = build(SchemeConfig(rotation="accum", increments="random_token", vocab_size=300), DM, H).to(device)
    source = scheme.rotation.source
    with pytest.raises(ValueError, match="vocab_size=300"):
        source(torch.zeros(1, 2, DM, device=device), torch.tensor([[3, 300]], device=device))
    calls = []
    real = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda t: calls.append(t.device.type) or real(t))
    for _ in range(3):
        source(torch.zeros(1, 3, DM, device=device), torch.tensor([[1, 2, 3]], device=device))
    assert calls == (["cpu"] * 3 if device == "cpu" else [device])


@pytest.mark.gpu
@CUDA
def test_cuda_training_draws_equal_the_counter_stream_and_fixed_draws_equal_the_cpus():
    """On CUDA: the training draw equals the counter stream computed on the CPU (to one float32 ulp on the rare
    element where the float64 libraries differ), and evaluation draws equal the CPU's exactly."""
    cfg = SchemeConfig(rotation="accum", increments="random_position", seed=4, sigma=0.3)
    cpu = build(cfg, DM, H).train()
    gpu = copy.deepcopy(cpu).cuda()
    x, tokens = torch.zeros(3, 50, DM), torch.zeros(3, 50, dtype=torch.long)
    got = gpu.rotation.increments(x.cuda(), tokens.cuda()).cpu()
    expect = cpu.rotation.source.counter_draw(cpu.rotation.source.next_key(), 3, 50, "cpu")
    ulp = torch.finfo(torch.float32).eps * expect.abs().clamp_min(1e-30)
    assert bool(((got - expect).abs() <= 2 * ulp).all())
    cpu.eval(), gpu.eval()
    long = torch.zeros(1, 3 * POSITION_CHUNK, dtype=torch.long)
    assert torch.equal(gpu.angles(x[:1].cuda(), long.cuda()).cpu(), cpu.angles(x[:1], long))
    assert torch.equal(gpu.rotation.increments(x[:1].cuda(), long.cuda()).cpu(), cpu.rotation.increments(x[:1], long))

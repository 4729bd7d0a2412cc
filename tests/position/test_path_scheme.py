"""The PaTH scheme module (accrot/position/path.py): what it exposes (w, β), its precision under autocast, its
causality, its attention and the configurations it rejects."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from accrot.ops.path import path_attention
from accrot.position import ROTATIONS, ConfigError, SchemeConfig, build
from accrot.position.base import RotationPart
from tests.helpers.tolerance import assert_close

B, T, D_MODEL, N_HEADS = 2, 23, 32, 2
HEAD_DIM = D_MODEL // N_HEADS


@pytest.fixture(autouse=True)
def _seed_and_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


def layer_inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, N_HEADS, T, HEAD_DIM, generator=g) for _ in range(3))  # [B, H, T, D]
    x = torch.randn(B, T, D_MODEL, generator=g)  # [B, T, d_model]
    tokens = torch.randint(0, 256, (B, T), generator=g)  # [B, T]
    return q, k, v, x, tokens


VARIANTS = {
    "reference": {},
    "plain": {"path_rank": 0, "conv_size": 0, "learned_init_std": None},
    "rank4-conv3": {"path_rank": 4, "conv_size": 3},
    "conv1-beta0.5": {"conv_size": 1, "beta_max": 0.5},
    "contract": {"beta_max": 1.0},
    "reflection": {"path_beta": "reflection"},
}


@pytest.mark.parametrize("options", list(VARIANTS.values()), ids=list(VARIANTS))
def test_householder_shapes_unit_rows_and_beta_range(options):
    scheme = build(SchemeConfig(rotation="path", **options), D_MODEL, N_HEADS).eval()
    _, _, _, x, tokens = layer_inputs()
    w, beta = scheme.householder(x, tokens)
    assert w.shape == (B, N_HEADS, T, HEAD_DIM) and beta.shape == (B, N_HEADS, T)
    assert w.dtype == beta.dtype == torch.float32
    assert torch.allclose(w.norm(dim=-1), torch.ones(()), atol=1e-6)
    beta_max = options.get("beta_max", 2.0)
    assert beta.min() > 0 and beta.max() <= beta_max
    w2, beta2 = scheme.householder(x, tokens)  # deterministic: what the forward used is what is exposed
    assert torch.equal(w, w2) and torch.equal(beta, beta2)


def test_registered_as_path_rotation():
    scheme = build(SchemeConfig(rotation="path"), D_MODEL, N_HEADS)
    assert ROTATIONS["path"] is type(scheme.rotation)
    assert isinstance(scheme.rotation, RotationPart) and scheme.rotation.kind == "path"
    info = scheme.describe()
    assert info["rotation"] == "path" and info["beta_max"] == 2.0 and info["chunk_size"] == 32


def test_low_rank_has_a_bottleneck():
    full = build(SchemeConfig(rotation="path", path_rank=0), D_MODEL, N_HEADS)
    low = build(SchemeConfig(rotation="path", path_rank=4), D_MODEL, N_HEADS)
    count = lambda m: sum(p.numel() for p in m.rotation.w_proj.parameters())  # noqa: E731
    assert count(full) == D_MODEL * D_MODEL and count(low) == 4 * D_MODEL * 2


def test_defaults_are_fla_path_attention():
    """The default layer is fla's PaTHAttention: w through a rank-32 bottleneck without bias, a width-3 depthwise
    convolution without bias, β's projection with a bias; every weight N(0, 0.02) and the bias 0, so β ≈ 1 at init."""
    torch.manual_seed(0)
    d_model, heads = 256, 4
    rot = build(SchemeConfig(rotation="path"), d_model, heads).rotation
    down, up = rot.w_proj
    assert (down.in_features, down.out_features, up.out_features) == (d_model, 32, d_model)
    assert down.bias is None and up.bias is None and rot.w_conv.bias is None
    assert rot.w_conv.kernel_size == (3,) and rot.w_conv.groups == d_model
    for weight in (down.weight, up.weight, rot.w_conv.weight, rot.beta_proj.weight):
        assert weight.std().item() == pytest.approx(0.02, rel=0.15)
    assert torch.equal(rot.beta_proj.bias, torch.zeros(heads))
    x = torch.randn(2, 40, d_model)
    _, beta = rot.householder(x, torch.zeros(2, 40, dtype=torch.long))
    assert abs(beta.mean().item() - 1) < 0.05 and beta.std().item() < 0.25  # 2·sigmoid(N(0, 0.32²)) at RMS-1 x
    plain = build(SchemeConfig(rotation="path", path_rank=0, conv_size=0, learned_init_std=None), d_model, heads)
    assert isinstance(plain.rotation.w_proj, torch.nn.Linear) and plain.rotation.w_conv is None


def test_householder_is_fla_short_convolution_then_l2_norm():
    """An independent twin of the default w, β in float64 (fla's ShortConvolution as its CPU fallback writes it:
    an ``nn.Conv1d`` padded by K − 1 on both sides, cut to the first T outputs, then SiLU), outputs and gradients."""
    scheme = build(SchemeConfig(rotation="path", learned_init_std=0.3), D_MODEL, N_HEADS).double()
    rot = scheme.rotation
    _, _, _, x, tokens = layer_inputs()
    x = x.double().requires_grad_()
    w, beta = rot.householder(x, tokens)
    down, up = rot.w_proj
    pre = up(down(x)).transpose(1, 2)  # [B, H·D, T]
    conv = torch.nn.functional.conv1d(pre, rot.w_conv.weight, padding=2, groups=D_MODEL)[..., :T]
    ref_w = torch.nn.functional.silu(conv).transpose(1, 2).unflatten(-1, (N_HEADS, HEAD_DIM))  # [B, T, H, D]
    ref_w = (ref_w / ref_w.norm(dim=-1, keepdim=True)).transpose(1, 2)  # [B, H, T, D]
    ref_beta = 2 * torch.sigmoid(rot.beta_proj(x)).transpose(1, 2)  # [B, H, T]
    assert_close(ref_w, w, 1e-12) and assert_close(ref_beta, beta, 1e-12)
    g_w, g_b = torch.randn_like(w), torch.randn_like(beta)
    params = [x, down.weight, up.weight, rot.w_conv.weight, rot.beta_proj.weight, rot.beta_proj.bias]
    ref = torch.autograd.grad((ref_w * g_w).sum() + (ref_beta * g_b).sum(), params)
    got = torch.autograd.grad((w * g_w).sum() + (beta * g_b).sum(), params)
    for name, a, b in zip("x down up conv beta_w beta_b".split(), ref, got):
        assert_close(a, b, 1e-12, name)


def test_householder_stays_float32_under_bf16_autocast():
    scheme = build(SchemeConfig(rotation="path", path_rank=4, conv_size=3), D_MODEL, N_HEADS).eval()
    _, _, _, x, tokens = layer_inputs()
    w, beta = scheme.householder(x, tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        w_ac, beta_ac = scheme.householder(x, tokens)
        w_bf, beta_bf = scheme.householder(x.bfloat16(), tokens)  # a bf16 residual stream
    assert w_ac.dtype == beta_ac.dtype == w_bf.dtype == beta_bf.dtype == torch.float32
    assert torch.equal(w_ac, w) and torch.equal(beta_ac, beta)
    assert torch.allclose(w_bf.norm(dim=-1), torch.ones(()), atol=1e-6)


def test_float64_model_stays_float64():
    scheme = build(SchemeConfig(rotation="path", conv_size=2), D_MODEL, N_HEADS).double()
    _, _, _, x, tokens = layer_inputs()
    w, beta = scheme.householder(x.double(), tokens)
    assert w.dtype == beta.dtype == torch.float64


def test_householder_is_causal():
    """The short convolution only looks back: changing x_t leaves w_j, β_j for j < t untouched."""
    scheme = build(SchemeConfig(rotation="path", path_rank=4, conv_size=4), D_MODEL, N_HEADS).eval()
    _, _, _, x, tokens = layer_inputs()
    w, beta = scheme.householder(x, tokens)
    x2 = x.clone()
    x2[:, 10] += 1.0
    w2, beta2 = scheme.householder(x2, tokens)
    assert torch.equal(w2[:, :, :10], w[:, :, :10]) and torch.equal(beta2[:, :, :10], beta[:, :, :10])
    assert not torch.allclose(w2[:, :, 10:14], w[:, :, 10:14])


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
@pytest.mark.parametrize("far_mass, beta", [("none", "learned"), ("forget", "learned"), ("none", "reflection"),
                                            ("forget", "reflection")])
def test_forward_is_path_attention_of_the_exposed_quantities(far_mass, beta, device):
    """The scheme's forward is the chunked kernel of its own w, β (and log f); on CUDA the same module on the GPU
    against the float64 recurrence twin on the CPU, outputs and the gradients of q, k, v, x."""
    cfg = SchemeConfig(rotation="path", far_mass=far_mass, path_rank=4, conv_size=3, chunk_size=8, path_beta=beta)
    scheme = build(cfg, D_MODEL, N_HEADS).eval()
    if device != "cpu":
        scheme = scheme.to(device)
    q, k, v, x, tokens = (t.to(device) for t in layer_inputs())
    for t in (q, k, v, x):
        t.requires_grad_()
    out = scheme(q, k, v, x, tokens)
    w, beta = scheme.householder(x, tokens)
    log_f = None if far_mass == "none" else scheme.log_decay(x, tokens)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device.type == device
    assert torch.equal(out, path_attention(q, k, v, w, beta, log_f, chunk_size=8))
    recurrent = build(dataclasses.replace(cfg, path_kernel="recurrent"), D_MODEL, N_HEADS).double()
    recurrent.load_state_dict(scheme.state_dict())
    twin_in = [t.detach().cpu().double().requires_grad_() for t in (q, k, v, x)]
    ref = recurrent(*twin_in, tokens.cpu())  # float64 on the CPU
    assert_close(ref, out, 1e-5)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    fast_grads = torch.autograd.grad(out, (q, k, v, x), g.to(device, out.dtype))
    for name, a, b in zip("q k v x".split(), torch.autograd.grad(ref, twin_in, g), fast_grads):
        assert_close(a, b, 1e-4, name)


def test_reflection_cell_reflects_every_token_and_keeps_norms():
    """path_beta='reflection': β = 2 for every token and no β projection, so each factor I − 2 w wᵀ is orthogonal
    (the transport keeps |k_s| at every distance), where the learned β (about 1 at init) contracts; β ∈ (0, 1)
    (beta_max=1) contracts along w with no negative eigenvalue."""
    _, _, _, x, tokens = layer_inputs()
    reflect = build(SchemeConfig(rotation="path", path_beta="reflection"), D_MODEL, N_HEADS).double().eval()
    learned = build(SchemeConfig(rotation="path"), D_MODEL, N_HEADS).double().eval()
    assert reflect.rotation.beta_proj is None and torch.equal(reflect.householder(x.double(), tokens)[1],
                                                              torch.full((B, N_HEADS, T), 2.0, dtype=torch.float64))
    n_params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n_params(learned) - n_params(reflect) == D_MODEL * N_HEADS + N_HEADS  # only the β projection is gone

    def transported_norms(scheme):
        w, beta = scheme.householder(x.double(), tokens)  # [B, H, T, D], [B, H, T]
        k = torch.randn(B, N_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        norms = []
        for t in range(T):  # k_0 carried through H_1 ... H_t
            if t:
                k = k - beta[:, :, t, None] * (w[:, :, t] * k).sum(-1, keepdim=True) * w[:, :, t]
            norms.append(k.norm(dim=-1))
        return torch.stack(norms, -1)  # [B, H, T]

    kept = transported_norms(reflect)
    assert torch.allclose(kept, kept[..., :1].expand_as(kept), rtol=1e-12)
    assert bool((transported_norms(learned)[..., -1] < kept[..., -1]).all())  # learned β ≈ 1 at init: contracts
    contract = build(SchemeConfig(rotation="path", beta_max=1.0), D_MODEL, N_HEADS).eval()
    beta = contract.householder(x, tokens)[1]
    assert beta.min() > 0 and beta.max() < 1  # eigenvalue 1 − β along w stays in (0, 1): never a sign flip


def test_gradients_reach_every_parameter():
    cfg = SchemeConfig(rotation="path", path_rank=4, conv_size=3, chunk_size=8)
    scheme = build(cfg, D_MODEL, N_HEADS)
    q, k, v, x, tokens = layer_inputs()
    q.requires_grad_(True)
    scheme(q, k, v, x, tokens).square().sum().backward()
    for name, p in scheme.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_bf16_autocast_forward():
    scheme = build(SchemeConfig(rotation="path", chunk_size=8), D_MODEL, N_HEADS).eval()
    q, k, v, x, tokens = layer_inputs()
    ref = scheme(q, k, v, x, tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = scheme(q.bfloat16(), k.bfloat16(), v.bfloat16(), x, tokens)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert_close(ref, out.float(), 2e-2)


def test_angles_is_not_defined_for_path():
    scheme = build(SchemeConfig(rotation="path"), D_MODEL, N_HEADS)
    _, _, _, x, tokens = layer_inputs()
    with pytest.raises(ConfigError, match="angles"):
        scheme.angles(x, tokens)


@pytest.mark.parametrize(
    "options, field",
    [
        pytest.param({"rotate_values": True}, "rotate_values", id="rotate_values"),
        pytest.param({"chunk_size": 0}, "chunk_size", id="chunk_size-0"),
        pytest.param({"chunk_size": -4}, "chunk_size", id="chunk_size-neg"),
        pytest.param({"chunk_size": 2.5}, "chunk_size", id="chunk_size-float"),
        pytest.param({"beta_max": 0.0}, "beta_max", id="beta_max-0"),
        pytest.param({"beta_max": 2.5}, "beta_max", id="beta_max-2.5"),
        pytest.param({"path_rank": -1}, "path_rank", id="path_rank-neg"),
        pytest.param({"path_kernel": "triton"}, "path_kernel", id="path_kernel"),
        pytest.param({"conv_size": -1}, "conv_size", id="conv_size-neg"),
        pytest.param({"path_beta": "fixed"}, "path_beta", id="path_beta"),
        pytest.param({"path_beta": "reflection", "beta_max": 1.0}, "beta_max", id="beta_max-with-reflection"),
    ],
)
def test_bad_configs_fail_at_construction(options, field):
    with pytest.raises(ConfigError, match=field):
        SchemeConfig(rotation="path", **options)

"""Theory diagnostics (T1–T5 of accrot/study/CLAIMS.md) against what the math predicts: coherence = |E[e^{iδ}]|^Δ for i.i.d.
increments and ≡ 1 for NoPE, far mass (t − W)/(t + 1) for flat NoPE logits and ALiBi's closed form, value
transport shrinking coherent far contributions; ``accrot diagnose`` end to end on a real checkpoint."""

from __future__ import annotations

import json
import math

import pytest
import torch

from accrot.cli import main
from accrot.diagnostics import (
    attention_rows,
    coherence_curve,
    diagnose,
    far_mass,
    layer_inputs,
    mixing_window_measured,
    predicted_coherence,
    scheme_coherence,
    value_far_norm,
)
from accrot.errors import UsageError
from accrot.model import Transformer
from accrot.ops.rotary import rotate_pairs
from accrot.position import SchemeConfig, build
from accrot.position.alibi import alibi_slopes
from accrot.run.diagnose import main as diagnose_main
from tests.conftest import tiny_model
from tests.helpers.tolerance import assert_close


@pytest.fixture(autouse=True)
def _one_thread():
    """Small tensor ops: one intra-op thread is fastest, and steady when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(**scheme) -> Transformer:
    """The tests' tiny model in eval mode, its weights from the generator as the test left it."""
    return tiny_model(seed=None, **scheme).eval()


def random_inputs(H: int, D: int, T: int, B: int = 1, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, D, generator=gen) for _ in range(2))
    return q, k, torch.zeros(B, T, H * D), torch.zeros(B, T, dtype=torch.long)


# -- coherence (T1, T2) ------------------------------------------------------------------------------------------
def test_coherence_follows_iid_prediction_for_random_position_increments():
    """c(Δ) = |E[e^{iδ}]|^Δ, within 10 % at every Δ of the window, per head. ε = 0.25 keeps the Monte-Carlo error
    (one fixed draw of increments per position) well under 10 % of the smallest predicted value, 0.25."""
    W, eps, H, D, T = 16, 0.25, 4, 16, 1 << 16
    scheme = build(SchemeConfig(rotation="accum", increments="random_position", window=W, window_eps=eps), H * D, H)
    scheme.eval()
    dist = list(range(W + 1))
    measured = scheme_coherence(scheme, *random_inputs(H, D, T), dist, max_queries=None)  # [H, W+1]
    predicted = predicted_coherence(scheme, dist)
    phi = scheme.describe()["increment_char_fn"][0]
    assert predicted[0, -1].item() == pytest.approx(eps) and predicted[0, 1].item() == pytest.approx(phi)
    rel = (measured - predicted).abs() / predicted
    assert rel.max() < 0.1, rel
    long = list(range(3 * W))
    m_long = scheme_coherence(scheme, *random_inputs(H, D, T, seed=1), long, max_queries=None)
    w_meas = mixing_window_measured(m_long, long, eps)
    w_pred = mixing_window_measured(predicted_coherence(scheme, long), long, eps)
    assert (w_meas - w_pred).abs().max() <= 2, (w_meas, w_pred)


@pytest.mark.parametrize("mean,spread", [("rope", "constant"), ("zero", "ladder"), ("rope", "ladder")],
                         ids=["rope-mean", "ladder", "rope-mean-ladder"])
def test_coherence_with_drift_or_ladder_follows_isotropic_prediction(mean, spread):
    """mean_i |φ_i|^Δ cos(Δ μ_i) for isotropic q, k."""
    H, D, T = 4, 16, 1 << 15
    cfg = SchemeConfig(rotation="accum", window=16, window_eps=0.25, increment_mean=mean, increment_spread=spread)
    scheme = build(cfg, H * D, H).eval()
    dist = list(range(0, 33, 2))
    measured = scheme_coherence(scheme, *random_inputs(H, D, T), dist, max_queries=None)
    assert (measured - predicted_coherence(scheme, dist)).abs().max() < 0.04


@pytest.mark.parametrize("scheme", [dict(rotation="none"), dict(rotation="none", far_mass="alibi")],
                         ids=["nope", "alibi"])
def test_coherence_without_rotation_is_exactly_one(scheme):
    model = tiny(**scheme)
    dist = [0, 1, 5, 20, 47]
    curves = coherence_curve(model, torch.randint(0, 256, (3, 48)), dist, max_queries=None)
    assert sorted(curves) == [0, 1]
    for curve in curves.values():
        assert curve.shape == (4, len(dist))
        torch.testing.assert_close(curve, torch.ones_like(curve), rtol=1e-12, atol=1e-12)
    assert torch.equal(predicted_coherence(model.schemes()[0], dist), torch.ones(4, len(dist), dtype=torch.float64))
    assert mixing_window_measured(curves[0], dist).isinf().all()


def test_path_with_vanishing_beta_is_coherent_and_model_level_matches_scheme_level():
    """β → 0 makes every H_j = I (PaTH = NoPE): c ≡ 1; and coherence_curve is the per-layer scheme_coherence."""
    model = tiny(rotation="path", chunk_size=8)
    tokens = torch.randint(0, 256, (2, 40))
    dist = [0, 1, 3, 17, 39]
    curves = coherence_curve(model, tokens, dist, max_queries=None)
    with torch.no_grad():
        for i, li in enumerate(layer_inputs(model, tokens)):
            torch.testing.assert_close(curves[i], scheme_coherence(li.scheme, li.q, li.k, li.x, li.tokens, dist, None))
        # β ≈ 1 at initialisation: the transport contracts (averaged over heads: one head's estimate on 80 tokens
        # can sit above 1 by its noise)
        assert curves[0][:, 1:3].mean(0).lt(0.95).all()
        for scheme in model.schemes():
            scheme.rotation.beta_proj.bias.fill_(-60.0)  # β = 2·sigmoid(−60) ≈ 1e−26
    curves = coherence_curve(model, tokens, dist, max_queries=None)
    for curve in curves.values():
        torch.testing.assert_close(curve, torch.ones_like(curve), rtol=1e-6, atol=1e-6)


def test_mixing_window_measured_first_and_sustained():
    dist = [0, 1, 2, 3, 4, 5]
    curve = torch.tensor([[1.0, 0.5, 0.01, 0.2, 0.01, 0.0], [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]])
    assert mixing_window_measured(curve, dist, 0.05).tolist() == [2.0, math.inf]
    assert mixing_window_measured(curve, dist, 0.05, sustained=True).tolist() == [4.0, math.inf]
    with pytest.raises(ValueError, match="distances"):
        mixing_window_measured(curve, dist[:3])


# -- attention rows, far mass (T3), values (T4) ---------------------------------------------------------------------
SCHEMES = {
    "nope": dict(rotation="none"),
    "rope": dict(rotation="rope"),
    "accum-values": dict(rotation="accum", rotate_values=True),
    "learned-forget": dict(rotation="accum", increments="learned", learned_init_std=0.5, far_mass="forget"),
    "token-alibi-values": dict(rotation="accum", increments="random_token", far_mass="alibi", rotate_values=True),
    "path": dict(rotation="path", chunk_size=16),
    "path-fox": dict(rotation="path", far_mass="forget", beta_max=1.5, chunk_size=16),
    "ssmax": dict(rotation="none", far_mass="ssmax", ssmax_init=1.3),
    "learned-ssmax-values": dict(rotation="accum", increments="learned", learned_init_std=0.5, far_mass="ssmax",
                                 ssmax_init=0.8, rotate_values=True),
    "path-ssmax": dict(rotation="path", far_mass="ssmax", chunk_size=16),
    "rope-values-gate": dict(rotation="rope", rotate_values=True, output_gate="elementwise"),
    "path-fox-headgate": dict(rotation="path", far_mass="forget", chunk_size=16, output_gate="headwise"),
}


@pytest.mark.parametrize("name", list(SCHEMES))
def test_attention_rows_reproduce_the_scheme_forward(name):
    """The probabilities the diagnostics use, applied to (transported) values and times the output gate, give the
    kernel's output (ssmax: the rows carry its factor s_h·log(t + 1); a gate leaves the rows as they are)."""
    H, D, T, B = 2, 8, 37, 2
    scheme = build(SchemeConfig(**SCHEMES[name], block_size=8), H * D, H).eval()
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
    x, tokens = torch.randn(B, T, H * D, generator=gen), torch.randint(0, 256, (B, T), generator=gen)
    with torch.no_grad():
        if scheme.gate is not None:
            scheme.gate.proj.weight.normal_(std=0.5)
        ref = scheme(q, k, v, x, tokens)
        a = attention_rows(scheme, q, k, x, tokens, torch.arange(T))  # [B, H, T, T]
        if scheme.cfg.rotate_values:
            theta = scheme.angles(x, tokens)
            out = rotate_pairs(a @ rotate_pairs(v, -theta), theta)
        else:
            out = a @ v
        out = out * scheme.output_gate(x, tokens)
    assert torch.allclose(a.sum(-1), torch.ones(B, H, T), atol=1e-5)
    assert_close(ref, out, 1e-5)


def test_far_mass_grows_for_nope_and_stays_bounded_for_alibi():
    """Random init gives near-flat logits: NoPE's far mass is (t − W)/(t + 1), ALiBi's is Σ_{d>W} e^{−md}/Σ_d e^{−md}."""
    W, nq, lengths = 16, 32, (64, 256, 1024)
    torch.manual_seed(0)
    blocks = {n: torch.randint(0, 256, (2, n)) for n in lengths}
    nope = far_mass(tiny(rotation="none"), blocks, W, n_queries=nq)
    alibi = far_mass(tiny(rotation="none", far_mass="alibi"), blocks, W, n_queries=nq)
    slopes = torch.tensor(alibi_slopes(4), dtype=torch.float64)
    for n in lengths:
        t = torch.arange(n - nq, n, dtype=torch.float64)
        flat = ((t - W) / (t + 1)).mean()
        d = torch.arange(n, dtype=torch.float64)
        w = torch.exp(-slopes[:, None, None] * d)  # [H, 1, n]
        visible = (d <= t[:, None]).double()  # [nq, n]
        closed = ((w * visible * (d > W)).sum(-1) / (w * visible).sum(-1)).mean(-1)  # [H]
        for layer in (0, 1):
            assert nope[layer][n].shape == (4,)
            assert (nope[layer][n] - flat).abs().max() < 0.02
            assert (alibi[layer][n] - closed).abs().max() < 0.02
    for layer in (0, 1):
        assert (nope[layer][256] > nope[layer][64] + 0.1).all() and (nope[layer][1024] > nope[layer][256] + 0.02).all()
        bound = torch.exp(-slopes * W)  # the far mass of an infinitely long context
        assert (alibi[layer][1024] < bound + 0.02).all()
        assert (alibi[layer][1024] - alibi[layer][256])[:2].abs().max() < 1e-3  # steep heads: already saturated
        assert alibi[layer][1024][0] < 0.05 < nope[layer][64].min()


def test_far_mass_of_scalable_softmax_follows_its_closed_form():
    """Known truth: keys s ≥ T − 48 score z, all others 0 (q_t = e_1, k_s = z·√D·e_1). Row t's weights are
    e^{c_t·z} on those keys and 1 elsewhere, c_t = s_h·log(t + 1) (ssmax) or 1 (softmax), so the far mass
    (t − s > W) of the last queries has a closed form; ssmax puts less of it far than softmax does."""
    from accrot.diagnostics import scheme_far_sums

    H, D, T, W, nq, z = 2, 8, 512, 16, 32, 1.0
    q = torch.zeros(1, H, T, D)
    q[..., 0] = 1.0
    k = torch.zeros(1, H, T, D)
    k[:, :, T - 48 :, 0] = z * math.sqrt(D)
    x, tokens = torch.zeros(1, T, H * D), torch.zeros(1, T, dtype=torch.long)
    t = torch.arange(T - nq, T, dtype=torch.float64)[:, None]  # [nq, 1] the last queries
    s = torch.arange(T, dtype=torch.float64)[None, :]  # [1, T]
    marked, visible, far = (s >= T - 48).double(), (s <= t).double(), (t - s > W).double()

    def closed(c):  # [H, nq] factor per head and row -> [H] mean far mass
        w = torch.exp(c[..., None] * z * marked) * visible  # [H, nq, T]
        return ((w * far).sum(-1) / w.sum(-1)).mean(-1)

    measured = {}
    for kind, slopes in (("none", [1.0, 1.0]), ("ssmax", [0.5, 1.5])):
        scheme = build(SchemeConfig(far_mass=kind), H * D, H).eval()
        if kind == "ssmax":
            with torch.no_grad():
                scheme.far_mass.s.copy_(torch.tensor(slopes))
            c = torch.tensor(slopes, dtype=torch.float64)[:, None] * torch.log(t[:, 0] + 1)[None, :]
        else:
            c = torch.ones(H, nq, dtype=torch.float64)
        with torch.no_grad():
            sums = scheme_far_sums(scheme, q, k, torch.zeros_like(q), x, tokens, W, n_queries=nq)
        measured[kind] = sums["far_mass"] / sums["far_rows"]
        torch.testing.assert_close(measured[kind], closed(c), rtol=1e-5, atol=1e-7)
    assert (measured["ssmax"] < measured["none"]).all()  # c_t = s·log(t + 1) > 1 for both heads at t ≈ 500


def test_value_rotation_makes_coherent_far_values_incoherent():
    """Values with a shared component (two tokens): unrotated far sums add up linearly, rotated ones like a random
    walk (≈ √(Σ a²‖v‖²))."""
    torch.manual_seed(0)
    model = tiny(rotation="accum", increments="random_position", window=8, rotate_values=True)
    tokens = torch.tensor([3, 7])[torch.randint(0, 2, (2, 512))]
    norms = value_far_norm(model, tokens, window=16)
    assert sorted(norms) == [0, 1]
    for layer in norms.values():
        assert (layer["rotated"] < 0.5 * layer["unrotated"]).all(), layer
        assert (layer["rotated"] < 3 * layer["incoherent"]).all() and (layer["incoherent"] > 0).all()
    assert value_far_norm(tiny(rotation="path", chunk_size=16), tokens[:, :64], window=16) == {}


def test_diagnose_bundle_is_json_and_consistent():
    model = tiny(rotation="accum", rotate_values=True)
    blocks = {n: torch.randint(0, 256, (2, n + 1)) for n in (64, 256)}
    result = diagnose(model, blocks, train_length=64, eps=0.05)
    doc = json.loads(json.dumps(result, allow_nan=False))  # strict JSON: no NaN / Infinity
    assert doc["lengths"] == [64, 256] and doc["far_window"] == 16 and doc["prediction"] == "exact"
    assert doc["scheme"]["rotation"] == "accum" and "mixing_window" in doc["scheme"]
    for layer in doc["layers"]:
        assert [c["length"] for c in layer["coherence"]] == [64, 256]
        for c in layer["coherence"]:
            assert len(c["curve"]) == 4 and len(c["curve"][0]) == len(c["distances"]) and len(c["window"]) == 4
            assert c["curve"][0][0] == pytest.approx(1.0) and c["stderr"][0][0] == pytest.approx(0.0, abs=1e-6)
            assert max(c["distances"]) <= 7 * c["length"] // 8
            # from the reference length (the one nearest 8× L: 256) on, also fitted over 1 ≤ Δ ≤ 7/8 of it; at the
            # reference itself that is its own range, so the same window
            assert ("window_common" in c) == (c["length"] >= 256)
            if c["length"] == 256:
                assert c["common_range"] == [1, 224] and c["window_common"] == c["window"]
        assert layer["predicted"]["window"] == pytest.approx([97.0] * 4, abs=1)  # DEFAULT_WINDOW = 96 at ε
        assert [f["length"] for f in layer["far"]] == [64, 256]
        assert all(len(f["mass_blocks"]) == 2 and len(f["mass_blocks"][0]) == 4 for f in layer["far"])
        # the predicted window, 97, capped at 7/8 of L = 64 so that L still has far keys to predict from
        assert layer["far_window"] == [56] * 4 and layer["far_window_source"][0] == "predicted 97; W = 56 (capped at 7L/8)"
        prediction = layer["far_prediction"]
        assert prediction["from_length"] == 64 and prediction["multiples"] == [1.0, 2.0, 4.0]
        assert len(prediction["mass"]) == 3 and all(len(m) == 4 for m in prediction["mass"])
        assert [len(v["rotated"]) for v in layer["value_far_norm"]] == [4, 4]
        # T1's prediction: the transport's own regularity, per head and pair, read on the longest blocks
        assert layer["regularity"]["kind"] == "pairs" and len(layer["regularity"]["mixes"]) == 4
        pairs = layer["regularity"]["pair_window"]
        assert len(pairs) == 4 and len({len(row) for row in pairs}) == 1 and len(pairs[0]) > 0
    assert not model.training


@pytest.mark.parametrize("scheme", [{"rotation": "none"}, {"rotation": "path", "chunk_size": 16},
                                    {"rotation": "accum", "rotate_values": True}], ids=["nope", "path", "accum+v"])
def test_diagnose_bundle_is_the_same_in_several_batches(scheme):
    """Blocks split over several batches (max_batch_tokens, as at the small and paper sizes) give the single
    batch's bundle: far sums add, coherence replicates stack (one per block, or per block and fresh draw). Both
    sum families carry a count of their own, so merging them per layer must not mix them up (it once crashed the
    small ablation). Random increments' fresh draws are keyed by the batch, so only their count is compared."""
    model = tiny(**scheme)
    blocks = {n: torch.randint(0, 256, (4, n + 1), generator=torch.Generator().manual_seed(n)) for n in (64, 128)}
    whole = diagnose(model, blocks, train_length=64, eps=0.05, draws=2)
    split = diagnose(model, blocks, train_length=64, eps=0.05, draws=2, max_batch_tokens=128)  # 2 blocks a batch
    for a, b in zip(whole["layers"], split["layers"]):
        for x, y in zip(a["far"], b["far"]):
            assert x["length"] == y["length"] and x["mass"] == pytest.approx(y["mass"], rel=1e-9, abs=1e-12)
        for x, y in zip(a["coherence"], b["coherence"]):
            assert x["replicates"] == y["replicates"] >= 4
            assert scheme["rotation"] == "accum" or torch.allclose(torch.tensor(x["curve"], dtype=torch.float64),
                                  torch.tensor(y["curve"], dtype=torch.float64), rtol=1e-9, atol=1e-12)


# -- the command ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fitted_run(tmp_path_factory):
    """A 2-step tiny accum fit, with the diagnostics callback attached."""
    root = tmp_path_factory.mktemp("runs")
    rc = main(["fit", "--config", "tiny", "--trainer.max_steps=2", "--model.scheme.rotation=accum", "--wandb=disabled",
               "--trainer.enable_progress_bar=false", "--extrapolation.multipliers=[1]",
               "--extrapolation.budget_tokens=512", f"--root={root}",
               "--trainer.callbacks+=callbacks.diagnostics.DiagnosticsCallback",
               "--trainer.callbacks.multipliers=[1,2]", "--trainer.callbacks.blocks=1"])
    assert rc == 0
    (run_dir,) = list(root.glob("accum-random_position-none/version_*"))  # the default increments
    return run_dir


def test_callback_writes_and_logs(fitted_run):
    doc = json.loads((fitted_run / "diagnostics" / "diagnostics.json").read_text())
    assert doc["step"] == 2 and doc["lengths"] == [128, 256]
    assert (fitted_run / "diagnostics" / "coherence.png").is_file()
    header = (fitted_run / "metrics.csv").read_text().splitlines()[0]
    assert "diag/window@layer0" in header and "diag/far_mass@2x@layer1" in header


def test_diagnose_main_writes_json_and_pngs(fitted_run, tmp_path, capsys):
    out = tmp_path / "diag"
    rc = diagnose_main(["--ckpt", str(fitted_run / "checkpoints" / "last.ckpt"), "--multipliers", "1", "4",
                        "--blocks", "1", f"--out={out}"])
    assert rc == 0
    doc = json.loads((out / "diagnostics.json").read_text())
    assert doc["schema"] == "accrot.diagnostics/2" and doc["train_length"] == 128 and doc["lengths"] == [128, 512]
    assert doc["blocks"] == {"128": 1, "512": 1} and doc["checkpoint"].endswith("last.ckpt")
    assert len(doc["layers"]) == 2 and doc["layers"][0]["predicted"] is not None
    for name in ("coherence.png", "far_mass.png", "value_far_norm.png"):
        assert (out / name).stat().st_size > 0, name
    assert not list(out.glob(".*tmp*"))
    printed = capsys.readouterr().out
    assert "far mass @4×" in printed and "window @1×" in printed


def test_diagnose_main_rejects_bad_input(fitted_run, tmp_path, monkeypatch, capsys):
    with pytest.raises(UsageError, match="--ckpt=.*: no such file or folder"):
        diagnose_main(["--ckpt", str(tmp_path / "missing.ckpt")])
    # through the accrot command: one line, exit status 2
    assert main(["diagnose", "--ckpt", str(tmp_path / "missing.ckpt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("accrot: error: --ckpt=") and "no such file or folder" in err[0]
    assert main(["diagnose", "--ckpt", str(tmp_path / "missing.ckpt"), "--blocks", "two"]) == 2
    ckpt = str(fitted_run / "checkpoints" / "last.ckpt")
    with pytest.raises(UsageError, match="--eps"):
        diagnose_main(["--ckpt", ckpt, "--eps", "1.5"])
    with pytest.raises(UsageError, match="--multipliers"):
        diagnose_main(["--ckpt", ckpt, "--multipliers", "0"])


def test_windows_beyond_the_reference_length_are_also_fitted_over_its_range():
    """At a length past the reference the window is fitted twice: over 7/8 of that length and over the reference's
    1 ≤ Δ ≤ 7/8 range, which is what compares like with like across lengths; the common fit sees no Δ beyond it."""
    from accrot.diagnostics.coherence import replicate_window

    model = tiny(rotation="accum", increments="random_token")
    blocks = {n: torch.randint(0, 256, (3, n + 1), generator=torch.Generator().manual_seed(n)) for n in (8, 64, 256)}
    doc = diagnose(model, blocks, train_length=8, eps=0.05)
    for layer in doc["layers"]:
        entries = {c["length"]: c for c in layer["coherence"]}
        assert "window_common" not in entries[8]
        assert entries[64]["common_range"] == entries[256]["common_range"] == [1, 56]
        assert entries[256]["fit_range"] == [1, 224] and entries[64]["window_common"] == entries[64]["window"]
    # and the cut itself: a curve whose points past the range would move the fit leave the common fit unchanged
    dist = list(range(0, 200))
    num = torch.tensor([[0.97**d if d <= 112 else 0.999 for d in dist]]).expand(4, 1, -1).double().clone()
    num += 0.001 * torch.randn(num.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sums = {"num": num, "den": torch.ones_like(num), "num2": num**2, "den2": torch.ones_like(num), "numden": num}
    full, cut_fit = replicate_window(sums, dist, 0.05, 199), replicate_window(sums, dist, 0.05, 112)
    assert float(cut_fit["window"][0]) == pytest.approx(math.log(0.05) / math.log(0.97), rel=0.05)
    assert bool(full["censored"][0]) or float(full["window"][0]) > 1.2 * float(cut_fit["window"][0])


def test_the_far_maximum_grows_with_the_far_keys_as_concentration_predicts_and_not_without_it():
    """Known truth for T5's instrument. Independent Gaussian q and k (no rotation): each query's far scores are
    i.i.d., so their maximum grows from n = 256 to 2 048 far keys as μ + σ√(2 ln n) says (the growth within 25 %),
    and the top near score is a maximum of only W + 1 draws: below the far maximum. Keys drawn from two vectors
    only: the far scores take two values per query, their maximum reached by the first few keys: it does not grow,
    where the prediction from their spread does."""
    from accrot.diagnostics.far_mass import scheme_far_sums
    from accrot.diagnostics.layers import far_means

    H, D, W = 2, 32, 16
    scheme = build(SchemeConfig(rotation="none"), H * D, H).eval()

    def stats(n, two_keys=False):
        q, k, x, tokens = random_inputs(H, D, n + W, B=2, seed=n)
        if two_keys:
            pick = torch.randint(0, 2, (n + W,), generator=torch.Generator().manual_seed(n))
            k = k[:, :, pick]
        return far_means(scheme_far_sums(scheme, q, k, torch.zeros_like(q), x, tokens, W, n_queries=64))

    def growth(kind):
        few, many = stats(256, kind), stats(2048, kind)
        return many["far_max"] - few["far_max"], many["far_max_predicted"] - few["far_max_predicted"], few

    measured, predicted, few = growth(False)
    assert ((measured / predicted).log().abs() < math.log(1.25)).all(), (measured, predicted)
    assert (few["top_gap"] < 0).all()  # 17 near draws lose to 256 far ones
    grown, expected, _ = growth(True)
    assert (expected > 0.3).all() and (grown.abs() < 0.2 * expected).all(), (grown, expected)


def test_the_regularity_read_off_a_transport_s_own_angles_and_factors():
    """Known truth for T1's per-head prediction. Random increments of window 16: every pair's resultant falls as
    |φ|^Δ, so every head mixes, its pairs near the configured window; the same spread on RoPE's ladder: the slow
    pairs never fall under ε within 512 steps (the control that breaks the condition); RoPE and NoPE accumulate
    nothing (no prediction); PaTH's mean factor with reflections of spread directions: E[H] = I − 2/D·I, ρ = 1 −
    2/D, a finite window; along one direction, or with β → 0, nothing contracts."""
    from accrot.diagnostics.regularity import regularity

    H, D, T = 4, 16, 8192
    x = torch.randn(2, T, H * D, generator=torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(1))
    dist = sorted({*range(33), *(int(d) for d in torch.logspace(1.6, math.log10(511), 12).tolist())})

    def read(**cfg):
        scheme = build(SchemeConfig(**cfg), H * D, H).eval()
        with torch.no_grad():
            return scheme, regularity(scheme, x, tokens, dist, eps=0.05)

    # ε = 0.25 for the windows' place: the resultant's sampling error on 2 × 8 192 positions (≈ 0.03 at Δ = 16,
    # ±1.5 steps where R falls 0.02 a step) stays well under it
    scheme, _ = read(rotation="accum", increments="random_position", window=16, window_eps=0.25)
    with torch.no_grad():
        mixing = regularity(scheme, x, tokens, dist, eps=0.25)
    assert mixing["kind"] == "pairs" and mixing["mixes"] == [True] * H
    assert all(12 <= w <= 21 for row in mixing["pair_window"] for w in row), mixing["pair_window"]
    _, ladder = read(rotation="accum", increments="random_position", window=16, increment_spread="ladder")
    assert ladder["mixes"] == [False] * H and all(row[-1] is None for row in ladder["pair_window"])
    assert all(row[0] is not None for row in ladder["pair_window"])  # pair 0 keeps the full spread: it mixes
    assert read(rotation="rope")[1] is None and read(rotation="none")[1] is None  # nothing accumulates
    # the mean Householder factor itself: reflections along directions spread over all D (E[wwᵀ] = I/D) contract
    # to ρ = 1 − 2/D; along one fixed direction they only flip its sign (ρ = 1: coherent, H² = I)
    from accrot.diagnostics.regularity import householder_contraction

    g = torch.Generator().manual_seed(2)
    spread = torch.nn.functional.normalize(torch.randn(1, H, 20000, D, generator=g, dtype=torch.float64), dim=-1)
    two = torch.full((1, H, 20000), 2.0, dtype=torch.float64)
    assert householder_contraction(spread, two).tolist() == pytest.approx([1 - 2 / D] * H, abs=0.01)
    fixed = torch.zeros_like(spread)
    fixed[..., 0] = 1.0
    assert householder_contraction(fixed, two).tolist() == pytest.approx([1.0] * H, abs=1e-12)
    scheme, reflect = read(rotation="path", path_beta="reflection")
    assert reflect["kind"] == "householder" and len(reflect["contraction"]) == H
    assert reflect["mixes"] == [w is not None and w <= max(dist) for w in reflect["window"]]
    scheme, _ = read(rotation="path")
    scheme.rotation.beta_proj.bias.data.fill_(-60.0)  # β ≈ 1e−26: every factor the identity
    with torch.no_grad():
        still = regularity(scheme, x, tokens, dist)
    assert still["mixes"] == [False] * H and still["contraction"] == pytest.approx([1.0] * H, abs=1e-9)


def test_the_regularity_counts_each_pair_by_the_share_of_the_score_it_carries():
    """Known truth for the score-weighted prediction. On RoPE's ladder with a random spread the fast pairs mix
    and the slow ones never do within 512 steps: q and k that live only on the mixing pairs make every head mix
    (its coherence can only fall with theirs), the same energy on the slow pairs keeps every head coherent, and
    q, k spread over every pair (a quarter or more of the energy on pairs that stay coherent) keep it coherent too.
    The weights themselves: E|q_i|²·E|k_i|², normalised per head, in the half-split layout."""
    from accrot.diagnostics.regularity import pair_weights, regularity

    H, D, T = 4, 16, 8192
    P = D // 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, T, H * D, generator=g)
    tokens = torch.randint(0, 256, (2, T), generator=g)
    dist = sorted({*range(33), *(int(d) for d in torch.logspace(1.6, math.log10(511), 12).tolist())})
    scheme = build(SchemeConfig(rotation="accum", increments="random_position", window=16, increment_spread="ladder"),
                   H * D, H).eval()
    with torch.no_grad():
        plain = regularity(scheme, x, tokens, dist)
    mixing = [i for i in range(P) if all(row[i] is not None for row in plain["pair_window"])]
    slow = [i for i in range(P) if all(row[i] is None for row in plain["pair_window"])]
    assert mixing and slow and plain["criterion"] == "every pair" and plain["mixes"] == [False] * H

    def on(pairs: list[int]) -> torch.Tensor:
        t = torch.zeros(2, H, T, D)
        for i in pairs:
            t[..., i] = torch.randn(2, H, T, generator=g)
            t[..., i + P] = torch.randn(2, H, T, generator=g)
        return t

    def read(q, k):
        with torch.no_grad():
            return regularity(scheme, x, tokens, dist, q=q, k=k)

    fast = read(on(mixing), on(mixing))
    assert fast["criterion"] == "score-weighted" and fast["mixes"] == [True] * H, fast["head_window"]
    assert all(w is not None and w <= 512 for w in fast["head_window"])
    assert read(on(slow), on(slow))["mixes"] == [False] * H
    spread = torch.randn(2, H, T, D, generator=g)
    assert read(spread, spread.flip(2))["mixes"] == [False] * H
    w = pair_weights(on([0]), 3 * on([0, 1]))
    assert w[:, 0].tolist() == pytest.approx([1.0] * H) and w.sum(-1).tolist() == pytest.approx([1.0] * H)
    assert torch.allclose(pair_weights(torch.zeros(1, H, 4, D), on([0])[:1, :, :4]), torch.full((H, P), 1 / P,
                                                                                    dtype=torch.float64))

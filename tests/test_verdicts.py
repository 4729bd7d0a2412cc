"""The study's instruments and verdict rules on known truth (STYLE §13), at the geometry the ablation uses.

Part 1, the coherence instrument (T1, T2): synthetic q, k (anisotropic and correlated, so the prediction is
exact only because fresh draws are independent of them) transported by the scheme's own increment distribution
at the geometry of the default ablation preset (read from it: H = 4, D = 24, L = 128, window 96). The error bars cover |φ|^Δ at their nominal rate; the
T1 rule passes a model that follows the theory in every trial and fails one whose increments spread 30 % more;
the fitted window is the same at L and at 2× L (T2) and moves when the decay rate does.

Part 2, every claim's rule on synthetic studies: for each of C1–C5, T1–T5 and N1, one study where it holds
(supported), one where it fails (not supported) and one inside the noise (inconclusive).
"""

from __future__ import annotations

import math

import pytest
import torch

from accrot.diagnostics import (
    FRESH_DRAWS,
    curve_and_stderr,
    default_distances,
    fitted_window,
    predicted_coherence,
    replicate_window,
    scheme_coherence_fresh,
)
from accrot.position import SchemeConfig, build
from accrot.study.claims import T1_TOLERANCE, T2_TOLERANCE, Results, Run, check_claims, coherence_disagreement
from accrot.study.stats import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py



def _study_geometry() -> tuple[int, int, int, int, float, int]:
    """(heads, head dim, d_model, L, window, fresh draws) of the default ``accrot ablation`` preset, from its
    base config."""
    import yaml

    from accrot.run.args import config_path
    from accrot.study.variants import SIZES, WINDOW_FRACTION

    size = SIZES["study"]
    model = yaml.safe_load(config_path(size.base).read_text())["model"]
    d_model = int(size.overrides.get("model.d_model", model["d_model"]))
    heads = int(size.overrides.get("model.n_heads", model["n_heads"]))
    return heads, d_model // heads, d_model, size.seq_len, WINDOW_FRACTION * size.seq_len, size.fresh_draws


H, D, D_MODEL, L, WINDOW, DRAWS = _study_geometry()
FIT = 7 * L // 8  # the windows' Δ range


def random_scheme(window: float, seed: int = 0):
    return build(SchemeConfig(rotation="accum", increments="random_position", window=window, seed=seed),
                 D_MODEL, H).eval()


def measure(seed: int, T: int = L, window: float = WINDOW, blocks: int = 2):
    """Coherence of synthetic q, k under fresh draws (the ablation's 2 blocks, DRAWS each): per-replicate
    sums, curve, stderr ``[H, n]`` and the distances."""
    gen = torch.Generator().manual_seed(1000 + seed)
    scale = torch.linspace(0.5, 1.5, D)  # anisotropic: coordinates of different size
    q = torch.randn(blocks, H, T, D, generator=gen) * scale
    k = 0.6 * q + 0.8 * torch.randn(blocks, H, T, D, generator=gen)  # q·k has a systematic part
    dist = default_distances(T)
    sums = scheme_coherence_fresh(random_scheme(window, seed), q, k, torch.zeros(blocks, T, D_MODEL),
                                  torch.zeros(blocks, T, dtype=torch.long), dist, max_queries=512, draws=DRAWS)
    curve, stderr = curve_and_stderr(sums)
    return sums, curve, stderr, dist


TRIALS = 20


@pytest.fixture(scope="module")
def trials():
    return [measure(seed) for seed in range(TRIALS)]


def test_coherence_error_bars_cover_the_truth_at_their_nominal_rate(trials):
    truth = predicted_coherence(random_scheme(WINDOW), default_distances(L))  # |φ|^Δ, exact in expectation
    covered = []
    for _, curve, stderr, dist in trials:
        inside = torch.tensor([1 <= d <= FIT for d in dist])
        covered.append(((curve - truth).abs() <= 1.96 * stderr)[:, inside].double().mean().item())
    rate = sum(covered) / len(covered)
    # nominal 95 % (points within one trial are correlated: the mean over trials is the check)
    assert 0.92 <= rate <= 0.975, (rate, covered)


def test_t1_rule_passes_the_theory_and_fails_a_30_percent_wider_spread(trials):
    dist = default_distances(L)
    exact = predicted_coherence(random_scheme(WINDOW), dist).tolist()
    wider = predicted_coherence(random_scheme(WINDOW / 1.3**2), dist).tolist()  # σ² ∝ 1/W: σ off by 30 %
    passed = failed = 0
    shares = []
    for _, curve, stderr, _ in trials:
        out, n = coherence_disagreement(curve.tolist(), stderr.tolist(), exact, dist, FIT)
        shares.append(out / n)
        passed += out / n <= T1_TOLERANCE
        out, n = coherence_disagreement(curve.tolist(), stderr.tolist(), wider, dist, FIT)
        failed += out / n > T1_TOLERANCE
    assert passed == TRIALS and failed == TRIALS, shares
    assert max(shares) < T1_TOLERANCE / 2  # a wide margin (100 trials: at most 3.6 %): ≥ 99 % of draws pass


def test_fitted_window_recovers_the_truth_and_t2_holds_across_lengths(trials):
    covered = []
    for seed, (sums, _, _, dist) in enumerate(trials):
        at_l = replicate_window(sums, dist, 0.05, FIT)
        assert not at_l["censored"].any()
        covered += ((at_l["window"] - WINDOW).abs() <= 1.96 * at_l["window_se"]).tolist()
        if seed >= 3:
            continue
        long_sums, *_, long_dist = measure(seed, T=2 * L)
        at_long = replicate_window(long_sums, long_dist, 0.05, FIT)  # the same Δ range at 2× L
        change = abs(at_long["window"].mean() / at_l["window"].mean() - 1)
        assert change <= T2_TOLERANCE / 2, change
        # a long-length decay 30 % faster in σ (window / 1.69) is a change T2 rejects
        fast_sums, *_, fast_dist = measure(seed, T=2 * L, window=WINDOW / 1.3**2)
        fast = replicate_window(fast_sums, fast_dist, 0.05, FIT)
        assert abs(fast["window"].mean() / at_l["window"].mean() - 1) > T2_TOLERANCE
    # the jackknife error bar of the fitted window covers the true window at about its nominal 95 %
    assert 0.85 <= sum(covered) / len(covered) <= 1.0, sum(covered) / len(covered)


@pytest.mark.parametrize("increments", ["random_position", "random_token"])
def test_fresh_draws_batched_equal_one_draw_at_a_time(increments, monkeypatch):
    """The fast path rotates several draws in one pass and computes the unrotated logits once; its naive twin
    is one :func:`scheme_coherence_sums` per draw with that draw's angles. Chunks of 3 draws cut 7 unevenly."""
    import accrot.diagnostics.coherence as coherence
    from accrot.diagnostics import scheme_coherence_sums
    from accrot.diagnostics.coherence import fresh_generator
    from tests.tolerance import assert_close

    scheme = build(SchemeConfig(rotation="accum", increments=increments, window=WINDOW, seed=5, vocab_size=64),
                   D_MODEL, H).eval()
    gen = torch.Generator().manual_seed(3)
    B, T = 2, 40
    q, k = torch.randn(B, H, T, D, generator=gen), torch.randn(B, H, T, D, generator=gen)
    tokens = torch.randint(0, 64, (B, T), generator=gen)
    x, dist = torch.zeros(B, T, D_MODEL), default_distances(T)
    monkeypatch.setattr(coherence, "DRAW_BUDGET", 3 * B * H * T * D)
    fast = scheme_coherence_fresh(scheme, q, k, x, tokens, dist, max_queries=16, draws=7, layer=1, batch=2)
    reps = [scheme_coherence_sums(scheme, q, k, x, tokens, dist, max_queries=16, theta=scheme.rotation
                                  .independent_angles(tokens, fresh_generator(scheme, 1, 2, d))) for d in range(7)]
    for name in ("num", "den", "msq", "count"):
        ref = torch.cat([r[name] for r in reps])  # [7 · B, H, n], draw-major
        assert fast[name].shape == ref.shape
        assert_close(ref, fast[name], 1e-12, name)
    assert not torch.equal(reps[0]["num"], reps[1]["num"])  # the draws differ


def test_window_beyond_the_measured_range_is_censored_not_dropped():
    dist = list(range(0, 113))
    flat = torch.ones(2, len(dist)) * 0.999 ** torch.tensor(dist, dtype=torch.float64)  # W ≈ 3000 ≫ 112
    out = fitted_window(flat, torch.full_like(flat, 1e-3), dist, 0.05, 112)
    assert out["censored"].all() and torch.isnan(out["window"]).all()
    noise = torch.full((2, len(dist)), 0.01, dtype=torch.float64)  # nothing resolved above zero
    assert fitted_window(noise, torch.full_like(noise, 0.05), dist, 0.05, 112)["censored"].all()
    # a learned transport: above 1 at first, gone within a few steps (a short, finite window, not a censored one)
    quick = torch.zeros(1, len(dist), dtype=torch.float64)
    quick[0, :5] = torch.tensor([1.0, 1.2, 0.8, 0.35, 0.1])
    fit = fitted_window(quick, torch.full_like(quick, 0.01), dist, 0.05, 112)
    assert not fit["censored"].any() and 4 < float(fit["window"][0]) < 8, fit  # the fit meets ε at ~7
    gone = torch.zeros(1, len(dist), dtype=torch.float64)
    gone[0, 0] = 1.0  # nothing left at Δ = 1, and known to be under ε there
    fit = fitted_window(gone, torch.full_like(gone, 0.01), dist, 0.05, 112)
    assert not fit["censored"].any() and float(fit["window"][0]) == 1.0


# ---------------------------------------------------------------------------------------------------
# Part 2: every claim on three synthetic studies
# ---------------------------------------------------------------------------------------------------
MULTS = (1, 2, 4, 8, 16, 32, 64)
SEEDS = (0, 1, 2)
JITTER = (-0.01, 0.0, 0.01)  # per-seed noise of a "clear" study: far below the differences it must resolve


def diagnostics(*, share: float = 0.0, censored: bool = False, window: tuple[float, float] = (96.0, 96.0),
                far: tuple[float, float] = (0.1, 0.1), value: float = 0.2, gap: tuple[float, float] = (3.0, 3.0),
                jitter: float = 0.0) -> dict:
    """A diagnostics.json of one run at L and 64 L with the quantities the claims read set directly."""
    longest = 64 * L
    dist = list(range(FIT + 1))
    pred = [[0.97**d for d in dist]] * H
    off = int(round(share * FIT))  # this many points of each head sit 10 standard errors off the prediction
    curve = [[p + (0.1 if 1 <= d <= off else 0.0) for d, p in zip(dist, pred[0])]] * H
    coherence = [{"length": n, "distances": dist, "curve": curve, "stderr": [[0.01] * len(dist)] * H,
                  "predicted": pred, "window": [None if censored else w + jitter] * H,
                  "window_censored": [censored] * H} for n, w in ((L, window[0]), (longest, window[1]))]
    return {"train_length": L, "lengths": [L, longest], "window_fit_range": [1, FIT], "layers": [{
        "layer": 0, "coherence": coherence,
        "far_mass": [{"length": L, "mass": [far[0] + jitter] * H}, {"length": longest, "mass": [far[1] + jitter] * H}],
        "value_far_norm": [{"length": longest, "rotated": [value + jitter + 1.0], "unrotated": [2.0],
                            "incoherent": [1.0]}],
        "score_gap": [{"length": L, "gap": [gap[0] + jitter] * H}, {"length": longest, "gap": [gap[1] + jitter] * H}],
    }]}


def run(variant: str, seed: int, nll: dict[float, float], dataset: str = "corpus", diag: dict | None = None) -> Run:
    rows = {float(m): {"multiplier": m, "length": int(L * m), "nll": v} for m, v in nll.items()}
    return Run(dataset, variant, seed, f"/runs/{dataset}/{variant}/{seed}", rows, L, diag)


def curve(base: float, rise_per_doubling: float, jitter: float) -> dict[float, float]:
    """NLL per multiple: ``base`` at 1× (+ jitter), rising by ``rise_per_doubling`` nats per doubling."""
    return {m: base + jitter + rise_per_doubling * math.log2(m) for m in MULTS}


def study(nll: dict[str, tuple[float, float]], diag: dict[str, dict] | None = None,
          jitter: tuple[float, ...] = JITTER, datasets: tuple[str, ...] = ("corpus",)) -> Results:
    """Runs of each variant × seed: NLL curve (base, rise per doubling) and diagnostics keyword arguments."""
    runs = []
    for dataset in datasets:
        for i, (variant, (base, rise)) in enumerate(nll.items()):
            # each variant its own per-seed noise (a rotation of the jitter, mirrored every len(jitter)
            # variants), so that paired differences between variants vary across seeds too
            k, sign = i % len(jitter), -1 if (i // len(jitter)) % 2 else 1
            for seed, j in zip(SEEDS, [sign * x for x in jitter[k:] + jitter[:k]]):
                kwargs = (diag or {}).get(variant)
                if isinstance(kwargs, list):  # per-seed diagnostics
                    kwargs = kwargs[seed]
                d = diagnostics(**kwargs, jitter=j) if kwargs is not None and dataset == "corpus" else None
                runs.append(run(variant, seed, curve(base, rise, j), dataset, d))
    return Results(runs)


NOISY = (-0.3, 0.0, 0.3)
YARN, PI = "RoPE+YaRN (eval-time extension)", "RoPE+PI (eval-time extension)"
ROTATION_ONLY = ("accum-random", "accum-token", "accum-learned", "accum-learned+values", "PaTH")
ACCUM = ("accum-random", "accum-token", "accum-learned", "accum-learned+values")
CONTROLLED = ("accum-random+alibi", "accum-learned+values+alibi", "accum-learned+values+forget")

CASES = {
    # claim: (holds, fails, inside the noise) — each a function returning Results
    "C1": (lambda: study({"RoPE": (2.0, 0.3), "accum-random": (2.0, 0.02)}),
           lambda: study({"RoPE": (2.0, 0.02), "accum-random": (2.0, 0.3)}),
           lambda: study({"RoPE": (2.0, 0.05), "accum-random": (2.0, 0.03)}, jitter=NOISY)),
    "C2": (lambda: study({"RoPE": (2.0, 0.3), "accum-learned": (2.0, 0.005)}),
           lambda: study({"RoPE": (2.0, 0.005), "accum-learned": (2.0, 0.3)}),
           lambda: study({"RoPE": (2.0, 0.02), "accum-learned": (2.0, 0.02)}, jitter=(-0.05, 0.0, 0.05))),
    "C3": (lambda: study({"accum-learned": (2.0, 0.2), "accum-learned+values": (2.0, 0.1)}),
           lambda: study({"accum-learned": (2.0, 0.1), "accum-learned+values": (2.0, 0.2)}),
           lambda: study({"accum-learned": (2.0, 0.1), "accum-learned+values": (2.0, 0.11)}, jitter=NOISY)),
    # C4 reads the rise after 16×: a curve that keeps rising supports it, a falling one refutes it
    "C4": (lambda: study({v: (2.0, 0.1) for v in ROTATION_ONLY}),
           lambda: study({v: (2.0, -0.1) for v in ROTATION_ONLY}),
           lambda: study({v: (2.0, 0.0) for v in ROTATION_ONLY}, jitter=NOISY)),
    "C5": (lambda: study({"ALiBi": (2.0, 0.0)}, jitter=(0.0, 0.001, 0.002)),
           lambda: study({"ALiBi": (2.0, 0.1)}),
           lambda: Results([run("ALiBi", s, curve(2.0, rise, 0.0)) for s, rise in zip(SEEDS, (0.0, 0.006, 0.012))])),
    "T1": (lambda: study({"accum-random": (2.0, 0.0)}, {"accum-random": {}}),
           lambda: study({"accum-random": (2.0, 0.0)}, {"accum-random": {"share": 0.5}}),
           lambda: study({"accum-random": (2.0, 0.0)}, {"accum-random": [{"share": x} for x in (0.0, 0.1, 0.2)]})),
    "T2": (lambda: study({v: (2.0, 0.0) for v in ACCUM}, {v: {} for v in ACCUM}),
           lambda: study({v: (2.0, 0.0) for v in ACCUM}, {v: {"window": (60.0, 120.0)} for v in ACCUM}),
           lambda: study({v: (2.0, 0.0) for v in ACCUM}, {v: {"censored": True} for v in ACCUM})),
    "T3": (lambda: study({v: (2.0, 0.0) for v in (*ROTATION_ONLY, "NoPE", "ALiBi", "PaTH-FoX",
                                                  "accum-learned+values+forget")},
                         {**{v: {"far": (0.1, 0.6)} for v in (*ROTATION_ONLY, "NoPE")},
                          **{v: {"far": (0.05, 0.1)} for v in ("ALiBi", "PaTH-FoX", "accum-learned+values+forget")}}),
           lambda: study({v: (2.0, 0.0) for v in (*ROTATION_ONLY, "NoPE", "ALiBi", "PaTH-FoX",
                                                  "accum-learned+values+forget")},
                         {**{v: {"far": (0.6, 0.1)} for v in (*ROTATION_ONLY, "NoPE")},
                          **{v: {"far": (0.05, 0.7)} for v in ("ALiBi", "PaTH-FoX", "accum-learned+values+forget")}}),
           lambda: study({v: (2.0, 0.0) for v in (*ROTATION_ONLY, "NoPE", "ALiBi", "PaTH-FoX",
                                                  "accum-learned+values+forget")},
                         {v: {"far": (0.3, 0.3)} for v in (*ROTATION_ONLY, "NoPE", "ALiBi", "PaTH-FoX",
                                                            "accum-learned+values+forget")},
                         jitter=(-0.01, 0.0, 0.01))),
    "T4": (lambda: study({v: (2.0, 0.0) for v in ("accum-learned+values", "accum-learned+values+forget")},
                         {v: {"value": 0.1} for v in ("accum-learned+values", "accum-learned+values+forget")}),
           lambda: study({v: (2.0, 0.0) for v in ("accum-learned+values", "accum-learned+values+forget")},
                         {v: {"value": 0.9} for v in ("accum-learned+values", "accum-learned+values+forget")}),
           lambda: study({v: (2.0, 0.0) for v in ("accum-learned+values", "accum-learned+values+forget")},
                         {v: {"value": 0.5} for v in ("accum-learned+values", "accum-learned+values+forget")})),
    "T5": (lambda: study({v: (2.0, 0.0) for v in ACCUM}, {v: {"gap": (3.0, 3.0)} for v in ACCUM}),
           lambda: study({v: (2.0, 0.0) for v in ACCUM}, {v: {"gap": (0.3, 0.3)} for v in ACCUM}),
           lambda: study({v: (2.0, 0.0) for v in ACCUM}, {v: {"gap": (1.0, 1.0)} for v in ACCUM})),
    "N1": (lambda: study({"accum-learned": (2.2, 0.1), **{v: (2.0, 0.0) for v in CONTROLLED}},
                         jitter=(0.0, 0.001, 0.002), datasets=("corpus", "local")),
           lambda: study({"accum-learned": (2.0, 0.1), **{v: (2.3, 0.1) for v in CONTROLLED}},
                         datasets=("corpus", "local")),
           lambda: study({"accum-learned": (2.0, 0.1), **{v: (2.01, 0.0) for v in CONTROLLED}},
                         jitter=(-0.05, 0.0, 0.05), datasets=("corpus", "local"))),
    # C1 against RoPE's best eval-time extension: the extension (here YaRN) is better than plain RoPE far out, so the
    # rule must pick it; holds when accum-random beats it too, fails when the extension beats accum-random
    "C1-ext": (lambda: study({"RoPE": (2.0, 0.3), YARN: (2.0, 0.1), PI: (2.0, 0.2), "accum-random": (2.0, 0.02)}),
               lambda: study({"RoPE": (2.0, 0.3), YARN: (2.0, 0.01), PI: (2.0, 0.2), "accum-random": (2.0, 0.1)}),
               lambda: study({"RoPE": (2.0, 0.3), YARN: (2.0, 0.03), "accum-random": (2.0, 0.03)}, jitter=NOISY)),
}


def verdict(res: Results, claim_id: str):
    (claim,) = [c for c in check_claims(res) if c.id == claim_id]
    return claim


@pytest.mark.parametrize("claim_id", sorted(CASES))
@pytest.mark.parametrize("which, expect", [(0, SUPPORTED), (1, NOT_SUPPORTED), (2, INCONCLUSIVE)],
                         ids=["holds", "fails", "noise"])
def test_every_claim_resolves_the_right_way_on_a_synthetic_study(claim_id, which, expect):
    claim = verdict(CASES[claim_id][which](), claim_id)
    assert claim.verdict == expect, [f"{c.what}: {c.numbers} → {c.outcome}" for c in claim.comparisons]
    assert all(c.outcome != "missing" for c in claim.comparisons), claim.comparisons  # every variant was read


def test_diagnose_end_to_end_on_a_model_that_follows_the_theory():
    """A freshly initialised tiny model with random increments (its q, k are whatever the weights make them):
    ``diagnose`` measures each layer under fresh draws, T1's share of disagreeing points stays far under its
    tolerance, and T2's fitted windows agree with the prediction (96) at L and at 8× L."""
    from accrot.diagnostics import diagnose
    from accrot.model import ModelConfig, Transformer
    from accrot.study.claims import coherence_share, window_change

    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=D_MODEL, n_layers=2, n_heads=H, scheme=SchemeConfig(
        rotation="accum", increments="random_position", window=WINDOW, seed=3)))
    gen = torch.Generator().manual_seed(5)
    blocks = {n: torch.randint(0, 256, (2, n), generator=gen) for n in (L, 8 * L)}
    result = diagnose(model, blocks, L)
    entries = [c for layer in result["layers"] for c in layer["coherence"]]
    assert all(c["fresh_draws"] == FRESH_DRAWS and c["replicates"] == 2 * FRESH_DRAWS for c in entries)
    rec = Run("corpus", "accum-random", 0, "/runs/x", {}, L, result)
    share = coherence_share(rec)
    assert share is not None and share <= T1_TOLERANCE / 2, share
    for c in entries:
        assert not any(c["window_censored"]) and all(abs(w - WINDOW) < 15 for w in c["window"]), c["window"]
    change, why = window_change(rec)
    assert why is None and change <= T2_TOLERANCE / 2, (change, why)


def test_the_extension_rows_follow_rope_and_c1_is_read_against_both():
    """RoPE's eval-time extensions sit right after RoPE in every table; C1 stays the comparison with plain RoPE and
    C1-ext, right after it, names the extension it was read against at each length; no extension rows, no C1-ext."""
    res = study({"NoPE": (2.0, 0.3), "RoPE": (2.0, 0.3), YARN: (2.0, 0.1), PI: (2.0, 0.2),
                 "accum-random": (2.0, 0.02)})
    assert res.variants("corpus") == ["NoPE", "RoPE", PI, YARN, "accum-random"]
    ids = [c.id for c in check_claims(res)]
    assert ids[:2] == ["C1", "C1-ext"]
    assert all(c.what.endswith("vs RoPE+YaRN") for c in verdict(res, "C1-ext").comparisons)
    assert "C1-ext" not in [c.id for c in check_claims(study({"RoPE": (2.0, 0.3), "accum-random": (2.0, 0.02)}))]

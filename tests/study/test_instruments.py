"""The study's instruments on known truth, at the geometry the ablation uses (read from its default preset:
H = 4, D = 24, L = 128, window 96). Each instrument gets a synthetic input whose answer is known, and its error
bars are checked to cover it.

* The calibration (random position increments under fresh draws of their distribution, whose coherence is
  |φ|^Δ for any q, k): error bars cover |φ|^Δ at their nominal rate, the disagreement rule passes the theory and
  fails a spread 30 % wider, the fitted window recovers the true one at two lengths and moves with the decay.
* The model's own transport (deterministic per block, every block a replicate, as learned and token increments
  and PaTH are measured): a transport with a known window gives that window at 8× and 64× L, its jackknife interval
  covering it; a window that grows with position is seen to grow; an oscillating coherence gets its window from
  the envelope.
* The lower bound (T3): planted near sets and stationary far logits, without and with ALiBi's bias: the far mass
  predicted from L alone falls within the measured one's interval at 8× and 64× L, and stays bounded with the bias.
* The score gap (T5): a near target planted by content correlated over ~200 tokens, under random increments of
  window 96: with the far keys beyond the variant's own window the gap keeps its size from 8× to 64× L, while the
  L/4 split read at L and 64× L (a far set inside the window at L, beyond it at 64×) shows a spurious change.
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
from accrot.diagnostics.coherence import scheme_coherence_sums, window_estimate
from accrot.diagnostics.far_mass import predicted_far_mass, scheme_far_sums
from accrot.diagnostics.layers import far_means
from accrot.position import SchemeConfig, build
from accrot.study.results import Run
from accrot.study.theory import (
    CALIBRATION_TOLERANCE,
    T3_AGREEMENT,
    WINDOW_BAND,
    coherence_disagreement,
    coherence_share,
    kind,
    window_error,
)

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


def test_calibration_rule_passes_the_theory_and_fails_a_30_percent_wider_spread(trials):
    dist = default_distances(L)
    exact = predicted_coherence(random_scheme(WINDOW), dist).tolist()
    wider = predicted_coherence(random_scheme(WINDOW / 1.3**2), dist).tolist()  # σ² ∝ 1/W: σ off by 30 %
    passed = failed = 0
    shares = []
    for _, curve, stderr, _ in trials:
        out, n = coherence_disagreement(curve.tolist(), stderr.tolist(), exact, dist, FIT)
        shares.append(out / n)
        passed += out / n <= CALIBRATION_TOLERANCE
        out, n = coherence_disagreement(curve.tolist(), stderr.tolist(), wider, dist, FIT)
        failed += out / n > CALIBRATION_TOLERANCE
    assert passed == TRIALS and failed == TRIALS, shares
    assert max(shares) < CALIBRATION_TOLERANCE / 2  # a wide margin (100 trials: at most 3.6 %): ≥ 99 % of draws pass


def test_fitted_window_recovers_the_truth_at_two_lengths(trials):
    covered = []
    for seed, (sums, _, _, dist) in enumerate(trials):
        at_l = replicate_window(sums, dist, 0.05, FIT)
        assert not at_l["censored"].any()
        covered += ((at_l["window"] - WINDOW).abs() <= 1.96 * at_l["window_se"]).tolist()
        if seed >= 3:
            continue
        long_sums, *_, long_dist = measure(seed, T=2 * L)
        at_long = replicate_window(long_sums, long_dist, 0.05, FIT)  # the same Δ range at 2× L
        change = abs(math.log(at_long["window"].mean() / at_l["window"].mean()))
        assert change <= WINDOW_BAND / 2, change
        # a long-length decay 30 % faster in σ (window / 1.69) is a change T2 rejects
        fast_sums, *_, fast_dist = measure(seed, T=2 * L, window=WINDOW / 1.3**2)
        fast = replicate_window(fast_sums, fast_dist, 0.05, FIT)
        assert abs(math.log(fast["window"].mean() / at_l["window"].mean())) > WINDOW_BAND
    # the jackknife error bar of the fitted window covers the true window at about its nominal 95 %
    assert 0.85 <= sum(covered) / len(covered) <= 1.0, sum(covered) / len(covered)


@pytest.mark.parametrize("increments", ["random_position", "random_token"])
def test_fresh_draws_batched_equal_one_draw_at_a_time(increments, monkeypatch):
    """The fast path rotates several draws in one pass and computes the unrotated logits once; its naive twin
    is one :func:`scheme_coherence_sums` per draw with that draw's angles. Chunks of 3 draws cut 7 unevenly."""
    import accrot.diagnostics.coherence as coherence
    from accrot.diagnostics import scheme_coherence_sums
    from accrot.diagnostics.coherence import fresh_generator
    from tests.helpers.tolerance import assert_close

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
# the model's own transport: deterministic per block, the blocks are the replicates
# ---------------------------------------------------------------------------------------------------
def own_transport(T: int, blocks: int, window_at, drift: float = 0.0, seed: int = 0):
    """Coherence sums of synthetic q, k under a transport fixed per block: angles θ_t = Σ_{j≤t} δ_j with δ_j
    ~ N(drift, σ_j²) drawn once per block (one "model" per block), σ_j set so that a window ``window_at(j)`` holds
    at position j. Returns the per-block sums and the distances."""
    gen = torch.Generator().manual_seed(100 + seed)
    P = D // 2
    j = torch.arange(T, dtype=torch.float64)
    sigma = (-2 * math.log(0.05) / window_at(j)).sqrt()  # |E e^{iδ}| = e^{−σ²/2}, W = log ε / log|φ|
    delta = drift + sigma[None, None, :, None] * torch.randn(blocks, H, T, P, generator=gen, dtype=torch.float64)
    theta = delta.cumsum(2).float()  # [B, H, T, P]
    scale = torch.linspace(0.5, 1.5, D)
    q = torch.randn(blocks, H, T, D, generator=gen) * scale
    k = 0.6 * q + 0.8 * torch.randn(blocks, H, T, D, generator=gen)
    scheme = build(SchemeConfig(rotation="accum", increments="learned"), D_MODEL, H).eval()
    dist = default_distances(T)
    x, tokens = torch.zeros(blocks, T, D_MODEL), torch.zeros(blocks, T, dtype=torch.long)
    with torch.no_grad():
        return scheme_coherence_sums(scheme, q, k, x, tokens, dist, max_queries=512, theta=theta), dist


OWN_WINDOW = 12.0  # a learned transport's window: a few tokens (the study's trained ones measure 5–10)


def test_a_known_window_is_recovered_at_8x_and_64x_with_a_covering_jackknife_interval():
    covered, drifts = [], []
    for seed in range(3):
        fits = {}
        for m in (8, 64):
            sums, dist = own_transport(m * L, 16, lambda j: torch.full_like(j, OWN_WINDOW), seed=seed)
            fits[m] = replicate_window(sums, dist, 0.05, 7 * m * L // 8)
            assert not fits[m]["censored"].any() and (fits[m]["method"] == 0).all()
            covered += ((fits[m]["window"] - OWN_WINDOW).abs() <= 1.96 * fits[m]["window_se"]).tolist()
        drifts.append(float((fits[64]["window"] / fits[8]["window"]).log().mean()))
    assert sum(covered) / len(covered) >= 0.8, covered  # 24 (head, length, seed) intervals at a nominal 95 %
    assert all(abs(d) <= WINDOW_BAND / 2 for d in drifts), drifts  # T2's band holds with room to spare


def test_a_window_that_grows_with_position_grows_from_8x_to_64x():
    """W(j) = 12·(1 + j/256): the queries of a longer block sit further along, where the window is longer."""
    drifts = []
    for seed in range(3):
        w = {}
        for m in (8, 64):
            sums, dist = own_transport(m * L, 16, lambda j: OWN_WINDOW * (1 + j / 256), seed=seed)
            w[m] = replicate_window(sums, dist, 0.05, 7 * m * L // 8)["window"]
        drifts.append(float((w[64] / w[8]).log().mean()))
    assert all(d > WINDOW_BAND for d in drifts), drifts


def test_an_oscillating_coherence_gets_its_window_from_the_envelope():
    """Increments drifting by 0.3 rad per token: c(Δ) = |φ|^Δ cos(0.3 Δ) crosses zero every ~10 tokens, which stops
    the log-linear fit at its first crossing; the envelope |φ|^Δ still meets ε at the known window."""
    window = 40.0
    sums, dist = own_transport(8 * L, 16, lambda j: torch.full_like(j, window), drift=0.3)
    fit = replicate_window(sums, dist, 0.05, 7 * L)
    assert (fit["method"] == 1).all() and not fit["censored"].any(), fit
    assert ((fit["window"] > 0.7 * window) & (fit["window"] <= 1.1 * window)).all(), fit["window"]
    # a monotone decay never takes the envelope
    curve = torch.tensor([[0.9**d for d in range(200)]], dtype=torch.float64)
    plain = window_estimate(curve, torch.full_like(curve, 1e-3), list(range(200)), 0.05, 190)
    assert plain["method"].item() == 0 and 27 < plain["window"].item() < 30  # log 0.05 / log 0.9 = 28.4


# ---------------------------------------------------------------------------------------------------
# the lower bound (T3): far mass predicted from L alone
# ---------------------------------------------------------------------------------------------------
def correlated_qk(blocks: int, T: int, seed: int, rho: float, amp: float = 1.0, noise: float = 0.5):
    """q = amp·z, k = amp·z + noise: z an AR(1) process in D dimensions (correlation ρ^Δ), so a query scores its
    near keys higher (the planted near set) and far keys by independent, stationary logits."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.empty(blocks, H, T, D)
    e = torch.randn(blocks, H, T, D, generator=gen)
    z[:, :, 0] = e[:, :, 0]
    for t in range(1, T):
        z[:, :, t] = rho * z[:, :, t - 1] + math.sqrt(1 - rho**2) * e[:, :, t]
    return amp * z, amp * z + noise * torch.randn(blocks, H, T, D, generator=gen)


def far_sums(scheme, T: int, blocks: int, seed: int, window, rho: float = 0.8, amp: float = 1.5):
    q, k = correlated_qk(blocks, T, seed, rho, amp)
    x, tokens = torch.zeros(blocks, T, D_MODEL), torch.zeros(blocks, T, dtype=torch.long)
    with torch.no_grad():
        return scheme_far_sums(scheme, q, k, q, x, tokens, window, 32)


@pytest.mark.parametrize("far_mass", ["none", "alibi"])
def test_the_far_mass_predicted_from_l_falls_inside_the_measured_interval(far_mass):
    scheme = build(SchemeConfig(far_mass=far_mass), D_MODEL, H).eval()
    window = torch.full((H,), L // 4)
    at_l = far_sums(scheme, L, 16, seed=1, window=window)
    log_gate = (at_l["decay_sum"] / at_l["decay_count"]).log() if "decay_sum" in at_l else torch.zeros(H)
    for m in (8, 64):
        measured = far_means(far_sums(scheme, m * L, 8, seed=2, window=window))
        per_block = measured["far_mass_blocks"].mean(1)  # [8] over heads
        half = 2.365 * float(per_block.std()) / math.sqrt(8) + 0.01  # t₀.₉₇₅,₇ · se, and a hundredth
        predicted = float(predicted_far_mass(at_l["z_near"], at_l["e_far_q"], log_gate, window, m * L).mean())
        assert abs(float(per_block.mean()) - predicted) <= min(half, T3_AGREEMENT), (m, per_block.mean(), predicted)
        if far_mass == "alibi":
            assert predicted < 0.1 and float(per_block.mean()) < 0.1  # bounded: the bias caps the far keys
    if far_mass == "none":
        # without a bias the prediction grows toward 1 with the far set: past 0.5 by 64× here
        assert float(predicted_far_mass(at_l["z_near"], at_l["e_far_q"], log_gate, window, 64 * L).mean()) > 0.45


def test_the_prediction_follows_the_bound_s_closed_form():
    """One query, one head: Z = 2, each far key weighs 1 (e^0, no spread), no bias: mass = n/(2 + n) for n far
    keys; a gate f̄ = 1/2 makes F a geometric sum, F → 2^{−W} as n grows."""
    z, e = torch.tensor([[2.0]], dtype=torch.float64), torch.tensor([[1.0]], dtype=torch.float64)
    w = torch.tensor([4])
    got = predicted_far_mass(z, e, torch.zeros(1), w, length=105, n_queries=1)  # query t = 104: 100 far keys
    assert float(got) == pytest.approx(100 / 102)
    gate = math.log(0.5)
    far = sum(0.5**d for d in range(5, 105))
    got = predicted_far_mass(z, e, torch.tensor([gate]), w, length=105, n_queries=1)
    assert float(got) == pytest.approx(far / (2 + far))


# ---------------------------------------------------------------------------------------------------
# the score gap (T5): far keys beyond the variant's own window
# ---------------------------------------------------------------------------------------------------
def test_the_gap_beyond_the_own_window_keeps_its_size_where_the_quarter_split_moves():
    scheme = build(SchemeConfig(rotation="accum", increments="random_position", window=WINDOW, seed=1),
                   D_MODEL, H).eval()
    own, quarter = torch.full((H,), int(WINDOW)), torch.full((H,), L // 4)

    def gap(T, window, seed):
        return float(far_means(far_sums(scheme, T, 16, seed, window, rho=0.995, amp=1.0))["gap"].mean())

    for seed in (3, 4, 5):
        kept = math.log(gap(64 * L, own, seed) / gap(8 * L, own, seed))
        moved = math.log(gap(64 * L, quarter, seed) / gap(L, quarter, seed))
        assert moved > WINDOW_BAND and moved - kept > 0.2, (seed, kept, moved)  # the old split: a spurious change
        assert abs(kept) < WINDOW_BAND + 0.1, (seed, kept)


def test_diagnose_end_to_end_on_a_model_that_follows_the_theory():
    """A freshly initialised tiny model with random increments (its q, k are whatever the weights make them):
    ``diagnose`` measures each layer under fresh draws, the calibration's share of disagreeing points stays far
    under its tolerance, and the fitted windows agree with the prediction (96) at L and at 8× L."""
    from accrot.diagnostics import diagnose
    from accrot.model import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=D_MODEL, n_layers=2, n_heads=H, scheme=SchemeConfig(
        rotation="accum", increments="random_position", window=WINDOW, seed=3)))
    gen = torch.Generator().manual_seed(5)
    blocks = {n: torch.randint(0, 256, (2, n), generator=gen) for n in (L, 8 * L)}
    result = diagnose(model, blocks, L)
    entries = [c for layer in result["layers"] for c in layer["coherence"]]
    assert all(c["fresh_draws"] == FRESH_DRAWS and c["replicates"] == 2 * FRESH_DRAWS for c in entries)
    rec = Run("corpus", "accum-random", 0, "/runs/x", {}, L, result)
    assert kind(rec) == "calibration"
    share = coherence_share(rec)
    assert share is not None and share <= CALIBRATION_TOLERANCE / 2, share
    for c in entries:
        assert not any(c["window_censored"]) and all(abs(w - WINDOW) < 15 for w in c["window"]), c["window"]
    for n in (L, 8 * L):
        error = window_error(rec, n)
        assert error is not None and abs(error) <= WINDOW_BAND / 2, (n, error)
    assert all(layer["far_window"] == [97] * H for layer in result["layers"])  # the predicted window (< 7L/8)



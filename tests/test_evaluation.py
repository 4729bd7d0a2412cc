"""Multi-length evaluation equals a direct forward; buckets and last window are consistent."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from accrot.evaluation import bootstrap_ci, bucket_width_for, evaluate_length, evaluate_lengths
from tests.conftest import tiny_model


@pytest.fixture
def model():
    return tiny_model(rotation="none").eval()


@pytest.mark.parametrize("max_batch_tokens", [40, 100000], ids=["chunked", "one-batch"])
def test_matches_direct_forward(model, max_batch_tokens):
    blocks = torch.randint(0, 256, (5, 41))  # 5 blocks of length 40
    res = evaluate_length(model, blocks, train_length=16, max_batch_tokens=max_batch_tokens)
    with torch.no_grad():
        nll = F.cross_entropy(model(blocks[:, :-1]).transpose(1, 2), blocks[:, 1:], reduction="none")  # [5, 40]
    assert res.blocks == 5 and res.tokens == 200 and res.length == 40
    assert res.nll == pytest.approx(nll.mean().item(), rel=1e-5)
    assert res.ppl == pytest.approx(math.exp(nll.mean().item()), rel=1e-5)
    assert res.last_window_nll == pytest.approx(nll[:, -16:].mean().item(), rel=1e-5)
    width = res.bucket_width
    expect = [nll[:, i : i + width].mean().item() for i in range(0, 40, width)]
    assert res.bucket_nll == pytest.approx(expect, rel=1e-5)
    with torch.no_grad():
        hits = (model(blocks[:, :-1]).argmax(-1) == blocks[:, 1:]).double()  # [5, 40]
    assert res.bucket_accuracy == pytest.approx([hits[:, i : i + width].mean().item() for i in range(0, 40, width)])


def test_lengths_sorted_with_multipliers(model):
    blocks = {64: torch.randint(0, 256, (2, 65)), 16: torch.randint(0, 256, (8, 17))}
    results = evaluate_lengths(model, blocks, train_length=16)
    assert [r.length for r in results] == [16, 64]
    assert [r.multiplier for r in results] == [1.0, 4.0]


def test_bucket_width_caps_points():
    assert bucket_width_for(128, 128) == 32
    assert math.ceil(8192 / bucket_width_for(8192, 128)) <= 64


def test_non_finite_is_an_error():
    def broken(tokens):
        return torch.full((*tokens.shape, 256), float("nan"))

    with pytest.raises(FloatingPointError, match="non-finite"):
        evaluate_length(broken, torch.randint(0, 256, (2, 9)), train_length=8)


def test_mask_scores_only_selected_positions_and_accuracy(model):
    blocks = torch.randint(0, 256, (4, 33))
    mask = torch.zeros(4, 32, dtype=torch.bool)
    mask[:, 5] = mask[:, 20] = True
    res = evaluate_length(model, blocks, train_length=16, mask=mask)
    with torch.no_grad():
        logits = model(blocks[:, :-1])
    nll = F.cross_entropy(logits.transpose(1, 2), blocks[:, 1:], reduction="none")
    assert res.tokens == 8
    assert res.nll == pytest.approx(nll[mask].mean().item(), rel=1e-5)
    hits = (logits.argmax(-1) == blocks[:, 1:])[mask].double().mean().item()
    assert res.accuracy == pytest.approx(hits)
    assert res.last_window_nll == pytest.approx(nll[:, 20].mean().item(), rel=1e-5)  # only 20 is in the last 16
    # buckets of 4 positions: 5 lies in bucket 1, 20 in bucket 5; the others scored nothing and have no NLL
    assert res.bucket_width == 4
    assert [i for i, v in enumerate(res.bucket_nll) if v is not None] == [1, 5]
    assert res.bucket_nll[1] == pytest.approx(nll[:, 5].mean().item(), rel=1e-5)
    # the accuracy per bucket counts the scored positions only, and has the same gaps
    assert [i for i, v in enumerate(res.bucket_accuracy) if v is not None] == [1, 5]
    right = logits.argmax(-1) == blocks[:, 1:]  # [4, 32]
    assert res.bucket_accuracy[5] == pytest.approx(right[:, 20].double().mean().item())


def test_bucket_accuracy_of_known_hits():
    """A model that is right exactly on the first half of every block: buckets of the first half score 1, the
    second half 0, and a bucket straddling the midpoint its share."""
    blocks = torch.randint(0, 256, (3, 41))  # ℓ = 40, train_length 16: buckets of 4

    def half_right(tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*tokens.shape, 256)
        targets = blocks[: tokens.shape[0], 1:]  # the blocks go through in one batch, in order
        logits[:, :18].scatter_(2, targets[:, :18, None], 10.0)  # right on positions 0..17
        logits[:, 18:].scatter_(2, ((targets[:, 18:] + 1) % 256)[..., None], 10.0)  # wrong from 18 on
        return logits

    res = evaluate_length(half_right, blocks, train_length=16)
    assert res.bucket_width == 4
    assert res.bucket_accuracy == [1.0] * 4 + [0.5] + [0.0] * 5
    assert res.accuracy == pytest.approx(18 / 40)


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_blocks(model):
    few = evaluate_length(model, torch.randint(0, 256, (4, 17)), train_length=16)
    many = evaluate_length(model, torch.randint(0, 256, (64, 17)), train_length=16)
    for r in (few, many):
        assert r.nll_ci[0] <= r.nll <= r.nll_ci[1]
    assert many.nll_ci[1] - many.nll_ci[0] < few.nll_ci[1] - few.nll_ci[0]


def ratio_se(sums: np.ndarray, counts: np.ndarray) -> float:
    """Standard error of the token-weighted mean Σ sums / Σ counts over blocks (the ratio estimator's
    linearisation): √(N/(N−1) · Σ (sums_i − m·counts_i)²) / Σ counts."""
    m, n = sums.sum() / counts.sum(), len(sums)
    return math.sqrt(n / (n - 1) * ((sums - m * counts) ** 2).sum()) / counts.sum()


def percentile_bootstrap(sums: np.ndarray, counts: np.ndarray, n: int, seed: int) -> tuple[float, float]:
    """An independent percentile bootstrap (numpy's generator, not torch's): resample whole blocks."""
    idx = np.random.default_rng(seed).integers(0, len(sums), size=(n, len(sums)))
    means = sums[idx].sum(1) / counts[idx].sum(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def test_bootstrap_interval_matches_an_independent_percentile_bootstrap():
    """Per-block NLLs with unequal token counts (blocks of 5–60 scored tokens, block-level effects): the 95 %
    interval's ends agree with an independent bootstrap within Monte-Carlo noise, and its width is 2·1.96·SE."""
    rng = np.random.default_rng(7)
    N = 300
    counts = rng.integers(5, 61, size=N).astype(np.float64)
    per_token = 2.0 + 0.3 * rng.standard_normal(N) + 0.8 * rng.standard_normal(N) / np.sqrt(counts)
    sums = per_token * counts
    lo, hi = bootstrap_ci(torch.from_numpy(sums), torch.from_numpy(counts), n=8000, seed=3)
    ref_lo, ref_hi = percentile_bootstrap(sums, counts, n=8000, seed=11)
    se = ratio_se(sums, counts)
    mean = sums.sum() / counts.sum()
    assert lo < mean < hi
    # Monte-Carlo error of a 2.5 % quantile from 8000 resamples: ~0.03·SE each, so the two differ by ~0.04·SE
    assert abs(lo - ref_lo) < 0.2 * se and abs(hi - ref_hi) < 0.2 * se, (lo, hi, ref_lo, ref_hi, se)
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=0.08)  # a 50 % interval would be 2·0.67·SE


def test_evaluation_interval_is_the_bootstrap_of_its_own_blocks(model):
    """``evaluate_length`` reports the bootstrap over the blocks it scored: recomputed here from a direct forward
    (per-block NLL sums and token counts), the same interval, of width ≈ 2·1.96·SE."""
    blocks = torch.randint(0, 256, (48, 33))
    res = evaluate_length(model, blocks, train_length=16)
    with torch.no_grad():
        nll = F.cross_entropy(model(blocks[:, :-1]).transpose(1, 2), blocks[:, 1:], reduction="none")  # [48, 32]
    sums, counts = nll.double().sum(1), torch.full((48,), 32.0, dtype=torch.float64)
    assert res.nll_ci == pytest.approx(bootstrap_ci(sums, counts), rel=1e-6)
    se = ratio_se(sums.numpy(), counts.numpy())
    assert res.nll_ci[1] - res.nll_ci[0] == pytest.approx(2 * 1.96 * se, rel=0.25)  # 48 blocks, 1000 resamples


def test_empty_mask_is_an_error(model):
    with pytest.raises(ValueError, match="scored no token"):
        evaluate_length(model, torch.randint(0, 256, (2, 9)), 8, mask=torch.zeros(2, 8, dtype=torch.bool))


def test_sliding_window_scores_each_target_once_with_its_context(model):
    from accrot.evaluation import evaluate_sliding

    stream = torch.randint(0, 256, (200,))
    res = evaluate_sliding(model, stream, context=32, stride=8, budget_tokens=120)
    # reference: target j (predicting stream[j+1]) scored with history stream[max(0, e - 32) : j + 1]
    starts = list(range(0, 120 - 32 + 1, 8))
    ref = []
    with torch.no_grad():
        for w, s in enumerate(starts):
            logits = model(stream[s : s + 32][None])[0]
            nll = F.cross_entropy(logits, stream[s + 1 : s + 33], reduction="none")
            ref.append(nll if w == 0 else nll[-8:])
    ref = torch.cat(ref)
    assert res["tokens"] == ref.numel() == 32 + 8 * (len(starts) - 1)
    assert res["nll"] == pytest.approx(ref.mean().item(), rel=1e-5)
    stride_eq_context = evaluate_sliding(model, stream, context=32, stride=32, budget_tokens=96)
    blocks = stream[:97].unfold(0, 33, 32)  # non-overlapping blocks: the same thing
    assert stride_eq_context["nll"] == pytest.approx(evaluate_length(model, blocks, 32).nll, rel=1e-5)


def test_accuracy_per_depth_groups_blocks(model):
    blocks = torch.randint(0, 256, (6, 17))
    mask = torch.zeros(6, 16, dtype=torch.bool)
    mask[:, -3:] = True
    depths = [0.0, 0.5, 1.0, 0.0, 0.5, 1.0]
    res = evaluate_length(model, blocks, train_length=16, mask=mask, depths=depths)
    with torch.no_grad():
        hits = (model(blocks[:, :-1]).argmax(-1) == blocks[:, 1:])[:, -3:].double()  # [6, 3]
    assert set(res.accuracy_by_depth) == {"0", "0.5", "1"}
    for d, rows in (("0", [0, 3]), ("0.5", [1, 4]), ("1", [2, 5])):
        assert res.accuracy_by_depth[d] == pytest.approx(hits[rows].mean().item())
    assert evaluate_length(model, blocks, train_length=16).accuracy_by_depth is None


class _Bf16Logits:
    """A model whose logits come out in bfloat16, as under bf16-mixed: a fixed table of sharp logits per token."""

    def __init__(self, vocab: int = 256, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.table = (6 * torch.randn(vocab, vocab, generator=gen)).bfloat16()  # [V, V] next-token logits

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table[tokens]  # [b, ℓ, V] bf16


@pytest.mark.parametrize("autocast", [True, False], ids=["under-bf16-autocast", "no-autocast"])
def test_bucket_curve_equals_a_float64_computation_from_bf16_logits(autocast):
    """The per-position curve of bf16 logits is the float64 NLL of those logits to float32 precision: a bf16
    log-softmax (±0.4 % per token) or a low-precision running sum would miss this by orders of magnitude."""
    model = _Bf16Logits()
    gen = torch.Generator().manual_seed(1)
    blocks = torch.randint(0, 256, (8, 513), generator=gen)  # 8 blocks of length 512
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        res = evaluate_length(model, blocks, train_length=64, max_batch_tokens=1024)
    logp = torch.log_softmax(model(blocks[:, :-1]).double(), -1)  # [8, 512, V] float64
    nll = -logp.gather(-1, blocks[:, 1:, None]).squeeze(-1)  # [8, 512]
    width = res.bucket_width
    ref = torch.stack([nll[:, i : i + width].mean() for i in range(0, 512, width)])  # [buckets]
    got = torch.tensor(res.bucket_nll, dtype=torch.float64)
    assert got.shape == ref.shape
    assert torch.linalg.vector_norm(got - ref) <= 1e-6 * torch.linalg.vector_norm(ref) + 1e-9
    assert abs(res.nll - nll.mean().item()) <= 1e-6 * nll.mean().item()
    assert abs(res.last_window_nll - nll[:, -64:].mean().item()) <= 1e-6 * nll.mean().item()


# -- the same targets at every length ------------------------------------------------------------------------


class _Window(torch.nn.Module):
    """A model whose receptive field is its last ``w`` tokens (a causal convolution over embeddings), float64:
    the known truth of the same-target rise, which must be 0 at every length."""

    def __init__(self, w: int = 5, vocab: int = 16, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = w
        self.emb = torch.randn(vocab, 8, generator=g, dtype=torch.float64)
        self.kernel = torch.randn(vocab, 8, w, generator=g, dtype=torch.float64)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb[tokens].transpose(1, 2)  # [b, 8, ℓ]
        return F.conv1d(F.pad(x, (self.w - 1, 0)), self.kernel).transpose(1, 2)  # [b, ℓ, V] from tokens t−w+1..t


def _markov_stream(n: int, vocab: int = 16, seed: int = 0) -> torch.Tensor:
    """Tokens with local structure that varies along the stream, so per-length blocks of different text differ."""
    g = torch.Generator().manual_seed(seed)
    out = torch.empty(n, dtype=torch.long)
    out[0] = 0
    steps = torch.randint(1, 4, (n,), generator=g)
    drift = (torch.arange(n) // 997) % vocab  # a slow change of regime
    for i in range(1, n):
        out[i] = (out[i - 1] + steps[i] + (drift[i] if i % 7 == 0 else 0)) % vocab
    return out


def test_a_finite_receptive_field_has_no_same_target_rise_where_per_length_blocks_do():
    from accrot.evaluation import evaluate_same_targets

    stream, L = _markov_stream(20000), 32
    model = _Window()
    lengths = [L * m for m in (1, 2, 4, 8, 16)]
    same = evaluate_same_targets(model, stream, lengths, L, anchors=12)
    assert same["k"] == 8 and same["anchors"] == 12 and same["reference_length"] == L
    for row in same["lengths"]:
        assert abs(row["rise"]) <= 1e-12 and all(abs(x - row["rise"]) <= 1e-12 for x in row["rise_ci"])
    # the same model on per-length blocks (different text per length): its NLL moves with the length
    blocks = {ln: torch.stack([stream[i * (ln + 1) : (i + 1) * (ln + 1)] for i in range(4096 // ln)]) for ln in lengths}
    per_length = [r.nll for r in evaluate_lengths(model, blocks, L)]
    assert max(per_length) - min(per_length) > 1e-3


def test_the_same_target_rise_is_paired_per_anchor_and_its_interval_covers_it(model):
    """A real model: every length scores the same tokens (the anchors' last k), the rise at L is exactly 0, and
    each rise is the mean of the anchors' paired differences, inside its Student-t interval."""
    from accrot.evaluation import evaluate_same_targets, same_target_anchors

    stream = torch.randint(0, 256, (3000,), generator=torch.Generator().manual_seed(1))
    same = evaluate_same_targets(model, stream, [16, 32, 64], 16, k=4, anchors=6)
    ends = same_target_anchors(3000, 64, 6)
    assert len(ends) == 6 and ends[0] == 64 and ends[-1] == 2999
    rows = {r["length"]: r for r in same["lengths"]}
    assert rows[16]["rise"] == 0.0 and rows[16]["rise_ci"] == [0.0, 0.0]
    with torch.no_grad():  # the 64-token window of the last anchor, scored by hand
        window = stream[2999 - 64 : 3000][None]
        nll = F.cross_entropy(model(window[:, :-1])[0, -4:].float(), window[0, -4:])
    assert rows[64]["anchor_nll"][-1] == pytest.approx(float(nll), rel=1e-5)
    for ln in (32, 64):
        diff = torch.tensor(rows[ln]["anchor_nll"], dtype=torch.float64) - torch.tensor(rows[16]["anchor_nll"], dtype=torch.float64)
        assert rows[ln]["rise"] == pytest.approx(float(diff.mean()), abs=1e-12)
        lo, hi = rows[ln]["rise_ci"]
        assert lo < rows[ln]["rise"] < hi


def test_same_target_windows_need_the_longest_length_in_the_stream(model):
    from accrot.evaluation import evaluate_same_targets

    with pytest.raises(ValueError, match="the same-target windows need 101 tokens; the stream has 50"):
        evaluate_same_targets(model, torch.zeros(50, dtype=torch.long), [100], 16)
    with pytest.raises(ValueError, match=r"same-target k=40 must lie in \[1, 16\]"):
        evaluate_same_targets(model, torch.zeros(500, dtype=torch.long), [16, 32], 16, k=40)

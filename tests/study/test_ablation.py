"""The ablation: the claim rules, the report builder on a synthetic study, the generated spec, and a
real interrupted-and-resumed ablation."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from optuna_dashboard import get_note

from accrot.position.rope_scaling import RopeScaling
from accrot.study.ablation import build_spec
from accrot.study.claims import Results, Run, check_claims
from accrot.study.report import write_report
from accrot.study.stats import (
    INCONCLUSIVE,
    NOT_SUPPORTED,
    SUPPORTED,
    compare_paired,
    compare_threshold,
    compare_variants,
    t_quantile,
)
from accrot.study.variants import SIZES, VARIANTS
from accrot.sweep.spec import SweepSpec
from accrot.sweep.storage import StorageRef, open_storage

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------------
# the comparison rules
# ---------------------------------------------------------------------------------------------------
def test_difference_inside_the_interval_is_inside_and_outside_is_resolved():
    inside = compare_variants("x", "a", [2.00, 2.10], "b", [2.05, 2.12])  # Welch: Δ −0.035 ± 0.65
    assert inside.outcome == "inside" and "95 %, Welch" in inside.numbers
    assert compare_variants("x", "a", [2.00, 2.01], "b", [2.50, 2.52]).outcome == "for"
    assert compare_variants("x", "a", [2.50, 2.52], "b", [2.00, 2.01]).outcome == "against"
    assert compare_variants("x", "a", [2.0], "b", [3.0]).outcome == "inside"  # one seed: no interval
    assert compare_variants("x", "a", [], "b", [3.0, 3.1]).outcome == "missing"
    # the same seeds on both sides: paired differences, whose spread leaves out what the seeds share
    a, b = {0: 2.0, 1: 2.3, 2: 2.6}, {0: 2.1, 1: 2.41, 2: 2.69}
    assert compare_variants("x", "a", list(a.values()), "b", list(b.values())).outcome == "inside"  # Welch
    paired = compare_variants("x", "a", a, "b", b)
    assert paired.outcome == "for" and "paired over 3 seeds" in paired.numbers


def test_paired_and_threshold_rules():
    assert compare_paired("x", [0.2, 0.3, 0.25]).outcome == "for"
    assert compare_paired("x", [0.2, -0.3, 0.1]).outcome == "inside"
    assert compare_paired("x", [-0.2, -0.3, -0.25]).outcome == "against"
    assert compare_threshold("x", [0.01, 0.02, 0.015], 0.05).outcome == "for"
    assert compare_threshold("x", [0.08, 0.09, 0.085], 0.05).outcome == "against"
    assert compare_threshold("x", [0.01, 0.09, 0.05], 0.05).outcome == "inside"


def test_t_quantiles_match_the_t_distribution():
    """t_{0.975, df} against a direct numerical integral of Student's t density: ∫₀ᵗ f = 0.475."""
    for df in (1, 2, 3, 5, 10, 29, 30, 31, 40, 100, 1000):
        t = t_quantile(df)
        c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
        n = 20000  # Simpson's rule on [0, t]
        xs = [t * i / n for i in range(n + 1)]
        f = [c * (1 + x * x / df) ** (-(df + 1) / 2) for x in xs]
        area = t / n / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
        assert area == pytest.approx(0.475, abs=2e-4), (df, t, area)


S = 0.1  # the per-seed standard deviation of the boundary cases below
HALF_PAIRED = t_quantile(2) * S / math.sqrt(3)  # 3 seeds: t₂ = 4.303
HALF_WELCH = t_quantile(4) * S * math.sqrt(2 / 3)  # 3 + 3 seeds, equal spreads: df = 4, t₄ = 2.776


def three(mean: float, std: float) -> list[float]:
    """Three values with exactly this mean and sample standard deviation."""
    return [mean - std, mean, mean + std]


@pytest.mark.parametrize("eps, outcome", [(-1e-6, "inside"), (1e-6, "for")], ids=["just-inside", "just-outside"])
def test_paired_variant_rule_is_pinned_at_its_interval(eps, outcome):
    """Same seeds: the per-seed differences (mean Δ, sd 0.1) resolve once |Δ| exceeds t₂·0.1/√3."""
    for sign in (1, -1):
        diffs = three(sign * (HALF_PAIRED + eps), S)
        b = {0: 2.0, 1: 2.5, 2: 1.7}
        a = {k: b[k] + d for k, d in zip(b, diffs)}
        got = compare_variants("x", "a", a, "b", b, lower_is_for=False)
        assert got.outcome == (outcome if sign > 0 else {"for": "against", "inside": "inside"}[outcome]), got


@pytest.mark.parametrize("eps, outcome", [(-1e-6, "inside"), (1e-6, "for")], ids=["just-inside", "just-outside"])
def test_welch_variant_rule_is_pinned_at_its_interval(eps, outcome):
    """Different seeds: Welch's interval, t₄·√(s²/3 + s²/3) for two groups of three with sd 0.1 each."""
    for sign in (1, -1):
        got = compare_variants("x", "a", three(2.0 - sign * (HALF_WELCH + eps), S), "b", three(2.0, S))
        assert got.outcome == (outcome if sign > 0 else {"for": "against", "inside": "inside"}[outcome]), got


@pytest.mark.parametrize("eps, outcome", [(-1e-6, "inside"), (1e-6, "resolved")], ids=["just-inside", "just-outside"])
def test_paired_rule_is_pinned_at_its_interval(eps, outcome):
    diffs = three(HALF_PAIRED + eps, S)
    assert compare_paired("x", diffs).outcome == ("inside" if outcome == "inside" else "for")
    assert compare_paired("x", [-d for d in diffs]).outcome == ("inside" if outcome == "inside" else "against")
    assert compare_paired("x", diffs, positive_is_for=False).outcome == ("inside" if outcome == "inside"
                                                                        else "against")


@pytest.mark.parametrize("eps", [1e-6, -1e-6], ids=["just-over", "just-under"])
def test_threshold_rule_is_pinned_at_its_interval(eps):
    values = three(0.03, S / 10)  # mean 0.03, sd 0.01: half-width t₂·0.01/√3
    half = HALF_PAIRED / 10
    assert compare_threshold("x", values, 0.03 + half + eps).outcome == ("for" if eps > 0 else "inside")
    assert compare_threshold("x", values, 0.03 - half + eps).outcome == ("inside" if eps > 0 else "against")
    assert compare_threshold("x", values, 0.03 - half + eps, below_is_for=False).outcome == (
        "inside" if eps > 0 else "for")


# ---------------------------------------------------------------------------------------------------
# the report builder on a synthetic study
# ---------------------------------------------------------------------------------------------------
def fake_run(variant: str, seed: int, nll: dict[float, float], dataset: str = "corpus") -> Run:
    rows = {m: {"multiplier": m, "length": int(128 * m), "nll": v, "accuracy": 0.5, "bucket_width": 128,
                "bucket_nll": [int(m), [v] * int(m)]} for m, v in nll.items()}
    return Run(dataset, variant, seed, f"/runs/{variant}/{seed}", rows, 128, params=246240)


def synthetic(rope_far: tuple[float, float], random_far: tuple[float, float]) -> Results:
    """Two variants × two seeds at 1×, 2×, 4×: RoPE and accum-random, NLL at 4× as given."""
    runs = []
    for seed in (0, 1):
        runs.append(fake_run("RoPE", seed, {1: 2.0, 2: 2.2, 4: rope_far[seed]}))
        runs.append(fake_run("accum-random", seed, {1: 2.0, 2: 2.05, 4: random_far[seed]}))
    return Results(runs)


def test_report_marks_a_difference_inside_the_spread_inconclusive(tmp_path):
    res = synthetic(rope_far=(2.40, 2.60), random_far=(2.30, 2.60))  # Δ −0.05, spread 0.35
    report = write_report(res, tmp_path, {"command": "test", "size": "tiny", "seeds": 2, "started": time.time()})
    text = report.read_text()
    assert "| variant | params | seeds | 1× | 2× | 4× |" in text
    assert "| RoPE | 246 k | 2 | 2.000 ± 0.000 | 2.200 ± 0.000 | 2.500 ± 0.141 |" in text
    assert "| accum-random | 246 k | 2 | 2.000 ± 0.000 | 2.050 ± 0.000 | 2.450 ± 0.212 |" in text
    (c1,) = [c for c in check_claims(res) if c.id == "C1"]
    assert c1.verdict == INCONCLUSIVE and c1.why().startswith("a difference lies inside the seeds' spread")
    # two seeds with this spread: the comparison says how many would resolve a difference of its size
    assert all(c.needed is not None and c.needed > 2 for c in c1.comparisons if c.outcome == "inside")
    assert "| C1 | random accumulated rotations extrapolate much better than RoPE |" in text
    assert "**C1 — inconclusive.**" in text and "→ *inside*" in text
    # every row of the claims table has its seven cells (the null's verdict among them): a |φ|^Δ in a rule must
    # not split it
    rows = [ln for ln in text.splitlines() if ln.startswith(("| C", "| T", "| N"))]
    assert len(rows) == 11 and all(ln.replace("\\|", "").count("|") == 8 for ln in rows), rows
    claims = json.loads((tmp_path / "claims.json").read_text())
    assert [c["id"] for c in claims] == ["C1", "C2", "C3", "C4", "C5", "T1", "T2", "T3", "T4", "T5", "N1"]
    assert all(c["verdict"] == INCONCLUSIVE for c in claims if c["id"] != "C1")  # their variants were not run
    rows = (tmp_path / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 4 * 3 and rows[0].startswith("dataset,variant,seed,multiplier")
    for png in ("nll_corpus.png", "per_position_corpus.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png


def test_report_resolves_a_clear_difference_either_way(tmp_path):
    better = synthetic(rope_far=(3.00, 3.02), random_far=(2.10, 2.12))
    assert [c.verdict for c in check_claims(better) if c.id == "C1"] == [SUPPORTED]
    worse = synthetic(rope_far=(2.10, 2.12), random_far=(3.00, 3.02))
    assert [c.verdict for c in check_claims(worse) if c.id == "C1"] == [NOT_SUPPORTED]


def test_a_trained_rope_variant_is_listed_once_and_the_extension_rows_follow_rope(tmp_path, monkeypatch):
    """RoPE+ssmax is a trained variant whose name starts as the extension rows' do: it is listed once, at its own
    place in the study's order, in the variant list, the tables and the figures; the extension row (its run says it
    is one) sits right after RoPE and is not counted as a trained run."""
    from dataclasses import replace

    from accrot.study import figures

    yarn = "RoPE+YaRN (eval-time extension)"
    runs = []
    for seed in (0, 1):
        runs.append(fake_run("RoPE", seed, {1: 2.0, 2: 2.2, 4: 2.5 + 0.01 * seed}))
        runs.append(fake_run("accum-random", seed, {1: 2.0, 2: 2.05, 4: 2.1 + 0.01 * seed}))
        runs.append(fake_run("RoPE+ssmax", seed, {1: 2.0, 2: 2.1, 4: 2.3 + 0.01 * seed}))
        runs.append(replace(fake_run(yarn, seed, {1: 2.0, 2: 2.15, 4: 2.4 + 0.01 * seed}), extension="yarn",
                            params=None))
    res = Results(runs)
    assert res.variants("corpus") == ["RoPE", yarn, "accum-random", "RoPE+ssmax"]
    assert res.trained() == 6 and res.is_extension(yarn) and not res.is_extension("RoPE+ssmax")
    drawn = {}
    save = figures.atomic_savefig
    monkeypatch.setattr(figures, "atomic_savefig", lambda fig, path: (save(fig, path), drawn.update({path.name: fig})))
    text = write_report(res, tmp_path, {"command": "test", "size": "tiny", "seeds": 2, "started": time.time()}).read_text()
    assert [ln.split(" | ")[0] for ln in text.splitlines() if ln.startswith("| RoPE+")] == ["| RoPE+YaRN (eval-time "
                                                                                          "extension)", "| RoPE+ssmax"]
    horizon = [t.get_text() for t in drawn["horizon_corpus.png"].axes[0].get_yticklabels()]
    assert horizon == ["RoPE", yarn, "accum-random", "RoPE+ssmax"]
    for ax in drawn["nll_corpus.png"].axes:  # each panel's legend names a variant once
        legend = ax.get_legend()
        labels = [t.get_text() for t in legend.get_texts()] if legend else []
        assert len(labels) == len(set(labels)), labels
    assert sum(t.get_text() == "RoPE+ssmax" for ax in drawn["nll_corpus.png"].axes if ax.get_legend()
               for t in ax.get_legend().get_texts()) == 1


@pytest.mark.parametrize("values_far, spread, verdict", [
    (2.3, 0.0, SUPPORTED), (2.7, 0.0, NOT_SUPPORTED), (2.5, 0.0, NOT_SUPPORTED), (2.49, 0.0, NOT_SUPPORTED),
    (2.48, 0.03, INCONCLUSIVE)], ids=["values-lower", "values-higher", "no-help", "help-under-the-margin",
                                      "at-the-margin-inside-the-spread"])
def test_value_rotation_claim_reads_lower_as_better(values_far, spread, verdict):
    """C3 says a +values variant is below its q/k-only twin at 16×–64× (learned without the ladder, random
    increments) by at least 1 % of the twin's NLL at 1× (here 2.0: 0.02 nats): a help of 0.01 nats is resolved
    *against* as surely as none, and a mean help at the margin with a spread over seeds is inside the noise."""
    runs = []
    for seed, jitter in enumerate((-0.01, 0.0, 0.01)):
        far = {m: 2.5 + jitter for m in (16, 32, 64)}
        own = values_far + jitter + spread * (seed - 1)  # the +values side's own per-seed deviation
        for qk in ("accum-learned-noladder", "accum-random"):
            runs.append(fake_run(qk, seed, {1: 2.0, **far}))
            runs.append(fake_run(qk + "+values", seed, {1: 2.0, **{m: own for m in far}}))
    (c3,) = [c for c in check_claims(Results(runs)) if c.id == "C3"]
    assert [c.what for c in c3.comparisons] == [f"{v}+values: NLL {m}×" for v in ("accum-learned-noladder",
                                                                                  "accum-random") for m in (16, 32, 64)]
    assert c3.verdict == verdict, [c.numbers for c in c3.comparisons]
    assert all("margin -0.020" in c.numbers for c in c3.comparisons), c3.comparisons[0].numbers


def test_length_stability_claim_uses_the_threshold():
    flat = Results([fake_run("ALiBi", s, {1: 2.0, 2: 2.01, 4: 2.0 + 0.005 * s}) for s in (0, 1)])
    rising = Results([fake_run("ALiBi", s, {1: 2.0, 2: 2.2, 4: 2.4 + 0.01 * s}) for s in (0, 1)])
    assert [c.verdict for c in check_claims(flat) if c.id == "C5"] == [SUPPORTED]
    assert [c.verdict for c in check_claims(rising) if c.id == "C5"] == [NOT_SUPPORTED]


# ---------------------------------------------------------------------------------------------------
# the generated spec
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", sorted(SIZES))
def test_generated_spec_is_a_valid_sweep_of_every_variant_and_data_set(size, tmp_path):
    doc = build_spec(f"ablation-{size}", SIZES[size], SIZES[size].seeds, list(VARIANTS), ["corpus", "local"])
    spec = SweepSpec(**yaml.safe_load(yaml.safe_dump(doc, sort_keys=False)))  # as _write_spec writes it
    assert spec.budget == SIZES[size].seeds  # one configuration × the seeds per variant
    strata = spec.strata()
    assert len(strata) == 2 * len(VARIANTS)
    # one study per data set, every variant's trials in it: the dashboard compares variants on one page
    studies = spec.studies()
    assert list(studies) == [f"ablation-{size}/corpus", f"ablation-{size}/local"]
    assert [s.variant for s in studies[f"ablation-{size}/local"]] == [f"local.{v}" for v in VARIANTS]
    assert spec.budget_of(f"ablation-{size}/corpus") == len(VARIANTS) * SIZES[size].seeds
    # equal budgets and recipe: strata differ only in the scheme, the data set and the corpus diagnostics
    for st in strata:
        assert set(st.overrides) - {"data", "trainer.callbacks"} <= {
            k for k in st.overrides if k.startswith("model.scheme.")}
    drift = next(s for s in strata if s.variant == "corpus.RoPE+jitter").overrides
    assert drift["model.scheme.increment_mean"] == "rope"
    assert drift["model.scheme.window"] == 0.75 * SIZES[size].seq_len
    assert max(spec.overrides["extrapolation.multipliers"]) == max(SIZES[size].multipliers) >= 32
    callbacks = next(s for s in strata if s.variant == "corpus.accum-random").overrides["trainer.callbacks"]
    if not SIZES[size].diagnose:  # a size that reads only the NLL claims: no diagnostics anywhere
        assert all(not str(c).count("DiagnosticsCallback") for st in strata for c in st.overrides["trainer.callbacks"])
        return
    diag = callbacks[-1]
    assert diag["class_path"].endswith("DiagnosticsCallback")
    assert diag["init_args"]["draws"] == SIZES[size].fresh_draws >= 8  # the coherence instrument's fresh draws
    # every diagnosed length on at least 16 blocks: the replicates of each head's window and its jackknife interval
    assert diag["init_args"]["blocks"] == SIZES[size].diagnostic_blocks >= 16
    assert max(diag["init_args"]["multipliers"]) == max(SIZES[size].multipliers)


FAR_MASS_CELLS = ("RoPE+ssmax", "RoPE+gate", "RoPE-NoPE-interleaved", "accum-learned+values+ssmax",
                    "accum-learned+values+gate")


def test_far_mass_design_variants_are_optional_and_valid_runs_of_every_size():
    """The cells of scalable softmax, the output gate and NoPE/RoPE interleaving run only when named, and each is a
    config the real CLI parser accepts at the study's shape (tiny: 2 layers, where the interleaved cell has one
    NoPE layer); the interleaved cell also fits the small and paper shape (6 layers)."""
    from accrot.model import ModelConfig
    from accrot.position import SchemeConfig
    from accrot.study.variants import DEFAULT_VARIANTS, OPTIONAL
    from accrot.sweep.trials import check_stratum

    assert set(FAR_MASS_CELLS) <= set(OPTIONAL) and not set(FAR_MASS_CELLS) & set(DEFAULT_VARIANTS)
    doc = build_spec("t", SIZES["study"], 1, list(FAR_MASS_CELLS), ["corpus"])
    spec = SweepSpec(**yaml.safe_load(yaml.safe_dump(doc, sort_keys=False)))
    for st in spec.strata():
        check_stratum(spec, st)  # raises a one-line UsageError naming the variant on a bad override
    labels = {v: SchemeConfig(**VARIANTS[v]).label() for v in FAR_MASS_CELLS}
    assert labels == {"RoPE+ssmax": "rope/ssmax", "RoPE+gate": "rope/none+gate",
                      "RoPE-NoPE-interleaved": "rope/none(cell,none)",
                      "accum-learned+values+ssmax": "accum:learned/ssmax+values",
                      "accum-learned+values+gate": "accum:learned/none+values+gate"}
    for n_layers in (2, 6):
        ModelConfig(n_layers=n_layers, scheme=SchemeConfig(**VARIANTS["RoPE-NoPE-interleaved"]))


def test_optional_data_sets_train_at_a_length_their_sequences_fit_in(tmp_path):
    """The retrieval tasks that need more than L = 128 train at 256 (window following), the text data set reads
    --text_root's .txt files, and every data module the spec names accepts what the spec gives it."""
    from accrot.study.variants import DATASETS, DEFAULT_DATASETS, MIN_SEQ_LEN

    size = SIZES["tiny"]
    doc = build_spec("t", size, 1, ["NoPE", "accum-random"], list(DATASETS), text_root=str(tmp_path),
                     hf_source=str(tmp_path / "a.txt"))
    spec = SweepSpec(**yaml.safe_load(yaml.safe_dump(doc, sort_keys=False)))
    assert list(spec.studies()) == [f"t/{d}" for d in DATASETS]
    (tmp_path / "a.txt").write_text("some prose. " * 400)
    (tmp_path / "b.txt").write_text("other prose. " * 400)
    for st in spec.strata():
        data, variant = st.variant.split(".", 1)
        over = st.overrides
        seq_len = over.get("data.init_args.seq_len", size.seq_len)
        assert seq_len == max(size.seq_len, MIN_SEQ_LEN.get(data, 0))
        if variant == "accum-random":
            assert over["model.scheme.window"] == 0.75 * seq_len
        if data in ("prose", "corpus"):
            continue  # prose: tests/data/test_prose.py (needs Debian's bible-kjv); corpus: the base config
        module, name = over["data"].rsplit(".", 1)
        cls = getattr(__import__(module, fromlist=[name]), name)
        kwargs = {k.removeprefix("data.init_args."): v for k, v in over.items() if k.startswith("data.init_args.")}
        dm = cls(**{"seq_len": seq_len, **kwargs})  # the task's sequences fit in its training length
        assert dm.seq_len == seq_len
    assert set(DEFAULT_DATASETS) == {"corpus", "local"}  # the optional ones run when --datasets names them


def test_a_state_study_runs_what_s1_to_s3_read():
    """Every state task runs the anchors, the SO(2) accumulations, PaTH and the forget-gated cells; flip-flop, where
    S3 reads far-mass control, also the field's far-mass designs crossed with a rotation: each a far-mass design,
    of which only the bias is far-mass control in S3's rule (a gate leaves the far mass, NoPE layers accumulate
    nothing, scalable softmax scales the logits)."""
    from accrot.study.options import check_args
    from accrot.study.state import controlled, far_mass_design
    from accrot.study.variants import DATASET_VARIANTS, STATE_BASE, STATE_FAR_MASS

    args = SimpleNamespace(size="study", seeds=None, workers=2, variants=None, datasets=["flipflop", "parity", "s3",
                           "s5"], corpus="stdlib", text_root=None, max_steps=None, multipliers=None, settings=None,
                           precision=None, tokens=None)
    size, seeds, variants, datasets = check_args(args)
    doc = build_spec("t", size, seeds, variants, datasets, only=DATASET_VARIANTS)
    runs = {d: sorted(st.variant.split(".", 1)[1] for st in SweepSpec(**doc).strata() if st.variant.startswith(d + "."))
            for d in datasets}
    assert runs["flipflop"] == sorted(STATE_BASE + STATE_FAR_MASS)
    assert runs["parity"] == runs["s3"] == runs["s5"] == sorted(STATE_BASE)
    assert all(far_mass_design(v) for v in STATE_FAR_MASS)
    assert [v for v in STATE_FAR_MASS if controlled(v)] == ["accum-learned+values+alibi"]
    from accrot.study.ablation import describe_scope

    scope = describe_scope(doc, "study")  # the report's header counts what each data set ran
    assert scope["per_dataset"] == {d: len(v) for d, v in runs.items()}
    assert scope["runs"] == 3 * sum(len(v) for v in runs.values()) == 96


def _accuracy_run(variant: str, seed: int, table: dict[float, dict[str, float]]) -> Run:
    rows = {m: {"multiplier": m, "length": int(128 * m), "nll": 1.0, "accuracy": sum(d.values()) / len(d),
                "bucket_width": 32, "bucket_nll": [1.0] * 4, "accuracy_by_depth": d} for m, d in table.items()}
    return Run("passkey", variant, seed, f"/runs/{variant}/{seed}", rows, 128)


def test_depth_heatmap_is_the_mean_over_seeds_per_depth_and_length(tmp_path):
    from accrot.study.figures import depth_accuracy

    runs = [_accuracy_run("NoPE", 0, {1: {"0": 1.0, "0.5": 0.5}, 2: {"0": 0.0, "0.5": 0.25}}),
            _accuracy_run("NoPE", 1, {1: {"0": 0.5, "0.5": 0.5}, 2: {"0": 1.0, "0.5": 0.75}}),
            _accuracy_run("RoPE", 0, {1: {"0": 1.0, "0.5": 1.0}})]
    res = Results(runs)
    depths, mults, grid = depth_accuracy(res, "passkey", "NoPE")
    assert depths == [0.0, 0.5] and mults == [1.0, 2.0]
    assert grid == [[0.75, 0.5], [0.5, 0.5]]
    assert depth_accuracy(res, "passkey", "RoPE")[2] == [[1.0], [1.0]]
    report = write_report(res, tmp_path, {"command": "test", "size": "tiny", "seeds": 2}).read_text()
    assert "![accuracy per depth and length](depth_passkey.png)" in report
    assert "Answer accuracy:" in report
    assert (tmp_path / "depth_passkey.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_state_task_section_says_what_an_answer_needs_and_shows_its_heatmap(tmp_path):
    """The S3 word problem's section: the accuracy table, the sentence with chance (1/6) and the commuting limit
    (1/3, computed from the group, not written here as text), and the heatmap of accuracy per length and position."""
    from accrot.study.state import accuracy_grid

    def run(variant: str, seed: int, acc: float) -> Run:
        rows = {m: {"multiplier": m, "length": int(128 * m), "nll": 1.0, "accuracy": acc, "bucket_width": 32,
                    "bucket_nll": [1.0] * int(4 * m), "bucket_accuracy": [acc] * int(4 * m)} for m in (1, 2)}
        return Run("s3", variant, seed, f"/runs/{variant}/{seed}", rows, 128)

    res = Results([run("PaTH", 0, 0.9), run("PaTH", 1, 0.7), run("accum-learned", 0, 1 / 3)])
    mults, bins, grid = accuracy_grid(res, "s3", "PaTH")
    assert mults == [1.0, 2.0] and bins == [(0.0, 1.0), (1.0, 2.0)]
    assert grid[0] == pytest.approx([0.8, 0.8]) and math.isnan(grid[1][0]) and grid[1][1] == pytest.approx(0.8)
    report = write_report(res, tmp_path, {"command": "test", "size": "tiny", "seeds": 2}).read_text()
    assert "a guess scores 1/6 = 0.167, a commuting state at best 1/|G'| = 0.333" in report
    assert "![accuracy per length and position](state_s3.png)" in report
    assert (tmp_path / "state_s3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------------
# a real ablation, interrupted and resumed
# ---------------------------------------------------------------------------------------------------
ABLATE = ["ablation", "--size=tiny", "--variants=[NoPE, RoPE]", "--datasets=[corpus]", "--seeds=2", "--max_steps=4",
          "--multipliers=[1, 2]", "--workers=2", "--study=t", "--wandb=disabled"]


def _complete(url: str) -> dict[tuple[str, int], tuple[int, str]]:
    """(variant, seed) -> (trial number, completion time) of the complete trials of the one study, t/corpus."""
    storage = open_storage(StorageRef.parse(url, "t", "."))
    out = {}
    try:
        study = optuna.load_study(study_name="t/corpus", storage=storage)
    except KeyError:
        return out
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        key = (t.params["variant"], t.params["seed"])
        assert key == (t.user_attrs["variant"], t.user_attrs["seed"])
        assert key not in out, f"{key} completed twice"
        out[key] = (t.number, str(t.datetime_complete))
    return out


@pytest.mark.slow
def test_interrupted_ablation_resumes_without_redoing_complete_trials(tmp_path):
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "accrot.cli", *ABLATE, f"--out={out}"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    url = f"sqlite:///{out}/t/study.db"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    deadline, before = time.time() + 300, {}
    while time.time() < deadline and proc.poll() is None and len(before) < 1:
        time.sleep(0.5)
        if (out / "t" / "workers").exists():
            try:
                before = _complete(url)
            except Exception:  # noqa: BLE001 - the storage is being written: poll again
                before = {}
    if proc.poll() is not None or not 1 <= len(before) < 4:
        proc.kill()
        pytest.fail(f"could not interrupt the ablation mid-way ({len(before)} trials complete, exit "
                    f"{proc.poll()}):\n{proc.communicate()[0][-3000:]}")
    proc.send_signal(signal.SIGTERM)  # what a scheduler or `kill` sends: the sweep stops as on Ctrl-C
    first = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, first[-2000:]
    assert not (out / "t" / "REPORT.md").exists(), first[-3000:]
    done = _complete(url)

    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    after = _complete(url)
    logs = first[-2000:] + again.stdout[-2000:]
    assert sorted(after) == [(v, s) for v in ("corpus.NoPE", "corpus.RoPE") for s in (0, 1)], logs
    for key, value in done.items():  # complete before the interruption: untouched, not run again
        assert after[key] == value, logs
    report = (out / "t" / "REPORT.md").read_text()
    # the main table: variant | params | seeds | ...
    assert re.search(r"\| NoPE \| \d+ k \| 2 \|", report) and re.search(r"\| RoPE \| \d+ k \| 2 \|", report)
    assert "## Claims" in report
    # RoPE's eval-time extensions, from the RoPE runs' checkpoints (no training), right after RoPE, and C1 read
    # against the best of them too
    for kind in ("PI", "NTK", "YaRN"):
        assert f"| RoPE+{kind} (eval-time extension) | – | 2 |" in report, report[:3000]
    assert "| C1-ext |" in report
    assert all((out / "t" / "corpus.RoPE").glob(f"runs/trial_*/version_0/eval-{k}/extrapolation.json")
               for k in ("pi", "ntk", "yarn"))
    # one study, the variants compared on its page: the claims table and verdicts are its dashboard note,
    # every length's NLL a user attribute of each trial
    storage = open_storage(StorageRef.parse(url, "t", "."))
    assert [n for n in optuna.get_all_study_names(storage) if n.startswith("t")] == ["t/corpus"]
    study = optuna.load_study(study_name="t/corpus", storage=storage)
    assert all({"nll@1x", "nll@2x"} <= set(t.user_attrs) for t in study.get_trials(states=(TrialState.COMPLETE,)))
    for note in [get_note(study)]:
        assert note.startswith("## t: the study's claims, 4 complete runs so far"), note[:200]
        assert "| # | claim | rule | decided by | on its null | verdict | why |" in note and "| C1 |" in note
        assert "**inconclusive**" in note
    # a second batch of seeds: the same command with --seeds 3 runs seed 2 only, the first two seeds' runs kept
    more = subprocess.run([*(a if a != "--seeds=2" else "--seeds=3" for a in cmd)], env=env, capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert more.returncode == 0, more.stdout[-2000:] + more.stderr[-2000:]
    staged = _complete(url)
    assert sorted(staged) == [(v, s) for v in ("corpus.NoPE", "corpus.RoPE") for s in (0, 1, 2)], more.stderr[-2000:]
    assert all(staged[key] == value for key, value in after.items())
    assert re.search(r"\| NoPE \| \d+ k \| 3 \|", (out / "t" / "REPORT.md").read_text())


def test_a_second_batch_of_seeds_resumes_the_first_and_fewer_seeds_are_refused(tmp_path, capsys):
    """``--seeds 1`` then ``--seeds 2``: one study, its first seed's trial kept and the second's queued (here with no
    workers, so nothing runs); ``--seeds 1`` again after that asks for other options: one line, exit 2."""
    from accrot.cli import main

    argv = ["ablation", "--study=s", "--workers=0", "--variants=[NoPE]", "--datasets=[corpus]", f"--out={tmp_path}"]
    assert main([*argv, "--seeds=1"]) == 0
    url = f"sqlite:///{tmp_path}/s/study.db"
    study = optuna.load_study(study_name="s/corpus", storage=open_storage(StorageRef.parse(url, "s", ".")))
    first = [(t.number, t.user_attrs["seed"]) for t in study.get_trials()]
    assert first == [(0, 0)]
    assert main([*argv, "--seeds=2"]) == 0
    assert [(t.number, t.user_attrs["seed"]) for t in study.get_trials()] == [(0, 0), (1, 1)]
    assert study.user_attrs["accrot"]["seeds"] == [0, 1]
    assert yaml.safe_load((tmp_path / "s" / "s.yaml").read_text())["seeds"] == [0, 1]
    capsys.readouterr()
    assert main([*argv, "--seeds=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds an ablation with other options (seeds differ)" in err[0], err


def test_the_deciding_size_runs_the_variants_c1_to_c3_compare_on_the_corpus(tmp_path):
    """``--size decide`` without --variants or --datasets: its own six variants on the corpus, 10 seeds, the
    study's recipe; its claims table reads C1–C3 on them (C2's null, NoPE, included)."""
    from accrot.cli import main
    from accrot.study.claims import C2_LEARNED, C3_PAIRS

    assert main(["ablation", "--size=decide", "--workers=0", "--study=d", f"--out={tmp_path}"]) == 0
    doc = yaml.safe_load((tmp_path / "d" / "d.yaml").read_text())
    variants = [k.split(".", 1)[1] for k in doc["variants"]]
    assert {k.split(".", 1)[0] for k in doc["variants"]} == {"corpus"}
    needed = {"accum-random", "RoPE", C2_LEARNED, "NoPE", *(v for pair in C3_PAIRS for v in pair)}
    assert set(variants) == needed and doc["seeds"] == list(range(10))
    study_doc = build_spec("s", SIZES["study"], 1, ["NoPE"], ["corpus"])
    assert doc["overrides"] == study_doc["overrides"]  # the study's recipe, unchanged


def test_bad_ablation_options_are_one_line_errors(tmp_path, capsys):
    from accrot.cli import main

    for argv, expect in [
        (["--size=huge"], "--size='huge' is not valid; choose one of study, decide, tiny, small, paper"),
        (["--variants=[NoPE, Rope]"], "--variants='Rope' is not valid; did you mean RoPE? choose one of NoPE, RoPE"),
        (["--variants", "NoPE", "Rope"], "--variants='Rope' is not valid; did you mean RoPE?"),  # shell words
        (["--variants=[NoPE, Rope"], "--variants='[NoPE, Rope' is not valid; give names (a b) or one YAML list"),
        (["--multipliers", "1", "x"], "--multipliers='1 x' is not valid"),
        (["--seeds=0"], "--seeds=0 is not valid"),
        (["--multipliers=[2, 4]"], "positive multiples of L that include 1"),
        (["--datasets", "corpus", "text"], "the text data set needs --text_root DIR"),
        (["--text_root", str(tmp_path)], "--text_root is given but --datasets does not name text"),
        (["--datasets", "text", "--text_root", "/nonexistent/books"],
         "--text_root='/nonexistent/books': no such folder"),
        (["--datasets", "prose", "passkey", "prose"], "a data set is listed twice"),
    ]:
        assert main(["ablation", *argv, f"--out={tmp_path}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("accrot: error: ") and expect in err[0], err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("ckpt_step, rows", [(150, 3), (100, 0)], ids=["same-model", "older-checkpoint"])
def test_extension_rows_come_only_from_the_model_the_rope_row_evaluated(tmp_path, ckpt_step, rows):
    """An eval-time extension row is RoPE's own model rescaled: a checkpoint from another step than the run's
    evaluation (a last.ckpt older than the end of training) would compare two models, and is left out."""
    from accrot.study.extensions import extension_runs
    from accrot.study.variants import EXTENSIONS

    run_dir = tmp_path / "run"
    lengths = [{"multiplier": 1.0, "length": 128, "nll": 2.0}]
    (run_dir).mkdir()
    (run_dir / "extrapolation.json").write_text(json.dumps({"final": {"step": 150, "lengths": lengths}}))
    for kind in EXTENSIONS.values():
        (run_dir / f"eval-{kind}").mkdir()
        (run_dir / f"eval-{kind}" / "extrapolation.json").write_text(json.dumps(
            {"train_length": 128, "final": {"step": ckpt_step, "lengths": lengths},
             "rope_scaling": RopeScaling(kind, 128).record()}))
    rope = Run("corpus", "RoPE", 0, str(run_dir), {1.0: lengths[0]}, 128)
    printed = []
    out = extension_runs(Results([rope]), console=SimpleNamespace(print=lambda m, **_: printed.append(m)))
    assert len(out) == rows and sorted(r.variant for r in out) == (sorted(EXTENSIONS) if rows else [])
    assert all(r.extension == EXTENSIONS[r.variant] for r in out)  # each row says which evaluation it is
    assert len(printed) == 3 - rows and all("from step 100, the run's evaluation from step 150" in m for m in printed)


@pytest.mark.parametrize("record, again", [
    (None, {"yarn"}),  # written before evaluations recorded their form: accrot's yarn was the paper's equation
    ({"kind": "yarn", "definition": "yarn-paper"}, {"yarn"}),
    ({"kind": "yarn", "definition": "yarn-code"}, set()),
], ids=["unrecorded", "paper-form", "code-form"])
def test_an_extension_evaluated_under_another_form_of_its_kind_is_evaluated_again(tmp_path, monkeypatch, record,
                                                                                    again):
    """A resumed study or a rebuilt report never shows a YaRN row computed with the form the name no longer means:
    the file's recorded definition (none: the old default, the paper's form) decides, kind by kind."""
    from accrot.study import extensions
    from accrot.study.variants import EXTENSIONS

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lengths = [{"multiplier": 1.0, "length": 128, "nll": 2.0}]
    (run_dir / "extrapolation.json").write_text(json.dumps({"final": {"step": 150, "lengths": lengths}}))
    for kind in EXTENSIONS.values():
        doc = {"train_length": 128, "final": {"step": 150, "lengths": lengths}}
        if kind != "yarn":
            doc["rope_scaling"] = RopeScaling(kind, 128).record()
        elif record is not None:
            doc["rope_scaling"] = record
        (run_dir / f"eval-{kind}").mkdir()
        (run_dir / f"eval-{kind}" / "extrapolation.json").write_text(json.dumps(doc))
    evaluated = []
    monkeypatch.setattr(extensions, "_evaluate", lambda run, kind: evaluated.append(kind))
    printed = []
    out = extensions.extension_runs(Results([Run("corpus", "RoPE", 0, str(run_dir), {1.0: lengths[0]}, 128)]),
                                    console=SimpleNamespace(print=lambda m, **_: printed.append(m)))
    assert set(evaluated) == again and len(out) == len(EXTENSIONS)
    assert all("again: its file holds an older form" in m for m in printed) and len(printed) == len(again)


# ---------------------------------------------------------------------------------------------------
# what the headline, the report and the summary say about what ran
# ---------------------------------------------------------------------------------------------------
def test_headline_and_report_describe_what_ran_and_mark_a_quick_look(tmp_path):
    """3 variants × 2 data sets × 2 seeds at 5 steps and 1×–4×: 12 runs, counted from the spec, and below the study
    preset in steps, seeds and lengths; the same options at the preset's own steps, seeds and lengths are not."""
    from accrot.study.ablation import describe_scope, headline

    variants, datasets = ["NoPE", "RoPE", "accum-learned+values"], ["corpus", "local"]
    scope = describe_scope(build_spec("q", SIZES["study"], 2, variants, datasets, max_steps=5, multipliers=[1, 2, 4]),
                           "study")
    text = headline(scope)
    assert text.startswith(f"{len(variants) * len(datasets) * 2} runs = 3 variants × 2 data sets × 2 seeds, 5 steps each "
                           "(d 96, 2 layers, L = 128), evaluated at 1×, 2×, 4× L; ")
    assert text.endswith("below the study preset (5 steps of its 300, 2 seeds of its 3, lengths to 4× of its 64×): "
                         "a quick look")
    full = describe_scope(build_spec("f", SIZES["study"], 3, variants, datasets), "study")
    assert full["below"] == [] and "quick look" not in headline(full) and full["runs"] == 18
    # data sets that run their own selections: the count per data set, never a product that does not hold
    own = describe_scope(build_spec("o", SIZES["study"], 3, ["NoPE", "accum-grape"], datasets,
                                    only={"local": ["NoPE"]}), "study")
    assert headline(own).startswith("9 runs = (2 on corpus + 1 on local) variants × 3 seeds, 300 steps each")

    res = synthetic(rope_far=(2.40, 2.60), random_far=(2.30, 2.60))
    meta = {"command": "test", "size": "study", "size_cost": SIZES["study"].cost, "seeds": 2, "scope": scope}
    report = write_report(res, tmp_path, meta).read_text()
    (ran,) = [ln for ln in report.splitlines() if ln.startswith("- ran: ")]
    assert ran.startswith("- ran: 12 runs = 3 variants (NoPE, RoPE, accum-learned+values) × 2 data sets (corpus, "
                          "local) × 2 seeds; 5 training steps each")
    assert "this study ran below it (5 steps of its 300, 2 seeds of its 3, lengths to 4× of its 64×)" in report
    claims = report[report.index("## Claims"):]
    assert claims.splitlines()[2].startswith("> **A quick look, not a result**")
    at_preset = write_report(res, tmp_path / "full", {**meta, "scope": full}).read_text()
    assert "A quick look, not a result" not in at_preset and "ran below" not in at_preset
    assert "- size preset: study (" in at_preset


def test_a_shared_study_summary_names_no_best_trial(tmp_path):
    """The ablation's studies are a grid of variants × seeds compared side by side: the end-of-sweep summary counts
    them and names no 'best' variant; a tuning sweep (one study per configuration space) still does."""
    from rich.console import Console

    from accrot.sweep.parent import _print_summary
    from accrot.sweep.spec import load_spec

    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(build_spec("grid", SIZES["tiny"], 2, ["NoPE", "RoPE"], ["corpus"])))
    spec = load_spec(path)
    study = optuna.create_study(study_name="grid/corpus")
    for i, nll in enumerate((2.0, 1.9)):
        study.add_trial(optuna.trial.create_trial(params={"x": float(i)}, value=nll,
                                                  distributions={"x": optuna.distributions.FloatDistribution(0, 1)}))
    out = Console(record=True, width=200)
    _print_summary(out, spec, [study], StorageRef.parse(None, spec.name, tmp_path), tmp_path)
    text = out.export_text()
    assert "grid/corpus: 2 complete, 0 pruned, 0 fail" in text and "best" not in text
    tuning = load_spec("smoke")  # one study, TPE over lr and the scheme: its best trial is what it is for
    out = Console(record=True, width=200)
    _print_summary(out, tuning, [study], StorageRef.parse(None, tuning.name, tmp_path), tmp_path)
    assert "best #1 nll@2x=1.9000" in out.export_text()

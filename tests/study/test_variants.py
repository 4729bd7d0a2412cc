"""The study's variants as data (accrot/study/variants.py): each builds, each has its one sentence for the report,
the reference parameterisations are what the variants name, and the regularity controls stand where their
descriptions say (RoPE+jitter mixes like accum-random; accum-random-ladder leaves slow pairs coherent)."""

from __future__ import annotations

import math

import pytest
import torch

from accrot.model import ModelConfig, Transformer
from accrot.position import SchemeConfig, build
from accrot.study.ablation import build_spec
from accrot.study.variants import (
    DEFAULT_VARIANTS,
    DESCRIPTIONS,
    OPTIONAL,
    SIZES,
    VARIANTS,
    WINDOW_FRACTION,
    WINDOWED,
)

STUDY = SIZES["study"]
D_MODEL, N_HEADS = STUDY.overrides["model.d_model"], 4  # the study's shape (tiny.yaml: 4 heads)


def scheme_of(label: str, seq_len: int = STUDY.seq_len) -> SchemeConfig:
    """The variant's scheme as the ablation's spec sets it (the windowed ones get their window)."""
    over = dict(VARIANTS[label])
    if label in WINDOWED:
        over["window"] = WINDOW_FRACTION * seq_len
    return SchemeConfig(**over)


def test_every_variant_builds_and_has_one_sentence():
    assert set(DESCRIPTIONS) == set(VARIANTS)
    for label, text in DESCRIPTIONS.items():
        assert text.endswith(".") and text.count(". ") == 0, label  # one sentence
    assert set(OPTIONAL) <= set(VARIANTS) and not set(OPTIONAL) & set(DEFAULT_VARIANTS)
    for label in VARIANTS:
        build(scheme_of(label), D_MODEL, N_HEADS)


def test_reference_variants_and_their_plain_ablations():
    """accum-learned and PaTH are the references' parameterisations; the -plain variants are the earlier settings:
    full rank, no convolution (and for learned increments: no ladder, the ±1 rad bound, the raw input)."""
    learned, plain = scheme_of("accum-learned"), scheme_of("accum-learned-plain")
    assert (learned.increment_rank, learned.conv_size, learned.learned_ladder) == (16, 4, True)
    assert (plain.increment_rank, plain.conv_size, plain.learned_ladder, plain.max_increment,
            plain.learned_form) == (0, 0, False, 1.0, "plain")
    path, path_plain = scheme_of("PaTH"), scheme_of("PaTH-plain")
    assert (path.path_rank, path.conv_size, path.learned_init_std) == (32, 3, 0.02)
    assert (path_plain.path_rank, path_plain.conv_size, path_plain.learned_init_std) == (0, 0, None)
    assert scheme_of("PaTH-FoX").forget_init == scheme_of("accum-learned+values+forget").forget_init == "fox"
    assert scheme_of("accum-learned+values+forget-alibi-init").forget_init == "alibi"
    assert scheme_of("accum-grape").increments == "softplus"


def test_regularity_controls_are_what_their_descriptions_say():
    """RoPE+jitter: every pair's window equals accum-random's (the drift does not change |φ|), all under L.
    accum-random-ladder: pair 0 mixes at 0.75 L, but pairs mix ever more slowly down the ladder and most never do
    within the longest evaluated length (64× L): the regularity condition broken."""
    L = STUDY.seq_len
    windows = {v: torch.tensor(build(scheme_of(v), D_MODEL, N_HEADS).describe()["mixing_window"])
               for v in ("accum-random", "RoPE+jitter", "accum-random-ladder")}
    assert torch.allclose(windows["RoPE+jitter"], windows["accum-random"])
    assert bool((windows["accum-random"] < L).all())
    ladder = windows["accum-random-ladder"]
    assert ladder[0].item() == pytest.approx(WINDOW_FRACTION * L)
    assert bool((ladder[1:] > ladder[:-1]).all())
    longest = max(STUDY.multipliers) * L
    assert (ladder > longest).sum().item() >= len(ladder) // 2
    assert math.isfinite(ladder.max().item())


def test_the_spec_sets_the_controls_window():
    doc = build_spec("t", STUDY, 1, ["RoPE+jitter", "accum-random-ladder"], ["corpus"])
    for label in ("RoPE+jitter", "accum-random-ladder"):
        over = doc["variants"][f"corpus.{label}"]
        assert over["model.scheme.window"] == WINDOW_FRACTION * STUDY.seq_len
    assert doc["variants"]["corpus.accum-random-ladder"]["model.scheme.increment_spread"] == "ladder"


def test_parameter_counts_at_the_study_size():
    """What each variant adds to the shared backbone at the study's shape (vocabulary 256): the scheme's own
    parameters, so a table can show them beside the NLLs."""
    def count(label: str) -> tuple[int, int]:
        model = Transformer(ModelConfig(d_model=D_MODEL, n_layers=2, n_heads=N_HEADS, scheme=scheme_of(label)))
        return model.num_parameters(), sum(p.numel() for s in model.schemes() for p in s.parameters())

    nope, _ = count("NoPE")
    P, HD = D_MODEL // N_HEADS // 2, D_MODEL
    # two layers: Selective RoPE's 16-rank projection and width-4 conv over H·P channels
    assert count("accum-learned") == (nope + 2 * (16 * D_MODEL + 16 * N_HEADS * P + 4 * N_HEADS * P),
                                      2 * (16 * D_MODEL + 16 * N_HEADS * P + 4 * N_HEADS * P))
    # fla's PaTH: rank-32 w, width-3 conv over H·D channels, β projection with bias
    path = 32 * D_MODEL + 32 * HD + 3 * HD + D_MODEL * N_HEADS + N_HEADS
    assert count("PaTH") == (nope + 2 * path, 2 * path)
    assert count("accum-grape") == (nope + 2 * (D_MODEL + 1 + P), 2 * (D_MODEL + 1 + P))

"""The study's variants as data (accrot/study/variants.py): one record per variant and per data set, the lists the
ablation reads derived from them; each variant builds, each has its one sentence for the report, the reference
parameterisations are what the variants name, and the regularity controls stand where their descriptions say
(RoPE+jitter mixes like accum-random; accum-random-ladder leaves slow pairs coherent)."""

from __future__ import annotations

import math

import pytest
import torch

from accrot.model import ModelConfig, Transformer
from accrot.position import SchemeConfig, build
from accrot.study.ablation import build_spec
from accrot.study.variants import (
    ANSWER_TASKS,
    DATASET_RECORDS,
    DATASET_VARIANTS,
    DATASETS,
    DEFAULT_DATASETS,
    DEFAULT_VARIANTS,
    DESCRIPTIONS,
    EXTENSION_RECORDS,
    EXTENSIONS,
    OPTIONAL,
    SIZES,
    STATE_TASKS,
    STATE_VARIANTS,
    VARIANT_RECORDS,
    VARIANTS,
    WINDOW_FRACTION,
    WINDOWED,
    Variant,
    by_name,
    extension_of,
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


def test_records_are_named_once_and_the_derived_views_follow_them():
    """A name is one record (a second of the same name is an error, not a silent overwrite); every view the ablation
    reads is its records' field, in the records' order."""
    with pytest.raises(ValueError, match="two study records are named 'NoPE'"):
        by_name([Variant("NoPE", {}, "a."), Variant("NoPE", {"rotation": "rope"}, "b.")])
    assert all(k == r.name for k, r in VARIANT_RECORDS.items()) and all(k == d.name for k, d in DATASET_RECORDS.items())
    assert list(VARIANTS) == list(VARIANT_RECORDS) and list(DATASETS) == list(DATASET_RECORDS)
    assert all(VARIANTS[n] == dict(r.scheme) and DESCRIPTIONS[n] == r.description for n, r in VARIANT_RECORDS.items())
    assert DEFAULT_VARIANTS == [n for n in VARIANTS if n not in OPTIONAL]
    assert set(WINDOWED) == {n for n, r in VARIANT_RECORDS.items() if r.windowed}
    # the records are read-only: a consumer's copy is its own
    with pytest.raises(TypeError):
        VARIANT_RECORDS["RoPE"].scheme["rotation"] = "none"  # type: ignore[index]
    VARIANTS["RoPE"]["rope_base"] = 1.0
    try:
        assert "rope_base" not in VARIANT_RECORDS["RoPE"].scheme
    finally:
        del VARIANTS["RoPE"]["rope_base"]


def test_the_default_selections_are_the_documented_ones_in_order():
    """The default study's 17 variants and the data sets' own selections (the README lists them), in the study's
    order: the order the spec queues the runs in and the tables print them in."""
    assert DEFAULT_VARIANTS == ["NoPE", "RoPE", "ALiBi", "accum-random", "accum-random-ladder", "accum-token",
                                "accum-learned", "accum-learned+values", "accum-learned-noladder",
                                "accum-learned-noladder+values", "accum-random+values", "accum-grape", "PaTH", "PaTH-FoX",
                                "accum-learned+values+forget", "accum-learned+values+alibi", "accum-random+alibi"]
    assert DEFAULT_DATASETS == ("corpus", "local")
    local = DATASET_VARIANTS["local"]
    assert len(local) == 11 and local == [v for v in DEFAULT_VARIANTS if v in local]  # the study's order
    assert not {"accum-random-ladder", "accum-token", "accum-grape"} & set(local)  # read on the corpus's diagnostics
    base = DATASET_VARIANTS["parity"]
    assert STATE_VARIANTS == DATASET_VARIANTS["flipflop"] == DATASET_VARIANTS["flipflop-dense"]
    assert STATE_VARIANTS[:len(base)] == base and base == [v for v in VARIANTS if v in base]
    assert set(DATASET_VARIANTS) == {"local", *STATE_TASKS}
    assert ANSWER_TASKS == tuple(d for d in DATASETS if d in ANSWER_TASKS) and ANSWER_TASKS[0] == "local"


@pytest.mark.parametrize("name", list(DATASET_RECORDS))
def test_every_data_set_record_is_consistent(name):
    """What a data set runs by default exists; a state task scores its answers only; what it overrides selects a
    data module by its dotted path (the corpus: the recipe's own)."""
    d = DATASET_RECORDS[name]
    assert d.title and d.min_seq_len >= 0
    if d.variants is not None:
        assert d.variants and set(d.variants) <= set(VARIANT_RECORDS) and len(set(d.variants)) == len(d.variants)
    assert d.answers_only or not d.state
    assert set(d.overrides) <= {"data"} | {k for k in d.overrides if k.startswith("data.init_args.")}
    assert d.overrides.get("data", "data_modules.").startswith("data_modules.")


def test_every_default_variant_builds_a_scheme_config_and_only_random_increments_are_windowed():
    """A variant is model.scheme overrides only: each default one a valid SchemeConfig as the spec writes it; the
    spec sets a mixing window on exactly the random increments (a window is what their spread is chosen by)."""
    for name in DEFAULT_VARIANTS:
        assert isinstance(scheme_of(name), SchemeConfig)
    for name, r in VARIANT_RECORDS.items():
        assert r.windowed == str(r.scheme.get("increments", "")).startswith("random"), name


def test_extension_records_are_rope_scalings_of_a_trained_variant():
    from accrot.position.rope_scaling import SCALINGS

    assert EXTENSIONS == {e.label: e.kind for e in EXTENSION_RECORDS}
    for e in EXTENSION_RECORDS:
        assert e.kind in SCALINGS and e.of in VARIANT_RECORDS and e.label not in VARIANT_RECORDS
        assert e.label.startswith(e.name) and "eval-time extension" in e.label  # what the row is, where printed
        assert extension_of(e.label) == e
    assert extension_of("RoPE+ssmax") is None and extension_of("RoPE") is None


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

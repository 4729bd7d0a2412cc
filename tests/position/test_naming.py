"""One name per scheme: the label and the run folder are spellings of the same tokens, every variant of the study
gets its own, and the registries' vocabularies are the config's."""

from __future__ import annotations

import re
from typing import get_args

import pytest

from accrot.position import FAR_MASS, OUTPUT_GATES, ROTATIONS, SchemeConfig
from accrot.position.config import FarMass, OutputGate, Rotation


def _study_configs() -> dict[str, SchemeConfig]:
    from accrot.study.variants import VARIANTS

    return {v: SchemeConfig(**over) for v, over in VARIANTS.items()}


def test_every_variant_of_the_study_has_its_own_label_and_folder():
    configs = _study_configs()
    labels = {v: c.label() for v, c in configs.items()}
    folders = {v: c.run_name() for v, c in configs.items()}
    assert len(set(labels.values())) == len(labels), labels
    assert len(set(folders.values())) == len(folders), folders
    # the large-base RoPE is another scheme than RoPE, and its name says so (it shared RoPE's label before)
    assert labels["RoPE"] == "rope/none" and labels["RoPE-base500k"] == "rope/none{base500000}"
    assert labels["accum-learned-plain"] == "accum:learned/none{plain,rank0,conv0,noladder}"


@pytest.mark.parametrize("variant", sorted(_study_configs()))
def test_the_folder_spells_the_label_s_tokens(variant):
    """Splitting either spelling at its separators gives the same tokens in the same order (the label's
    ``rotation:increments`` / ``far_mass`` / ``+parts`` / ``(pattern)`` / ``{settings}``)."""
    cfg = _study_configs()[variant]
    label = cfg.label()
    m = re.fullmatch(r"(?P<cell>[^({]+)(?:\((?P<pattern>[^)]*)\))?(?:\{(?P<settings>[^}]*)\})?", label)
    assert m, label
    rotation, rest = m["cell"].split("/")
    far_mass, *extras = rest.split("+")
    gates = [e for e in extras if e in ("gate", "headgate")]
    values = [e for e in extras if e == "values"]
    assert len(gates) + len(values) == len(extras), label
    settings = m["settings"].split(",") if m["settings"] else []
    pattern = ["layers_" + m["pattern"].replace(",", "_")] if m["pattern"] else []
    tokens = [*rotation.split(":"), far_mass, *values, *settings, *gates, *pattern]
    assert "-".join(tokens) == cfg.run_name()


def test_a_setting_that_only_changes_how_a_scheme_is_computed_is_not_in_its_name():
    base = SchemeConfig(rotation="path")
    for other in (SchemeConfig(rotation="path", chunk_size=16), SchemeConfig(rotation="path", path_kernel="recurrent"),
                  SchemeConfig(rotation="path", seed=7)):
        assert other.label() == base.label() == "path/none" and other.run_name() == base.run_name()


def test_the_registries_build_exactly_the_config_s_vocabulary():
    """A family added to the config's Literal but never registered (or registered under a name the config rejects)
    is caught here, not by a user's first run."""
    assert set(ROTATIONS) == set(get_args(Rotation))
    assert set(FAR_MASS) | {"none"} == set(get_args(FarMass)) and "none" not in FAR_MASS
    assert set(OUTPUT_GATES) | {"none"} == set(get_args(OutputGate)) and "none" not in OUTPUT_GATES


def test_the_bench_names_each_cell_apart_by_its_scheme_s_label():
    from accrot.bench.grid import grid

    cells = grid()
    names = [c.name for c in cells]
    assert len(set(names)) == len(cells) and "accum:learned/forget+values" in names  # not the bench's own "+v"

"""What a scheme is, read off its parts' declared facts through the registries, without building a module.

:func:`facts` answers the questions the study, the diagnostics and resuming ask of a scheme (does it accumulate,
commute, draw at random, control far mass, ...) for a :class:`~accrot.position.config.SchemeConfig` or a saved
scheme dict; :func:`reads` and :func:`ignored` say which options the parts in use read. Each part class declares its
own facts (:mod:`accrot.position.base`), so a new family answers for itself and no reader tests family names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from accrot.errors import ConfigError
from accrot.position.config import SchemeConfig
from accrot.position.scheme import FAR_MASS, INCREMENTS, OUTPUT_GATES, ROTATIONS

# options every run fills in whatever its scheme (the CLI's seed and the tokenizer's vocabulary): never "ignored"
RUN_WIDE = frozenset(("seed", "vocab_size"))


@dataclass(frozen=True)
class SchemeFacts:
    """The declared facts of one scheme (of its first layer's cell; ``position_free_layers`` says whether a
    ``layer_pattern`` drops the rotation in some layers).

    Attributes:
        transport: the rotation's kind, ``"none"``, ``"so2"`` (angles) or ``"path"`` (Householder products).
        accumulates: M_{t,s} is a product of per-token factors from the data or from draws (accum, PaTH).
        commutes: those factors commute (SO(2) and no rotation); PaTH's do not.
        random: something is drawn at random (random increments, a learned mixing floor): the seed matters.
        learned: the transport is a learned function of the input (learned or softplus increments, PaTH).
        drifts: non-negative increments by construction (softplus): a drift whose slow pairs stay coherent.
        fresh_draws: a new draw per position and batch (random_position): no one draw is the model's transport,
            so its coherence is measured under fresh draws of the distribution (the instrument's calibration).
        regularity: the theory's condition that every pair mixes: ``"holds"`` by construction (random increments
            of one spread, a mixing floor), ``"may hold"`` (learned: training decides), ``"fails"`` by construction
            (a spread on RoPE's ladder, a softplus drift), None where nothing accumulates.
        rotates_values: values are transported along the same rotations.
        controls_far_mass: a term on the logits that grows with distance (ALiBi, a forget gate): the far-mass
            lower bound's meaning of control.
        scales_logits: a factor on each row's logits that grows with its number of keys (scalable softmax).
        gates_output: a gate on the attention output (it leaves the attention weights, and the far mass, as is).
        position_free_layers: some layers drop the rotation (``layer_pattern``, NoPE interleaving).
    """

    transport: str
    accumulates: bool
    commutes: bool
    random: bool
    learned: bool
    drifts: bool
    fresh_draws: bool
    regularity: str | None
    rotates_values: bool
    controls_far_mass: bool
    scales_logits: bool
    gates_output: bool
    position_free_layers: bool

    @property
    def rotates(self) -> bool:
        """Any rotation at all (RoPE included)."""
        return self.transport != "none"

    @property
    def breaks_condition(self) -> bool:
        """The regularity condition fails by construction: the theory predicts coherent pairs, not a window."""
        return self.regularity == "fails"

    @property
    def rotation_only(self) -> bool:
        """An accumulated transport whose far mass nothing controls, so the lower bound applies: no logit term
        growing with distance, and no logit factor growing with the keys (scalable softmax moves the bound's
        premise, logits whose scale does not change with the length). An output gate or position-free layers
        leave it rotation-only."""
        return self.accumulates and not self.controls_far_mass and not self.scales_logits

    @property
    def far_mass_design(self) -> bool:
        """Any of the field's far-mass designs: a growing bias, scalable softmax, an output gate, NoPE layers."""
        return self.controls_far_mass or self.scales_logits or self.gates_output or self.position_free_layers


def config_of(scheme: SchemeConfig | Mapping[str, Any] | None) -> SchemeConfig:
    """``scheme`` as a config: a SchemeConfig as is; a dict (run.json's ``scheme``, a checkpoint's hyperparameters,
    a scheme's ``describe()``, a variant's overrides) through :meth:`SchemeConfig.of`."""
    if isinstance(scheme, SchemeConfig):
        return scheme
    config = SchemeConfig.of(scheme)
    if config is None:
        raise ConfigError(f"{dict(scheme or {})!r} describes no valid scheme")
    return config


def _rotation(cfg: SchemeConfig) -> dict:
    return ROTATIONS[cfg.rotation].declared(cfg)


def facts(scheme: SchemeConfig | Mapping[str, Any] | None) -> SchemeFacts:
    """The :class:`SchemeFacts` of ``scheme`` (a SchemeConfig or a saved scheme dict: :func:`config_of`), from the
    part classes its config selects; nothing is built. A dict that describes no valid scheme is a ConfigError."""
    cfg = config_of(scheme)
    rotation = ROTATIONS[cfg.rotation]
    own = _rotation(cfg)
    far = FAR_MASS.get(cfg.far_mass)
    gate = OUTPUT_GATES.get(cfg.output_gate)
    return SchemeFacts(
        transport=rotation.kind, accumulates=rotation.accumulates, commutes=rotation.commutes,
        random=own["random"], learned=own["learned"], drifts=own["drifts"], fresh_draws=own["fresh_draws"],
        regularity=own["regularity"], rotates_values=bool(cfg.rotate_values),
        controls_far_mass=bool(far and far.controls_far_mass), scales_logits=bool(far and far.scales_logits),
        gates_output=bool(gate and gate.gates_output), position_free_layers="none" in (cfg.layer_pattern or ()))


def parts_of(cfg: SchemeConfig) -> tuple[type, ...]:
    """The part classes ``cfg`` builds: its rotation (with its increment source and mixing floor), far mass, gate."""
    extra = (FAR_MASS.get(cfg.far_mass), OUTPUT_GATES.get(cfg.output_gate))
    return (*_rotation(cfg)["parts"], *(p for p in extra if p is not None))


def reads(scheme: SchemeConfig | Mapping[str, Any] | None) -> frozenset[str]:
    """The options the parts of ``scheme`` read (less what one part makes unused: PaTH's walk and ``block_size``)."""
    parts = parts_of(config_of(scheme))
    unread = {name for p in parts for name in getattr(p, "unread", ())}
    return frozenset(name for p in parts for name in p.reads if name not in unread)


def _registries() -> tuple[tuple[str, dict], ...]:
    return (("rotation", ROTATIONS), ("increments", INCREMENTS), ("far_mass", FAR_MASS),
            ("output_gate", OUTPUT_GATES))


def readers(option: str) -> str:
    """Who reads ``option``, in words: ``rotation='accum'``, ``rotation='path' or increments='learned'``."""
    said, unread = [], []
    for selector, registry in _registries():
        names = list(dict.fromkeys(n for n, cls in registry.items() if option in cls.reads))
        if names:
            said.append(f"{selector}={names[0]!r}" + "".join(f" or {n!r}" for n in names[1:]))
        unread += [f"{selector}={n!r}" for n, cls in registry.items() if option in getattr(cls, "unread", ())]
    return " or ".join(said) + (f" without {' or '.join(unread)}" if unread else "")


def ignored(cfg: SchemeConfig) -> list[tuple[str, str]]:
    """``(field, who reads it)`` for every option set to other than its default that no part of ``cfg`` reads, in
    the config's field order: the run would silently not be what its config says (``window`` with ``rotation='rope'``),
    so the command warns about each."""
    someone = {name for _, registry in _registries() for cls in registry.values() for name in cls.reads}
    mine = reads(cfg)
    return [(f.name, readers(f.name)) for f in fields(cfg)
            if f.name in someone and f.name not in RUN_WIDE and f.name not in mine and getattr(cfg, f.name) != f.default]

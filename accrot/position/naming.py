"""One name per scheme, derived from its config: :func:`label` (what tables, figures, sweeps, the bench and error
messages print) and :func:`run_name` (the folder a run of it trains in) are two spellings of the same tokens.

A scheme's tokens are its cell of the ablation grid — rotation (and increments), far mass, value transport, output
gate, layer pattern — and every setting that makes it another scheme than that cell's reference implementation
(the accum options that change what the increments are, a learned or PaTH projection other than the reference's, the
ALiBi-initialised forget gate, a RoPE base other than 10000). Two configs that train different schemes never share a
name; a setting that only changes how a scheme is computed (a kernel, a chunk size) or its seed is not in it.
"""

from __future__ import annotations

from accrot.position.reference import REFERENCE, REFERENCE_INIT_STD

# the output gate's token, and its label suffix: ``+gate`` elementwise (the reference), ``+headgate`` one per head
GATE_TOKEN = {"none": None, "elementwise": "gate", "headwise": "headgate"}
# accum's increment options that make another kind of increments (the drift control, the frequency ladder, ...),
# with the value that is the plain cell
_NAMED_INCREMENT_OPTIONS = {"increment_mean": "zero", "increment_spread": "constant", "increment_family": "gaussian"}
_SHORT = {"increment_rank": "rank", "path_rank": "rank", "conv_size": "conv", "ladder_base": "ladder"}


def settings(cfg) -> list[str]:
    """The settings that make ``cfg`` another scheme than its cell's reference implementation, in a fixed order:
    ``mean_rope``, ``spread_ladder``, ``family_uniform`` (random increments), ``plain``, ``rank0``, ``conv0``,
    ``noladder``, ``ladder10000`` (a learned or PaTH projection), ``torchinit`` / ``init0.5`` (its init),
    ``alibi_init`` (the forget gate), ``reflection`` / ``betamax1`` (PaTH's β), ``base500000`` (RoPE's base);
    empty for a reference cell."""
    out = []
    if cfg.rotation == "accum":
        out += [f"{k.removeprefix('increment_')}_{getattr(cfg, k)}" for k, off in _NAMED_INCREMENT_OPTIONS.items()
                if getattr(cfg, k) != off]
    part = cfg.increments if cfg.rotation == "accum" else cfg.rotation
    if part == "learned" and cfg.learned_form != "selective":
        out.append(cfg.learned_form)
    for name, ref in REFERENCE.get(part, {}).items():
        value = getattr(cfg, name)
        if value != ref:
            out.append(("ladder" if value else "noladder") if name == "learned_ladder" else f"{_SHORT[name]}{value:g}")
    if part in ("learned", "path") and cfg.learned_init_std != REFERENCE_INIT_STD:
        out.append("torchinit" if cfg.learned_init_std is None else f"init{cfg.learned_init_std:g}")
    if cfg.far_mass == "forget" and cfg.forget_init != "fox":
        out.append(f"{cfg.forget_init}_init")
    if cfg.rotation == "path" and cfg.path_beta != "learned":
        out.append(cfg.path_beta)
    if cfg.rotation == "path" and cfg.beta_max != 2.0:
        out.append(f"betamax{cfg.beta_max:g}")
    if cfg.rotation == "rope" and cfg.rope_base != 10000.0:
        out.append(f"base{cfg.rope_base:g}")
    return out


def label(cfg) -> str:
    """``rotation[:increments]/far_mass[+values][+gate][(pattern)][{settings}]``: ``accum:learned/forget+values``,
    ``rope/ssmax``, ``rope/none+gate`` (``+headgate``: one gate per head), ``rope/none(cell,none)`` (every 2nd layer
    NoPE), ``rope/none{base500000}``, ``accum:learned/none{plain,rank0,conv0,noladder}``. Parentheses and braces,
    never brackets: rich's tables read brackets as markup."""
    rotation = f"{cfg.rotation}:{cfg.increments}" if cfg.increments else cfg.rotation
    name = f"{rotation}/{cfg.far_mass}" + ("+values" if cfg.rotate_values else "")
    gate = GATE_TOKEN[cfg.output_gate]
    name += f"+{gate}" if gate else ""
    name += f"({','.join(cfg.layer_pattern)})" if cfg.layer_pattern else ""
    extra = settings(cfg)
    return name + ("{" + ",".join(extra) + "}" if extra else "")


def run_name(cfg) -> str:
    """The same tokens as a folder name, joined by ``-``: ``rope-none``, ``accum-learned-forget-values``,
    ``accum-random_position-none-mean_rope``, ``path-none-rank0-conv0-torchinit``, ``rope-none-gate``,
    ``rope-none-layers_cell_none``."""
    parts = [cfg.rotation, cfg.increments, cfg.far_mass, "values" if cfg.rotate_values else None, *settings(cfg),
             GATE_TOKEN[cfg.output_gate], "layers_" + "_".join(cfg.layer_pattern) if cfg.layer_pattern else None]
    return "-".join(p for p in parts if p)

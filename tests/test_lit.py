"""The LightningModule's optimiser: which parameters are decayed. The position scheme's own matrices (its
projections, convolutions and gates) take ``scheme_weight_decay``, 0 by default, the backbone's matrices
``weight_decay``, vectors nothing; the three groups keep their order whatever the scheme has."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from accrot.lit import LitLM
from accrot.position import SchemeConfig

SCHEMES = {
    "nope": SchemeConfig(),
    "learned-forget": SchemeConfig(rotation="accum", increments="learned", far_mass="forget"),
    "path": SchemeConfig(rotation="path"),
    "softplus": SchemeConfig(rotation="accum", increments="softplus"),
}


def optimiser(module: LitLM) -> torch.optim.Optimizer:
    module._trainer = SimpleNamespace(max_steps=10)  # the schedule's length, as a Trainer would give it
    try:
        return module.configure_optimizers()["optimizer"]
    finally:
        module._trainer = None


@pytest.mark.parametrize("name", list(SCHEMES))
def test_scheme_matrices_are_not_decayed_by_default(name):
    """One AdamW step with every gradient zero is decay alone: the backbone's matrices shrink by lr·wd, the
    scheme's parameters and every vector stay; each trainable parameter is in exactly one group."""
    torch.manual_seed(0)
    module = LitLM(d_model=32, n_layers=1, n_heads=4, lr=0.01, weight_decay=0.5, warmup_steps=0,
                   scheme=SCHEMES[name])
    opt = optimiser(module)
    assert [g["name"] for g in opt.param_groups] == ["backbone", "scheme", "vectors"]
    grouped = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in module.parameters() if p.requires_grad)
    scheme_matrices = {id(p) for block in module.model.blocks for p in block.attn.scheme.parameters() if p.dim() >= 2}
    assert {id(p) for p in opt.param_groups[1]["params"]} == scheme_matrices
    assert bool(scheme_matrices) == (name != "nope")
    assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0, 0.0]
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in module.named_parameters():
        if ".scheme." in n or p.dim() < 2:
            assert torch.equal(p, before[n]), n
        else:
            torch.testing.assert_close(p, before[n] * (1 - 0.01 * 0.5), rtol=1e-6, atol=0)


def test_scheme_weight_decay_is_a_choice():
    torch.manual_seed(0)
    module = LitLM(d_model=32, n_layers=1, n_heads=4, lr=0.01, weight_decay=0.0, scheme_weight_decay=0.5,
                   warmup_steps=0, scheme=SCHEMES["path"])
    opt = optimiser(module)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in module.named_parameters():
        if ".scheme." in n and p.dim() >= 2:
            torch.testing.assert_close(p, before[n] * (1 - 0.01 * 0.5), rtol=1e-6, atol=0)
        else:
            assert torch.equal(p, before[n]), n

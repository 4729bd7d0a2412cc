"""The backbone: shapes, tying, causality, and no Lightning import."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from accrot.model import ModelConfig, Transformer
from accrot.position import ConfigError
from tests.conftest import tiny_model

CELLS = [
    dict(rotation="none"),
    dict(rotation="rope"),
    dict(far_mass="alibi"),
    dict(rotation="rope", far_mass="alibi"),
    dict(rotation="accum", increments="random_position"),
    dict(rotation="accum", increments="learned", rotate_values=True, far_mass="forget"),
    dict(rotation="path"),
    dict(rotation="path", far_mass="forget"),
]


def cell_id(cell: dict) -> str:
    return "-".join(f"{v}" for v in cell.values())


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
def test_shapes_and_causal_prefix_invariance(cell):
    model = tiny_model(**cell).eval()
    tokens = torch.randint(0, 256, (2, 37))
    with torch.no_grad():
        full = model(tokens)
        prefix = model(tokens[:, :20])
    assert full.shape == (2, 37, 256)
    torch.testing.assert_close(prefix, full[:, :20], rtol=1e-5, atol=1e-5)


def test_tied_embeddings_share_storage():
    model = Transformer(ModelConfig(d_model=32, n_layers=1, n_heads=2))
    assert model.head.weight is model.embed.weight
    untied = Transformer(ModelConfig(d_model=32, n_layers=1, n_heads=2, tie_embeddings=False))
    assert untied.head.weight is not untied.embed.weight
    assert model.num_parameters() < untied.num_parameters()


def test_gradients_reach_every_parameter():
    model = tiny_model(rotation="rope")
    tokens = torch.randint(0, 256, (2, 16))
    model(tokens).logsumexp(-1).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


@pytest.mark.parametrize(
    "kwargs, field",
    [(dict(d_model=30, n_heads=4), "d_model"), (dict(n_layers=0), "n_layers"), (dict(vocab_size=-1), "vocab_size")],
    ids=["indivisible", "zero-layers", "negative-vocab"],
)
def test_bad_shapes_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig(**kwargs)


def test_backbone_imports_no_lightning():
    code = "import sys, accrot.model; bad = [m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')]; print(bad); sys.exit(bool(bad))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr

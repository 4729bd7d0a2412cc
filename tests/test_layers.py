"""Imports flow one way (pyproject.toml ``[tool.importlinter]``, the layout in accrot/README.md): the tree keeps
every contract, and an upward import, added to a copy of the tree, breaks one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(tree: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "HOME": str(tree)}
    return subprocess.run([str(LINT), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=120)


def copy_tree(dst: Path) -> Path:
    for name in ("accrot", "callbacks", "data_modules"):
        shutil.copytree(REPO / name, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "build"))
    shutil.copy(REPO / "pyproject.toml", dst / "pyproject.toml")
    where = subprocess.run([sys.executable, "-c", "import accrot; print(accrot.__file__)"], cwd=dst,
                           env={"PYTHONPATH": str(dst)}, capture_output=True, text=True)
    if not where.stdout.strip().startswith(str(dst)):
        pytest.skip(f"the copy is not imported first ({where.stdout.strip() or where.stderr.strip()[-200:]})")
    return dst


def test_the_tree_keeps_every_contract():
    res = lint(REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout


@pytest.mark.parametrize(("module", "upward"), [
    ("accrot/model.py", "import accrot.sweep.worker"),  # the maths half reaching up into the orchestration
    ("accrot/errors.py", "from accrot.run import args"),  # a base module that would close a circle
    ("accrot/sweep/spec.py", "from accrot.sweep.parent import run_sweep"),  # upward inside a stage
    ("data_modules/streams.py", "from callbacks import preemption"),  # independent siblings
    ("accrot/model.py", "from accrot.position.accum import RandomPositionIncrements"),  # a family, not the scheme API
    # an instrument recomputing attention from the kernels' primitives instead of asking the scheme
    ("accrot/diagnostics/far_mass.py", "from accrot.ops.path import naive_path_attention_products"),
], ids=["model->sweep", "errors->run", "spec->parent", "data->callbacks", "model->accum", "diagnostics->path-op"])
def test_an_upward_import_breaks_a_contract(tmp_path, module, upward):
    tree = copy_tree(tmp_path)
    path = tree / module
    text = path.read_text()
    head, sep, rest = text.partition("from __future__ import annotations\n")
    path.write_text(head + sep + upward + "  # noqa\n" + rest)
    res = lint(tree)
    assert res.returncode != 0, res.stdout[-3000:]
    assert "BROKEN" in res.stdout and "is not allowed to import" in res.stdout


def import_cycles(package: str) -> list[tuple[str, str]]:
    """Every direct import a → b of ``package`` that lies on a circle (b reaches a again through the imports,
    deferred ones inside functions included), from grimp's import graph."""
    import grimp

    graph = grimp.build_graph(package)
    return sorted((a, b) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)
                  if graph.find_shortest_chain(importer=b, imported=a) is not None)


@pytest.mark.parametrize("package", ["accrot", "callbacks", "data_modules"])
def test_no_module_imports_itself_through_others(package):
    """No import circle, not even through a deferred import inside a function (which import-linter's layers allow
    within one layer): a reader can take the modules in one order."""
    assert import_cycles(package) == []

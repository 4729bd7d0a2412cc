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
], ids=["model->sweep", "errors->run", "spec->parent", "data->callbacks", "model->accum"])
def test_an_upward_import_breaks_a_contract(tmp_path, module, upward):
    tree = copy_tree(tmp_path)
    path = tree / module
    text = path.read_text()
    head, sep, rest = text.partition("from __future__ import annotations\n")
    path.write_text(head + sep + upward + "  # noqa\n" + rest)
    res = lint(tree)
    assert res.returncode != 0, res.stdout[-3000:]
    assert "BROKEN" in res.stdout and "is not allowed to import" in res.stdout


def import_cycles(package: str) -> list[list[str]]:
    """Every set of modules of ``package`` that import each other in a circle (strongly connected components of
    the direct-import graph, imports inside functions included), by Tarjan's algorithm on grimp's graph."""
    import grimp

    graph = grimp.build_graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


@pytest.mark.parametrize("package", ["accrot", "callbacks", "data_modules"])
def test_no_module_imports_itself_through_others(package):
    """No import circle, not even through a deferred import inside a function (which import-linter's layers allow
    within one layer): a reader can take the modules in one order."""
    assert import_cycles(package) == []

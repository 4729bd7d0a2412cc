"""``make wheelhouse`` (.ci/wheelhouse.py) and the offline install it serves (.ci/node_venv.py), on this machine.

The "node" is built the way a cluster image is: a virtual environment with torch pip-installed into it, whose
Python is then the node's Python (a venv itself: ``--system-site-packages`` alone would not see its torch, which
the test shows first). Over it: a full wheelhouse for this Python and platform and the README's route (node_venv.py,
``--no-index``, no pip configuration), then ``accrot fit`` and gpu-check's CPU-side parts with what was installed;
and the minimal carry, built from the node's own ``pip list``, installed the same way, then a fit.

Triton is the node's (its torch brings it) and is left out of every wheelhouse, and a CPU torch brings none: in the
full route the gpu extra is installed as its other two wheels (fla-core, einops) by name, ``accrot[dev]`` beside
them. The plan's pieces (platform tags, what is left to the node, the node's package list, the run's requirements)
are tested without the network.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def load_wheelhouse():
    spec = importlib.util.spec_from_file_location("wheelhouse", REPO / ".ci" / "wheelhouse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_manylinux_tag_widens_to_every_older_one_and_others_stay_as_given():
    wh = load_wheelhouse()
    tags = wh.platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and tags.index("manylinux_2_17_x86_64") < tags.index("manylinux_2_5_x86_64")
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    assert wh.platforms("manylinux2014_aarch64")[0] == "manylinux_2_17_aarch64"
    assert "manylinux2014_aarch64" in wh.platforms("manylinux2014_aarch64")
    assert wh.platforms("macosx_14_0_arm64") == ["macosx_14_0_arm64"]
    assert wh.target_flags(None, None) == []
    assert wh.target_flags("3.12", "linux_x86_64") == ["--python-version", "3.12", "--implementation", "cp",
                                                       "--platform", "linux_x86_64"]


def test_the_nodes_torch_and_its_cuda_stack_are_left_out():
    wh = load_wheelhouse()
    resolved = [("accrot", "0.1.0"), ("torch", "2.13.0"), ("triton", "3.7.1"), ("nvidia-cudnn-cu13", "9.20.0.48"),
                ("cuda-bindings", "13.5.0"), ("cuda-toolkit", "13.0.3.0"), ("fla-core", "0.6.0"),
                ("einops", "0.8.2"), ("typing_extensions", "4.16.0"), ("lightning", "2.6.6")]
    wanted, left = wh.split(resolved)
    assert wanted == ["fla-core==0.6.0", "einops==0.8.2", "typing_extensions==4.16.0", "lightning==2.6.6"]
    assert left == ["torch==2.13.0", "triton==3.7.1", "nvidia-cudnn-cu13==9.20.0.48", "cuda-bindings==13.5.0",
                    "cuda-toolkit==13.0.3.0"]


def test_make_wheelhouse_passes_the_nodes_python_and_platform():
    done = subprocess.run(["make", "-n", "wheelhouse", "PY=3.12", "PLATFORM=manylinux_2_28_x86_64"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert ".ci/wheelhouse.py --python-version 3.12 --platform manylinux_2_28_x86_64 --dest 'wheelhouse'" in done.stdout


def test_the_nodes_package_list_is_read_from_pip_list_or_freeze():
    wh = load_wheelhouse()
    listed = json.dumps([{"name": "torch", "version": "2.11.0+cu130"}, {"name": "Lightning", "version": "2.6.1"},
                         {"name": "typing_extensions", "version": "4.15.0"}])
    assert wh.node_packages(listed) == {"torch": "2.11.0", "lightning": "2.6.1", "typing-extensions": "4.15.0"}
    frozen = "# a comment\ntorch==2.11.0+cu130\n-e git+https://x/y.git#egg=mine\nfla @ file:///opt/fla\nnumpy == 2.3.1\n"
    assert wh.node_packages(frozen) == {"torch": "2.11.0", "numpy": "2.3.1"}


def test_the_minimal_carry_leaves_out_what_the_node_has():
    wh = load_wheelhouse()
    resolved = [("accrot", "0.1.0"), ("torch", "2.11.0"), ("triton", "3.6.0"), ("lightning", "2.6.1"),
                ("jsonargparse", "4.53.0"), ("docstring_parser", "0.18.0"), ("fla-core", "0.6.0")]
    wanted, left = wh.split(resolved, {"torch": "2.11.0", "lightning": "2.6.1"})
    assert wanted == ["jsonargparse==4.53.0", "docstring_parser==0.18.0", "fla-core==0.6.0"]
    assert left == ["torch==2.11.0", "triton==3.6.0", "lightning==2.6.1"]


def test_the_runs_requirements_are_pyprojects_and_a_node_version_out_of_range_is_carried(tmp_path, monkeypatch):
    wh = load_wheelhouse()
    reqs = wh.run_requirements("gpu")
    text = (REPO / "pyproject.toml").read_text()
    assert all(f'"{r}"' in text for r in reqs)  # pyproject's own ranges, as written
    names = {re.match(r"[A-Za-z0-9_-]+", r)[0] for r in reqs}
    assert names == set(wh.RUN) | {"fla-core", "einops", "triton"}
    assert {"optuna", "wandb", "datasets", "pytest"}.isdisjoint(names)  # sweeps' and tests' packages stay home
    kept = wh.usable({"lightning": "2.5.0", "numpy": "1.26.4", "scipy": "1.15.0"}, reqs)
    assert kept == {"numpy": "1.26.4", "scipy": "1.15.0"}  # lightning 2.5 is outside >=2.6,<2.7: carried
    pinned = wh.constraints_with({"numpy": "1.26.4"}, tmp_path).read_text().splitlines()
    assert "numpy==1.26.4" in pinned and "numpy==2.4.6" not in pinned and "lightning==2.6.6" in pinned


def test_make_wheelhouse_passes_the_nodes_package_list():
    done = subprocess.run(["make", "-n", "wheelhouse", "HAVE=node-packages.json"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--have 'node-packages.json'" in done.stdout


def test_without_wandb_installed_auto_logs_no_wandb(monkeypatch):
    import importlib.util

    from accrot.run.lightning import wandb_mode

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    real = importlib.util.find_spec
    assert wandb_mode("auto") == "online"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert wandb_mode("auto") == "disabled" and wandb_mode("offline") == "offline"


IMPORTS = """
import atexit, importlib.metadata as md, json, sys
def dump():
    where = md.packages_distributions()
    names = {d for m in list(sys.modules) for d in where.get(m.split(".")[0], [])}
    print("IMPORTED " + json.dumps(sorted(names)), file=sys.__stdout__)
atexit.register(dump)
from accrot.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_run_imports_exactly_the_distributions_the_minimal_carry_names(tmp_path):
    """A real ``accrot fit`` (logging no wandb, as a minimal install does) imports, of accrot's own requirements,
    exactly :data:`RUN`: one more would be missing on a node that got the minimal carry, one fewer carried for
    nothing."""
    wh = load_wheelhouse()
    script = tmp_path / "imports.py"
    script.write_text(IMPORTS)
    env = {**os.environ, "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, str(script), "fit", "--config", "small", "--trainer.max_steps=1",
                           "--trainer.limit_val_batches=1", "--data.init_args.batch_size=1",
                           "--extrapolation.multipliers=[1]", "--extrapolation.budget_tokens=1024",
                           "--trainer.enable_progress_bar=false", f"--root={tmp_path / 'runs'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    imported = {wh.canonical(n) for n in json.loads(done.stdout.split("IMPORTED ")[1].splitlines()[0])}
    deps, _ = wh.project_requirements()
    required = {wh.canonical(re.match(r"[A-Za-z0-9_.-]+", d)[0]) for d in deps}
    assert imported & required == set(wh.RUN)


# -- the real thing (downloads) ------------------------------------------------------------------------------------
def registry_or_skip(tmp_path: Path) -> None:
    """One small wheel through pip's own configuration; unreachable: a skip with the reason (under CI=true a
    failure)."""
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           "--dest", str(tmp_path / "probe"), "einops==0.8.2"], capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        skip_or_fail(f"the package registry is unreachable (pip download einops: {last_line(done)})")


def last_line(done: subprocess.CompletedProcess) -> str:
    return (done.stderr.strip().splitlines() or [""])[-1][:160]


def skip_or_fail(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(why + " and CI=true")
    pytest.skip(why)


def offline_env(tmp_path: Path) -> dict[str, str]:
    """No pip configuration (no index, no find-links), nothing online: what a node without network has."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "WANDB"))}
    return {**clean, "PIP_CONFIG_FILE": os.devnull, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "MPLCONFIGDIR": str(tmp_path / "mpl"), "HF_HOME": str(tmp_path / "hf")}


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Path:
    """A node as a cluster image is built: a venv with this interpreter's torch release pip-installed into it (with
    pip's own configuration: the image was built with network). Its python is the node's Python."""
    import torch

    where = tmp_path_factory.mktemp("node")
    registry_or_skip(where)
    subprocess.run([sys.executable, "-m", "venv", str(where / "venv")], check=True, timeout=300)
    python = where / "venv" / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"torch=={torch.__version__}"],
                          capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        skip_or_fail(f"torch=={torch.__version__} does not install into the node's venv ({last_line(done)})")
    return python


def run(cmd: list, env: dict, cwd: Path = REPO, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def where_from(python: Path, env: dict, cwd: Path, *modules: str) -> list[str]:
    done = run([python, "-c", f"import {', '.join(modules)}; "
                              f"print({', '.join(f'{m}.__file__' for m in modules)}, sep='\\n')"], env, cwd, 300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def fit(venv: Path, root: Path, env: dict, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    return run([venv / "bin" / "accrot", "fit", "--config", "tiny", "--trainer.fast_dev_run=true", f"--root={root}",
                "--extrapolation.multipliers=[1]", "--trainer.limit_val_batches=1", "--data.init_args.batch_size=2",
                "--trainer.enable_progress_bar=false", "--extrapolation.budget_tokens=2048", *extra], env, cwd)


@pytest.mark.slow
def test_the_nodes_venv_python_is_not_seen_through_system_site_packages_alone(node, tmp_path):
    """The bug the route exists for: a --system-site-packages venv made by a venv's Python sees the base's
    site-packages, not the node venv's torch."""
    env = offline_env(tmp_path)
    assert where_from(node, env, tmp_path, "torch")[0].startswith(str(node.parent.parent))  # the node has torch
    subprocess.run([str(node), "-m", "venv", "--system-site-packages", str(tmp_path / "plain")], check=True,
                   timeout=300)
    plain = run([tmp_path / "plain" / "bin" / "python", "-c", "import torch"], env, tmp_path, 300)
    assert plain.returncode != 0 and "No module named 'torch'" in plain.stderr


@pytest.mark.slow
def test_an_offline_install_from_the_wheelhouse_over_a_venv_nodes_torch(node, tmp_path):
    wheels = tmp_path / "wheelhouse"
    done = run([sys.executable, ".ci/wheelhouse.py", "--dest", wheels], os.environ, REPO, 1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    print(done.stdout)
    assert "python .ci/node_venv.py --wheelhouse wheelhouse" in done.stdout
    assert re.search(r"^wheelhouse: \d+ wheels, [\d.]+ MiB in ", done.stdout, flags=re.M)
    names = {p.name.split("-")[0].lower() for p in wheels.glob("*.whl")}
    assert {"accrot", "lightning", "fla_core", "einops", "pytest_timeout"} <= names
    assert not {n for n in names if n in ("torch", "triton") or n.startswith(("nvidia", "cuda"))}

    env, venv = offline_env(tmp_path), tmp_path / "venv"
    route = run([node, ".ci/node_venv.py", "--venv", venv, "--wheelhouse", wheels, "accrot[dev]", "fla-core",
                 "einops"], env)
    print(route.stdout[-1500:])
    assert route.returncode == 0, (route.stdout + route.stderr)[-3000:]
    assert f"node_venv: the node's torch: {node.parent.parent}" in route.stdout
    accrot_at, lightning_at, torch_at, _ = where_from(venv / "bin" / "python", env, tmp_path, "accrot", "lightning",
                                                      "torch", "fla")
    assert accrot_at.startswith(str(venv)) and lightning_at.startswith(str(venv))
    assert torch_at.startswith(str(node.parent.parent))  # the node's torch, not a second one

    done = fit(venv, tmp_path / "runs", {**env, "WANDB_MODE": "disabled"}, tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert list((tmp_path / "runs").glob("*/version_0/run.json"))

    # gpu-check's CPU side with the installed packages: its no-CUDA report, and the gpu tests collected with
    # pytest-timeout's per-test limit (the options its pytest section passes)
    python, cpu = venv / "bin" / "python", {**env, "CUDA_VISIBLE_DEVICES": ""}
    check = run([python, "tests/helpers/gpu_check.py", "--out", tmp_path / "gpu-check"], cpu, REPO, 300)
    assert check.returncode == 0 and "no CUDA device" in check.stdout, check.stderr[-2000:]
    collect = run([python, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                   "--timeout=180", "tests/ops", "tests/position", "tests/test_gpu.py"], cpu, REPO, 600)
    assert collect.returncode == 0, (collect.stdout + collect.stderr)[-3000:]
    assert re.search(r"^\d+/\d+ tests collected", collect.stdout, flags=re.M), collect.stdout[-1000:]


@pytest.mark.slow
def test_the_minimal_carry_from_the_nodes_package_list_trains(node, tmp_path):
    """The node's ``pip list`` in, only what a run imports and the node lacks out (no torch, nothing of the
    sweeps or the tests), its size printed; installed by the same route, a fit runs (wandb, absent, is off)."""
    env = offline_env(tmp_path)
    have = tmp_path / "node-packages.json"
    listed = run([node, "-m", "pip", "list", "--format=json"], env, tmp_path, 300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    have.write_text(listed.stdout)
    wheels = tmp_path / "minimal"
    done = run([sys.executable, ".ci/wheelhouse.py", "--have", have, "--dest", wheels], os.environ, REPO, 1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    print(done.stdout)
    size = re.search(r"^wheelhouse: (\d+) wheels, ([\d.]+) MiB in ", done.stdout, flags=re.M)
    whls = list(wheels.glob("*.whl"))
    assert size and int(size[1]) == len(whls)
    assert float(size[2]) == pytest.approx(sum(p.stat().st_size for p in whls) / 2**20, abs=0.05)
    names = {p.name.split("-")[0].lower() for p in whls}
    assert {"accrot", "jsonargparse", "fla_core", "lightning"} <= names
    assert not names & {"torch", "triton", "sympy", "filelock", "optuna", "wandb", "datasets", "pytest"}
    assert (wheels / "run.txt").exists()

    venv = tmp_path / "venv"
    route = run([node, ".ci/node_venv.py", "--venv", venv, "--wheelhouse", wheels], env)
    assert route.returncode == 0, (route.stdout + route.stderr)[-3000:]
    missing = run([venv / "bin" / "python", "-c", "import optuna"], env, tmp_path, 120)
    assert missing.returncode != 0  # the sweeps' packages did not travel
    done = fit(venv, tmp_path / "runs", env, tmp_path)  # --wandb auto: no wandb installed, so none
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (record,) = (tmp_path / "runs").glob("*/version_0/run.json")
    assert json.loads(record.read_text())["ran"]["device"] == "cpu"

"""``make wheelhouse`` (.ci/wheelhouse.py) and the offline install it serves, on this machine: a wheelhouse for this
Python and platform, a fresh ``--system-site-packages`` venv over a "node" whose only packages are torch and what
torch requires (this interpreter's own, reached by a .pth file the way a node's site-packages is reached), the
install from the wheelhouse alone (``--no-index``, no pip configuration), then ``accrot fit`` and gpu-check's
CPU-side parts with what was installed.

Triton is the node's (its torch brings it) and is left out of every wheelhouse, and a CPU torch brings none: here
the gpu extra is installed as its other two wheels (fla-core, einops) by name, ``accrot[dev]`` beside them.
The plan's pieces (platform tags, what is left to the node) are tested without the network.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
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


# -- the real thing (downloads) ------------------------------------------------------------------------------------
def registry_or_skip(tmp_path: Path) -> None:
    """One small wheel through pip's own configuration; unreachable: a skip with the reason (under CI=true a
    failure)."""
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           "--dest", str(tmp_path / "probe"), "einops==0.8.2"], capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        why = f"the package registry is unreachable (pip download einops: {(done.stderr.strip().splitlines() or [''])[-1][:160]})"
        if os.environ.get("CI") == "true":
            pytest.fail(why + " and CI=true")
        pytest.skip(why)


def node_with_torch(site: Path) -> list[str]:
    """``site``: links to this interpreter's torch and every distribution it requires (its files and dist-info),
    nothing else: what a node's own site-packages holds under a torch it brings. Returns their names."""
    from importlib import metadata

    seen, todo = [], ["torch"]
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:  # a requirement of another platform or Python (markers)
            continue
        if name in seen:
            continue
        seen.append(name)
        todo += [re.match(r"[A-Za-z0-9._-]+", req)[0] for req in dist.requires or [] if "extra ==" not in req]
        for top in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            link = site / top
            if not link.exists():
                link.symlink_to(dist.locate_file(top))
    return seen


@pytest.mark.slow
def test_an_offline_install_from_the_wheelhouse_over_a_nodes_own_torch(tmp_path):
    registry_or_skip(tmp_path)
    wheels = tmp_path / "wheelhouse"
    done = subprocess.run([sys.executable, ".ci/wheelhouse.py", "--dest", str(wheels)], cwd=REPO,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "--no-index --find-links wheelhouse 'accrot[dev,gpu]'" in done.stdout
    names = {p.name.split("-")[0].lower() for p in wheels.glob("*.whl")}
    assert {"accrot", "lightning", "fla_core", "einops", "pytest_timeout"} <= names
    assert not {n for n in names if n in ("torch", "triton") or n.startswith(("nvidia", "cuda"))}

    site = tmp_path / "node-site"
    site.mkdir()
    brought = node_with_torch(site)
    assert "torch" in brought and "lightning" not in brought
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    (Path(purelib) / "node-torch.pth").write_text(f"{site}\n")
    python = venv / "bin" / "python"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env = {**clean, "PIP_CONFIG_FILE": os.devnull, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "WANDB_MODE": "disabled", "MPLCONFIGDIR": str(tmp_path / "mpl"), "HF_HOME": str(tmp_path / "hf")}
    seen = subprocess.run([str(python), "-c", "import torch; print(torch.__file__)"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert seen.returncode == 0 and seen.stdout.startswith(str(site)), seen.stderr  # the node's torch, seen

    install = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "--find-links", str(wheels),
                              "accrot[dev]", "fla-core", "einops"], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=900)
    assert install.returncode == 0, (install.stdout + install.stderr)[-3000:]
    where = subprocess.run([str(python), "-c", "import accrot, lightning, torch, fla; "
                            "print(accrot.__file__, lightning.__file__, torch.__file__, sep='\\n')"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert where.returncode == 0, where.stderr[-2000:]
    accrot_at, lightning_at, torch_at = where.stdout.split()
    assert accrot_at.startswith(str(venv)) and lightning_at.startswith(str(venv)) and torch_at.startswith(str(site))

    fit = subprocess.run([str(venv / "bin" / "accrot"), "fit", "--config", "tiny", "--trainer.fast_dev_run=true",
                          f"--root={tmp_path / 'runs'}", "--extrapolation.multipliers=[1]",
                          "--trainer.limit_val_batches=1", "--data.init_args.batch_size=2",
                          "--trainer.enable_progress_bar=false", "--wandb=disabled",
                          "--extrapolation.budget_tokens=2048"], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=900)
    assert fit.returncode == 0, (fit.stdout + fit.stderr)[-3000:]
    assert list((tmp_path / "runs").glob("*/version_0/run.json"))

    # gpu-check's CPU side with the installed packages: its no-CUDA report, and the gpu tests collected with
    # pytest-timeout's per-test limit (the options its pytest section passes)
    cpu = {**env, "CUDA_VISIBLE_DEVICES": ""}
    check = subprocess.run([str(python), "tests/helpers/gpu_check.py", "--out", str(tmp_path / "gpu-check")],
                           env=cpu, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and "no CUDA device" in check.stdout, check.stderr[-2000:]
    collect = subprocess.run([str(python), "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p",
                              "no:cacheprovider", "--timeout=180", "tests/ops", "tests/position", "tests/test_gpu.py"],
                             env=cpu, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert collect.returncode == 0, (collect.stdout + collect.stderr)[-3000:]
    assert re.search(r"^\d+/\d+ tests collected", collect.stdout, flags=re.M), collect.stdout[-1000:]

"""``make wheelhouse``: every wheel accrot needs on a node without network that brings its own torch.

    python3 .ci/wheelhouse.py [--python-version 3.12] [--platform manylinux_2_28_x86_64] [--dest wheelhouse]
                              [--have node-packages.json]

On a machine with network (any OS: pip is told the node's Python and platform, nothing is built for it):

1. accrot's own wheel is built into ``--dest`` (pure Python: its C++ sources ship inside and compile on first use);
2. ``accrot[dev,gpu]`` is resolved under ``constraints.txt`` for that Python and platform (``pip install --dry-run
   --report``: only metadata is fetched, nothing is installed);
3. every resolved wheel is downloaded (``pip download --no-deps --only-binary=:all:``) except what the node's torch
   brings and must stay the node's own: torch itself and the CUDA stack its wheel pulls in (triton, ``nvidia-*``,
   ``cuda-*``). A torch built for the node's driver is the point of using it; a second triton beside it would not
   match its Inductor.

``--platform`` names the node's newest manylinux tag (``manylinux_2_N_ARCH``, N from the node's glibc: ``ldd
--version``); pip matches platform tags exactly, so it is widened to every older manylinux tag the node also runs.
Without ``--python-version`` and ``--platform`` the wheels are this interpreter's.

**The minimal carry** (``--have FILE``): only the wheels a training run imports that the node lacks. FILE is the
node's package list, ``python -m pip list --format=json > node-packages.json`` (or ``pip freeze``) run there with
the Python that imports its torch. The requirements are then the distributions ``accrot fit`` imports
(:data:`RUN`, with pyproject.toml's ranges, and the gpu extra), not all of ``accrot[dev,gpu]`` (the sweeps'
Optuna, wandb, datasets, the tests' tools); the node's versions that satisfy them are pinned in the resolution
(they replace constraints.txt's pins), and what the node has is not downloaded. ``run.txt`` in the folder lists the
run's requirements for the node's install. A run from such an install logs no wandb (``--wandb`` auto turns it off
where wandb is not installed); sweeps, the ablation and the tests need the full wheelhouse.

On the node, with the Python that imports its torch (a supported version: accrot/runtime.py)::

    python .ci/node_venv.py --wheelhouse wheelhouse

(:mod:`node_venv`: a ``--system-site-packages`` venv that also sees that Python's own site-packages where it is a
venv itself, then ``pip install --no-index``). pip keeps whatever the node already has that satisfies a requirement
(torch, its triton) and takes the rest from the wheelhouse; no torch pin is enforced (pyproject.toml asks for a
range, constraints.txt's exact pins are the CPU install's). ``wheelhouse/requirements.txt`` lists what was
downloaded; the last line printed is the folder's size.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXTRAS = "dev,gpu"
# what a CUDA torch wheel brings with it (torch 2.11+ on CUDA 13: triton, nvidia-*, cuda-toolkit, cuda-bindings,
# cuda-pathfinder): the node's own, never downloaded
NODE_OWN = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")
LEGACY = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}  # PEP 600's aliases: glibc 2.N
INSTALL_LINE = "python .ci/node_venv.py --wheelhouse {dest}"
# the distributions `accrot fit` imports (measured: tests/test_wheelhouse.py runs a fit and compares), by their
# names in pyproject.toml's dependencies; with the gpu extra they are the minimal carry's requirements
RUN = ("torch", "lightning", "torchmetrics", "jsonargparse", "rich", "scipy", "matplotlib", "ninja")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def platforms(platform: str) -> list[str]:
    """Every manylinux tag a node whose newest is ``platform`` runs (``manylinux_2_28_x86_64`` → 2_28 … 2_5 and the
    legacy aliases); any other platform (macOS, Windows, ``linux_x86_64``) as given."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    legacy = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_(\w+)", platform)
    if not (m or legacy):
        return [platform]
    glibc, arch = (int(m[1]), m[2]) if m else (LEGACY[legacy[1]], legacy[2])
    tags = [f"manylinux_2_{n}_{arch}" for n in range(glibc, 4, -1)]
    return tags + [f"{alias}_{arch}" for alias, n in LEGACY.items() if n <= glibc]


def target_flags(python_version: str | None, platform: str | None) -> list[str]:
    """pip's flags for wheels of another interpreter or platform (none: this one's)."""
    flags = []
    if python_version:
        flags += ["--python-version", python_version, "--implementation", "cp"]
    for tag in platforms(platform) if platform else []:
        flags += ["--platform", tag]
    return flags


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    done = subprocess.run(cmd, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"wheelhouse: pip {args[0]} failed (exit status {done.returncode}); see pip's output above")


def resolve(dest: Path, flags: list[str], extras: str, requirements: list[str] | None = None,
            have: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """(name, version) of every wheel ``accrot[extras]`` (or ``requirements``) needs on the target, accrot itself
    included, resolved under constraints.txt (with the node's versions of ``have`` in place of its pins) against
    accrot's wheel in ``dest``."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        constraints = constraints_with(have, Path(tmp)) if have else REPO / "constraints.txt"
        pip("install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report), "--target",
            str(Path(tmp) / "target"), "--only-binary=:all:", *flags, "-c", str(constraints),
            "--find-links", str(dest), *(requirements or [f"accrot[{extras}]"]))
        doc = json.loads(report.read_text())
    return sorted((item["metadata"]["name"], item["metadata"]["version"]) for item in doc["install"])


def split(resolved: list[tuple[str, str]], have: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """The pins to download, and those left out: the node's own stack (:data:`NODE_OWN`) and whatever the node
    already has (``have``: canonical name -> version); accrot is built, not fetched."""
    have = have or {}

    def left_out(name: str) -> bool:
        return bool(NODE_OWN.match(canonical(name))) or canonical(name) in have

    wanted = [f"{n}=={v}" for n, v in resolved if canonical(n) != "accrot" and not left_out(n)]
    left = [f"{n}=={v}" for n, v in resolved if canonical(n) != "accrot" and left_out(n)]
    return wanted, left


def node_packages(text: str) -> dict[str, str]:
    """The node's packages (canonical name -> version) from ``pip list --format=json`` or ``pip freeze`` output;
    a local version label (``2.11.0+cu130``) is dropped (the index knows the release), and lines that pin no
    version (``-e``, ``name @ url``, comments) are skipped."""
    text = text.strip()
    if text.startswith("["):
        return {canonical(p["name"]): p["version"].split("+")[0] for p in json.loads(text)}
    found = {}
    for line in text.splitlines():
        m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)\s*", line)
        if m:
            found[canonical(m[1])] = m[2].split("+")[0]
    return found


def _packaging():
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # pip's own copy: the script needs nothing beyond pip
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.version import Version
    return Requirement, Version


def project_requirements() -> tuple[list[str], dict[str, list[str]]]:
    """pyproject.toml's dependencies and optional dependencies, as written."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        from pip._vendor import tomli as tomllib
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return doc["dependencies"], doc.get("optional-dependencies", {})


def run_requirements(extras: str = "gpu") -> list[str]:
    """What a run needs: pyproject.toml's requirements of :data:`RUN` (their ranges and extras) and of ``extras``."""
    Requirement, _ = _packaging()
    deps, optional = project_requirements()
    wanted = [d for d in deps if canonical(Requirement(d).name) in RUN]
    missing = set(RUN) - {canonical(Requirement(d).name) for d in wanted}
    if missing:
        raise SystemExit(f"wheelhouse: RUN names {', '.join(sorted(missing))}, which pyproject.toml does not require")
    return wanted + [d for e in filter(None, extras.split(",")) for d in optional.get(e, [])]


def usable(have: dict[str, str], requirements: list[str]) -> dict[str, str]:
    """The node's packages to keep: all of them but those whose version a requirement's range excludes (the
    run gets its own, shadowing the node's in .venv)."""
    Requirement, Version = _packaging()
    ranges = {canonical(Requirement(r).name): Requirement(r).specifier for r in requirements}
    return {n: v for n, v in have.items() if n not in ranges or ranges[n].contains(Version(v), prereleases=True)}


def constraints_with(have: dict[str, str], folder: Path) -> Path:
    """constraints.txt with the node's versions in place of its pins for what the node has."""
    lines = [ln for ln in (REPO / "constraints.txt").read_text().splitlines()
             if not (m := re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", ln)) or canonical(m[1]) not in have]
    path = folder / "constraints-node.txt"
    path.write_text("\n".join(lines + [f"{n}=={v}" for n, v in sorted(have.items())]) + "\n")
    return path


def size_line(dest: Path) -> str:
    wheels = list(dest.glob("*.whl"))
    total = sum(p.stat().st_size for p in wheels)
    return f"wheelhouse: {len(wheels)} wheels, {total / 2**20:.1f} MiB in {dest}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-version", help="the node's Python, e.g. 3.12 (default: this interpreter's)")
    parser.add_argument("--platform", help="the node's newest manylinux tag, e.g. manylinux_2_28_x86_64 "
                                           "(default: this machine's)")
    parser.add_argument("--dest", default=str(REPO / "wheelhouse"), help="the folder of wheels (default: wheelhouse)")
    parser.add_argument("--extras", default=EXTRAS, help=f"accrot's extras to include (default: {EXTRAS}; with "
                                                         "--have: gpu)")
    parser.add_argument("--have", help="the node's `pip list --format=json` (or `pip freeze`) output: only what a "
                                       "run imports and the node lacks (the minimal carry)")
    args = parser.parse_args(argv)
    have = None
    if args.have:
        try:
            have = node_packages(Path(args.have).read_text())
        except (OSError, ValueError, KeyError, TypeError) as err:
            parser.exit(2, f"wheelhouse: error: --have={args.have!r} is not the node's package list ({err}); give "
                           "the output of `python -m pip list --format=json` run on the node\n")
        if args.extras == EXTRAS:
            args.extras = "gpu"
    dest = Path(args.dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("accrot-*.whl"):  # a rebuilt accrot replaces the last one (two would stop the install)
        old.unlink()
    flags = target_flags(args.python_version, args.platform)
    print(f"wheelhouse: accrot's wheel -> {dest}", flush=True)
    pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(dest), str(REPO))
    what = "what a run imports (accrot fit), and the gpu extra," if have is not None else f"accrot[{args.extras}]"
    print(f"wheelhouse: resolving {what} under constraints.txt for "
          f"{args.python_version or 'this Python'} on {args.platform or 'this platform'}", flush=True)
    requirements = run_requirements(args.extras) if have is not None else None
    if have is not None:
        have = usable(have, requirements)
    wanted, left = split(resolve(dest, flags, args.extras, requirements, have), have)
    print(f"wheelhouse: downloading {len(wanted)} wheels; left to the node: {', '.join(left) or 'nothing'}",
          flush=True)
    if wanted:
        pip("download", "--quiet", "--no-deps", "--only-binary=:all:", *flags, "--dest", str(dest), *wanted)
    (dest / "requirements.txt").write_text(
        "# the wheels of this folder (accrot's own beside them); left to the node: "
        f"{', '.join(left) or 'nothing'}\n" + "".join(f"{pin}\n" for pin in wanted))
    run = dest / "run.txt"
    if requirements is not None:  # node_venv.py installs accrot alone, then these (torch and triton: the node's)
        Requirement, _ = _packaging()
        own = [r for r in requirements if not NODE_OWN.match(canonical(Requirement(r).name))]
        run.write_text("# what an accrot run imports but the node's own stack (node_venv.py installs accrot "
                       "--no-deps, then these)\n" + "".join(f"{r}\n" for r in own))
    else:
        run.unlink(missing_ok=True)
    print("wheelhouse: on the node:\n  " + INSTALL_LINE.format(dest=dest.name))
    print(size_line(dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())

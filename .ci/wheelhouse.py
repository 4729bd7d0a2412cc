"""``make wheelhouse``: every wheel accrot needs on a node without network that brings its own torch.

    python3 .ci/wheelhouse.py [--python-version 3.12] [--platform manylinux_2_28_x86_64] [--dest wheelhouse]

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

On the node, with its torch in the interpreter's site-packages (a supported version: accrot/runtime.py)::

    python -m venv --system-site-packages .venv
    .venv/bin/pip install --no-index --find-links wheelhouse 'accrot[dev,gpu]'

pip keeps whatever the node already has that satisfies a requirement (torch, its triton) and takes the rest from the
wheelhouse; no torch pin is enforced (pyproject.toml asks for a range, constraints.txt's exact pins are the CPU
install's). ``wheelhouse/requirements.txt`` lists what was downloaded.
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
INSTALL_LINE = ("python -m venv --system-site-packages .venv && "
                ".venv/bin/pip install --no-index --find-links {dest} 'accrot[{extras}]'")


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


def resolve(dest: Path, flags: list[str], extras: str) -> list[tuple[str, str]]:
    """(name, version) of every wheel ``accrot[extras]`` needs on the target, accrot itself included, resolved
    under constraints.txt against accrot's wheel in ``dest``."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip("install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report), "--target",
            str(Path(tmp) / "target"), "--only-binary=:all:", *flags, "-c", str(REPO / "constraints.txt"),
            "--find-links", str(dest), f"accrot[{extras}]")
        doc = json.loads(report.read_text())
    return sorted((item["metadata"]["name"], item["metadata"]["version"]) for item in doc["install"])


def split(resolved: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """The pins to download, and the node's own packages left out (:data:`NODE_OWN`); accrot is built, not fetched."""
    wanted = [f"{n}=={v}" for n, v in resolved if canonical(n) != "accrot" and not NODE_OWN.match(canonical(n))]
    left = [f"{n}=={v}" for n, v in resolved if NODE_OWN.match(canonical(n))]
    return wanted, left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-version", help="the node's Python, e.g. 3.12 (default: this interpreter's)")
    parser.add_argument("--platform", help="the node's newest manylinux tag, e.g. manylinux_2_28_x86_64 "
                                           "(default: this machine's)")
    parser.add_argument("--dest", default=str(REPO / "wheelhouse"), help="the folder of wheels (default: wheelhouse)")
    parser.add_argument("--extras", default=EXTRAS, help=f"accrot's extras to include (default: {EXTRAS})")
    args = parser.parse_args(argv)
    dest = Path(args.dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("accrot-*.whl"):  # a rebuilt accrot replaces the last one (two would stop the install)
        old.unlink()
    flags = target_flags(args.python_version, args.platform)
    print(f"wheelhouse: accrot's wheel -> {dest}", flush=True)
    pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(dest), str(REPO))
    print(f"wheelhouse: resolving accrot[{args.extras}] under constraints.txt for "
          f"{args.python_version or 'this Python'} on {args.platform or 'this platform'}", flush=True)
    wanted, left = split(resolve(dest, flags, args.extras))
    print(f"wheelhouse: downloading {len(wanted)} wheels; left to the node's torch: "
          f"{', '.join(left) or 'nothing'}", flush=True)
    pip("download", "--quiet", "--no-deps", "--only-binary=:all:", *flags, "--dest", str(dest), *wanted)
    (dest / "requirements.txt").write_text(
        "# the wheels of this folder (accrot's own beside them); left to the node's torch: "
        f"{', '.join(left) or 'nothing'}\n" + "".join(f"{pin}\n" for pin in wanted))
    print(f"wheelhouse: {dest} holds {len(list(dest.glob('*.whl')))} wheels; on the node:\n  "
          + INSTALL_LINE.format(dest=dest.name, extras=args.extras))
    return 0


if __name__ == "__main__":
    sys.exit(main())

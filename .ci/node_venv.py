"""On a node without network: ``.venv`` over the node's own Python (its torch, its Triton), the rest from a wheelhouse.

    python .ci/node_venv.py [--venv .venv] [--wheelhouse wheelhouse] [REQUIREMENT ...]

Run it with the node's Python, the one that imports the node's torch. It creates ``--venv`` with
``--system-site-packages`` and then installs from ``--wheelhouse`` alone (``pip --no-index``): ``accrot[dev,gpu]``
from a full wheelhouse (``make wheelhouse``), or, from a minimal one (``make wheelhouse HAVE=node-packages.json``,
which holds ``run.txt``), accrot without its dependencies and then what a run imports (``run.txt``); REQUIREMENTs
given replace either.

Why not ``python -m venv --system-site-packages`` alone: where the node's Python is itself a virtual environment (a
cluster image's ``/opt/.../.venv`` with torch inside), the new venv's ``pyvenv.cfg`` names only the *base*
interpreter (``home``), and ``--system-site-packages`` adds that base's site-packages, not the outer venv's: the new
venv sees no torch and pip stops on ``torch>=2.11``. pyvenv.cfg has no key for a second, outer environment, so this
script adds the node Python's own site-packages with the mechanism the ``site`` module documents for it: a ``.pth``
file in the new venv's site-packages, whose ``import`` line runs at start-up and calls ``site.addsitedir`` on each
of them (not a bare path line: addsitedir also processes *their* .pth files, the editable installs and namespace
packages of the node's venv). They come after the new venv's own, so what it installs shadows the node's, while the node's torch stays visible to Python and to
pip (which keeps it: a requirement already satisfied is not downloaded, and pip never uninstalls outside its own
environment). Installing into the outer venv instead would work too, but it writes into the cluster's image,
which is often read-only or shared.
"""

from __future__ import annotations

import argparse
import os
import site
import subprocess
import sys
from pathlib import Path

PTH = "node-site-packages.pth"
DEFAULT = "accrot[dev,gpu]"


def node_site_packages() -> list[str]:
    """This interpreter's site-packages folders (a venv's own, and its base's where it includes them)."""
    sites = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        sites.append(site.getusersitepackages())
    return [p for p in dict.fromkeys(sites) if os.path.isdir(p)]


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def purelib(python: Path) -> Path:
    done = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def make_venv(venv: Path) -> Path:
    """``venv`` with --system-site-packages, plus a .pth of this interpreter's site-packages where it is a venv
    itself (module docstring). Returns the venv's python.

    Made ``--without-pip``: ensurepip would put its own pip and (Python < 3.12) setuptools 65 in front of the
    node's, and pip would then find the node's torch requiring a newer setuptools than the one it sees; the node's
    pip (seen through the .pth or the system site-packages) installs into the new venv as well. Only where the new
    venv sees no pip at all is ensurepip run."""
    if not venv_python(venv).exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                       check=True)
    python = venv_python(venv)
    if sys.prefix != sys.base_prefix:  # the node's Python is a venv: its site-packages is not the base's
        target = purelib(python) / PTH
        # one exec'd line per folder: a comprehension would not see `site` (exec's locals are not its globals)
        target.write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in node_site_packages()))
        print(f"node_venv: {venv} sees {sys.prefix}'s packages ({target.name})", flush=True)
    if subprocess.run([str(python), "-c", "import pip"], capture_output=True).returncode != 0:
        subprocess.run([str(python), "-m", "ensurepip", "--default-pip"], check=True)
    return python


def torch_seen(python: Path) -> str | None:
    """Where ``python`` imports torch from, or None."""
    done = subprocess.run([str(python), "-c", "import torch; print(torch.__file__, torch.__version__)"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def pip(python: Path, wheelhouse: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "install", "--no-index", "--find-links", str(wheelhouse), *args]
    done = subprocess.run(cmd)
    if done.returncode != 0:
        sys.exit(f"node_venv: pip install {' '.join(args)} failed (exit status {done.returncode}); see pip above")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", default=".venv", help="the virtual environment to create (default .venv)")
    parser.add_argument("--wheelhouse", default="wheelhouse", help="the folder of wheels (default wheelhouse)")
    parser.add_argument("requirements", nargs="*", help=f"what to install (default {DEFAULT}, or a minimal "
                                                        "wheelhouse's run.txt)")
    args = parser.parse_args(argv)
    wheelhouse = Path(args.wheelhouse)
    if not wheelhouse.is_dir():
        parser.exit(2, f"node_venv: error: --wheelhouse={args.wheelhouse!r} is not a folder; copy the one "
                       "make wheelhouse built beside the checkout\n")
    python = make_venv(Path(args.venv))
    seen = torch_seen(python)
    if seen is None:
        parser.exit(2, f"node_venv: error: {args.venv} sees no torch: {sys.executable} does not import one; run "
                       "this with the node's Python that imports its torch\n")
    print(f"node_venv: the node's torch: {seen}", flush=True)
    run = wheelhouse / "run.txt"
    if args.requirements:
        pip(python, wheelhouse, *args.requirements)
    elif run.exists():  # a minimal wheelhouse: accrot alone, then what a run imports
        pip(python, wheelhouse, "--no-deps", "accrot")
        pip(python, wheelhouse, "-r", str(run))
    else:
        pip(python, wheelhouse, DEFAULT)
    print(f"node_venv: ready: {venv_python(Path(args.venv))} (call .venv/bin/... directly; make would install "
          "from the network)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

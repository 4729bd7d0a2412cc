"""``make node-stack``: the GPU node's Triton and fla-core, on this CPU, under the suite's warning filters.

    .venv/bin/python .ci/node_stack.py [--triton 3.6.0] [--fla 0.6.0] [--venv .cache/node-stack]

A GPU node brings its own torch and Triton (torch 2.11 with Triton 3.6 on the last one checked) and the wheelhouse
brings fla-core 0.6.0; the suite here runs on whatever ``make install`` resolved. An import-time warning of the
node's Triton or fla (a deprecation their next release adds, say) would fail fla's tests there, where
``filterwarnings = error`` holds, and nobody would know before a node is lent. So this makes a venv over ``.venv``
(``node_venv.make_venv``: it sees ``.venv``'s torch and accrot, as a node's venv sees the node's), installs the
node's versions of Triton and fla-core into it from the package registry (both install and import on a CPU; the
Triton kernels themselves need a GPU), checks that they are the versions that import, and runs fla's tests
(tests/ops/test_path_fla.py: fla's own wrapper with its reference kernel, and the bridge's import under the suite's
filters) with pyproject.toml's warning filters; a skipped test fails the target, as a skip would hide a missing fla.
torch stays ``.venv``'s (a CUDA torch 2.11 does not install on a CPU machine): the node's torch is not exercised.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from node_venv import make_venv  # noqa: E402 - the sibling script, not a package

TESTS = ["tests/ops/test_path_fla.py"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--triton", default="3.6.0", help="the node's Triton (default 3.6.0)")
    parser.add_argument("--fla", default="0.6.0", help="the node's fla-core (default 0.6.0)")
    parser.add_argument("--venv", default=str(REPO / ".cache" / "node-stack"), help="where to build the venv")
    args = parser.parse_args(argv)
    python = make_venv(Path(args.venv))
    pins = [f"triton=={args.triton}", f"fla-core=={args.fla}"]
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *pins], cwd=REPO)
    if done.returncode != 0:
        sys.exit(f"node-stack: pip install {' '.join(pins)} failed (exit status {done.returncode}); see pip above")
    seen = subprocess.run([str(python), "-W", "error", "-c",
                           "import importlib.metadata as md, triton, fla, torch; "
                           "print(md.version('triton'), md.version('fla-core'), torch.__version__)"],
                          cwd=REPO, capture_output=True, text=True)
    if seen.returncode != 0:
        sys.exit(f"node-stack: importing Triton and fla under warnings-as-errors failed:\n{seen.stderr[-3000:]}")
    triton, fla, torch = seen.stdout.split()
    print(f"node-stack: triton {triton}, fla-core {fla} (torch {torch}, .venv's) import under warnings-as-errors",
          flush=True)
    if (triton, fla) != (args.triton, args.fla):
        sys.exit(f"node-stack: the venv imports triton {triton} and fla-core {fla}, not {args.triton} and {args.fla}")
    tests = subprocess.run([str(python), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *TESTS], cwd=REPO,
                           capture_output=True, text=True)
    print(tests.stdout[-3000:], tests.stderr[-2000:], sep="", flush=True)
    skipped = re.search(r"(\d+) skipped", tests.stdout)
    if tests.returncode != 0 or skipped:
        why = f"pytest exit status {tests.returncode}" if tests.returncode else f"{skipped[1]} skipped"
        sys.exit(f"node-stack: fla's tests on the node's stack did not all pass ({why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

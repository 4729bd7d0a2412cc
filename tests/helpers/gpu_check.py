"""``make gpu-check``: every GPU check in one prepared script, within 10 minutes on one GPU.

    .venv/bin/python tests/helpers/gpu_check.py [--budget 540] [--out results/gpu-check] [--dry-run] [--all-sections]

``--dry-run`` (no GPU needed) prints what a check would run on this node and for how long at most, and what its
GPU-hours estimate will count; it runs nothing.

Without CUDA it prints one line, writes a REPORT.md whose every section reads "skipped: no CUDA", and exits 0 (the
rest of the suite never needs a GPU). With CUDA it runs, each section in a child process under its own share of the
time budget (a section that runs out is stopped and reported as such, and the next one starts), the fastest
failure-finders first; REPORT.md is rewritten after every section (and names the one running), so a check stopped
from outside keeps what it measured. A section passes only if what it claims ran: a skipped test, an fla that
did not run or a benchmark cell that erred is not a pass.

0. the environment: CUDA, Triton and fla import (under warnings-as-errors), one fla PaTH-FoX forward and backward
   against the chunked kernel (output and every gradient, to fla's own bounds), one compiled rotation
   (``ACCROT_GPU_KERNELS=on``) with its graph count (a second length compiles nothing);
1. ``pytest -m gpu`` over tests/ops, tests/position and tests/test_gpu.py, with skip reasons: the CUDA parameters of
   the twin tests (outputs and gradients against the float64 CPU twins, fla PaTH / PaTH-FoX against the chunked
   kernel), a resumed run on CUDA, a 2-step bf16-mixed fast_dev_run of every shipped config × every scheme cell;
2. one-rank DDP over NCCL: ``accrot fit --config tiny --trainer.strategy=ddp`` on one GPU;
3. ``accrot bench path --device cuda``: chunked vs fla PaTH, forward and forward + backward, and peak memory, one
   call per length (4k, 16k, 64k), each kept as it ends;
4. the fused rotation kernels on CUDA, ``torch.compile`` (``ACCROT_GPU_KERNELS=on``) against eager (``off``), on the
   small model's training step of the learned-increment cells: which measures better;
5. ``accrot bench schemes --device cuda``: training-step tokens/s per scheme cell (small, float32) and evaluation
   peak memory at 4k / 16k / 64k tokens, one call per evaluation length, each kept as it ends;
6. last, the first 200 steps of the ``small`` preset per variant of the study (bf16-mixed, one GPU, in one
   process): tokens/s, ms/step and peak memory measured after a 10-step warm-up (a variant whose share of the budget
   runs out stops early; its rate is over the steps it took), and the training time of the preset's runs they
   imply: each variant's runs as the preset's size record makes them (its data sets × (seeds + the learning-rate
   grid's points)), :func:`preset_runs`.

A first check on a node (no ``warm`` mark in the cache folder) skips the sections of :data:`COLD_SKIPS`, which
would spend their share compiling, and says so in their rows; their time goes to the others, so the check fits its
budget and measures the GPU-hours. Once every planned section has run, the caches are marked warm and the next
check runs all seven (``--all-sections`` runs them on a cold node too).

A section that measures as it goes (the steps, the kernels) rewrites its results so far after each row
(``NAME.partial.json``): stopped at its time limit, it is reported "timed out" with them. Triton's and Inductor's
caches (``TRITON_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR``) live in ``.cache/gpu-check`` unless set, so a second check
on the same node skips fla's autotuning (some 40 configs per new head shape) and the rotations' compiles.

Everything lands in ``--out`` (default ``results/gpu-check``): one ``REPORT.md`` (GPU model, torch / CUDA / Triton /
fla versions, each section's outcome and numbers), the sections' JSON and logs. Exit status 0 when every section
passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script: make `tests` and the packages importable
    sys.path.insert(0, str(REPO))

NO_CUDA = "gpu-check: no CUDA device (torch.cuda.is_available() is False); nothing to check"
SKIPPED_NO_CUDA = "skipped: no CUDA"
DEFAULT_BUDGET = 540.0  # seconds for all sections; with each child's 10 s grace the check ends within 10 minutes
GRACE = 10.0  # a child past its budget by this much is killed (each child also watches its own budget)
# (section, share of the budget): what is left over by a section that finishes early goes to the next ones
# fastest failure-finders first, the ms/step measurements last
PLAN = [("env", 0.06), ("pytest", 0.36), ("ddp", 0.05), ("path", 0.10), ("kernels", 0.07), ("schemes", 0.12),
        ("steps", 0.24)]
TITLES = {"env": "environment: imports, one fla PaTH call, one compiled rotation",
          "ddp": "one-rank DDP over NCCL (accrot fit, tiny, a few steps)",
          "pytest": "pytest -m gpu (twin tests on CUDA, fast_dev_runs, resume)",
          "steps": "200 steps of the small preset per variant (bf16-mixed)",
          "kernels": "fused rotation kernels on CUDA: torch.compile vs eager",
          "schemes": "accrot bench schemes --device cuda",
          "path": "accrot bench path --device cuda (chunked vs fla)"}
STEPS, WARMUP = 200, 10
PRESET = "small"  # the preset whose runs the steps section prices (accrot/study/variants.py's SIZES)
# what a first check on a node skips: its compile caches are empty, and these two spend their share compiling
# (torch.compile's rotations in every scheme cell, fla's autotuning) rather than measuring; the second check,
# with the caches warm, runs them. The steps section (the GPU-hours) and the correctness sections always run.
COLD_SKIPS = {"kernels": "torch.compile of every rotation cell", "schemes": "torch.compile of every scheme cell"}
WARM_MARK = "warm"  # written into the cache folder when a check has run its last section
# Triton's and Inductor's compiled kernels, kept for the next check on the same node: fla autotunes some 40 configs
# per new (heads, head dim) on first use, and torch.compile's rotations compile once per shape family
CACHE = REPO / ".cache" / "gpu-check"


def preset_runs(size_name: str = PRESET) -> dict[str, Any]:
    """The training runs ``accrot ablation --size SIZE`` makes, from its size record: per variant, the data sets
    that run it (a data set may run only some variants) × (the seeds + the learning-rate grid's points, one seed
    each, when the size tunes its rate), each of the size's training steps."""
    import yaml

    from accrot.run.args import CONFIG_DIR
    from accrot.study.tuning import GRID_FACTORS
    from accrot.study.variants import DATASET_VARIANTS, DEFAULT_DATASETS, DEFAULT_VARIANTS, SIZES

    size = SIZES[size_name]
    base = yaml.safe_load((CONFIG_DIR / f"{size.base}.yaml").read_text())
    steps = size.overrides.get("trainer.max_steps", base["trainer"]["max_steps"])
    grid = len(GRID_FACTORS) if size.tune_lr else 0
    datasets = list(size.datasets or DEFAULT_DATASETS)
    per_variant = {}
    for variant in size.variants or DEFAULT_VARIANTS:
        runs_it = [d for d in datasets if d not in DATASET_VARIANTS or variant in DATASET_VARIANTS[d]]
        per_variant[variant] = {"datasets": runs_it, "runs": len(runs_it) * (size.seeds + grid)}
    return {"size": size_name, "seeds": size.seeds, "grid": grid, "steps": steps, "datasets": datasets,
            "variants": per_variant, "runs": sum(v["runs"] for v in per_variant.values())}


def runs_line(runs: dict[str, Any]) -> str:
    """The preset's runs in words: ``224 runs of 5000 steps: 17 variants × 2 data sets (...) × (5 seeds + 3 ...)``."""
    only = {d: sum(d in r["datasets"] for r in runs["variants"].values()) for d in runs["datasets"]}
    only = {d: n for d, n in only.items() if n < len(runs["variants"])}
    grid = f" + {runs['grid']} learning rates of the grid" if runs["grid"] else ""
    return (f"{runs['runs']} runs of {runs['steps']} steps: {len(runs['variants'])} variants × "
            f"{len(runs['datasets'])} data sets ({', '.join(runs['datasets'])}) × ({runs['seeds']} seeds{grid})"
            + "".join(f", {d} running {n} of the variants" for d, n in only.items()))


def plan(cold: bool, everything: bool = False) -> tuple[list[tuple[str, float]], dict[str, str]]:
    """The sections to run, with their budget shares, and those skipped with the reason: on a cold node (no warm
    mark in the cache folder) the sections of :data:`COLD_SKIPS`, unless ``everything``."""
    if not cold or everything:
        return list(PLAN), {}
    skipped = {name: (f"skipped: first check on this node (compile caches empty): its share would go to {what}, "
                      "not to measuring; run make gpu-check again to measure it with the caches warm")
               for name, what in COLD_SKIPS.items()}
    return [(n, share) for n, share in PLAN if n not in skipped], skipped


def is_cold(cache: Path = CACHE) -> bool:
    """No check has yet run all its sections with these caches (:data:`WARM_MARK`)."""
    return not (cache / WARM_MARK).exists()


def dry_run(budget: float, cold: bool, everything: bool = False) -> list[str]:
    """What a check would run here and for how long at most (each section's budget; a section that ends early
    leaves its time to the next), and what its GPU-hours estimate will count."""
    sections, skipped = plan(cold, everything)
    total = sum(share for _, share in sections)
    lines = [f"gpu-check --dry-run: a {'cold' if cold else 'warm'} node ({'no ' if cold else ''}{CACHE / WARM_MARK})"
             f", budget {budget:.0f} s ({budget / 60:.1f} min) + up to {GRACE:.0f} s per section to stop one"]
    spent = 0.0
    for name, _ in PLAN:
        share = dict(sections).get(name)
        if share is None:
            lines.append(f"  {name:<8} {skipped[name]}")
            continue
        seconds = budget * share / total
        spent += seconds
        lines.append(f"  {name:<8} at most {seconds:4.0f} s (until {spent:4.0f} s)  {TITLES[name]}")
    runs = preset_runs()
    lines += [f"estimated: at most {spent:.0f} s ({spent / 60:.1f} min) for {len(sections)} of {len(PLAN)} sections"
              f"{'; ' + ', '.join(skipped) + ' on the next check' if skipped else ''}",
              f"GPU-hours estimate: the {runs['size']} preset's {runs_line(runs)}, at each variant's ms/step "
              f"measured over {STEPS - WARMUP} of its {STEPS} steps"]
    return lines


def cache_env(cache: Path = CACHE) -> dict[str, str]:
    """TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR under ``cache`` (a value already set is kept)."""
    return {"TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR") or str(cache / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(cache / "inductor")}


def environment() -> dict[str, Any]:
    """What the report records about the machine and the software."""
    import importlib.metadata as md

    import torch

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "triton": version("triton"),
                           "fla-core": version("fla-core"), "host": platform.node()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(),
                   capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                   gpu_memory_gib=round(props.total_memory / 2**30, 1), cudnn=torch.backends.cudnn.version())
        from accrot.ops.path import fla_problem

        env["fla_path_kernel"] = fla_problem("cuda") or "ok"
    try:
        env["revision"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                         text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["revision"] = None
    return env


# -- the report -----------------------------------------------------------------------------------------------
def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return "(no rows)"
    columns = columns or list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def render_report(env: dict[str, Any], sections: list[dict[str, Any]], started: str | None = None) -> str:
    """REPORT.md from the environment and the sections' results (``name``, ``status``, ``seconds``, ``budget_s``,
    ``summary`` and, optionally, ``tables`` — a list of ``(title, rows)`` — and ``log``)."""
    ok = bool(sections) and all(s["status"] == "passed" for s in sections)
    none_ran = all(s["status"].startswith("skipped") or s["status"] == "running" for s in sections)
    overall = "passed" if ok else "nothing checked" if none_ran else "not all passed"
    out = ["# accrot gpu-check", "",
           f"{started or time.strftime('%Y-%m-%d %H:%M:%S')} · overall: **{overall}** "
           f"({sum(s['status'] == 'passed' for s in sections)}/{len(sections)} sections passed, "
           f"{sum(float(s.get('seconds') or 0) for s in sections):.0f} s)", "",
           "## Machine and software", "", markdown_table([{"what": k, "value": v} for k, v in env.items()]), "",
           "## Sections", "",
           markdown_table([{"section": TITLES.get(s["name"], s["name"]), "status": s["status"],
                            "seconds": s.get("seconds"), "budget s": s.get("budget_s"), "summary": s.get("summary")}
                           for s in sections]), ""]
    for s in sections:
        out += [f"## {TITLES.get(s['name'], s['name'])}", "", f"**{s['status']}** — {s.get('summary') or ''}", ""]
        for title, rows in s.get("tables") or []:
            out += [f"### {title}", "", markdown_table(rows), ""]
        for note in s.get("notes") or []:
            out += [f"- {note}"]
        if s.get("notes"):
            out.append("")
        if s.get("log") and s["status"] != "passed":
            out += ["<details><summary>log tail</summary>", "", "```", s["log"].rstrip()[-3000:], "```", "",
                    "</details>", ""]
    return "\n".join(out)


def write_report(path: Path, env: dict[str, Any], sections: list[dict[str, Any]], started: str | None = None) -> str:
    from accrot.io import atomic_write_text

    text = render_report(env, sections, started)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return text


# -- the parent: run each section in a child under its budget ----------------------------------------------------
def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def run_child(name: str, budget: float, out: Path) -> dict[str, Any]:
    """Run section ``name`` in a child process with a wall-clock limit; its result JSON, or what is known."""
    log, result = out / f"{name}.log", out / f"{name}.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--section", name, "--budget", f"{budget:.0f}",
           "--out", str(out)]
    started = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "WANDB_MODE": "disabled", **cache_env()}
    partial_path(out, name).unlink(missing_ok=True)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=budget + GRACE)  # the child watches its own budget; this is the backstop
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            rc = None
    return child_result(name, out, rc, budget, time.monotonic() - started)


def partial_path(out: Path, name: str) -> Path:
    """Where a section writes what it has measured so far (:func:`write_partial`)."""
    return out / f"{name}.partial.json"


def write_partial(out: Path, name: str, doc: dict[str, Any]) -> None:
    """A section's results so far (its tables, notes, summary), rewritten as it goes: a section stopped at its
    time limit is reported with them."""
    from accrot.io import atomic_write_text

    atomic_write_text(partial_path(out, name), json.dumps(doc, default=str))


def child_result(name: str, out: Path, rc: int | None, budget: float, seconds: float) -> dict[str, Any]:
    """The section's result: its JSON when it finished; else, stopped at its limit (``rc`` None) or crashed, its
    partial results (:func:`write_partial`) under an honest status."""
    result, partial = out / f"{name}.json", partial_path(out, name)
    doc: dict[str, Any] = {"name": name, "budget_s": round(budget), "seconds": round(seconds, 1)}
    if result.exists():
        doc.update(json.loads(result.read_text()))
        doc["seconds"] = round(seconds, 1)
    else:
        so_far = json.loads(partial.read_text()) if partial.exists() else {}
        doc.update({k: v for k, v in so_far.items() if k in ("tables", "notes", "log")})
        measured = f"; results so far: {so_far['summary']}" if so_far.get("summary") else ""
        if rc is None:
            doc.update(status="timed out", summary=f"stopped after its {budget:.0f} s budget{measured}")
        else:
            doc.update(status="failed", summary=f"exited with status {rc} before writing its result{measured}")
    if rc not in (0, None) and doc.get("status") == "passed":
        doc["status"] = "failed"
    if not doc.get("log"):  # a section's own log (pytest's output) says more than the child's stdout
        doc["log"] = _tail(out / f"{name}.log")
    return doc


def report_without_cuda(out: Path) -> Path:
    """REPORT.md where there is no CUDA device: the machine, and every section "skipped: no CUDA"."""
    sections = [{"name": name, "status": SKIPPED_NO_CUDA, "seconds": 0, "summary": NO_CUDA} for name, _ in PLAN]
    report = out / "REPORT.md"
    write_report(report, environment(), sections)
    return report


def run_all(budget: float, out: Path, cold: bool = False, everything: bool = False, cache: Path = CACHE) -> int:
    """Every section of :func:`plan` in order, each under its share of what is left of ``budget``; on a cold node
    the sections it skips are reported as skipped with the reason, and the caches are marked warm once every
    planned section has run (passed, failed or timed out: it compiled what it reached)."""
    out.mkdir(parents=True, exist_ok=True)
    started, deadline = time.strftime("%Y-%m-%d %H:%M:%S"), time.monotonic() + budget
    report, env = out / "REPORT.md", environment()
    sections: list[dict[str, Any]] = []
    todo, skipped = plan(cold, everything)
    for name, why in skipped.items():
        sections.append({"name": name, "status": "skipped", "seconds": 0, "budget_s": 0, "summary": why})
        print(f"gpu-check: {TITLES[name]}: {why}", flush=True)
    for i, (name, share) in enumerate(todo):
        left = deadline - time.monotonic()
        rest = sum(s for _, s in todo[i:])
        mine = left * share / rest  # this section's share of what is left
        if mine < 15:
            sections.append({"name": name, "status": "skipped", "seconds": 0, "budget_s": round(mine),
                             "summary": "no time left in the budget"})
            continue
        print(f"gpu-check: {TITLES[name]} (budget {mine:.0f} s)", flush=True)
        running = {"name": name, "status": "running", "seconds": None, "budget_s": round(mine),
                   "summary": "started; a report that still says so was stopped during this section"}
        write_report(report, env, [*sections, running], started)  # what is known so far, if the check is killed
        sections.append(run_child(name, mine, out))
        write_report(report, env, sections, started)
        print(f"gpu-check:   {sections[-1]['status']}: {sections[-1].get('summary')}", flush=True)
    sections.sort(key=lambda s: [n for n, _ in PLAN].index(s["name"]))
    write_report(report, env, sections, started)
    ran = [s for s in sections if s["name"] in dict(todo)]
    if ran and all(s["status"] != "skipped" for s in ran):
        cache.mkdir(parents=True, exist_ok=True)  # every section compiled what it needs: the next check is warm
        (cache / WARM_MARK).write_text(f"{started}\n")
    passed = sum(s["status"] == "passed" for s in sections)
    print(f"gpu-check: {passed}/{len(sections)} sections passed; wrote {report}")
    return 0 if passed == len(sections) else 1


# -- the sections (run in the child) ----------------------------------------------------------------------------
PYTEST_TEST_TIMEOUT = 180  # seconds per test (pytest-timeout): one hung test must not take the whole section


def pytest_outcome(junit: Path, log_text: str, returncode: int | None, budget: float) -> dict[str, Any]:
    """The pytest section's result from its JUnit XML (or, where pytest was stopped before writing it, from the
    ``-v`` lines of its log): passed only when pytest exited 0 and nothing skipped; skips and failures listed with
    their reasons."""
    import re
    import xml.etree.ElementTree as ET

    if junit.exists():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
        failed, skipped = [], []
        for case in suite.iter("testcase"):
            test = f"{case.get('classname')}::{case.get('name')}"
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is not None:
                failed.append({"test": test, "message": (bad.get("message") or "")[:200]})
            if case.find("skipped") is not None:
                skipped.append({"test": test, "reason": (case.find("skipped").get("message") or "")[:200]})
    else:  # stopped: count the `-v` result lines it printed
        found = re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)", log_text, flags=re.M)
        counts = {"tests": len(found), "failures": sum(r == "FAILED" for _, r in found),
                  "errors": sum(r == "ERROR" for _, r in found), "skipped": sum(r == "SKIPPED" for _, r in found)}
        failed = [{"test": t, "message": r} for t, r in found if r in ("FAILED", "ERROR")]
        skipped = [{"test": t, "reason": "see the log"} for t, r in found if r == "SKIPPED"]
    bad = counts["failures"] + counts["errors"]
    passed = counts["tests"] - bad - counts["skipped"]
    summary = f"{passed} passed, {bad} failed, {counts['skipped']} skipped"
    if returncode is None:
        status, summary = "timed out", f"{summary} before pytest was stopped at its {budget:.0f} s budget"
    else:
        status = "passed" if returncode == 0 and not counts["skipped"] and counts["tests"] else "failed"
        summary += f" (pytest exit status {returncode}{'; a skipped test did not run' if counts['skipped'] else ''})"
    tables = [("failures", failed)] if failed else []
    tables += [("skipped (did not run)", skipped)] if skipped else []
    return {"status": status, "summary": summary, "tables": tables, "log": log_text[-3000:]}


def section_pytest(budget: float, out: Path) -> dict[str, Any]:
    junit, log = out / "pytest.xml", out / "pytest.log"
    junit.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-rfEs", "-p", "no:cacheprovider",
           f"--timeout={PYTEST_TEST_TIMEOUT}", f"--junitxml={junit}", "tests/ops", "tests/position", "tests/test_gpu.py"]
    with open(log, "w") as fh:  # streamed: a section stopped at its budget still has every result line so far
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=max(1.0, budget - 5))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            rc = None
    return pytest_outcome(junit, _tail(log, 10**6), rc, budget)


def _step_timer_class():
    """:class:`StepTimer`, built on first use so that the parent process (and the no-CUDA line) never imports
    Lightning; ``tests.helpers.gpu_check.StepTimer`` resolves through the module's ``__getattr__``."""
    import lightning as L
    import torch

    class StepTimer(L.Callback):
        """Times training steps after a warm-up (``--trainer.callbacks+=``): ms/step, tokens/s and peak CUDA
        memory, written as JSON to ``path`` when training ends."""

        def __init__(self, path: str, warmup: int = WARMUP) -> None:
            self.path, self.warmup = Path(path), warmup
            self.t0: float | None = None
            self.steps = self.tokens = 0

        @staticmethod
        def _sync() -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step == self.warmup:
                self._sync()
                if torch.cuda.is_available():
                    torch.cuda.reset_peak_memory_stats()
                self.t0, self.steps = time.perf_counter(), 0
            elif self.t0 is not None:
                self.steps += 1
                self.tokens = int(batch[0].numel())

        def on_train_end(self, trainer, pl_module) -> None:
            self._sync()
            seconds = None if self.t0 is None else time.perf_counter() - self.t0
            doc: dict[str, Any] = {"steps": trainer.global_step, "timed_steps": self.steps, "seconds": seconds,
                                   "tokens_per_step": self.tokens,
                                   "peak_mib": torch.cuda.max_memory_allocated() / 2**20
                                   if torch.cuda.is_available() else None}
            if seconds and self.steps:
                doc["ms_per_step"] = 1e3 * seconds / self.steps
                doc["tokens_per_s"] = self.tokens * self.steps / seconds
            self.path.write_text(json.dumps(doc))

    return StepTimer


def __getattr__(name: str):
    if name == "StepTimer":
        cls = _step_timer_class()
        globals()["StepTimer"] = cls
        return cls
    raise AttributeError(name)


def variant_overrides(label: str, seq_len: int = 512) -> list[str]:
    """The ``model.scheme`` overrides of a study variant, as the ablation sets them (a window just under L)."""
    from accrot.study.variants import VARIANTS, WINDOW_FRACTION, WINDOWED

    over = {f"model.scheme.{k}": v for k, v in VARIANTS[label].items()}
    if label in WINDOWED:
        over["model.scheme.window"] = WINDOW_FRACTION * seq_len
    return [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in over.items()]


def _max_time(seconds: float) -> str:
    seconds = max(3, int(seconds))
    return f"00:00:{seconds // 60:02d}:{seconds % 60:02d}"  # Lightning's DD:HH:MM:SS


def section_steps(budget: float, out: Path, config: str = "small", steps: int = STEPS, warmup: int = WARMUP,
                  variants: list[str] | None = None, accelerator: str = "gpu",
                  precision: str = "bf16-mixed") -> dict[str, Any]:
    """The first ``steps`` steps of the preset per variant, in this process, each under its share of the budget.
    (The arguments other than the budget exist for the CPU test of this section's plumbing.)"""
    from accrot.cli import main
    from accrot.study.variants import DEFAULT_VARIANTS, SIZES

    size = SIZES[config] if config in SIZES else SIZES["small"]
    variants = list(variants or DEFAULT_VARIANTS)
    runs = preset_runs()
    deadline = time.monotonic() + budget - 5
    rows, failed = [], []
    root = out / "steps-runs"
    for i, label in enumerate(variants):
        share = (deadline - time.monotonic()) / (len(variants) - i)
        if share < 6:
            rows.append({"variant": label, "status": "skipped: no time left"})
            failed.append(label)
            write_partial(out, "steps", steps_outcome(rows, failed, steps, warmup, runs))
            continue
        timing = out / f"steps-{i}.json"
        timing.unlink(missing_ok=True)
        timer = json.dumps({"class_path": "tests.helpers.gpu_check.StepTimer",
                            "init_args": {"path": str(timing), "warmup": warmup}})
        argv = ["fit", "--config", config, f"--trainer.max_steps={steps}", f"--trainer.precision={precision}",
                f"--trainer.accelerator={accelerator}", "--trainer.devices=1", "--trainer.limit_val_batches=0",
                "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=50", "--wandb=disabled",
                f"--trainer.max_time={_max_time(share - 4)}", "--extrapolation.multipliers=[1]",
                "--extrapolation.budget_tokens=1024", "--extrapolation.every_n_steps=0", f"--model.lr={size.lr}",
                f"--root={root}", f"--name=v{i}", f"--trainer.callbacks+={timer}",
                *variant_overrides(label, size.seq_len)]
        t0 = time.monotonic()
        try:
            rc = main(argv)
        except Exception as err:  # noqa: BLE001 - one variant's failure is a result, the others still run
            rc = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:160]}"
        row: dict[str, Any] = {"variant": label, "status": "ok" if rc == 0 else f"failed ({rc})",
                               "wall_s": time.monotonic() - t0}
        if timing.exists():
            doc = json.loads(timing.read_text())
            row.update(steps=doc["steps"], ms_per_step=doc.get("ms_per_step"), tokens_per_s=doc.get("tokens_per_s"),
                       peak_mib=doc.get("peak_mib"))
            if doc.get("ms_per_step"):
                row["preset_runs"] = runs["variants"].get(label, {}).get("runs", 0)
                row["preset_min_per_run"] = runs["steps"] * doc["ms_per_step"] / 6e4
                row["preset_gpu_h"] = row["preset_runs"] * row["preset_min_per_run"] / 60
        if rc != 0:
            failed.append(label)
        rows.append(row)
        write_partial(out, "steps", steps_outcome(rows, failed, steps, warmup, runs))  # kept if the section is stopped
    return steps_outcome(rows, failed, steps, warmup, runs)


def steps_outcome(rows: list[dict[str, Any]], failed: list[str], steps: int, warmup: int,
                  runs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The steps section's result from the variants measured so far."""
    runs = runs or preset_runs()
    measured = [r for r in rows if r.get("preset_gpu_h")]
    total = sum(r["preset_gpu_h"] for r in measured)
    notes = [f"ms/step and tokens/s over the steps after a {warmup}-step warm-up (batch × L tokens per step); a "
             f"variant stopped by its time share before step {steps} is measured over the steps it took",
             f"preset_min_per_run: {runs['steps']} steps at that rate (training only: the evaluation every "
             "1000 steps and the diagnostics come on top); preset_gpu_h: × the variant's preset_runs",
             f"the {runs['size']} preset: {runs_line(runs)}"]
    unmeasured = runs["runs"] - sum(r.get("preset_runs", 0) for r in measured)
    summary = (f"{len(measured)}/{len(rows)} variants measured; the {runs['size']} preset's training ≈ {total:.1f} "
               f"GPU-hours on this GPU for {runs['runs'] - unmeasured} of its {runs['runs']} runs (+ evaluation)"
               if measured else "no variant measured")
    if failed:
        summary += f"; not measured: {', '.join(failed)}"
    return {"status": "passed" if not failed and len(measured) == len(rows) else "failed", "summary": summary,
            "tables": [("per variant", rows)], "notes": notes}


def section_kernels(budget: float, out: Path) -> dict[str, Any]:
    import statistics

    import torch
    import torch.nn.functional as F

    from accrot.model import ModelConfig, Transformer
    from accrot.ops import gpu_kernels
    from accrot.position import SchemeConfig

    cells = {"accum:learned/none+values": dict(rotation="accum", increments="learned", rotate_values=True),
             "accum:learned/forget+values": dict(rotation="accum", increments="learned", rotate_values=True,
                                            far_mass="forget"),
             "rope/none+values": dict(rotation="rope", rotate_values=True)}
    deadline = time.monotonic() + budget - 5
    rows = []
    tokens = torch.randint(0, 256, (32, 513), device="cuda")
    for name, scheme in cells.items():
        torch.manual_seed(0)
        model = Transformer(ModelConfig(d_model=256, n_layers=6, n_heads=8, scheme=SchemeConfig(**scheme))).cuda()
        row: dict[str, Any] = {"cell": name}
        for mode, key in (("auto", "compiled_ms"), ("off", "eager_ms")):
            os.environ["ACCROT_GPU_KERNELS"] = mode
            if time.monotonic() > deadline:
                row[key] = None
                continue

            def step(model=model) -> None:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(tokens[:, :-1])
                F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()

            for _ in range(3):  # warm-up: compiles the kernels on the first call of "auto"
                step()
            if mode == "auto" and gpu_kernels.describe("cuda") != "compiled":
                row["note"] = f"not compiled: {gpu_kernels.failure() or 'no Triton'}"
            times = []
            for _ in range(10):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                step()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            row[key] = statistics.median(times)
        if row.get("compiled_ms") and row.get("eager_ms") and "note" not in row:
            row["compiled_vs_eager"] = row["compiled_ms"] / row["eager_ms"]
        rows.append(row)
        write_partial(out, "kernels", kernels_outcome(rows))
    os.environ.pop("ACCROT_GPU_KERNELS", None)
    return kernels_outcome(rows)


def kernels_outcome(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The kernels section's result: passed only when every cell was compiled and measured both ways."""
    import statistics

    ratios = [r["compiled_vs_eager"] for r in rows if r.get("compiled_vs_eager")]
    if not ratios:
        return {"status": "failed", "summary": "nothing measured in the budget", "tables": [("cells", rows)]}
    better = "torch.compile" if statistics.median(ratios) < 1 else "eager"
    summary = (f"compiled / eager step time: median {statistics.median(ratios):.3f} over {len(ratios)} cells → "
               f"{better} measures better (default ACCROT_GPU_KERNELS=auto compiles"
               f"{'' if better == 'torch.compile' else '; set ACCROT_GPU_KERNELS=off, or flip the default'})")
    fell_back = [r["cell"] for r in rows if "note" in r]  # "compiled vs eager" of eager with eager is no result
    if fell_back or len(ratios) < len(rows):
        summary = f"not compiled or not measured: {', '.join(fell_back) or 'see the table'}; " + summary
    return {"status": "failed" if fell_back or len(ratios) < len(rows) else "passed", "summary": summary,
            "tables": [("training step, small, B 32, T 512, bf16", rows)]}


def _bench(command: list[str], budget: float, out: Path, name: str) -> tuple[dict | None, dict[str, Any]]:
    """Run ``accrot bench COMMAND`` under the budget: (its JSON report, {}) or (None, the section's failure)."""
    target = out / f"bench_{name}.json"
    target.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "accrot.cli", "bench", *command, "--out", str(target)]
    try:
        done = subprocess.run(cmd, cwd=REPO, timeout=max(1.0, budget - 5), capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return None, {"status": "timed out", "summary": f"did not finish within {budget:.0f} s"}
    if done.returncode != 0 or not target.exists():
        last = (done.stderr.strip().splitlines() or [""])[-1][:200]
        return None, {"status": "failed", "summary": f"exit status {done.returncode}: {last}",
                      "log": (done.stdout + done.stderr)[-3000:]}
    return json.loads(target.read_text()), {}


def schemes_rows(doc: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """Tokens/s per scheme (training step) and evaluation peak memory per length, from the schemes report."""
    train, memory = [], []
    for row in doc["rows"]:
        entry: dict[str, Any] = {"variant": row["variant"]}
        for size, res in row["train"].items():
            entry[f"{size} tokens/s"] = res["batch"] * res["T"] / (res["ms"] / 1e3) if res["ms"] else None
            entry[f"{size} ×NoPE"] = res["ratio"]
        train.append(entry)
        mem: dict[str, Any] = {"variant": row["variant"]}
        for length, res in row["eval"].items():
            mem[f"{length} MiB"] = res.get("peak_mib")
            mem[f"{length} ×NoPE"] = res.get("mem_ratio")
        memory.append(mem)
    return train, memory


SCHEMES_STAGES = ([4096], [16384], [65536])  # evaluation lengths per bench call, shortest first
SCHEMES_ARGS = ["schemes", "--device", "cuda", "--sizes", "small", "--T", "512", "--batch", "{small: 32}",
                "--eval_repeats", "1"]


def merge_schemes(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One schemes report from the staged calls: the first call's training step, every call's evaluations."""
    rows = {row["variant"]: {**row, "eval": dict(row["eval"])} for row in docs[0]["rows"]}
    for doc in docs[1:]:
        for row in doc["rows"]:
            if row["variant"] in rows:
                rows[row["variant"]]["eval"].update(row["eval"])
    return {"rows": list(rows.values())}


def schemes_outcome(docs: list[dict[str, Any]], stages: int, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The schemes section from the calls done so far (``stages`` planned): passed only when every one ran."""
    if not docs:
        return error or {"status": "failed", "summary": "nothing measured"}
    train, memory = schemes_rows(merge_schemes(docs))
    lengths = sorted({int(k) for row in merge_schemes(docs)["rows"] for k in row["eval"]})
    summary = (f"{len(train)} cells; float32 training step at small, B 32, T 512; evaluation at "
               f"{', '.join(map(str, lengths))} tokens")
    status = "passed"
    if len(docs) < stages:
        status = (error or {}).get("status", "failed")
        summary += f"; {stages - len(docs)} of {stages} evaluation stages not measured: {(error or {}).get('summary')}"
    return {"status": status, "summary": summary,
            "tables": [("training tokens/s (small, float32)", train),
                       ("evaluation peak memory (tiny, batch 1; n/m cells: see --eval_all)", memory)]}


def section_schemes(budget: float, out: Path, stages=SCHEMES_STAGES) -> dict[str, Any]:
    """``accrot bench schemes --device cuda`` in one call per evaluation length, shortest first, each written as
    it ends: a section stopped at its limit keeps every length measured before. The first call also times the
    training step (2 rounds); the later ones repeat it at 1 round (a few seconds on a GPU) and only their
    evaluations are kept."""
    deadline = time.monotonic() + budget
    docs: list[dict[str, Any]] = []
    for i, lengths in enumerate(stages):
        repeats = "2" if i == 0 else "1"
        doc, error = _bench([*SCHEMES_ARGS, "--repeats", repeats, "--eval_lengths", *map(str, lengths)],
                            deadline - time.monotonic(), out, f"schemes-{i}")
        if doc is None:
            return schemes_outcome(docs, len(stages), error)
        docs.append(doc)
        write_partial(out, "schemes", schemes_outcome(docs, len(stages)))
    return schemes_outcome(docs, len(stages))


def path_outcome(doc: dict[str, Any]) -> dict[str, Any]:
    """The path section's result from ``accrot bench path --device cuda``'s report: passed only when fla ran in
    every cell (a cell where it erred, or an fla that could not run at all, fails the section, named)."""
    problem = doc.get("fla", "ok")
    errs = [f"T={r['T']} {r['mode']}: {r['fla']}" for r in doc["kernels"] if r.get("fla", "ok") != "ok"]
    errs += [f"T={r['T']} {r['mode']}: no fla time" for r in doc["kernels"]
             if r.get("fla", "ok") == "ok" and r.get("fla_s") is None]
    if problem != "ok":
        status, summary = "failed", f"fla did not run: {problem}"
    elif errs:
        status, summary = "failed", f"fla failed in {len(errs)} of {len(doc['kernels'])} cells: {errs[0]}"
    else:
        status, summary = "passed", f"chunked vs fla in {len(doc['kernels'])} cells"
    return {"status": status, "summary": summary,
            "tables": [("PaTH kernels (q, k, v bf16; w, β float32)", doc["kernels"]),
                       ("PaTH evaluation peak memory", doc["memory"])],
            "notes": errs[1:]}


PATH_STAGES = ((4096, True), (16384, True), (65536, False))  # (length, also forward + backward), shortest first


def section_path(budget: float, out: Path, stages=PATH_STAGES) -> dict[str, Any]:
    """``accrot bench path --device cuda`` in one call per length, shortest first, each written as it ends (a
    section stopped at its limit keeps the lengths measured before)."""
    deadline = time.monotonic() + budget
    merged: dict[str, Any] = {"fla": "ok", "kernels": [], "memory": []}
    for i, (length, backward) in enumerate(stages):
        doc, error = _bench(["path", "--device", "cuda", "--lengths", str(length), "--memory_lengths", str(length),
                             "--backward_lengths", *([str(length)] if backward else [])],
                            deadline - time.monotonic(), out, f"path-{i}")
        if doc is None:
            if not merged["kernels"]:
                return error
            done = path_outcome(merged)
            return {**done, "status": error["status"] if done["status"] == "passed" else done["status"],
                    "summary": f"{done['summary']}; T={length} and longer not measured: {error['summary']}"}
        merged["fla"] = merged["fla"] if doc.get("fla", "ok") == "ok" else doc["fla"]
        merged["kernels"] += doc["kernels"]
        merged["memory"] += doc["memory"]
        write_partial(out, "path", path_outcome(merged))
    return path_outcome(merged)


def section_env(budget: float, out: Path) -> dict[str, Any]:
    """The quickest failures: fla imports (warnings are errors, as in the suite), one fla PaTH-FoX forward and
    backward against the chunked kernel, one compiled rotation under ``ACCROT_GPU_KERNELS=on``."""
    import warnings

    import torch

    from accrot.ops import gpu_kernels
    from accrot.ops.path import fla_problem, path_attention
    from tests.helpers.tolerance import fla_mismatches, norms
    from tests.ops.test_path import outputs_and_grads

    rows: list[dict[str, Any]] = []

    def check(what: str, fn) -> None:
        t0 = time.monotonic()
        try:
            detail = fn()
            rows.append({"check": what, "status": "ok", "detail": detail, "s": time.monotonic() - t0})
        except Exception as err:  # noqa: BLE001 - each check's failure is a row
            rows.append({"check": what, "status": "failed", "s": time.monotonic() - t0,
                         "detail": f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"})

    def fla_import() -> str:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            problem = fla_problem("cuda")
        if problem:
            raise RuntimeError(problem)
        return "imports under warnings-as-errors"

    def fla_call() -> str:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(1, 2, 130, 32, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
        w = torch.nn.functional.normalize(torch.randn(1, 2, 130, 32, device="cuda", generator=g), dim=-1)
        beta = 2 * torch.rand(1, 2, 130, device="cuda", generator=g)
        log_f = torch.nn.functional.logsigmoid(torch.randn(1, 2, 130, device="cuda", generator=g) + 1)
        leaves = [t.requires_grad_() for t in (q, k, v, w, beta)]
        inputs = dict(zip(("q", "k", "v", "w", "beta"), leaves), log_decay=log_f.requires_grad_())
        fast = outputs_and_grads(path_attention, inputs, kernel="fla")
        ref = outputs_and_grads(path_attention, {n: t.float() for n, t in inputs.items()}, chunk_size=64)
        bad = fla_mismatches(ref, fast)  # fla's own per-tensor bounds, the same as the gpu tests'
        if bad:
            raise AssertionError("fla vs chunked: " + "; ".join(bad))
        diff, size = norms(ref[0], fast[0])
        return f"T 130, D 32, bf16, gated: output and 6 gradients within bounds (output {diff / size:.1e})"

    def compiled_rotation() -> str:
        from torch._dynamo.utils import counters

        os.environ["ACCROT_GPU_KERNELS"] = "on"
        graphs = []
        for T in (64, 97):  # a second length must compile nothing new (lengths are dynamic)
            x, theta = torch.randn(2, 2, T, 32, device="cuda"), torch.randn(1, 2, T, 16, device="cuda")
            got = gpu_kernels.CompiledOps.rotate(x, theta.cos(), theta.sin(), 1.0)
            torch.testing.assert_close(got, gpu_kernels.EAGER["rotate+"](x, theta.cos(), theta.sin()))
            graphs.append(counters["stats"]["unique_graphs"])
        if not 1 <= graphs[0] <= gpu_kernels.RECOMPILE_LIMIT or graphs[1] != graphs[0]:
            raise AssertionError(f"graphs compiled after T 64, T 97: {graphs} (want one, and none for the new length)")
        return f"ACCROT_GPU_KERNELS=on compiles ({graphs[0]} graph, none more for a second length), matches eager"

    check("fla imports", fla_import)
    check("fla PaTH-FoX forward + backward vs chunked", fla_call)
    check("compiled rotation", compiled_rotation)
    bad = [r["check"] for r in rows if r["status"] != "ok"]
    return {"status": "failed" if bad else "passed",
            "summary": f"failed: {', '.join(bad)}" if bad else f"{len(rows)} checks ok",
            "tables": [("checks", rows)]}


def ddp_outcome(rc: int | None, text: str, budget: float) -> dict[str, Any]:
    """The DDP section's result from the fit's exit status and output: passed only when it finished and Lightning
    says it ran DDP over NCCL."""
    nccl = "distributed_backend=nccl" in text
    if rc is None:
        return {"status": "timed out", "summary": f"accrot fit did not finish within {budget:.0f} s", "log": text[-3000:]}
    if rc != 0 or not nccl:
        why = f"exit status {rc}" if rc != 0 else "finished, but not over NCCL (no distributed_backend=nccl)"
        return {"status": "failed", "summary": f"one-rank DDP: {why}", "log": text[-3000:]}
    return {"status": "passed", "summary": "accrot fit --trainer.strategy=ddp on one GPU: NCCL process group, "
                                           "all-reduced steps, a checkpoint"}


DDP_STEPS = 5


def section_ddp(budget: float, out: Path) -> dict[str, Any]:
    """One rank of DDP over NCCL (accrot fit, tiny, a few steps): the process group, the gradient all-reduce and the
    rank-0 checkpoint that a multi-GPU run needs, on the one GPU a check has."""
    root = out / "ddp-runs"
    cmd = [sys.executable, "-m", "accrot.cli", "fit", "--config", "tiny", "--trainer.accelerator=gpu",
           "--trainer.devices=1", "--trainer.strategy=ddp", f"--trainer.max_steps={DDP_STEPS}",
           "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false", "--wandb=disabled",
           "--extrapolation.every_n_steps=0", f"--root={root}", "--name=ddp"]
    try:
        done = subprocess.run(cmd, cwd=REPO, timeout=max(1.0, budget - 5), capture_output=True, text=True)
        rc, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        rc, text = None, (err.stdout or b"").decode(errors="replace") if isinstance(err.stdout, bytes) else ""
    text += "".join(p.read_text(errors="replace") for p in root.glob("*/version_*/console.log"))
    return ddp_outcome(rc, text, budget)


SECTIONS = {"env": section_env, "pytest": section_pytest, "ddp": section_ddp, "steps": section_steps, "kernels": section_kernels,
            "schemes": section_schemes, "path": section_path}


def run_section(name: str, budget: float, out: Path) -> int:
    """Child mode: run one section and write its result JSON (the parent reads it)."""
    started = time.monotonic()
    try:
        doc = SECTIONS[name](budget, out)
    except Exception as err:  # noqa: BLE001 - reported in the section's row
        import traceback

        doc = {"status": "failed", "summary": f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}",
               "log": traceback.format_exc()[-3000:]}
    doc["seconds"] = round(time.monotonic() - started, 1)
    (out / f"{name}.json").write_text(json.dumps(doc, default=str))
    return 0 if doc["status"] == "passed" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET, help="seconds for all sections")
    parser.add_argument("--out", default=str(REPO / "results" / "gpu-check"), help="report folder")
    parser.add_argument("--section", choices=sorted(SECTIONS), help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--dry-run", action="store_true",
                        help="print what the check would run here and for how long at most, run nothing (no GPU needed)")
    parser.add_argument("--all-sections", action="store_true",
                        help="run every section even on a cold node (a first check: some sections may time out)")
    args = parser.parse_args(argv)
    if args.budget < 60:
        parser.exit(2, f"gpu-check: error: --budget={args.budget:g} is not valid; give at least 60 seconds\n")
    if args.dry_run:
        print("\n".join(dry_run(args.budget, is_cold(), args.all_sections)))
        return 0
    import torch

    out = Path(args.out).resolve()
    if not torch.cuda.is_available():
        print(NO_CUDA)
        if not args.section:  # the report says so, section by section
            out.mkdir(parents=True, exist_ok=True)
            report_without_cuda(out)
        return 0
    if args.section:
        return run_section(args.section, args.budget, out)
    return run_all(args.budget, out, cold=is_cold(), everything=args.all_sections)


if __name__ == "__main__":
    sys.exit(main())

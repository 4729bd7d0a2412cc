"""``make gpu-check`` (tests/helpers/gpu_check.py) where there is no GPU: the one line, a report that says "skipped: no
CUDA" per section, exit 0; the make target; the report written from fake section results, and rewritten after
every section; the budget split; how each section's outcome is judged (a skip, an fla cell that erred, a rotation
that was not compiled is not a pass); and the plumbing of the sections a CPU can run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import gpu_check

REPO = Path(__file__).resolve().parent.parent


def test_without_cuda_it_says_so_in_one_line_and_the_report_skips_every_section(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no device, whatever the machine has
    done = subprocess.run([sys.executable, "tests/helpers/gpu_check.py", "--out", str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [gpu_check.NO_CUDA]
    assert gpu_check.NO_CUDA.startswith("gpu-check: no CUDA device") and "nothing to check" in gpu_check.NO_CUDA
    text = (tmp_path / "REPORT.md").read_text()
    assert "overall: **nothing checked**" in text and f"0/{len(gpu_check.PLAN)} sections passed" in text
    for name, _ in gpu_check.PLAN:
        assert f"## {gpu_check.TITLES[name]}\n\n**skipped: no CUDA**" in text
    assert "**passed**" not in text and "| passed |" not in text


def test_make_target_runs_the_script():
    done = subprocess.run(["make", "-n", "gpu-check"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "tests/helpers/gpu_check.py" in done.stdout
    help_text = subprocess.run(["make", "help"], cwd=REPO, capture_output=True, text=True, timeout=60).stdout
    assert "gpu-check" in help_text


ENV = {"gpu": "NVIDIA H200", "torch": "2.13.0+cu128", "cuda": "12.8", "triton": "3.9.0",
       "fla-core": "0.6.0", "fla_path_kernel": "ok"}


def fake_sections() -> list[dict]:
    return [
        {"name": "pytest", "status": "passed", "seconds": 120.5, "budget_s": 205, "summary": "180 passed, 0 failed"},
        {"name": "steps", "status": "failed", "seconds": 140.0, "budget_s": 148, "summary": "12/13 variants measured",
         "tables": [("per variant", [{"variant": "NoPE", "ms_per_step": 21.5, "tokens_per_s": 762000.0},
                                     {"variant": "PaTH|FoX", "status": "failed (2)"}])],
         "notes": ["ms/step after a 10-step warm-up"], "log": "Traceback ...\nRuntimeError: boom"},
        {"name": "kernels", "status": "timed out", "seconds": 45.0, "budget_s": 45, "summary": "stopped",
         "log": "still compiling"},
        {"name": "schemes", "status": "skipped", "seconds": 0, "budget_s": 3, "summary": "no time left in the budget"},
    ]


def test_report_names_the_machine_and_every_section(tmp_path):
    text = gpu_check.write_report(tmp_path / "REPORT.md", ENV, fake_sections(), started="2026-01-01 00:00:00")
    assert (tmp_path / "REPORT.md").read_text() == text
    assert text.startswith("# accrot gpu-check") and "not all passed" in text and "1/4 sections passed" in text
    for value in ENV.values():
        assert f"| {value} |" in text
    for title in ("pytest -m gpu", "200 steps of the small preset", "torch.compile vs eager",
                  "accrot bench schemes --device cuda"):
        assert f"## {next(t for t in gpu_check.TITLES.values() if title in t)}" in text
    assert "**timed out**" in text and "**skipped**" in text and "**passed** — 180 passed" in text
    assert "| NoPE | 21.5 | 7.62e+05 | – |" in text  # rows fill every column; a missing value is –
    assert "PaTH\\|FoX" in text  # a pipe inside a cell does not break the table
    assert "RuntimeError: boom" in text and "still compiling" in text  # logs of what did not pass
    assert "- ms/step after a 10-step warm-up" in text


@pytest.fixture
def passing_sections(monkeypatch) -> dict[str, float]:
    """Every section a child that passes at once; returns the budget each section was given, by name."""
    budgets: dict[str, float] = {}

    def child(name, budget, out):
        budgets[name] = budget
        return {"name": name, "status": "passed", "seconds": 1.0, "budget_s": round(budget), "summary": "ok"}

    monkeypatch.setattr(gpu_check, "run_child", child)
    monkeypatch.setattr(gpu_check, "environment", lambda: dict(ENV))
    return budgets


def test_all_sections_passed_is_exit_0_and_the_budget_is_shared(tmp_path, passing_sections):
    budgets = passing_sections
    assert gpu_check.run_all(500.0, tmp_path, cache=tmp_path / "cache") == 0
    assert list(budgets) == [name for name, _ in gpu_check.PLAN]
    # each section gets its share of what is left: the first its share of all, the last what the others left
    assert budgets[gpu_check.PLAN[0][0]] == pytest.approx(500 * gpu_check.PLAN[0][1], abs=0.5)
    assert budgets[gpu_check.PLAN[-1][0]] == pytest.approx(500, abs=0.5)  # the fakes took no time
    assert all(b <= 500 for b in budgets.values())
    text = (tmp_path / "REPORT.md").read_text()
    n = len(gpu_check.PLAN)
    assert "overall: **passed**" in text and f"{n}/{n} sections passed" in text


def test_a_failed_section_is_exit_1_and_no_time_left_skips(tmp_path, monkeypatch):
    def child(name, budget, out):
        return {"name": name, "status": "failed" if name == "steps" else "passed", "seconds": 0, "summary": "x"}

    monkeypatch.setattr(gpu_check, "run_child", child)
    monkeypatch.setattr(gpu_check, "environment", lambda: dict(ENV))
    assert gpu_check.run_all(500.0, tmp_path, cache=tmp_path / "cache") == 1
    assert gpu_check.run_all(20.0, tmp_path, cache=tmp_path / "cache") == 1  # 20 s: every share is under 15 s
    assert "no time left in the budget" in (tmp_path / "REPORT.md").read_text()


def test_the_report_is_rewritten_after_every_section_and_names_the_running_one(tmp_path, monkeypatch):
    """A check stopped from outside keeps what it measured: while a section runs, REPORT.md already holds every
    earlier section's result and names the running one."""
    seen = {}

    def child(name, budget, out):
        seen[name] = (out / "REPORT.md").read_text()
        return {"name": name, "status": "passed", "seconds": 1.0, "budget_s": round(budget), "summary": f"{name} ok"}

    monkeypatch.setattr(gpu_check, "run_child", child)
    monkeypatch.setattr(gpu_check, "environment", lambda: dict(ENV))
    gpu_check.run_all(500.0, tmp_path, cache=tmp_path / "cache")
    first, second = gpu_check.PLAN[0][0], gpu_check.PLAN[1][0]
    assert f"**passed** — {first} ok" in seen[second] and f"## {gpu_check.TITLES[second]}\n\n**running**" in seen[second]
    assert "overall: **not all passed**" in seen[second]  # a report stopped here does not read as a pass


def test_a_skipped_test_fails_the_pytest_section_and_a_stopped_pytest_keeps_its_counts(tmp_path):
    junit = tmp_path / "pytest.xml"
    junit.write_text('<testsuites><testsuite tests="3" failures="0" errors="0" skipped="1">'
                     '<testcase classname="tests.ops.test_path" name="test_fla_matches_chunked[f32]">'
                     '<skipped message="fla-core is not installed"/></testcase>'
                     '<testcase classname="a" name="b"/><testcase classname="a" name="c"/></testsuite></testsuites>')
    doc = gpu_check.pytest_outcome(junit, "", 0, 100)
    assert doc["status"] == "failed" and "2 passed, 0 failed, 1 skipped" in doc["summary"]
    assert doc["tables"] == [("skipped (did not run)", [{"test": "tests.ops.test_path::test_fla_matches_chunked[f32]",
                                                          "reason": "fla-core is not installed"}])]
    junit.unlink()  # pytest stopped at its budget: the -v lines it printed are the result so far
    log = "tests/a.py::test_x PASSED [ 10%]\ntests/a.py::test_y FAILED [ 20%]\ntests/a.py::test_z PASSED [ 30%]\n"
    doc = gpu_check.pytest_outcome(junit, log, None, 100)
    assert doc["status"] == "timed out" and doc["summary"].startswith("2 passed, 1 failed, 0 skipped before pytest")
    assert doc["tables"][0][1] == [{"test": "tests/a.py::test_y", "message": "FAILED"}]


def _path_row(T, mode, fla="ok", fla_s=0.01):
    return {"T": T, "mode": mode, "chunked_s": 0.02, "fla_s": fla_s, "fla": fla}


@pytest.mark.parametrize("doc, status, words", [
    ({"fla": "ok", "kernels": [_path_row(4096, "fwd"), _path_row(4096, "fwd+bwd")], "memory": []}, "passed",
     "chunked vs fla in 2 cells"),
    ({"fla": "ok", "kernels": [_path_row(4096, "fwd"),
                               _path_row(4096, "fwd+bwd", "AssertionError: w, beta should be float32", None)],
      "memory": []}, "failed", "fla failed in 1 of 2 cells: T=4096 fwd+bwd: AssertionError: w, beta"),
    ({"fla": "kernel='fla' needs fla's ops", "kernels": [_path_row(4096, "fwd", "kernel='fla' needs", None)],
      "memory": []}, "failed", "fla did not run: kernel='fla' needs fla's ops"),
], ids=["fla-ran", "a-cell-erred", "no-fla"])
def test_the_path_section_passes_only_where_fla_ran_in_every_cell(doc, status, words):
    outcome = gpu_check.path_outcome(doc)
    assert outcome["status"] == status and words in outcome["summary"]


def test_the_kernels_section_fails_where_the_rotation_was_not_compiled():
    rows = [{"cell": "a", "compiled_ms": 1.0, "eager_ms": 2.0, "compiled_vs_eager": 0.5},
            {"cell": "b", "compiled_ms": 2.0, "eager_ms": 2.0, "note": "not compiled: rotate+: FailOnRecompileLimitHit"}]
    assert gpu_check.kernels_outcome(rows[:1])["status"] == "passed"
    doc = gpu_check.kernels_outcome(rows)
    assert doc["status"] == "failed" and "not compiled or not measured: b" in doc["summary"]


def test_a_child_that_writes_no_result_is_a_failure_with_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the child finds no CUDA: says so and writes nothing
    doc = gpu_check.run_child("path", 60, tmp_path)
    assert doc["status"] == "failed" and "before writing its result" in doc["summary"]
    assert gpu_check.NO_CUDA in doc["log"]


def test_schemes_report_becomes_tokens_per_second_and_memory_rows():
    doc = {"rows": [{"variant": "none/none", "train": {"small": {"batch": 32, "T": 512, "ms": 64.0, "ratio": 1.0}},
                     "eval": {"4096": {"peak_mib": 10.0, "mem_ratio": 1.0}, "65536": {"peak_mib": 160.0,
                                                                                    "mem_ratio": 1.0}}},
                    {"variant": "path/none", "train": {"small": {"batch": 32, "T": 512, "ms": 128.0, "ratio": 2.0}},
                     "eval": {"4096": {"peak_mib": 30.0, "mem_ratio": 3.0}}}]}
    train, memory = gpu_check.schemes_rows(doc)
    assert train[0]["small tokens/s"] == pytest.approx(32 * 512 / 0.064) and train[1]["small ×NoPE"] == 2.0
    assert memory[0]["65536 MiB"] == 160.0 and "65536 MiB" not in memory[1]


def test_variant_overrides_are_the_ablations():
    assert gpu_check.variant_overrides("NoPE") == []
    assert gpu_check.variant_overrides("accum-random") == ["--model.scheme.rotation=accum",
                                                           "--model.scheme.increments=random_position",
                                                           "--model.scheme.window=384.0"]
    assert "--model.scheme.rotate_values=true" in gpu_check.variant_overrides("accum-learned+values")
    assert gpu_check._max_time(75.9) == "00:00:01:15" and gpu_check._max_time(1) == "00:00:00:03"


@pytest.mark.slow
def test_steps_section_plumbing_on_the_cpu(tmp_path):
    """The steps section end to end on the CPU (tiny, 4 steps, 2 variants): its fit arguments parse, the step timer
    is found by its class path and reports, and the per-variant rows and the preset estimate are filled in."""
    doc = gpu_check.section_steps(400, tmp_path, config="tiny", steps=4, warmup=1, variants=["NoPE", "accum-random"],
                                  accelerator="cpu", precision="32-true")
    assert doc["status"] == "passed", doc
    (title, rows), = doc["tables"]
    assert [r["variant"] for r in rows] == ["NoPE", "accum-random"]
    for row in rows:
        assert row["status"] == "ok" and row["steps"] == 4 and row["ms_per_step"] > 0 and row["tokens_per_s"] > 0
        # both variants run on both of the small preset's data sets: 2 × (5 seeds + a 3-point lr grid) runs
        assert row["preset_runs"] == 16
        assert row["preset_gpu_h"] == pytest.approx(16 * 5000 * row["ms_per_step"] / 3.6e6)
    assert "GPU-hours" in doc["summary"]
    json.dumps(doc)  # the child writes it as JSON


def test_the_fastest_failure_finders_run_first_and_the_step_timings_last():
    order = [name for name, _ in gpu_check.PLAN]
    assert order[:3] == ["env", "pytest", "ddp"] and order[-1] == "steps"
    assert set(order) == set(gpu_check.SECTIONS) == set(gpu_check.TITLES)
    assert sum(share for _, share in gpu_check.PLAN) == pytest.approx(1.0)
    assert gpu_check.DEFAULT_BUDGET + gpu_check.GRACE < 600  # the whole check within 10 minutes


def test_a_section_stopped_at_its_limit_keeps_its_results_so_far_and_says_timed_out(tmp_path):
    """The steps section rewrites its results after each variant; the parent, finding no final result from a child it
    stopped, reports those rows under "timed out" (not a pass, not an empty section)."""
    rows = [{"variant": "NoPE", "status": "ok", "steps": 200, "ms_per_step": 21.5, "preset_gpu_h": 0.1}]
    gpu_check.write_partial(tmp_path, "steps", gpu_check.steps_outcome(rows, [], 200, 10))
    doc = gpu_check.child_result("steps", tmp_path, None, 120, 130.2)
    assert doc["status"] == "timed out" and doc["summary"].startswith("stopped after its 120 s budget; results so far")
    assert doc["tables"] == [["per variant", rows]]
    text = gpu_check.write_report(tmp_path / "REPORT.md", ENV, [doc])
    assert "**timed out** — stopped after its 120 s budget; results so far: 1/1 variants measured" in text
    assert "| NoPE | ok | 200 | 21.5 | 0.1 |" in text and "overall: **not all passed**" in text
    crashed = gpu_check.child_result("steps", tmp_path, -9, 120, 5.0)  # killed from outside: failed, rows kept
    assert crashed["status"] == "failed" and crashed["tables"] == doc["tables"]
    (tmp_path / "steps.partial.json").unlink()
    assert gpu_check.child_result("steps", tmp_path, None, 120, 130)["summary"] == "stopped after its 120 s budget"


def test_the_steps_section_writes_each_variant_as_it_goes(tmp_path, monkeypatch):
    import accrot.cli

    seen = []

    def fit(argv):  # a fit that leaves no timing: each variant's row is written before the next one starts
        partial = tmp_path / "steps.partial.json"
        seen.append(json.loads(partial.read_text())["tables"][0][1] if partial.exists() else [])
        return 0

    monkeypatch.setattr(accrot.cli, "main", fit)
    doc = gpu_check.section_steps(300, tmp_path, config="tiny", variants=["NoPE", "accum-random"], accelerator="cpu")
    assert [len(rows) for rows in seen] == [0, 1] and seen[1][0]["variant"] == "NoPE"
    saved = json.loads((tmp_path / "steps.partial.json").read_text())
    assert [r["variant"] for r in saved["tables"][0][1]] == ["NoPE", "accum-random"]
    assert doc["status"] == "failed" and "no variant measured" in doc["summary"]  # no timings: nothing measured


def test_the_compile_caches_live_where_the_next_check_finds_them(tmp_path, monkeypatch):
    """Every section's child gets TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR in one folder of the checkout (fla's
    autotuning and the rotations' compiles are paid once per node); a cache the user set is kept."""
    ignored = subprocess.run(["git", "check-ignore", "-q", ".cache/gpu-check/triton/x"], cwd=REPO, timeout=30)
    assert ignored.returncode == 0  # never committed
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    seen = {}

    class Child:
        def __init__(self, cmd, **kwargs):
            seen.update(kwargs["env"])
            self.pid = 0

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(gpu_check.subprocess, "Popen", Child)
    gpu_check.run_child("env", 60, tmp_path)
    assert seen["TRITON_CACHE_DIR"] == str(REPO / ".cache" / "gpu-check" / "triton")
    assert seen["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


@pytest.mark.parametrize("rc, text, status, words", [
    (0, "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/1\ndistributed_backend=nccl\n", "passed", "NCCL"),
    (0, "distributed_backend=gloo\n", "failed", "not over NCCL"),
    (1, "RuntimeError: NCCL error", "failed", "exit status 1"),
    (None, "", "timed out", "did not finish within 60 s"),
], ids=["nccl", "gloo", "error", "timeout"])
def test_the_ddp_section_passes_only_over_nccl(rc, text, status, words):
    doc = gpu_check.ddp_outcome(rc, text, 60)
    assert doc["status"] == status and words in doc["summary"]


# -- what the GPU-hours estimate counts, the cold node's plan, the dry run, the staged benches ---------------------
def test_the_preset_runs_are_read_from_the_size_record(monkeypatch):
    """The small preset's runs: 5 seeds and a 3-point learning-rate grid per variant and data set, and the local
    task runs only its own variants; another record counts otherwise (nothing is assumed about seeds)."""
    from accrot.study import variants

    runs = gpu_check.preset_runs("small")
    assert (runs["seeds"], runs["grid"], runs["steps"], runs["datasets"]) == (5, 3, 5000, ["corpus", "local"])
    assert runs["variants"]["NoPE"] == {"datasets": ["corpus", "local"], "runs": 16}
    only_corpus = [v for v in variants.DEFAULT_VARIANTS if v not in variants.LOCAL_VARIANTS]
    assert only_corpus and all(runs["variants"][v]["runs"] == 8 for v in only_corpus)
    assert runs["runs"] == 16 * (len(variants.DEFAULT_VARIANTS) - len(only_corpus)) + 8 * len(only_corpus)
    assert gpu_check.preset_runs("paper")["steps"] == 20000  # the record's own trainer.max_steps
    study = gpu_check.preset_runs("study")  # no lr grid, 3 seeds, tiny's 300 steps... as its record says
    assert study["grid"] == 0 and study["variants"]["NoPE"]["runs"] == 2 * variants.SIZES["study"].seeds
    monkeypatch.setitem(variants.SIZES, "small", variants.Size(base="small", seq_len=512, seeds=7, lr=1e-3,
                                                               datasets=("corpus",), variants=("NoPE", "RoPE")))
    assert gpu_check.preset_runs("small")["runs"] == 2 * 7
    assert "14 runs of 5000 steps: 2 variants × 1 data sets (corpus) × (7 seeds)" in gpu_check.runs_line(
        gpu_check.preset_runs("small"))


def test_the_gpu_hours_count_each_variants_runs(monkeypatch):
    rows = [{"variant": "NoPE", "status": "ok", "ms_per_step": 36.0, "preset_runs": 16,
             "preset_gpu_h": 16 * 5000 * 36.0 / 3.6e6}]
    doc = gpu_check.steps_outcome(rows, [], 200, 10)
    assert "training ≈ 0.8 GPU-hours on this GPU for 16 of its 224 runs" in doc["summary"]


def test_a_cold_node_skips_the_compile_bound_sections_says_why_and_is_warm_after(tmp_path, passing_sections):
    budgets = passing_sections
    cache = tmp_path / "cache"
    assert gpu_check.is_cold(cache)
    assert gpu_check.run_all(500.0, tmp_path, cold=True, cache=cache) == 1  # skipped sections are not passes
    assert set(budgets) == {n for n, _ in gpu_check.PLAN} - set(gpu_check.COLD_SKIPS)
    assert budgets["steps"] == pytest.approx(500, abs=0.5) and max(budgets.values()) <= 500
    text = (tmp_path / "REPORT.md").read_text()
    for name in gpu_check.COLD_SKIPS:
        assert f"## {gpu_check.TITLES[name]}\n\n**skipped** — skipped: first check on this node" in text
    assert "run make gpu-check again" in text
    assert text.index(gpu_check.TITLES["kernels"]) < text.index(gpu_check.TITLES["steps"])  # in the plan's order
    assert not gpu_check.is_cold(cache)  # the last section ran: the next check is warm and runs everything
    budgets.clear()
    assert gpu_check.run_all(500.0, tmp_path, cold=gpu_check.is_cold(cache), cache=cache) == 0
    assert set(budgets) == {n for n, _ in gpu_check.PLAN}


def test_a_check_stopped_before_its_last_section_leaves_the_node_cold(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "run_child", lambda name, budget, out: {
        "name": name, "status": "passed", "seconds": 0, "summary": "x"})
    monkeypatch.setattr(gpu_check, "environment", lambda: dict(ENV))
    gpu_check.run_all(20.0, tmp_path, cold=True, cache=tmp_path / "cache")  # every share under 15 s: skipped
    assert gpu_check.is_cold(tmp_path / "cache")


def test_the_dry_run_prints_the_plan_and_its_time_without_a_gpu(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "tests/helpers/gpu_check.py", "--dry-run", "--budget", "300", "--out",
                           str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("gpu-check --dry-run: a ") and "budget 300 s" in lines[0]
    at_most = [float(line.split("at most")[1].split()[0]) for line in lines if line.startswith("  ") and " at most " in line]
    skipped = [line for line in lines if "skipped: first check" in line]
    assert len(at_most) + len(skipped) == len(gpu_check.PLAN) and sum(at_most) == pytest.approx(300, abs=len(at_most))
    assert any(line.startswith("estimated: at most ") for line in lines)
    assert "224 runs of 5000 steps" in done.stdout.replace(str(gpu_check.preset_runs()["runs"]), "224")
    assert not (tmp_path / "out").exists()  # runs nothing, writes nothing
    warm = gpu_check.dry_run(300, cold=False)
    assert not any("skipped" in line for line in warm) and "for 7 of 7 sections" in "".join(warm)
    bad = subprocess.run([sys.executable, "tests/helpers/gpu_check.py", "--dry-run", "--budget", "5"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "gpu-check: error: --budget=5 is not valid; give at least 60 seconds"]


def _path_doc(T, backward):
    rows = [_path_row(T, "fwd")] + ([_path_row(T, "fwd+bwd")] if backward else [])
    return {"fla": "ok", "kernels": rows, "memory": [{"T": T, "chunked_mib": 1.0}]}


def test_the_path_section_writes_each_length_as_it_goes_and_keeps_them_when_stopped(tmp_path, monkeypatch):
    calls, seen = [], []

    def bench(command, budget, out, name):
        calls.append(command)
        partial = tmp_path / "path.partial.json"
        seen.append(len(json.loads(partial.read_text())["tables"][0][1]) if partial.exists() else 0)
        T = int(command[command.index("--lengths") + 1])
        if T == 65536:
            return None, {"status": "timed out", "summary": "did not finish within 20 s"}
        return _path_doc(T, "--backward_lengths" in command and command[-1] == str(T)), {}

    monkeypatch.setattr(gpu_check, "_bench", bench)
    doc = gpu_check.section_path(100, tmp_path)
    assert [c[c.index("--lengths") + 1] for c in calls] == ["4096", "16384", "65536"]
    assert calls[2][-1] == "--backward_lengths"  # no backward at 64k: the default pair of lengths only
    assert seen == [0, 2, 4]  # the rows of every earlier length were on disk before the next call
    assert doc["status"] == "timed out" and "chunked vs fla in 4 cells" in doc["summary"]
    assert "T=65536 and longer not measured: did not finish within 20 s" in doc["summary"]
    assert [r["T"] for r in doc["tables"][0][1]] == [4096, 4096, 16384, 16384]


def _schemes_doc(lengths):
    return {"rows": [{"variant": v, "train": {"small": {"batch": 32, "T": 512, "ms": 64.0, "ratio": 1.0}},
                      "eval": {str(ln): {"peak_mib": 10.0 * ln / 4096, "mem_ratio": 1.0} for ln in lengths}}
                     for v in ("none/none", "rope/none")]}


def test_the_schemes_section_keeps_the_lengths_measured_before_a_time_out(tmp_path, monkeypatch):
    def bench(command, budget, out, name):
        lengths = [int(x) for x in command[command.index("--eval_lengths") + 1:]]
        if lengths == [65536]:
            assert json.loads((tmp_path / "schemes.partial.json").read_text())["status"] == "failed"
            return None, {"status": "timed out", "summary": "did not finish within 30 s"}
        return _schemes_doc(lengths), {}

    monkeypatch.setattr(gpu_check, "_bench", bench)
    doc = gpu_check.section_schemes(100, tmp_path)
    assert doc["status"] == "timed out" and "evaluation at 4096, 16384 tokens" in doc["summary"]
    assert "1 of 3 evaluation stages not measured: did not finish within 30 s" in doc["summary"]
    memory = doc["tables"][1][1]
    assert memory[0]["4096 MiB"] == 10.0 and memory[0]["16384 MiB"] == 40.0 and "65536 MiB" not in memory[0]

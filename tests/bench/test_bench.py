"""``accrot bench``: the schemes report has a row per built cell with positive ratios and NoPE at exactly 1,
bad input is one line and exit status 2. No timing assertions."""

from __future__ import annotations

import json
import os
import random

import pytest
import torch

from accrot.bench.command import main
from accrot.bench.grid import (
    LEARNED_LIMIT,
    LEARNED_VALUES_LIMIT,
    OP_FAR_MASS_LIMIT,
    PATH_EVAL_LIMIT,
    ROTATION_LIMIT,
    ROTATION_VALUES_LIMIT,
    Cell,
    grid,
)
from accrot.cli import main as cli_main
from accrot.position import FAR_MASS, ROTATIONS


def test_grid_has_every_registered_cell_once_nope_first():
    """The bench enumerates the registries: every rotation, every far-mass part and every increment source the
    bench times itself (the others name the source whose timing stands for theirs) appear, so a newly registered
    family is benchmarked without an edit to the grid."""
    from accrot.position import INCREMENTS

    cells = grid()
    names = [c.name for c in cells]
    assert names[0] == "none/none" and len(set(names)) == len(names)
    timed = {name for name, source in INCREMENTS.items() if source.timed_as is None}
    assert timed == {"random_position", "learned"}
    assert all(INCREMENTS[s.timed_as].timed_as is None for s in INCREMENTS.values() if s.timed_as)
    far = 1 + len(FAR_MASS)  # none + the registered far-mass parts
    per_rotation = {"none": 1, "rope": 2, "accum": 2 * len(timed), "path": 1}  # × rotate_values, × increments
    plain = [c for c in cells if c.plain]
    assert set(ROTATIONS) == set(per_rotation)
    assert len(plain) == far * sum(per_rotation.values())
    assert {c.far_mass for c in plain} == {"none", *FAR_MASS} and {c.rotation for c in plain} == set(ROTATIONS)
    # beyond the grid: the output gate once per rotation kind (and headwise on NoPE), NoPE/RoPE interleaving
    extra = [c.name for c in cells if not c.plain]
    assert extra == ["none/none+gate", "none/none+headgate", "rope/none+gate", "accum:learned/none+values+gate",
                     "path/none+gate", "rope/none(cell,none)"]
    assert all(c.rotation in ("rope", "accum") for c in cells if c.rotate_values)
    assert {c.increments for c in cells if c.rotation == "accum"} == timed
    for c in cells:
        c.scheme()  # every cell is a valid config


def test_a_newly_registered_far_mass_part_is_benchmarked_without_an_edit_to_the_grid(monkeypatch):
    from accrot.position import scheme as registry
    from accrot.position.alibi import ALiBi

    monkeypatch.setitem(registry.FAR_MASS, "alibi2", ALiBi)
    monkeypatch.setattr("accrot.position.config.check_choice", lambda *a, **k: None)
    names = [c.name for c in grid()]
    assert "rope/alibi2" in names and "accum:learned/alibi2+values" in names


@pytest.mark.slow
def test_quick_schemes_report(tmp_path):
    out = tmp_path / "bench_schemes.json"
    # the report's shape, not its numbers: --quick at half its lengths (every cell is still trained and evaluated)
    assert main(["schemes", "--quick", "--T", "128", "--eval_lengths", "512", "--op_T", "128", "--op_eval_length",
                 "512", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["machine"]["kernels"] == doc["rotation_kernels"] and doc["machine"]["threads"] == doc["threads"]
    cells = grid()
    assert [r["variant"] for r in doc["rows"]] == [c.name for c in cells]
    lengths = [str(ln) for ln in doc["settings"]["eval_lengths"]]
    for row in doc["rows"]:
        assert set(row["train"]) == set(doc["settings"]["sizes"])
        assert all(res["ms"] > 0 and res["ratio"] > 0 for res in row["train"].values()), row["variant"]
        assert sorted(row["eval"]) == sorted(lengths)  # --quick evaluates every cell
        assert all(res["ratio"] > 0 and res["mem_ratio"] > 0 for res in row["eval"].values()), row["variant"]
    # each row's verdict is its targets': the rotation-only cells' training ratio per size (learned increments:
    # their own limits), PaTH's training ratio per size, the far-mass anchors' evaluation time and memory at the
    # longest length and their op, PaTH-FoX's op against PaTH's, PaTH's op evaluation; nothing (None) for the others
    by_name = {r["variant"]: r for r in doc["rows"]}
    for cell, row in zip(cells, doc["rows"]):
        targets = {t["what"]: t for t in row["targets"]}
        op = row["op"]
        assert op["train"]["ms"] > 0 and op["train"]["ratio"] > 0, cell.name
        assert (op["eval"] is not None) == (cell.name in doc["settings"]["op"]["eval_cells"]), cell.name
        # gated and interleaved cells (not plain) are reported beside the others, with no target of their own
        if cell.plain and cell.far_mass == "none" and cell.rotation in ("rope", "accum"):
            if cell.increments == "learned":
                limit = LEARNED_VALUES_LIMIT if cell.rotate_values else LEARNED_LIMIT
            else:
                limit = ROTATION_VALUES_LIMIT if cell.rotate_values else ROTATION_LIMIT
            assert sorted(targets) == sorted(f"train {size}" for size in row["train"]), cell.name
            for size, res in row["train"].items():
                assert targets[f"train {size}"]["value"] == res["ratio"] and targets[f"train {size}"]["limit"] == limit
                # learned increments carry their measured floor: RoPE's ratio (same values setting) + the projection
                rope = by_name["rope/none" + ("+values" if cell.rotate_values else "")]["train"][size]["ratio"]
                floor = res.get("floor")
                assert (floor is not None) == (cell.increments == "learned"), cell.name
                if floor is not None:
                    assert floor["rope"] == rope and 0 < floor["projection"] < 1
                    assert floor["ratio"] == pytest.approx(rope + floor["projection"])
                    assert targets[f"train {size}"]["floor"] == floor
                    assert targets[f"train {size}"]["limit_below_floor"] == (floor["ratio"] > limit)
        elif cell.plain and cell.rotation == "none" and cell.far_mass != "none":
            longest = max(lengths, key=int)
            assert targets[f"eval {longest} time"]["value"] == row["eval"][longest]["ratio"], cell.name
            assert targets[f"eval {longest} memory"]["value"] == row["eval"][longest]["mem_ratio"], cell.name
            assert targets["op"]["value"] == op["train"]["ratio"] and targets["op"]["limit"] == OP_FAR_MASS_LIMIT
        elif cell.plain and cell.rotation == "path" and cell.far_mass in ("none", "forget"):
            what = f"op eval {doc['settings']['op']['eval_length']}"
            assert targets[what]["value"] == op["eval"]["ratio"] and targets[what]["limit"] == PATH_EVAL_LIMIT
            if cell.far_mass == "none":
                assert sorted(targets) == sorted([what] + [f"train {size}" for size in row["train"]])
            else:
                path = by_name["path/none"]["op"]["train"]
                assert targets["op / PaTH's"]["value"] == pytest.approx(op["train"]["ratio"] / path["ratio"])
                assert sorted(targets) == sorted([what, "op / PaTH's"])
        else:
            assert targets == {} and row["ok"] is None, cell.name
            continue
        assert all(t["ok"] == (t["value"] <= t["limit"]) for t in targets.values()), cell.name
        assert row["ok"] == all(t["ok"] for t in targets.values()), cell.name
    nope = doc["rows"][0]
    assert all(res["ratio"] == 1.0 for res in nope["train"].values())
    assert all(res["ratio"] == 1.0 and res["mem_ratio"] == 1.0 for res in nope["eval"].values())
    assert nope["op"]["train"]["ratio"] == 1.0 and nope["op"]["eval"]["mem_ratio"] == 1.0


@pytest.mark.parametrize(
    "argv",
    [["bench", "nonsense"], ["bench", "schemes", "--sizes", "huge"], ["bench", "schemes", "--repeats", "0"],
     ["bench", "schemes", "--batch", "{medium: 2}"], ["bench", "schemes", "--out", "/no/such/dir/x.json"],
     ["bench", "path", "--chunk", "0"], ["bench", "path", "--H", "-1"], ["bench", "all", "--lengths", "512", "0"],
     ["bench", "path", "--memory_lengths", "0"], ["bench", "precision", "--precision_repeats", "0"],
     ["bench", "precision", "--precision_size", "huge"]],
    ids=["unknown-bench", "unknown-size", "zero-repeats", "unknown-batch-size", "missing-out-dir", "zero-chunk",
         "negative-heads", "zero-length", "zero-memory-length", "precision-zero-repeats", "precision-unknown-size"],
)
def test_bad_input_is_one_line(argv, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("accrot: error: ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without CUDA")
@pytest.mark.parametrize("command", ["schemes", "path"])
def test_cuda_benchmarks_without_cuda_are_one_line(command, capsys, tmp_path):
    """``accrot bench schemes|path --device cuda`` (what ``make gpu-check`` runs) on a CPU-only machine."""
    assert cli_main(["bench", command, "--device", "cuda", "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    (line,) = err  # the same line as eval's and diagnose's --device (accrot.run.args.check_device)
    assert line.startswith("accrot: error: --device='cuda' needs a CUDA GPU, but ") and line.endswith("devices here: cpu")
    assert not (tmp_path / "x.json").exists()


def test_path_bench_on_the_cpu_reports_its_device_and_memory_lengths(monkeypatch):
    """``run_path`` on the CPU: chunked vs recurrence, memory at the lengths asked for (probes stubbed out)."""
    from accrot.bench import path as bench_path

    monkeypatch.setattr(bench_path, "bench_kernels", lambda **kw: [{"T": kw["lengths"][0], "mode": "fwd"}])
    seen = {}

    def memory(lengths, **kw):
        seen["lengths"] = lengths
        return []

    monkeypatch.setattr(bench_path, "eval_memory", memory)
    doc = bench_path.run_path([48], 1, 1, 8, 16, log=lambda m: None, memory_lengths=[64, 128], peer="none")
    assert doc["device"] == "cpu" and doc["kernels"] == [{"T": 48, "mode": "fwd"}] and seen["lengths"] == (64, 128)
    assert doc["peer"] == {"peer": "peer skipped: --peer none", "rows": []}


def test_a_peer_that_cannot_be_installed_is_skipped_in_one_line(monkeypatch, tmp_path):
    """No package index (offline): the peer comparison is one line saying why, and nothing half-installed stays."""
    from accrot.bench.peer import bench_peer

    monkeypatch.setenv("ACCROT_PEER_DIR", str(tmp_path / "peers" / "fla"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip may not reach an index: the install fails as it would offline
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # nor a machine's own wheel folders (pip.conf find-links)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    logged = []
    doc = bench_peer([64], [], 1, 1, 8, 16, log=logged.append)
    assert doc["rows"] == [] and doc["peer"].startswith("peer skipped: flash-linear-attention==0.6.0")
    assert "could not be installed" in doc["peer"] and "\n" not in doc["peer"]
    assert logged[-1] == f"path: {doc['peer']}"
    assert list((tmp_path / "peers").iterdir()) == []  # the staging folder is gone, no 'fla' folder was made


def test_the_installed_peer_computes_what_accrot_computes():
    """Where fla's naive_path_attn is installed (after a `make bench`), it agrees with accrot's PaTH: the two are
    one function, so the bench compares like with like."""
    from accrot.bench.peer import PEER_FILE, _calls, _inputs, load_peer, peer_directory

    if not (peer_directory() / PEER_FILE).exists():
        pytest.skip(f"the peer is not installed in {peer_directory()} (make bench installs it)")
    peer, _ = load_peer(log=lambda m: None)
    calls = _calls(peer, _inputs(2, 2, 100, 8, seed=0, grad=False), chunk=16)
    with torch.no_grad():
        torch.testing.assert_close(calls["fla"](), calls["accrot"](), rtol=0, atol=1e-5)


def test_pipeline_bench_times_both_loops_on_the_same_model(tmp_path):
    """Both loops train: the same number of timed steps each, positive times, the ratio their quotient."""
    out = tmp_path / "pipe.json"
    assert main(["pipeline", "--pipeline_steps=10", "--pipeline_rounds=1", "--pipeline_sizes", "tiny",
                 f"--out={out}"]) == 0
    doc = json.loads(out.read_text())
    (size, res), = doc["sizes"].items()
    assert size == "tiny" and res["bare_ms"] > 0 and res["lightning_ms"] > 0
    assert res["pairs"] == 10 - 5  # every step after the warm-up has its bare twin
    assert res["target"] == 1.05 and res["meets_target"] == (res["ratio"] <= 1.05)


def test_pipeline_loops_reach_the_same_weights():
    """The bare loop is the same training as Lightning's (same optimiser, schedule, clipping, batches): after a few
    steps both models hold the same weights, so the ratio compares like with like."""
    import copy

    import lightning as L
    import torch

    from accrot.bench.pipeline import bare, fixed_batches, lightning_loop
    from accrot.lit import LitLM

    L.seed_everything(0, verbose=False)
    base = LitLM(d_model=32, n_layers=1, n_heads=2, vocab_size=256, lr=3e-3, warmup_steps=2)
    batches = fixed_batches(256, 4, 16, 6, seed=0)
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    bare(a, batches, 1.0, 6)
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        lightning_loop(b, batches, 1.0, 6, False, root)
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_interleaved_ratios_are_unbiased_under_noise():
    """A variant exactly 1.10× NoPE, every sample scaled by the same noise (uniform 1–1.3, as on a shared
    machine): both statistics must recover 1.10. The minimum of two neighbours as the reference read ~1.15."""
    from accrot.bench.grid import interleaved_rounds

    rng = random.Random(0)

    def measure(name: str) -> dict[str, float]:
        return {"ms": (1.1 if name == "slow" else 1.0) * rng.uniform(1.0, 1.3)}

    res = interleaved_rounds(["nope", "slow", "same"], "nope", repeats=400, seed=0, measure=measure)
    assert res["slow"]["ms"]["ratio"] == pytest.approx(1.10, abs=0.02)
    assert res["slow"]["ms"]["ratio_of_min"] == pytest.approx(1.10, abs=0.02)
    assert res["same"]["ms"]["ratio"] == pytest.approx(1.00, abs=0.02)
    assert res["nope"]["ms"]["ratio"] == 1.0


def test_quick_applies_to_every_bench_unless_a_flag_is_given():
    from accrot.bench.command import QUICK_PATH, QUICK_PIPELINE, _checked_args

    args = _checked_args("all", ["--quick"])
    assert args.lengths == QUICK_PATH["lengths"] and args.memory_lengths == QUICK_PATH["memory_lengths"]
    assert (args.pipeline_steps, args.pipeline_rounds) == (QUICK_PIPELINE["pipeline_steps"], 1)
    given = _checked_args("path", ["--quick", "--lengths", "64", "128"])
    assert given.lengths == [64, 128] and given.memory_lengths == QUICK_PATH["memory_lengths"]
    full = _checked_args("path", [])
    assert full.lengths == [512, 2048, 8192]


def test_every_report_names_the_machine_it_measured():
    import os

    from accrot.bench.grid import machine, machine_line

    info = machine("cpu")
    assert info["cores"] == os.cpu_count() and info["threads"] == torch.get_num_threads()
    assert info["torch"] == torch.__version__ and info["kernels"] in ("compiled", "eager") and info["cpu"]
    line = machine_line(info)
    assert line.startswith("machine: ") and info["cpu"] in line and f"rotation kernels: {info['kernels']}" in line
    assert "\n" not in line


def test_learned_floor_is_rope_plus_the_projection_and_the_verdict_names_it():
    """Known truth: RoPE at 1.02× (1.04× with values) and the projection at 3 % of NoPE's step give floors of 1.05
    and 1.07. A learned cell measured above its limit says so with its floor; one at or under it is a plain ✓;
    a random-increment cell has no floor."""
    from accrot.bench.schemes import PROJECTION, _mark, learned_floor, targets

    def res(ratio):
        return {"ratio": ratio, "ratio_of_min": ratio - 0.01}

    train = {"rope/none": res(1.02), "rope/none+values": res(1.04), PROJECTION: res(0.03)}
    learned, learned_v = Cell("accum", increments="learned"), Cell("accum", rotate_values=True, increments="learned")
    assert learned_floor(learned, train) == pytest.approx(
        {"ratio": 1.05, "ratio_of_min": 1.03, "rope": 1.02, "projection": 0.03})
    assert learned_floor(learned_v, train)["ratio"] == pytest.approx(1.07)
    assert learned_floor(Cell("accum", increments="random_position"), train) is None
    assert learned_floor(learned, {"rope/none": res(1.02)}) is None  # no projection measured, no floor

    def row(cell, ratio):
        floor = learned_floor(cell, train)
        r = {"train": {"tiny": {**res(ratio), "floor": floor}}, "eval": {}}
        r["targets"] = targets(cell, r)
        return r

    over = row(learned, 1.09)
    assert over["targets"][0]["limit_below_floor"] is False  # 1.05 is not above the 1.05 limit
    assert _mark(over) == "✗ train tiny 1.090>1.05 (floor 1.050 = RoPE 1.020 + proj 0.030)"
    assert row(learned_v, 1.075)["targets"][0]["ok"] and _mark(row(learned_v, 1.075)).startswith("✓")
    assert row(learned_v, 1.09)["targets"][0]["limit_below_floor"] is False
    train[PROJECTION] = res(0.05)  # floor 1.07 > 1.05: the target lies below what was measured
    assert row(learned, 1.09)["targets"][0]["limit_below_floor"] is True


@pytest.mark.parametrize("mode", ["flush", "keep"])
def test_evaluation_children_run_under_the_benchmarks_subnormal_mode(mode, monkeypatch):
    """The evaluation probes run in children of a fresh interpreter, not of the `accrot` command: they must apply
    ACCROT_DENORMALS themselves (with IEEE subnormals PaTH's evaluation forward at 16k ran 7x slower on a Xeon)."""
    from accrot.bench.grid import Cell
    from accrot.bench.memory import Zygote

    monkeypatch.setenv("ACCROT_DENORMALS", mode)
    zygote = Zygote()
    try:
        shape = {"d_model": 32, "n_layers": 1, "n_heads": 2, "vocab_size": 256}
        result = zygote.measure(Cell("path", "forget"), shape, seed=0, T=64, mode="time")
    finally:
        zygote.close()
    assert result["seconds"] > 0 and result["denormals"] == ("flushed" if mode == "flush" else "IEEE")
    assert result["allocator"] == "tuned"  # ACCROT_MALLOC's default, as in the benchmark process


@pytest.mark.slow
@pytest.mark.integration
def test_storage_bench_kills_a_worker_and_the_proxy_and_loses_nothing(tmp_path):
    """`accrot bench storage` on a small load: one row per (workers, storage), a worker killed mid-trial in every
    row and the proxy killed and restarted in every proxy row, and every trial accounted for. Its shape and its
    accounting, not its speed: direct workers each hold database connections, the proxy's workers none."""
    from accrot.bench.postgres import missing

    if missing() is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(missing() + " and CI=true")
        pytest.skip(missing())
    out = tmp_path / "bench_storage.json"
    assert main(["storage", "--workers", "2", "4", "--trials", "30", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(r["storage"], r["workers"]) for r in doc["rows"]] == [
        ("postgresql", 2), ("proxy", 2), ("postgresql", 4), ("proxy", 4)]
    for row in doc["rows"]:
        assert not row["timed_out"] and row["lost"] == 0 and row["over_budget"] == 0, row
        assert row["trials_per_s"] > 0 and any(e.startswith("killed worker") for e in row["events"]), row
        assert row["proxy_restarts"] == (1 if row["storage"] == "proxy" else 0), row
    direct, proxied = doc["rows"][2], doc["rows"][3]
    assert direct["connections_peak"] >= direct["workers"] > 0  # at least one connection per direct worker
    assert proxied["connections_peak"] < direct["connections_peak"]


def test_subnormal_table_runs_each_side_in_its_own_float_mode():
    """Both sides of the subnormal table measure the same cells, each in a fresh interpreter whose recorded float
    mode is the one asked for (IEEE: the library's case; flushed process-wide), NoPE at exactly 1."""
    from rich.console import Console

    from accrot.bench.subnormals import run_subnormals, subnormal_cells, subnormals_table

    cells = grid()
    doc = run_subnormals(cells, {"B": 1, "H": 2, "T": 32, "D": 8}, repeats=1, seed=0, log=lambda _: None)
    chosen = [c.name for c in subnormal_cells(cells)]
    assert doc["cells"] == chosen and chosen[0] == "none/none"
    assert {"none/alibi", "none/forget", "path/none", "path/forget", "accum:learned/forget+values"} <= set(chosen)
    assert doc["sides"]["keep"]["denormals"] == "IEEE" and doc["sides"]["flush"]["denormals"] == "flushed"
    assert [r["variant"] for r in doc["rows"]] == chosen
    for row in doc["rows"]:
        assert row["keep"] > 0 and row["flush"] > 0 and row["keep_over_flush"] == row["keep"] / row["flush"]
    assert doc["rows"][0]["keep"] == doc["rows"][0]["flush"] == 1.0
    console = Console(width=200, record=True)
    console.print(subnormals_table(doc))
    assert "IEEE ÷ flushed" in console.export_text()


def test_a_failing_subnormal_side_raises_with_its_reason():
    """A side whose cell cannot be built (an SO(2) rotation at an odd head dim) is an error with its last line,
    never a table cell."""
    from accrot.bench.subnormals import run_subnormals

    cells = [Cell("none"), Cell("accum", "forget", True, "learned")]
    with pytest.raises(RuntimeError, match=r"the subnormal bench's keep side failed \(exit 1\): .*even"):
        run_subnormals(cells, {"B": 1, "H": 2, "T": 32, "D": 7}, 1, 0, log=lambda _: None)


def test_an_fla_cell_that_raised_makes_the_path_bench_exit_1_with_its_reason(monkeypatch, tmp_path, capsys):
    """The report keeps fla's error in its cell, and the command says so and exits 1 (a passing exit status
    would hide that fla never ran there); the JSON is still written."""
    from accrot.bench import command

    rows = [{"T": 512, "mode": "fwd", "chunked_s": 0.01, "fla_s": None, "fla": "ok"},
            {"T": 512, "mode": "fwd+bwd", "chunked_s": 0.02, "fla_s": None, "fla_failed": True,
             "fla": "AssertionError: w, beta should be float32"}]
    monkeypatch.setattr(command, "run_path", lambda *a, **kw: {"device": "cuda", "kernels": rows, "memory": []})
    out = tmp_path / "path.json"
    assert command.main(["path", f"--out={out}"]) == 1
    assert json.loads(out.read_text())["kernels"][1]["fla_failed"] is True
    err = capsys.readouterr().err
    assert "accrot bench path: fla failed in 1 cell(s); first at T 512 fwd+bwd: AssertionError: w, beta should be " \
           "float32" in " ".join(err.split())
    rows[1].pop("fla_failed")
    assert command.main(["path", f"--out={out}"]) == 0


def test_decode_bench_times_cached_and_recomputed_side_by_side():
    """The decode table on a tiny shape: every cell and prompt length has both speeds and a speed-up (no timing
    is asserted: only that each was measured)."""
    from accrot.bench.decode import decode_table, run_decode
    from accrot.bench.grid import Cell

    shape = {"d_model": 16, "n_layers": 1, "n_heads": 2, "vocab_size": 256, "recipe_batch": 1}
    cells = [Cell("none"), Cell("path", "forget"), Cell("accum", "none", True, "learned")]
    doc = run_decode(cells, train_length=4, multipliers=(1, 4), new_tokens=2, repeats=1, shape=shape,
                     log=lambda _: None)
    assert [(r["cell"], r["prompt"]) for r in doc["rows"]] == [(c.name, ln) for c in cells for ln in (4, 16)]
    for row in doc["rows"]:
        assert row["cached_tokens_per_s"] > 0 and row["recomputed_tokens_per_s"] > 0 and row["speedup"] > 0
        assert len(row["samples"]["cached"]) == len(row["samples"]["recomputed"]) == 1
    assert decode_table(doc).row_count == len(cells)


def test_decode_bench_times_the_registries_grid_by_default(monkeypatch):
    """Without cells of its own the decode bench takes the grid (the registries' cells)."""
    import accrot.bench.decode as decode
    from accrot.bench.grid import Cell

    monkeypatch.setattr(decode, "grid", lambda: [Cell("none"), Cell("rope")])
    shape = {"d_model": 16, "n_layers": 1, "n_heads": 2, "vocab_size": 256, "recipe_batch": 1}
    doc = decode.run_decode(train_length=4, multipliers=(1,), new_tokens=1, repeats=1, shape=shape,
                            log=lambda _: None)
    assert [r["cell"] for r in doc["rows"]] == ["none/none", "rope/none"]


@pytest.mark.parametrize("hardware", ["avx512_bf16", None], ids=["cpu-with-bf16", "cpu-without-bf16"])
def test_precision_bench_times_float32_and_bf16_side_by_side_where_the_cpu_has_bf16(monkeypatch, hardware):
    """Both precisions per cell and their ratio (the median of the per-round ratios, from the samples it kept)
    where the CPU has hardware bf16; float32 alone and the reason where it has not. Nothing about speed."""
    import statistics

    from accrot.bench.precision import precision_lines, run_precision

    monkeypatch.setattr("accrot.runtime.cpu_bf16", lambda: hardware)
    doc = run_precision("tiny", T=32, batch=1, repeats=3, log=lambda _: None)
    assert [r["variant"] for r in doc["rows"]] == ["rope/none", "path/none"]
    lines = precision_lines(doc)
    for row, line in zip(doc["rows"], lines):
        assert len(row["samples"]["32-true"]) == 3 and row["float32 ms"] > 0
        if hardware:
            ratios = [a / b for a, b in zip(row["samples"]["32-true"], row["samples"]["bf16-mixed"])]
            assert row["float32 / bf16"] == pytest.approx(statistics.median(ratios))
            assert f"float32 / bf16 = {row['float32 / bf16']:.2f}x" in line
        else:
            assert "bf16-mixed" not in row["samples"] and row["float32 / bf16"] is None
            assert "no hardware bf16" in row["note"] and "no hardware bf16" in line
    assert doc["bf16"] == ("measured" if hardware else doc["rows"][0]["note"])


def test_the_precision_bench_is_a_command_and_part_of_all(tmp_path, monkeypatch):
    from accrot.bench.command import QUICK_PRECISION, _checked_args

    args = _checked_args("all", ["--quick"])
    assert (args.precision_size, args.precision_T, args.precision_repeats) == (
        QUICK_PRECISION["precision_size"], QUICK_PRECISION["precision_T"], 1)
    monkeypatch.setattr("accrot.runtime.cpu_bf16", lambda: "amx_bf16")
    out = tmp_path / "p.json"
    assert main(["precision", "--precision_size", "tiny", "--precision_T", "16", "--precision_batch", "1",
                 "--precision_repeats", "1", f"--out={out}"]) == 0
    doc = json.loads(out.read_text())
    assert doc["bench"] == "precision" and doc["machine"]["cpu"] and len(doc["rows"]) == 2

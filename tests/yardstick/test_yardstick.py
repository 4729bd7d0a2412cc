"""accrot yardstick: scoring against an oracle and a constant model, the predictions fixed by the cells' algebra,
the rules (learnability gate, outcome, rank test and its null) each holding, failing and sitting in the noise,
matched parameter counts, and the command as a user meets it (bad inputs, a held folder, a resumed run)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from accrot.cli import main
from accrot.yardstick.cells import CELLS
from accrot.yardstick.protocols import PROTOCOLS, headline, predict, score
from accrot.yardstick.report import CellResult, Results, claims, outcome, rank_test, verdict
from accrot.yardstick.runner import Job, choose_lr, load, matched_hidden


class Oracle(torch.nn.Module):
    """Answers every formal problem right (its own reading of the text: Python's arithmetic, a count of b's) or,
    with ``constant``, always the same class; logits over all 256 bytes."""

    def __init__(self, task: str, constant: int | None = None) -> None:
        super().__init__()
        self.task, self.constant = task, constant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*x.shape, 256)
        for b, row in enumerate(x.tolist()):
            t = row.index(ord("="))
            text = bytes(row[1:t]).decode()
            answer = text.count("b") % 2 if self.task == "parity" else eval(text) % 5
            logits[b, t, ord(str(answer if self.constant is None else self.constant))] = 5.0
            logits[b, t, ord("x")] = 9.0  # a byte that is no class: scoring must not pick it
        return logits


@pytest.mark.parametrize("name", ["parity", "modarith", "modarith-brackets"])
def test_an_oracle_scores_one_and_a_constant_scores_chance(name):
    protocol = dataclasses.replace(PROTOCOLS[name], eval_count=40, test_sizes=(40, 64), train_sizes=(3, 20))
    task = protocol.data["task"]
    right = score(Oracle(task), protocol)
    assert set(right) == {"3", "20", "40", "64"} and all(v == 1.0 for v in right.values())
    assert headline(protocol, right, "test") == 1.0
    constant = score(Oracle(task, constant=0), protocol)
    chance = 0.5 if task == "parity" else 0.2
    assert all(abs(v - chance) < 0.25 for v in constant.values()), constant
    assert abs(headline(protocol, constant, "test")) < 0.35  # scaled: 0 at chance


def test_the_predictions_follow_the_algebra_and_not_the_results():
    p, m = PROTOCOLS["parity"], PROTOCOLS["modarith-brackets"]
    assert predict(p, CELLS["accum-learned-plain"]).beyond == "yes"  # a half turn per b
    assert predict(p, CELLS["PaTH-reflect"]).beyond == "yes"
    assert predict(p, CELLS["PaTH-contract"]).beyond == "no"  # no negative eigenvalue
    assert predict(p, CELLS["RoPE"]).beyond == "no" and predict(p, CELLS["accum-token"]).beyond == "no"
    assert {predict(m, c).beyond for c in CELLS.values() if not c.control} == {"no"}  # a stack, for every cell
    # modular arithmetic's monoid is solvable: a cascade of two or more commuting layers may carry it; one may not
    m2 = PROTOCOLS["modarith"]
    assert m2.shape["n_layers"] == 2 and predict(m2, CELLS["accum-learned"]).beyond == "open"
    assert predict(m2, CELLS["PaTH"]).beyond == "open" and predict(m2, CELLS["NoPE"]).beyond == "no"
    assert predict(m2, CELLS["PaTH-contract"]).beyond == "no"
    one = dataclasses.replace(m2, shape={**m2.shape, "n_layers": 1})
    assert predict(one, CELLS["accum-learned"]).beyond == "no" and predict(one, CELLS["PaTH"]).beyond == "no"
    assert "solvable" in predict(m2, CELLS["accum-learned-plain"]).why


def _runs(train, test):
    return [{"train": a, "test": b, "settings": {"seed": i, "lr": 3e-3}, "model": {"parameters": 1}}
            for i, (a, b) in enumerate(zip(train, test, strict=True))]


def test_the_gate_and_the_outcome_can_each_come_out_either_way():
    p = PROTOCOLS["parity"]
    assert outcome(p, CellResult("x", runs=_runs([0.2, 0.3, 0.1], [0.95, 1.0, 0.9]))) == ("not tested", 0)
    assert outcome(p, CellResult("x", runs=_runs([1.0, 0.95, 0.2], [0.95, 0.92, 0.0]))) == ("solved beyond", 2)
    assert outcome(p, CellResult("x", runs=_runs([1.0, 1.0, 1.0], [0.3, 0.2, 0.5]))) == ("not beyond", 3)
    assert verdict("yes", "solved beyond") == "as predicted" and verdict("no", "solved beyond") == \
        "against the prediction"
    assert verdict("no", "not tested") == "not tested" and verdict("open", "not beyond") == "(open)"
    flip = PROTOCOLS["flipflop"]  # an error rate: low is good
    assert outcome(flip, CellResult("x", runs=_runs([0.0, 0.01, 0.02], [0.3, 0.2, 0.4]))) == ("not beyond", 3)
    assert outcome(flip, CellResult("x", runs=_runs([0.5, 0.4, 0.45], [0.0, 0.0, 0.0]))) == ("not tested", 0)


def test_rank_test_holds_fails_and_sits_in_the_noise():
    # at the study's one-sided α = 0.025: 4 seeds a side decide (p = 1/70), 3 cannot (1/20)
    assert rank_test([0.9, 0.95, 0.92, 0.93], [0.1, 0.2, 0.0, 0.1]) == ("for", pytest.approx(1 / 70))
    assert rank_test([0.1, 0.2, 0.0, 0.1], [0.9, 0.95, 0.92, 0.93])[0] == "against"
    assert rank_test([0.9, 0.1, 0.5, 0.7], [0.4, 0.6, 0.2, 0.3])[0] == "unresolved"
    assert rank_test([0.9, 0.95, 0.92], [0.1, 0.2, 0.0])[0] == "unresolved (too few seeds)"


def _results(rows: dict[str, tuple[list, list]], name: str = "parity") -> Results:
    r = Results()
    r.protocols[name] = PROTOCOLS[name]
    r[name] = {c: CellResult(c, lr=3e-3, runs=_runs(*v)) for c, v in rows.items()}
    return r


SOLVED4, FLAT4 = ([1.0] * 4, [0.95, 0.97, 0.99, 0.96]), ([1.0] * 4, [0.0, 0.05, -0.02, 0.01])


def test_s1_reads_its_null_its_positive_check_and_its_gate():
    controls = {"clock": SOLVED4, "reflection": SOLVED4}
    text = "\n".join(claims(_results({**controls, "accum-learned-plain": SOLVED4, "RoPE": FLAT4, "NoPE": FLAT4})))
    assert "accum-learned-plain above RoPE beyond the training lengths: **for**" in text
    assert "positive check (the fixed clock above NoPE): for" in text  # the rule can read for ...
    assert "null (RoPE above NoPE, neither with a state): unresolved" in text  # ... and does not on its null
    # RoPE above NoPE on every seed: the rule reads for where the claim says nothing differs: uninformative
    text = "\n".join(claims(_results({**controls, "accum-learned-plain": SOLVED4,
                                      "RoPE": ([1.0] * 4, [0.5, 0.6, 0.55, 0.52]), "NoPE": FLAT4})))
    assert "uninformative at this size" in text
    # a cell that never learned at the training lengths is not tested, whatever it scores beyond them
    text = "\n".join(claims(_results({**controls, "accum-learned-plain": ([0.1] * 4, [0.9] * 4), "RoPE": FLAT4,
                                      "NoPE": FLAT4})))
    assert "accum-learned-plain: **not tested**" in text and "above RoPE" not in text


def test_a_failed_control_stops_every_judgement_and_a_passed_one_allows_it():
    from accrot.yardstick.report import controls, judged

    failed = _results({"clock": ([1.0] * 4, [0.1, 0.0, 0.2, 0.1]), "reflection": SOLVED4,
                       "accum-learned-plain": SOLVED4, "RoPE": FLAT4, "NoPE": FLAT4})
    rows, p = failed["parity"], failed.protocols["parity"]
    assert controls(p, rows)[0] == "fails"
    assert judged(p, rows, "accum-learned-plain") == "not judged (controls)" == judged(p, rows, "NoPE")
    assert judged(p, rows, "clock") == "against the prediction"  # the control itself is read
    assert "a positive control failed" in "\n".join(claims(failed)) and "above RoPE" not in "\n".join(claims(failed))
    passed = _results({"clock": SOLVED4, "reflection": SOLVED4, "accum-learned-plain": FLAT4, "NoPE": FLAT4})
    rows, p = passed["parity"], passed.protocols["parity"]
    assert controls(p, rows)[0] == "separates"
    assert judged(p, rows, "NoPE") == "as predicted" and judged(p, rows, "accum-learned-plain") == \
        "against the prediction"
    # no exact fixed transport on modular arithmetic: no control runs, nothing is judged
    plain = _results({"NoPE": FLAT4}, "modarith")
    assert controls(plain.protocols["modarith"], plain["modarith"])[0] == "none"
    assert judged(plain.protocols["modarith"], plain["modarith"], "NoPE") == "not judged (no control)"


def test_the_grid_chooses_at_the_training_lengths_only():
    p = PROTOCOLS["parity"]
    grid = [{"train": 0.2, "test": 0.9, "settings": {"lr": 3e-3}}, {"train": 0.8, "test": 0.1, "settings": {"lr": 1e-3}}]
    assert choose_lr(p, grid) == 1e-3
    flip = PROTOCOLS["flipflop"]
    assert choose_lr(flip, [{"train": 0.3, "settings": {"lr": 3e-3}}, {"train": 0.01, "settings": {"lr": 1e-3}}]) == 1e-3


@pytest.mark.parametrize("name", ["parity", "flipflop"])
def test_parameter_counts_match_nope_within_one_percent(name):
    protocol = PROTOCOLS[name]
    seq_len = protocol.data_module(0).seq_len
    from accrot.yardstick.protocols import applies

    for cell in (c for c in CELLS.values() if applies(protocol, c)):
        hidden, params, nope = matched_hidden(protocol, cell, seq_len)
        assert abs(params - nope) <= 0.01 * nope, (cell.name, params, nope, hidden)


def test_a_run_record_with_other_settings_or_broken_is_refused(tmp_path):
    from accrot.errors import UsageError

    job = Job("parity", "NoPE", 3e-3, 0, 10)
    path = tmp_path / job.path
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(UsageError, match="is not a yardstick run's record"):
        load(tmp_path, job)
    path.write_text(json.dumps({"settings": {**job.settings(), "steps": 20}}))
    with pytest.raises(UsageError, match="was made with other settings"):
        load(tmp_path, job)


def test_bad_options_are_one_line_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "ys"
    for argv, expect in [
        (["--protocols", "parity", "dyck"], "--protocols='dyck' is not valid; choose one of parity"),
        (["--cells", "NoPE", "Rope"], "--cells='Rope' is not valid; did you mean RoPE?"),
        (["--cells", "NoPE", "NoPE"], "a cell is named twice"),
        (["--seeds", "0"], "--seeds=0 is not valid"),
        (["--steps", "0"], "--steps=0 is not valid"),
        (["--lrs", "2"], "--lrs=[2.0] is not valid"),
        (["--workers", "0"], "--workers=0 is not valid"),
    ]:
        assert main(["yardstick", *argv, f"--out={out}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("accrot: error: ") and expect in err[0], err
    assert not out.exists()


def test_a_held_or_unwritable_folder_is_one_line(tmp_path, capsys):
    import fcntl

    out = tmp_path / "ys"
    out.mkdir()
    from accrot.run.rundir import LOCK_NAME

    with open(out / LOCK_NAME, "a") as held:  # another command writing the folder (one writer per folder)
        fcntl.flock(held, fcntl.LOCK_EX)
        assert main(["yardstick", "--protocols", "parity", "--cells", "NoPE", f"--out={out}"]) == 2
        assert "the yardstick's folder is being written by another accrot command" in capsys.readouterr().err
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert main(["yardstick", "--protocols", "parity", f"--out={blocked / 'ys'}"]) == 2
    assert "is a file, not a folder; give a results folder" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_one_line(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert main(["yardstick", "--protocols", "parity", f"--out={ro / 'ys'}"]) == 2
        assert "cannot be written" in capsys.readouterr().err
    finally:
        ro.chmod(0o700)


def test_a_small_yardstick_runs_reports_and_resumes(tmp_path, capsys):
    out = tmp_path / "ys"
    argv = ["yardstick", "--protocols", "parity", "--cells", "NoPE", "accum-learned-plain", "--steps", "3",
            "--seeds", "2", "--lrs", "3e-3", "1e-3", "--workers", "1", "--quiet", f"--out={out}"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.count("parity / ") == 6  # 2 grid runs and 1 more seed per cell
    runs = sorted(p.relative_to(out).as_posix() for p in out.glob("runs/**/*.json"))
    assert len(runs) == 6
    record = json.loads((out / runs[0]).read_text())
    assert record["ran"]["steps"] == 3 and record["ran"]["threads"] == 1 and record["data"]["fingerprint"]
    assert set(record["accuracy"]) == {str(s) for s in (3, 10, 20, 30, 40, 64, 96, 128, 192, 256)}
    report = (out / "report.md").read_text()
    assert report.index("What the algebra predicts") < report.index("## Parity")
    assert "| NoPE |" in report and (out / "yardstick.png").stat().st_size > 10_000
    summary = json.loads((out / "yardstick.json").read_text())
    assert len(summary["parity"]["NoPE"]["seeds"]) == 2 and set(summary["parity"]["NoPE"]["grid"]) == {"0.003", "0.001"}
    # the same command again trains nothing and writes the same runs
    before = {r: (out / r).read_text() for r in runs}
    assert main(argv) == 0
    again = capsys.readouterr().out
    assert "6 of 6 runs already in" in again and "parity / " not in again
    assert before == {r: (out / r).read_text() for r in runs}


def test_the_curriculum_protocols_grow_the_longest_size_from_40_to_160():
    for name in ("parity-curriculum", "modarith-curriculum"):
        protocol = PROTOCOLS[name]
        dm = protocol.data_module(0)
        assert [hi for _, _, hi in dm.curriculum.stages] == [40, 80, 120, 160]
        assert {lo for _, lo, _ in dm.curriculum.stages} == {3} and dm.seq_len >= 160
        assert protocol.test_sizes == (256,) and not protocol.default  # defined, not in the default run (cost)
        assert dm.curriculum.stages[-1][0] < protocol.steps  # the last stage is reached within the budget
    assert PROTOCOLS["parity-curriculum"].shape["n_layers"] == 1 and PROTOCOLS["modarith-curriculum"].shape[
        "n_layers"] == 3  # the paper's depths


def test_published_rows_are_quoted_per_task():
    parity = {r.model: (r.a, r.b) for r in PROTOCOLS["parity"].published}
    assert parity["DeltaNet [−1,1]"] == (1.0, 0.999) and parity["DeltaNet [0,1]"] == (0.017, 0.010)
    brackets = {r.model: r.a for r in PROTOCOLS["modarith-brackets"].published}
    assert brackets["Transformer"] == 0.067
    flip = {r.model: (r.a, r.b, r.c) for r in PROTOCOLS["flipflop"].published}
    assert flip["RoPE"] == (0.069, 0.403, 0.0001)


def test_the_default_selection_leaves_the_curriculum_protocols_out():
    from accrot.yardstick.command import _check, _parser

    protocols, cells = _check(_parser().parse_args([]))
    assert protocols == ["parity", "modarith", "modarith-brackets", "flipflop"] and cells == list(CELLS)


def test_the_preset_declares_its_selection_and_options_beside_it_win():
    from accrot.yardstick.command import PRESETS, _check, _parser

    args = _parser().parse_args(["--preset", "decide-s1"])
    protocols, cells = _check(args)
    assert protocols == ["parity-dense"] and args.seeds == 4 and args.lrs == [3e-3, 1e-3]
    assert cells[:2] == ["clock", "reflection"] and {"NoPE", "RoPE", "accum-learned-plain", "PaTH",
                                                     "PaTH-reflect"} <= set(cells)
    assert CELLS["accum-learned-plain"].scheme["max_increment"] >= 3.14159  # a half turn is reachable
    assert args.steps > PROTOCOLS["parity"].steps  # more steps than the default protocol
    args = _parser().parse_args(["--preset", "decide-s1", "--steps", "10", "--seeds", "2"])
    _check(args)
    assert args.steps == 10 and args.seeds == 2 and PRESETS["decide-s1"]["steps"] != 10


def test_an_unknown_preset_is_one_line(tmp_path, capsys):
    assert main(["yardstick", "--preset", "decide-s3", f"--out={tmp_path / 'ys'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--preset='decide-s3' is not valid; did you mean decide-s1?" in err[0] and "decide-s1" in err[0]


def test_the_learnable_protocol_is_labelled_and_its_curriculum_follows_the_steps():
    import dataclasses as dc

    p = PROTOCOLS["parity-dense"]
    assert "curriculum" in p.deviation and "prefix" in p.deviation and p.published == PROTOCOLS["parity"].published
    for steps in (3000, 400):
        dm = dc.replace(p, steps=steps).data_module(0)
        assert dm.prefix_labels and dm.curriculum.stages == ((0, 1, 10), (steps // 4, 1, 20), (steps // 2, 1, 40))
    assert p.test_sizes == PROTOCOLS["parity"].test_sizes and p.train_sizes == PROTOCOLS["parity"].train_sizes


def test_flipflop_names_each_cells_convolution_and_its_twin():
    assert CELLS["PaTH"].conv == 3 and CELLS["accum-learned"].conv == 4 and CELLS["NoPE"].conv == 0
    for name in ("PaTH", "PaTH-reflect", "accum-learned"):
        twin = CELLS[f"{name} (no conv)"]
        assert twin.conv == 0 and twin.state == CELLS[name].state
        assert {k: v for k, v in twin.scheme.items() if k != "conv_size"} == \
            {k: v for k, v in CELLS[name].scheme.items() if k != "conv_size"}
    from accrot.yardstick.report import _lookback

    assert _lookback(0.5 * 0.8**2, 0.8) == pytest.approx(2.0)  # the two-instruction heuristic reads k = 2

"""Every option of every command, tried with its kind's family of bad values: generated from the parsers.

Each command declares every option with its kind (accrot.options): the test enumerates the parsers (by running each
command with good arguments up to the point where its options have passed their checks, accrot.options._checked),
and for every declared option tries every bad value of its kind (``Kind.bad``: paths missing, a folder for a file,
a file for a folder, read-only, unreadable; numbers 0, negative, nan, inf, huge, not a number; lists empty; YAML
empty, comments only, ``---``, a list). Each must end in exit status 2 with one line naming the option, no
traceback, nothing left behind, and before the command does anything (the checks' end is never reached). An option
added without a kind fails :func:`test_every_option_declares_its_kind`; one added with a kind is covered here
without a new test.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import accrot.options as options
from accrot.cli import main

REPO = Path(__file__).resolve().parent.parent


class Reached(Exception):
    """A command got past its option checks (the tests stop it there)."""

    def __init__(self, parser):
        super().__init__("checks passed")
        self.parser = parser


def _good_run(tmp: Path) -> Path:
    """A folder that looks like a run to the checks (a checkpoint path that exists): the checks read no weights."""
    run = tmp / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"not read by the option checks")
    (run / "config.yaml").write_text("model: {}\n")
    return run


# the commands, each with the good arguments it needs beside the option under test
COMMANDS: dict[str, object] = {
    "fit": lambda t: ["fit", "--config", "tiny", "--root", str(t["out"])],
    "eval": lambda t: ["eval", "--ckpt", str(t["run"])],
    "sample": lambda t: ["sample", "--ckpt", str(t["run"]), "--prompt", "x", "--temperature", "1"],
    "diagnose": lambda t: ["diagnose", "--ckpt", str(t["run"])],
    "demo": lambda t: ["demo", "--root", str(t["out"])],
    "ablation": lambda t: ["ablation", "--out", str(t["out"])],
    "yardstick": lambda t: ["yardstick", "--out", str(t["out"])],
    "report": lambda t: ["report", "--study", "s", "--root", str(t["dir"])],
    "sweep": lambda t: ["sweep", "smoke", "--root", str(t["out"])],
    "storage-proxy": lambda t: ["storage-proxy", "--storage", f"sqlite:///{t['out']}/s.db"],
    "slurm train": lambda t: ["slurm", "train", "--dry-run"],
    "slurm sweep": lambda t: ["slurm", "sweep", "smoke", "--storage", "postgresql://u@h/db", "--dry-run"],
    **{f"bench {b}": (lambda name: lambda t: ["bench", name, "--out", str(t["out"] / "b.json")])(b)
       for b in ("schemes", "path", "pipeline", "precision", "storage", "decode", "all")},
}


@pytest.fixture
def stop_after_checks(monkeypatch):
    def stop(parser, args):
        raise Reached(parser)

    monkeypatch.setattr(options, "_checked", stop)


@pytest.fixture
def places(tmp_path) -> dict[str, Path]:
    """The prepared paths the symbolic bad values stand for, and good ones for the base arguments."""
    t = {"dir": tmp_path / "a_dir", "file": tmp_path / "a_file", "out": tmp_path / "out"}
    t["dir"].mkdir()
    t["file"].write_text("x")
    t["run"] = _good_run(tmp_path)
    for name, text in {"EMPTY_YAML": "", "COMMENTS_YAML": "# nothing\n", "DASHES_YAML": "---\n",
                       "LIST_YAML": "- a\n- b\n"}.items():
        (tmp_path / f"{name.lower()}.yaml").write_text(text)
        t[name] = tmp_path / f"{name.lower()}.yaml"
    return t


def resolve(value: str, t: dict[str, Path]) -> str | None:
    """A bad value with its symbolic path made real (None: not possible here, e.g. unreadable as root)."""
    base, _, rest = value.partition("/")
    if base == "MISSING":
        return str(t["dir"] / "missing" / (rest or "x"))
    if base == "A_FILE":
        return str(t["file"]) + (f"/{rest}" if rest else "")
    if base == "A_DIR":
        return str(t["dir"])
    if base in ("READ_ONLY", "UNREADABLE"):
        if os.geteuid() == 0:
            # root writes and reads anything; /sys is a folder no one may create files in
            return f"/sys/{rest}" if base == "READ_ONLY" and Path("/sys").is_dir() else None
        path = t["dir"] / base.lower()
        path.mkdir(exist_ok=True)
        path.chmod(0o555 if base == "READ_ONLY" else 0o000)
        return str(path / rest) if rest else str(path)
    if value in t:
        return str(t[value])
    return value


def parser_of(command: str, t, capsys) -> object:
    try:
        rc = main(COMMANDS[command](t))
    except Reached as reached:
        return reached.parser
    raise AssertionError(f"accrot {command} with good arguments did not reach its checks' end (exit {rc}): "
                         f"{capsys.readouterr().err.strip()}")


# fit's parser is LightningCLI's: its class groups (trainer, model, data, extrapolation: their dotted keys are the
# classes' own typed arguments, each checked by its constructor and in tests/test_bad_inputs.py) and LightningCLI's
# own options are not accrot's to declare; accrot's own options of fit are
LIGHTNING_OWN = {"ckpt_path", "config", "data", "extrapolation", "model", "print_config", "seed_everything", "trainer",
                 "weights_only"}


def accrots_own(command: str, action) -> bool:
    return command != "fit" or ("." not in action.dest and action.dest not in LIGHTNING_OWN)


def cases() -> list:
    """(command, option index) for every declared option of every command: found by building the parsers once."""
    out = []
    import tempfile

    saved = options._checked
    options._checked = lambda parser, args: (_ for _ in ()).throw(Reached(parser))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t = {"dir": Path(tmp), "out": Path(tmp) / "out", "run": _good_run(Path(tmp))}
            for command, build in COMMANDS.items():
                try:
                    main(build(t))
                except Reached as reached:
                    for action in options.declared(reached.parser):
                        kind = getattr(action, "accrot_kind", None) if accrots_own(command, action) else None
                        for bad in (kind.bad if kind else ()):
                            out.append(pytest.param(command, options.flag_of(action), bad,
                                                    id=f"{command}-{options.flag_of(action)}-{bad or 'empty'}"))
    finally:
        options._checked = saved
    return out


CASES = cases()


def test_every_option_declares_its_kind(places, stop_after_checks, capsys):
    undeclared = []
    for command in COMMANDS:
        parser = parser_of(command, places, capsys)
        undeclared += [f"accrot {command} {options.flag_of(a)}" for a in options.declared(parser)
                       if accrots_own(command, a) and getattr(a, "accrot_kind", None) is None]
    assert not undeclared, f"options without a declared kind: {undeclared}"


def test_the_generated_cases_cover_every_command_and_kind():
    commands = {c.values[0] for c in CASES}
    assert commands == set(COMMANDS)
    assert len(CASES) > 300, len(CASES)


@pytest.mark.parametrize("command, flag, bad", CASES)
def test_a_bad_value_is_refused_in_one_line_before_any_work(command, flag, bad, places, stop_after_checks, capsys,
                                                            tmp_path):
    value = resolve(bad, places)
    if value is None:
        pytest.skip(f"{bad} cannot be made here (root reads and writes everything)")
    argv = list(COMMANDS[command](places))
    if flag.startswith("-"):
        # the option under test replaces the base argument of the same name, if any
        if flag in argv:
            i = argv.index(flag)
            del argv[i:i + 2]
        argv.append(f"{flag}={value}")
    else:  # a positional: the spec
        argv[argv.index("smoke")] = value
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    started = time.perf_counter()
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, f"exit {rc}, stderr {err!r}"
    assert "\n" not in err and err.startswith("accrot: error: ") and "Traceback" not in err, err
    named = flag.lstrip("-") if flag.startswith("-") else "spec"
    assert named in err or flag in err, f"the message does not name {flag}: {err}"
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing left behind
    assert time.perf_counter() - started < 5.0  # refused at start-up, before any compute


def test_declared_interactions_are_refused():
    """Pairs that conflict, options that need another, and options without effect given the others."""
    from jsonargparse import ArgumentParser

    from accrot.errors import UsageError

    parser = ArgumentParser(exit_on_error=False)
    options.option(parser, "--a", kind=options.count(1), type=int, default=1)
    options.option(parser, "--b", kind=options.count(1), type=int, default=None)
    options.option(parser, "--c", kind=options.POSITIVE, type=float, default=None)
    options.option(parser, "--t", kind=options.number(0, low_open=False), type=float, default=1.0)
    options.option(parser, "--k", kind=options.count(1), type=int, default=None)
    options.conflicts(parser, "--a", "--b", "--b replaces --a")
    options.needs(parser, "--c", "--b")
    options.no_effect_unless(parser, "--k", lambda args: args.t > 0, "--t 0 draws nothing")
    assert options.parse(parser, ["--a", "2"]).a == 2  # alone: fine
    with pytest.raises(UsageError, match="--a and --b cannot both be given"):
        options.parse(parser, ["--a", "2", "--b=3"])
    with pytest.raises(UsageError, match="--c takes effect only with --b"):
        options.parse(parser, ["--c", "2"])
    assert options.parse(parser, ["--c", "2", "--b", "1"]).c == 2
    with pytest.raises(UsageError, match="--k has no effect here"):
        options.parse(parser, ["--t", "0", "--k", "3"])
    assert options.parse(parser, ["--t", "0.5", "--k", "3"]).k == 3


def test_each_kind_accepts_its_good_values(tmp_path):
    """The other way round: the kinds are not refusing everything."""
    good = {options.count(1): ["1", "7"], options.POSITIVE: ["0.5", "3"], options.numbers(): [["1", "2", "4"], "1,2"],
            options.choice("a", "b"): ["a", ["a", "b"], "[a, b]"], options.text(): ["x"],
            options.read_file(): [str(REPO / "README.md")], options.read_dir(): [str(tmp_path)],
            options.write_dir(): [str(tmp_path / "new" / "deeper")], options.write_file(): [str(tmp_path / "r.json")]}
    for kind, values in good.items():
        for value in values:
            kind.check("--x", value)
    assert not (tmp_path / "new").exists()  # checking a folder to write creates nothing


def test_an_option_given_twice_is_refused_and_a_collecting_one_may_repeat():
    """argparse keeps the last of a flag given twice without a word; a collecting option (``action="append"``)
    is meant to repeat."""
    from jsonargparse import ArgumentParser

    from accrot.errors import UsageError

    parser = ArgumentParser(exit_on_error=False)
    options.option(parser, "--n", kind=options.count(1), type=int, default=1)
    options.option(parser, "--set", kind=options.FREE_TEXT, type=str, action="append", default=None)
    with pytest.raises(UsageError, match="--n is given 2 times; give it once"):
        options.parse(parser, ["--n", "2", "--n=3"])
    assert options.parse(parser, ["--set", "a=1", "--set", "b=2"]).set == ["a=1", "b=2"]


def test_every_command_refuses_an_option_given_twice(places, stop_after_checks, capsys):
    for command in COMMANDS:
        if command == "fit":  # LightningCLI's parser: fit's own options are checked, its class groups are the classes'
            continue
        argv = list(COMMANDS[command](places))
        pairs = [(a, b) for a, b in zip(argv, argv[1:]) if a.startswith("--") and not b.startswith("--")]
        if not pairs:  # slurm train: only a flag without a value
            pairs = [("--dry-run", None)]
        flag, value = pairs[0]
        assert main([*argv, flag, *([value] if value is not None else [])]) == 2, command
        err = capsys.readouterr().err.strip()
        # the message may spell an option by its other name (--dry-run / --dry_run)
        assert err.replace("_", "-") == f"accrot: error: {flag} is given 2 times; give it once".replace("_", "-"), (
            command, err)

"""What each command-line option is, checked in one place before any compute.

Every option of an accrot command is added through :func:`option` with its :class:`Kind` (a count, a finite
positive number, a list of lengths, a file to read, a folder to write, a choice, ...), and every command parses its
arguments through :func:`parse`, which checks all of them at start-up, with one message form that names the option
and the value, and then the declared interactions between options (:func:`conflicts`, :func:`needs`,
:func:`no_effect_unless`): a pair that cannot both take effect is refused, an option that would have no effect given
the others is refused, none is dropped. A folder to write is checked writable before the first step.

The tests enumerate every command's parser and try each kind's family of bad values (:attr:`Kind.bad`) on every
option of that kind (tests/test_options.py), so an option added with its kind is covered without a new test.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accrot.errors import UsageError

HUGE = 10**9  # no count accrot reads is this large; a value past a count's declared bound is a typo


@dataclass(frozen=True)
class Kind:
    """What an option is: ``check(flag, value)`` raises a one-line UsageError naming the flag and the value;
    ``bad``: the family of bad values the generated tests try on every option of the kind (symbolic paths —
    ``MISSING``, ``A_FILE``, ``A_DIR``, ``READ_ONLY``, ``UNREADABLE`` — stand for prepared paths)."""

    name: str
    check: Callable[[str, Any], None] = lambda flag, value: None
    bad: tuple[str, ...] = ()
    valid: str = ""  # what a good value is, for the message


def _number(flag: str, value: Any, valid: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{flag}={value!r} is not valid; {valid}") from None
    if not math.isfinite(x):
        raise UsageError(f"{flag}={value!r} is not valid; {valid} (a finite number)")
    return x


def count(low: int = 0, high: int = HUGE) -> Kind:
    """A whole number in ``[low, high]``."""
    valid = f"give a whole number from {low} to {high}" if high < HUGE else f"give a whole number >= {low}"

    def check(flag: str, value: Any) -> None:
        x = _number(flag, value, valid)
        if x != int(x) or not low <= x <= high:
            raise UsageError(f"{flag}={value!r} is not valid; {valid}")

    bad = tuple(dict.fromkeys(b for b in (str(low - 1), "-3", "nan", "inf", str(high + 1), "2.5", "many")
                              if int(low) > -3 or b != "-3"))
    return Kind("count", check, bad, valid)


def number(low: float = 0.0, high: float = math.inf, low_open: bool = True, what: str = "") -> Kind:
    """A finite number in ``(low, high]`` (``low_open``) or ``[low, high]``."""
    bound = f"> {low:g}" if low_open else f">= {low:g}"
    valid = f"give a finite number {bound}" + (f" and <= {high:g}" if math.isfinite(high) else "") + (
        f" ({what})" if what else "")

    def check(flag: str, value: Any) -> None:
        x = _number(flag, value, valid)
        if (x <= low if low_open else x < low) or x > high:
            raise UsageError(f"{flag}={value!r} is not valid; {valid}")

    below = f"{low - 1:g}" if low_open or low != 0 else "-1"
    bad = (below, "nan", "inf", "-inf", "x") + ((f"{low:g}",) if low_open else ()) + (
        (f"{high * 10 + 1:g}",) if math.isfinite(high) else ())
    return Kind("number", check, bad, valid)


POSITIVE = number()


def numbers(low: float = 0.0, what: str = "multiples of the training length", whole: bool = False) -> Kind:
    """A non-empty list of distinct finite numbers > ``low`` (shell words ``1 2 4``, ``'[1,2,4]'`` or ``1,2,4``);
    ``whole``: whole numbers only (lengths in tokens)."""
    valid = f"give finite {'whole ' if whole else ''}numbers > {low:g} ({what}), e.g. 1 2 4"

    def check(flag: str, value: Any) -> None:
        xs = parse_numbers(flag, value, valid)
        if not xs:
            raise UsageError(f"{flag} needs at least one number; {valid}")
        for x in xs:
            if not math.isfinite(x) or x <= low or (whole and x != int(x)):
                raise UsageError(f"{flag}: {x:g} is not valid; {valid}")
        twice = sorted({x for x in xs if xs.count(x) > 1})
        if twice:
            raise UsageError(f"{flag}: {', '.join(f'{x:g}' for x in twice)} given twice; give each once")

    return Kind("numbers", check, ("0", "-1", "nan", "inf", "[]", "1,1", "x") + (("2.5",) if whole else ()), valid)


def parse_numbers(flag: str, value: Any, valid: str = "give numbers, e.g. 1 2 4") -> list[float]:
    """Numbers from shell words, one YAML-like list or commas; a one-line UsageError naming ``flag`` otherwise."""
    words = value if isinstance(value, (list, tuple)) else [value]
    out = []
    try:
        for v in words:
            out += [float(part) for part in str(v).strip().strip("[]").split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{flag}={' '.join(map(str, words))!r} is not valid; {valid}") from None
    return out


def words(values: Sequence[str] | str | None, flag: str) -> list[str] | None:
    """Items of a list flag given either as shell words (``a b``) or as one YAML list (``'[a, b]'``)."""
    import yaml

    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    out: list[str] = []
    for value in values:
        if value.lstrip().startswith("["):
            try:
                items = yaml.safe_load(value)
            except yaml.YAMLError:
                items = None
            if not isinstance(items, list):
                raise UsageError(f"{flag}={value!r} is not valid; give names (a b) or one YAML list ('[a, b]')")
            out.extend(str(v) for v in items)
        else:
            out.extend(v for v in value.replace(",", " ").split())
    return out


def _close(value: str, choices: Sequence[str]) -> str | None:
    """The choice a typo most likely meant (case ignored), or None."""
    import difflib

    lower = {c.lower(): c for c in choices}
    found = difflib.get_close_matches(str(value).lower(), list(lower), n=1, cutoff=0.6)
    return lower[found[0]] if found else None


def choice(*choices: str, also: Callable[[str], bool] | None = None, what: str = "") -> Kind:
    """One of ``choices`` (or a list of them: shell words, commas or one YAML list), or a value ``also`` accepts
    (``what`` names those, e.g. ``hf:NAME``)."""
    valid = f"choose one of {', '.join(choices)}" + (f" or {what}" if what else "")

    def check(flag: str, value: Any) -> None:
        items = words([str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)], flag)
        if not items:
            raise UsageError(f"{flag} needs at least one value; {valid}")
        for v in items:
            if v not in choices and not (also is not None and also(v)):
                close = _close(v, choices)
                raise UsageError(f"{flag}={v!r} is not valid; {f'did you mean {close}? ' if close else ''}{valid}")

    return Kind("choice", check, ("bogus", "", "[]"), valid)


def text(what: str = "a name") -> Kind:
    """Free text that must not be empty (a name, a prompt, a partition)."""
    def check(flag: str, value: Any) -> None:
        values = value if isinstance(value, (list, tuple)) else [value]
        if not values or any(not str(v).strip() for v in values):
            raise UsageError(f"{flag}={value!r} is not valid; give {what} (not empty)")

    return Kind("text", check, ("", "  "), f"give {what}")


def pattern(regex, valid: str) -> Kind:
    """Text that ``regex`` (a compiled pattern) matches whole: a time limit, a host name, a job name."""
    def check(flag: str, value: Any) -> None:
        if not regex.fullmatch(str(value)):
            raise UsageError(f"{flag}={value!r} is not valid; give {valid}")

    return Kind("pattern", check, ("", "bad value!", "a b"), f"give {valid}")


FLAG = Kind("flag", bad=("maybe", "2"), valid="true or false")
FREE_TEXT = Kind("free_text", valid="any text")  # a prompt, extra overrides: any text is a value


def _readable(flag: str, path: Path, value: Any) -> None:
    if not os.access(path, os.R_OK) or (path.is_dir() and not os.access(path, os.X_OK)):
        raise UsageError(f"{flag}={str(value)!r} cannot be read (permission denied)")


def _empty(flag: str, value: Any, what: str) -> None:
    if not str(value).strip():  # Path("") is the current folder: an empty value would read it silently
        raise UsageError(f"{flag}={str(value)!r} is empty; give {what}")


def read_file(what: str = "a file") -> Kind:
    def check(flag: str, value: Any) -> None:
        _empty(flag, value, what)
        path = Path(str(value)).expanduser()
        if not path.exists():
            raise UsageError(f"{flag}={str(value)!r}: no such file; give {what}")
        if path.is_dir():
            raise UsageError(f"{flag}={str(value)!r} is a folder; give {what}")
        _readable(flag, path, value)

    return Kind("read_file", check, ("MISSING", "A_DIR", "UNREADABLE", ""), f"give {what}")


def read_dir(what: str = "a folder") -> Kind:
    def check(flag: str, value: Any) -> None:
        _empty(flag, value, what)
        path = Path(str(value)).expanduser()
        if not path.exists():
            raise UsageError(f"{flag}={str(value)!r}: no such folder; give {what}")
        if not path.is_dir():
            raise UsageError(f"{flag}={str(value)!r} is a file; give {what}")
        _readable(flag, path, value)

    return Kind("read_dir", check, ("MISSING", "A_FILE", "UNREADABLE", ""), f"give {what}")


def read_path(what: str = "a file or a folder") -> Kind:
    """A file or a folder that exists and can be read (a checkpoint or its run directory)."""
    def check(flag: str, value: Any) -> None:
        path = Path(str(value)).expanduser()
        if not str(value).strip() or not path.exists():
            raise UsageError(f"{flag}={str(value)!r}: no such file or folder; give {what}")
        _readable(flag, path, value)

    return Kind("read_path", check, ("MISSING", "UNREADABLE", ""), f"give {what}")


def write_dir(what: str = "a folder to write") -> Kind:
    """A folder the command may create or write: not a file, and its nearest existing folder writable (nothing is
    created here; the command makes it, and holds its lock, when it starts writing)."""
    def check(flag: str, value: Any) -> None:
        if not str(value).strip():
            raise UsageError(f"{flag}={str(value)!r} is not valid; give {what}")
        path = Path(str(value)).expanduser().absolute()
        if path.exists() and not path.is_dir():
            raise UsageError(f"{flag}={str(value)!r} is a file; give {what}")
        probe = path
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir():
            raise UsageError(f"{flag}={str(value)!r} is not valid: {str(probe)!r} is a file, not a folder; give {what}")
        try:  # a real write (permissions say nothing for root, a read-only mount or a full disk): made and removed
            fd, tmp = tempfile.mkstemp(prefix=".accrot-probe-", dir=probe)
            os.close(fd)
            os.unlink(tmp)
        except OSError as err:
            raise UsageError(f"{flag}={str(value)!r} cannot be written ({str(probe)!r}: {err.strerror}); "
                             f"give {what}") from None

    return Kind("write_dir", check, ("A_FILE", "A_FILE/x", "READ_ONLY/x", ""), f"give {what}")


def write_file(what: str = "a file to write") -> Kind:
    """A file the command writes: not a folder, and its folder (or the nearest existing one above) writable."""
    folder = write_dir(what)

    def check(flag: str, value: Any) -> None:
        path = Path(str(value)).expanduser()
        if not str(value).strip() or path.is_dir():
            raise UsageError(f"{flag}={str(value)!r} is {'a folder' if path.is_dir() else 'empty'}; give {what}")
        folder.check(flag, str(path.absolute().parent))

    return Kind("write_file", check, ("A_DIR", "A_FILE/x.json", "READ_ONLY/x.json", ""), f"give {what}")


# -- declaring options and their interactions --------------------------------------------------------------------
@dataclass
class Rules:
    """The interactions a parser declared (kept on the parser as ``accrot_rules``)."""

    conflicts: list[tuple[str, str, str]] = field(default_factory=list)
    needs: list[tuple[str, str]] = field(default_factory=list)
    no_effect: list[tuple[str, Callable[[Any], bool], str]] = field(default_factory=list)


def rules(parser) -> Rules:
    if not hasattr(parser, "accrot_rules"):
        parser.accrot_rules = Rules()
    return parser.accrot_rules


def option(parser, *flags: str, kind: Kind, **kwargs):
    """``parser.add_argument(*flags, **kwargs)``, the option declared of ``kind``; returns the action."""
    action = parser.add_argument(*flags, **kwargs)
    action.accrot_kind = kind
    return action


def conflicts(parser, a: str, b: str, why: str) -> None:
    """``a`` and ``b`` cannot both be given (``why``: which one takes effect otherwise)."""
    rules(parser).conflicts.append((a, b, why))


def needs(parser, a: str, b: str) -> None:
    """``a`` takes effect only together with ``b``."""
    rules(parser).needs.append((a, b))


def no_effect_unless(parser, a: str, when: Callable[[Any], bool], why: str) -> None:
    """``a`` given while ``when(args)`` is false would do nothing: refused, ``why`` says when it acts."""
    rules(parser).no_effect.append((a, when, why))


def declared(parser) -> list:
    """The options and positional arguments of ``parser``, each with ``accrot_kind`` (None where undeclared)."""
    return [a for a in parser._actions if a.dest not in ("help", "print_shtab")]


def flag_of(action) -> str:
    """An option's flag as a user types it (not jsonargparse's ``--name+``, which appends to a list); a positional's
    name."""
    flags = [f for f in action.option_strings if not f.endswith("+")]
    return (flags or action.option_strings)[-1] if action.option_strings else action.dest


def given(argv: Sequence[str], flag: str | Sequence[str]) -> bool:
    """Whether the command line names ``flag`` (or one of its spellings); a positional (no flag) always counts."""
    flags = [flag] if isinstance(flag, str) else list(flag)
    if not flags:
        return True
    return any(a == f or a.startswith(f + "=") for a in argv for f in flags)


def parse(parser, argv: Sequence[str]):
    """Parse ``argv`` and check every declared option and interaction, before the command does anything else."""
    argv = list(argv)
    _once(parser, argv)
    args = parser.parse_args(argv)
    check(parser, args, argv)
    return args


def _once(parser, argv: Sequence[str]) -> None:
    """An option given twice is refused (argparse keeps the last without a word); an option that collects values
    (``--set``, action append) may repeat."""
    for action in declared(parser):
        if not action.option_strings or type(action).__name__ == "_AppendAction":
            continue
        flags = [f for f in action.option_strings if not f.endswith("+")]
        times = sum(1 for a in argv if a.split("=", 1)[0] in flags)
        if times > 1:
            raise UsageError(f"{flag_of(action)} is given {times} times; give it once")


def check(parser, args, argv: Sequence[str]) -> None:
    """Every declared option of ``parser`` in ``args`` (a namespace, or LightningCLI's config, read by ``dest``) and
    every declared interaction, ``argv`` telling which options were given."""
    for action in declared(parser):
        kind = getattr(action, "accrot_kind", None)
        value = args.get(action.dest) if hasattr(args, "get") else getattr(args, action.dest, None)
        if kind is None or value is None or (value == action.default and not given(argv, action.option_strings)):
            continue  # a default is the command's own choice (a default folder may not exist yet)
        kind.check(flag_of(action), value)
    found = rules(parser)
    for a, b, why in found.conflicts:
        if given(argv, a) and given(argv, b):
            raise UsageError(f"{a} and {b} cannot both be given ({why}); keep one")
    for a, b in found.needs:
        if given(argv, a) and not given(argv, b):
            raise UsageError(f"{a} takes effect only with {b}; add {b}, or drop {a}")
    for a, when, why in found.no_effect:
        if given(argv, a) and not when(args):
            raise UsageError(f"{a} has no effect here ({why}); drop it")
    _checked(parser, args)


def _checked(parser, args) -> None:
    """Called once every option of a command has passed its checks, before the command does anything (the tests
    stop commands here: whatever a bad value would do must have been refused by then)."""

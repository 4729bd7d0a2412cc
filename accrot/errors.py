"""The errors every layer raises for bad input, how they become one line, and the exit codes.

A bad input never prints a traceback: every command catches :class:`BadInput` (and jsonargparse's own errors,
and an unwritable output folder) and prints one line through :func:`one_line`, then exits with status 2.
"""

from __future__ import annotations

import errno
import re
from typing import get_args

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1  # the input was fine but the run failed (it diverged)
EXIT_INTERRUPTED = 128 + 2  # Ctrl-C (SIGINT), the shell's code; a run checkpointed first (callbacks.preemption)
EXIT_STOPPED = 128 + 15  # stopped by SIGTERM / the SLURM warning signal, checkpointed (the shell's code for SIGTERM)
# an output directory that cannot be written (read-only, not a directory, full) is bad input, not a bug
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR}


class BadInput(ValueError):
    """Bad input caught by accrot itself. Its message is one line that names the offending value and what would
    be valid; the command line prints it and exits with :data:`EXIT_BAD_INPUT`, without a traceback."""


class UsageError(BadInput):
    """A bad command-line value or option combination."""


class ConfigError(BadInput):
    """A bad configuration value (model, scheme, trainer); the message names the field and the valid choices."""


class DataError(BadInput):
    """Bad data input: a missing or empty corpus, an impossible split, a length the data cannot fill."""


# the folders this process writes, each with the option that named it (declared when the command made the folder)
_WRITE_FOLDERS: dict[str, str] = {}


def declare_write_folder(folder, option: str) -> None:
    """``folder`` is written by this command and was named by ``option`` (``--root``, ``--out``): a write that fails
    under it later names that option."""
    import os

    _WRITE_FOLDERS[os.path.abspath(folder)] = option


def write_option(filename) -> str | None:
    """The option whose declared folder holds ``filename`` (the innermost), or None."""
    import os

    path = os.path.abspath(os.fsdecode(filename))
    held = [f for f in _WRITE_FOLDERS if path == f or path.startswith(f.rstrip(os.sep) + os.sep)]
    return _WRITE_FOLDERS[max(held, key=len)] if held else None


def check_choice(name: str, value: object, literal: object) -> None:
    """``value`` is one of the ``Literal``'s values, or a one-line :class:`ConfigError` listing them."""
    choices = get_args(literal)
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of {', '.join(map(repr, choices))}")


def bad_input_message(err: BaseException) -> str | None:
    """The one-line message of a bad input anywhere in ``err``'s cause chain; None for a real bug."""
    from jsonargparse import ArgumentError

    chain, seen = [], err
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for e in chain:  # our own messages are already one line and name the field
        if isinstance(e, BadInput):
            return one_line(str(e))
    for e in chain:
        if isinstance(e, ArgumentError):
            return one_line(str(e))
    for e in chain:  # an output folder that cannot be written (or filled) mid-run
        if isinstance(e, OSError) and e.errno in _UNWRITABLE and e.filename:
            # no option is guessed: the one whose folder holds the file, as the command declared it
            option = write_option(e.filename)
            fix = (f"pass a writable {option} with free space" if option else
                   "free space there or make it writable, then run again")
            return f"cannot write {str(e.filename)!r} ({e.strerror}); {fix}"
    return None


_EXPECTED = re.compile(r"Expected an? (?P<type>.*?)\. Got value: (?P<value>[^\n;]*)")
_LITERAL = re.compile(r"typing\.Literal\[(?P<choices>.*)\]")
_KEY = re.compile(r'Parser key "(?P<key>[\w.]+)"')
_UNION = re.compile(r"Does not validate against any of the Union subtypes; Subtypes: \[.*?\]; Errors:; "
                    r"(?P<errors>.+?)(; Expected a <class 'NoneType'>.*)?$")


_OPTIONAL_LITERAL = re.compile(r'Parser key "(?P<key>[\w.]+)":; Does not validate against any of the Union subtypes; '
                               r"Subtypes: \[typing\.Literal\[(?P<choices>[^\]]*)\], <class 'NoneType'>\].*?"
                               r"Given value: (?P<value>[^;]*)$")

_OPTIONAL_LIST = re.compile(r'Parser key "(?P<key>[\w.]+)":; Does not validate against any of the Union subtypes; '
                            r"Subtypes: \[list\[\w+\], <class 'NoneType'>\].*?Given value: (?P<value>[^;]*)$")


_PLAIN_UNION = re.compile(r'Parser key "(?P<key>[\w.]+)":; Does not validate against any of the Union subtypes; '
                          r"Subtypes: \[(?P<types>(?:<class '\w+'>(?:, )?)+)\]; Errors:;.*?Given value: (?P<value>[^;]*)$")


def one_line(message: str) -> str:
    """Collapse a (possibly nested, multi-line) parser message into one readable line."""
    message = str(message)
    expected = _EXPECTED.search(message)
    if expected:  # "model.scheme" + "rotation": the full dotted key, the bad value and what is valid
        keys = list(dict.fromkeys(m.group("key") for m in _KEY.finditer(message[: expected.start()])))
        key = ".".join(keys) or "value"
        kind = expected.group("type")
        literal = _LITERAL.fullmatch(kind)
        if literal:
            valid = f"choose one of {literal.group('choices')}"
        else:
            valid = "expected " + re.sub(r"<class '(.*?)'>", r"\1", kind)
        return f"{key}={expected.group('value').strip()!r} is not valid; {valid}"
    lines = [re.sub(r"^- ", "", ln.strip()) for ln in message.splitlines() if ln.strip(" -")]
    # jsonargparse nests "Problem with given class_path ..." / "Parser key ...": keep the informative parts
    lines = [ln for ln in lines if not ln.startswith(("Given value type", "Subcommand", "tip:"))]
    text = re.sub(r"\s+", " ", "; ".join(dict.fromkeys(lines)))
    optional = _OPTIONAL_LITERAL.search(text)
    if optional:  # an Optional[Literal[...]] key given a value outside the literal
        return (f"{optional.group('key')}={optional.group('value').strip()!r} is not valid; choose one of "
                f"{optional.group('choices')} (or null)")
    listed = _OPTIONAL_LIST.search(text)
    if listed:  # an Optional[list[...]] key given something that is not a list
        return (f"{listed.group('key')}={listed.group('value').strip()!r} is not valid; give a list in brackets "
                "([a, b, ...]) or null")
    plain = _PLAIN_UNION.search(text)
    if plain:  # a union of plain types (bool | int, Optional[int]) given a value of none of them
        kinds = re.findall(r"<class '(\w+)'>", plain.group("types"))
        named = " or ".join(k for k in kinds if k != "NoneType")
        return (f"{plain.group('key')}={plain.group('value').strip()!r} is not valid; expected {named}"
                f"{' (or null)' if 'NoneType' in kinds else ''}")
    union = _UNION.match(text)
    if union:  # a class's own error, wrapped by jsonargparse's Union matching: keep that error alone
        text = union.group("errors")
    return text[:600]

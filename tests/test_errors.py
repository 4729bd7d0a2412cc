"""``one_line`` against the messages jsonargparse really writes: each shape it rewrites is produced by parsing a bad
flag the way ``accrot fit`` does (:func:`accrot.run.probe.probe`: the same CLI, parser and ``exit_on_error=False``;
``accrot eval``'s own parser for a plain command), never typed by hand. A jsonargparse release that rewords a
message then fails here, naming the shape, instead of printing a 600-character line to a user."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from jsonargparse import ArgumentError

from accrot.errors import BadInput, bad_input_message, one_line


@dataclass(frozen=True)
class Shape:
    id: str
    flags: tuple[str, ...]  # added to `accrot fit --config tiny`
    raw: str  # what identifies the shape in jsonargparse's own message (so a rewording names the shape)
    line: str  # the one line a user reads


SHAPES = [
    # "Expected a typing.Literal[...]. Got value: x" under 'Parser key "a.b.c"'
    Shape("literal", ("--model.scheme.rotation=bogus",), "Expected a typing.Literal['none', 'rope', 'accum', 'path']",
          "model.scheme.rotation='bogus' is not valid; choose one of 'none', 'rope', 'accum', 'path'"),
    # "Expected a <class 'int'>. Got value: x"
    Shape("type", ("--model.d_model=abc",), "Expected a <class 'int'>. Got value: abc",
          "model.d_model='abc' is not valid; expected int"),
    # the same inside a subclass's init_args: the data module's keys nested under "data" and the class_path
    Shape("type-in-a-class", ("--data.init_args.seq_len=abc",), "Problem with given class_path",
          "data.seq_len='abc' is not valid; expected int"),
    # an Optional[Literal[...]]: jsonargparse's Union of the literal and NoneType
    Shape("optional-literal", ("--model.scheme.increments=lerned",),
          "Subtypes: [typing.Literal['random_position', 'random_token', 'learned', 'softplus'], <class 'NoneType'>]",
          "model.scheme.increments='lerned' is not valid; choose one of 'random_position', 'random_token', "
          "'learned', 'softplus' (or null)"),
    # an Optional[list[...]] given a scalar
    Shape("optional-list", ("--model.scheme.rotation=rope", "--model.scheme.layer_pattern=cell"),
          "Subtypes: [list[str], <class 'NoneType'>]",
          "model.scheme.layer_pattern='cell' is not valid; give a list in brackets ([a, b, ...]) or null"),
    # a union of plain types given a value of none of them: Optional[float] ...
    Shape("optional-plain", ("--model.scheme.sigma=abc",), "Subtypes: [<class 'float'>, <class 'NoneType'>]",
          "model.scheme.sigma='abc' is not valid; expected float (or null)"),
    # ... and LightningCLI's seed_everything, bool | int
    Shape("plain-union", ("--seed_everything=abc",), "Subtypes: [<class 'bool'>, <class 'int'>]",
          "seed_everything='abc' is not valid; expected bool or int"),
]


def fit_error(*flags: str) -> Exception:
    """The exception ``accrot fit --config tiny FLAGS`` raises while it parses and builds (no training)."""
    from accrot.run.probe import probe

    with pytest.raises((ArgumentError, BadInput)) as err:
        probe(["fit", "--config", "tiny", *flags])
    return err.value


@pytest.mark.parametrize("shape", SHAPES, ids=[s.id for s in SHAPES])
def test_each_parser_message_shape_becomes_its_one_line(shape):
    err = fit_error(*shape.flags)
    assert isinstance(err, ArgumentError), f"{type(err).__name__}: {err}"
    raw = str(err)
    assert shape.raw in raw, f"jsonargparse's wording of the {shape.id!r} shape changed:\n{raw}"
    assert "\n" in raw  # jsonargparse's own message is several lines ...
    assert one_line(raw) == shape.line  # ... the user reads one
    assert bad_input_message(err) == shape.line  # what `accrot` prints after "accrot: error: "


def test_a_class_refusing_its_arguments_inside_a_union_keeps_the_class_message():
    """A data module's constructor refusing a value, wrapped by jsonargparse's Union matching (the data module is
    ``TokenStreamDataModule | None``) when it instantiates: the class's own message alone."""
    err = fit_error("--data.init_args.seq_len=0")
    raw = str(err.__cause__)  # jsonargparse's error, which the CLI turned into a one-line UsageError
    assert raw.startswith("Does not validate against any of the Union subtypes\n"), raw
    assert "Expected a <class 'NoneType'>" in raw
    line = "seq_len=0 is not valid; use an integer >= 2"
    assert one_line(raw) == line
    assert bad_input_message(err) == line


def test_a_command_parser_message_names_its_option():
    """``accrot eval``'s own jsonargparse parser: a top-level option, no dotted key."""
    from accrot.run.eval import main

    with pytest.raises(ArgumentError) as err:
        main(["--ckpt", "unused.ckpt", "--budget_tokens", "many"])
    raw = str(err.value)
    assert raw.startswith('Parser key "budget_tokens":\n'), raw
    assert one_line(raw) == "budget_tokens='many' is not valid; expected int"


def test_a_command_parser_union_message_names_its_option():
    """``accrot ablation --seeds 1.5``: an ``int | None`` option of a command's own parser."""
    from accrot.study.ablation import main

    with pytest.raises(ArgumentError) as err:
        main(["--seeds", "1.5"])
    raw = str(err.value)
    assert "Does not validate against any of the Union subtypes" in raw, raw
    assert one_line(raw) == "seeds='1.5' is not valid; expected int (or null)"


def test_what_no_rule_names_is_collapsed_into_one_line():
    """A nested message no rule rewrites keeps its informative lines, joined into one."""
    raw = 'Parser key "a":\n  - Problem one\n  - Given value type: x\n  - Problem two'
    assert one_line(raw) == 'Parser key "a":; Problem one; Problem two'

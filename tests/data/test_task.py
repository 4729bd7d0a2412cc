"""Every shipped data module provides what the pipeline asks of it (data_modules/task.py): the members of
:class:`Task`, with the protocol's parameters; a task that scores its answers only, :class:`AnswerTask`'s too; and
the ablation's data-set records say "answers only" exactly of the data sets whose module is an answer task."""

from __future__ import annotations

import inspect

import pytest

import data_modules
from accrot.study.variants import DATASET_RECORDS
from data_modules import AnswerTask, StdlibDataModule, Task, TokenStreamDataModule

BASES = ("TokenStreamDataModule", "SyntheticDataModule")  # not a data set: what a new one subclasses
SHIPPED = {n: getattr(data_modules, n) for n in data_modules.__all__ if inspect.isclass(getattr(data_modules, n))
           and issubclass(getattr(data_modules, n), TokenStreamDataModule) and n not in BASES}
CHEAP = ("LocalDependencyDataModule", "PasskeyDataModule", "MultiKeyNeedleDataModule", "MultiValueDataModule",
         "VariableTrackingDataModule", "FlipFlopDataModule", "ModCountDataModule", "WordProblemDataModule",
         "NBackDataModule", "StdlibDataModule")  # built without a package, a file or the network


def members(protocol) -> dict[str, object]:
    """The protocol's own members (not Protocol's machinery), by name."""
    out: dict[str, object] = {}
    for klass in reversed(protocol.__mro__):
        if klass.__dict__.get("_is_protocol") and klass not in (object,) and klass.__module__ != "typing":
            out.update({n: v for n, v in vars(klass).items() if not n.startswith("_")})
            out.update({n: None for n in klass.__dict__.get("__annotations__", {})})
    return out


def has_protocol(cls, protocol) -> bool:
    """``cls`` has every member of ``protocol``, each method taking the protocol's parameters in its order."""
    for name, member in members(protocol).items():
        if member is None:  # a data attribute (seq_len): an instance's, checked on built modules
            continue
        own = inspect.getattr_static(cls, name, None)
        if own is None:
            return False
        if inspect.isfunction(member):
            want = list(inspect.signature(member).parameters)
            if list(inspect.signature(getattr(cls, name)).parameters)[:len(want)] != want:
                return False
    return True


def test_the_protocols_name_what_the_pipeline_reads():
    assert set(members(Task)) == {"seq_len", "vocab_size", "train_dataloader", "val_dataloader", "eval_blocks",
                                  "describe"}
    assert set(members(AnswerTask)) == set(members(Task)) | {"eval_mask", "eval_targets"}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_data_module_is_a_task(name):
    cls = SHIPPED[name]
    assert has_protocol(cls, Task), name
    # a module that scores answers scores them through both members, or through neither
    assert has_protocol(cls, AnswerTask) == hasattr(cls, "eval_mask") == hasattr(cls, "eval_targets"), name


@pytest.mark.parametrize("name", CHEAP)
def test_a_built_data_module_passes_the_runtime_check(name):
    dm = SHIPPED[name]()
    assert isinstance(dm, Task) and dm.seq_len > 0 and dm.vocab_size > 0
    assert isinstance(dm, AnswerTask) == (name != "StdlibDataModule")


def test_a_module_without_a_member_is_not_a_task():
    class NoBlocks:
        seq_len, vocab_size = 8, 256

        def train_dataloader(self): ...

        def val_dataloader(self): ...

        def describe(self) -> dict:
            return {}

    assert not isinstance(NoBlocks(), Task) and not has_protocol(NoBlocks, Task)

    class OtherBlocks(NoBlocks):
        def eval_blocks(self, n: int, budget_tokens: int) -> None: ...  # another parameter name than length

    assert isinstance(OtherBlocks(), Task) and not has_protocol(OtherBlocks, Task)  # the runtime check is names only


@pytest.mark.parametrize("name", list(DATASET_RECORDS))
def test_a_data_set_record_is_answers_only_exactly_when_its_module_is_an_answer_task(name):
    record = DATASET_RECORDS[name]
    path = record.overrides.get("data")  # none: the recipe's own, the embedded corpus
    cls = StdlibDataModule if path is None else getattr(data_modules, path.removeprefix("data_modules."))
    assert has_protocol(cls, Task)
    assert has_protocol(cls, AnswerTask) == record.answers_only, name

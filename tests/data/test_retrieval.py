"""Retrieval tasks: the text says what the rules say, the scored answer is the one the text implies, depths,
determinism, eval ≠ train, an oracle scores 1, errors."""

from __future__ import annotations

import json
import math
import pickle
import re
from dataclasses import dataclass

import pytest
import torch

from accrot.evaluation import eval_sets, evaluate_length
from data_modules import DataError, MultiKeyNeedleDataModule, MultiValueDataModule, VariableTrackingDataModule
from data_modules.retrieval import NAMES, _min_filler, is_eval_value
from data_modules.synthetic import FILLER, _boundaries

IGNORE = -100
SENTENCES = {s + ". " for s in FILLER.split(". ") if s}
LONGEST_SENTENCE = max(map(len, SENTENCES))  # 22 bytes
DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]

NEEDLE_RE = re.compile(r"The magic number for ([a-z]+) is (\d+)\. ")
ASSIGN_RE = re.compile(r"VAR ([A-Z]{3}) = ([A-Z]{3}|\d+)\. ")
KEY_QUERY_RE = re.compile(r"What is the magic number for ([a-z]+)\? The magic number for \1 is ")
VALUES_QUERY_RE = re.compile(r"What are all the magic numbers for ([a-z]+)\? They are ")
TRACK_QUERY_RE = re.compile(r"What is the value of ([A-Z]{3})\? \1 = ")


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg
    return msg


# --- an independent reading of a sequence's text -------------------------------------------------


@dataclass
class Parsed:
    filler: str  # the text without needles, question and answer
    needles: list[tuple[int, re.Match]]  # (filler offset, match) in order of appearance
    answer_start: int  # byte index in the text where the answer begins
    answer: str  # what the needles imply the answer is
    anchor: int  # filler offset of the depth-defining needle
    distractor: str | None = None  # multi-key: a wrong needle's value
    hops: int | None = None  # variable tracking: assignments from the queried name back to its value


def _split(text: str, needle_re: re.Pattern, query_re: re.Pattern) -> tuple[re.Match, list[tuple[int, re.Match]], str]:
    (q,) = list(query_re.finditer(text))
    body = text[: q.start()]
    needles, removed, pieces, at = [], 0, [], 0
    for m in needle_re.finditer(body):
        needles.append((m.start() - removed, m))
        pieces.append(body[at : m.start()])
        removed += m.end() - m.start()
        at = m.end()
    filler = "".join(pieces) + body[at:]
    assert filler == "" or (filler in FILLER * (len(filler) // len(FILLER) + 2) and filler.endswith(". "))
    for P, _ in needles:  # a needle starts a sentence: whole filler sentences follow it (the filler is a window)
        *whole, tail = filler[P:].split(". ")
        assert tail == "" and all(w + ". " in SENTENCES for w in whole), "a needle does not start a sentence"
    assert len({P for P, _ in needles}) == len(needles), "two needles at one boundary"
    return q, needles, filler


def parse_multikey(text: str) -> Parsed:
    q, needles, filler = _split(text, NEEDLE_RE, KEY_QUERY_RE)
    values = {m.group(1): m.group(2) for _, m in needles}
    assert len(values) == len(needles), "names are not distinct"
    assert len(set(values.values())) == len(needles), "values are not distinct"
    name = q.group(1)
    (anchor,) = [P for P, m in needles if m.group(1) == name]
    wrong = next((m.group(2) for _, m in needles if m.group(1) != name), None)
    return Parsed(filler, needles, q.end(), values[name], anchor, wrong)


def parse_multivalue(text: str) -> Parsed:
    q, needles, filler = _split(text, NEEDLE_RE, VALUES_QUERY_RE)
    assert {m.group(1) for _, m in needles} == {q.group(1)}, "a needle of another name"
    values = [m.group(2) for _, m in needles]
    assert len(set(values)) == len(values)
    return Parsed(filler, needles, q.end(), ", ".join(values), needles[0][0])


def parse_tracking(text: str) -> Parsed:
    q, needles, filler = _split(text, ASSIGN_RE, TRACK_QUERY_RE)
    rhs = {m.group(1): m.group(2) for _, m in needles}
    where = {m.group(1): P for P, m in needles}
    assert len(rhs) == len(needles), "a variable is assigned twice"
    for P, m in needles:  # every chain reads in order: a name is assigned before it is used
        assert m.group(2).isdigit() or where[m.group(2)] < P
    used = [v for v in rhs.values() if not v.isdigit()]
    assert len(used) == len(set(used)), "a name is copied twice: not a chain"
    name, hops = q.group(1), 1
    while not rhs[name].isdigit():
        name, hops = rhs[name], hops + 1
    return Parsed(filler, needles, q.end(), rhs[name], where[name], hops=hops)


def chain_lengths(parsed: Parsed) -> list[int]:
    """Assignments per chain (a chain: a value and the names bound to it through the hops)."""
    rhs = {m.group(1): m.group(2) for _, m in parsed.needles}
    roots = []
    for name in rhs:
        while not rhs[name].isdigit():
            name = rhs[name]
        roots.append(name)
    return sorted(roots.count(r) for r in set(roots))


def text_of(x: torch.Tensor) -> str:
    return bytes(x.tolist()).decode()


# --- the three tasks, one spec each ---------------------------------------------------------------


@dataclass
class Spec:
    make: type
    parse: object
    n_needles: int  # with the default arguments
    scored: int  # scored digits per sequence
    room: int  # needles that must follow the anchor
    chains: list[int] | None = None  # variable tracking: assignments per chain


SPECS = {
    "multikey": Spec(MultiKeyNeedleDataModule, parse_multikey, 4, 4, 0),
    "multivalue": Spec(MultiValueDataModule, parse_multivalue, 3, 12, 2),
    "tracking": Spec(VariableTrackingDataModule, parse_tracking, 6, 4, 2, [3, 3]),
}
TASKS = pytest.mark.parametrize("spec", list(SPECS.values()), ids=list(SPECS))


def module(spec: Spec, **kw):
    return spec.make(**{"seq_len": 300, "batch_size": 4, "val_blocks": 5, **kw})


def check_sequence(spec: Spec, x: torch.Tensor, mask: torch.Tensor, dm) -> Parsed:
    """``x [ℓ+1]``, ``mask [ℓ]``: layout, needle count, the scored targets = the answer the text implies."""
    length = x.numel() - 1
    text = text_of(x)
    p = spec.parse(text)
    assert len(p.needles) == spec.n_needles
    assert len(p.filler) == dm.task.filler_bytes(length)
    assert text[p.answer_start :] == p.answer  # the sequence ends with the implied answer
    expected = torch.zeros(length, dtype=torch.bool)
    for k, c in enumerate(p.answer):  # target t is x[t + 1]
        expected[p.answer_start + k - 1] = c.isdigit()
    assert torch.equal(mask, expected) and int(mask.sum()) == spec.scored
    assert text_of(x[1:][mask]) == p.answer.replace(", ", "")
    if spec.chains is not None:
        assert chain_lengths(p) == spec.chains and p.hops == spec.chains[0]
    return p


def test_min_filler_gives_exactly_the_boundaries_needed():
    for k in range(1, 25):
        assert len(_boundaries(_min_filler(k))) == k
        if k > 1:
            assert len(_boundaries(_min_filler(k) - 1)) == k - 1


@TASKS
@pytest.mark.parametrize("extra", [0, 90, 700], ids=lambda n: f"min+{n}")
def test_eval_blocks_answers_and_depths(spec, extra):
    dm = module(spec)
    length = dm.min_length + extra
    blocks, mask = dm.eval_blocks(length, 10 * length), dm.eval_mask(length, 10 * length)
    depths = dm.eval_depths(length, 10 * length)
    assert blocks.shape == (10, length + 1) and blocks.dtype == torch.int64 and blocks.max() < dm.vocab_size == 256
    assert mask.shape == (10, length) and mask.dtype == torch.bool
    assert depths == DEPTHS * 2
    F = dm.task.filler_bytes(length)
    for x, m, depth in zip(blocks, mask, depths, strict=True):
        p = check_sequence(spec, x, m, dm)
        assert is_eval_value(p.answer.split(", ")[0])
        assert p.anchor == dm.anchor_position(length, depth)
        later = p.filler[p.anchor :].count(". ")  # boundaries after the anchor (the last is F)
        if depth < 1 and extra >= 700:
            assert abs(p.anchor - depth * F) <= LONGEST_SENTENCE  # within a sentence of the stated depth
        else:  # or as late as leaves room for the needles that follow it
            assert abs(p.anchor - depth * F) <= LONGEST_SENTENCE or (p.anchor < depth * F and later == spec.room)
        if spec.room == 0:
            assert abs(p.anchor - depth * F) <= LONGEST_SENTENCE


@TASKS
def test_train_items_and_loader(spec):
    dm = module(spec, seq_len=400)
    anchors = set()
    for i in range(40):
        x, t = dm.train_dataset()[i]
        assert x.shape == t.shape == (400,) and x.dtype == t.dtype == torch.int64
        full = torch.cat([x, t[-1:]])  # the last target is the sequence's last byte
        scored = t != IGNORE
        p = check_sequence(spec, full, scored, dm)
        assert torch.equal(t[scored], full[1:][scored]) and (t[~scored] == IGNORE).all()
        anchors.add(p.anchor)
    assert len(anchors) > 3  # training depths vary
    dm.setup("fit")
    inputs, targets = next(iter(dm.train_dataloader()))
    assert inputs.shape == targets.shape == (4, 400) and inputs.dtype == targets.dtype == torch.int64
    assert ((targets != IGNORE).sum(1) == spec.scored).all()
    assert ((targets[targets != IGNORE] >= ord("0")) & (targets[targets != IGNORE] <= ord("9"))).all()


@TASKS
def test_deterministic_per_seed_and_budget_free(spec):
    a, b, c = module(spec), module(spec), module(spec, seed=1)
    assert torch.equal(a.eval_blocks(300, 3000), b.eval_blocks(300, 3000))
    assert torch.equal(a.eval_mask(300, 3000), b.eval_mask(300, 3000))
    assert torch.equal(a.train_dataset()[11][0], b.train_dataset()[11][0])
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    assert not torch.equal(a.eval_blocks(300, 3000), c.eval_blocks(300, 3000))
    assert not torch.equal(a.train_dataset()[11][0], c.train_dataset()[11][0])
    assert a.fingerprint != c.fingerprint != module(spec, digits=5).fingerprint
    assert torch.equal(b.eval_blocks(300, 600), a.eval_blocks(300, 3000)[:2])  # block i does not depend on N
    info = json.loads(json.dumps(a.describe()))
    assert info["task"] == a.task.name and info["min_length"] == a.min_length and info["parameters"]["digits"] == 4
    ds = pickle.loads(pickle.dumps(a.train_dataset()))  # DataLoader workers under spawn
    assert torch.equal(ds[3][0], a.train_dataset()[3][0])


@TASKS
def test_training_answers_are_never_evaluation_answers(spec):
    dm = module(spec)
    train = set()
    for i in range(300):
        x, t = dm.train_dataset()[i]
        train.add(spec.parse(text_of(torch.cat([x, t[-1:]]))).answer)
    evals = {spec.parse(text_of(x)).answer for x in dm.eval_blocks(300, 300 * 100)}
    values = lambda answers: {v for a in answers for v in a.split(", ")}  # noqa: E731
    assert not any(is_eval_value(v) for v in values(train)) and all(is_eval_value(v) for v in values(evals))
    assert len(train) > 250 and not values(train) & values(evals)


def test_hparams_and_defaults():
    dm = VariableTrackingDataModule(seq_len=256, hops=2, n_chains=3)
    assert dict(dm.hparams) == {"seq_len": 256, "batch_size": 16, "num_workers": 0, "seed": 0, "val_blocks": 32,
                                "hops": 2, "n_chains": 3, "digits": 4, "depths": DEPTHS}
    blocks, mask = dm.eval_set(256, 256 * 5)
    for x, m in zip(blocks, mask, strict=True):
        check_sequence(Spec(VariableTrackingDataModule, parse_tracking, 6, 4, 1, [2, 2, 2]), x, m, dm)
    every = MultiKeyNeedleDataModule(seq_len=900, n_keys=16)
    p = check_sequence(Spec(MultiKeyNeedleDataModule, parse_multikey, 16, 4, 0), every.eval_blocks(900, 900)[0],
                       every.eval_mask(900, 900)[0], every)
    assert {m.group(1) for _, m in p.needles} == set(NAMES)


# --- scoring through the evaluation ---------------------------------------------------------------


def reader(parse, wrong: bool = False):
    """A model ``[b, ℓ] → [b, ℓ, 256]`` that reads each input's text and puts a large logit on the implied
    answer's next byte wherever the answer is being read (``wrong``: a distractor needle's value)."""

    def model(inputs: torch.Tensor) -> torch.Tensor:
        b, length = inputs.shape
        logits = torch.zeros(b, length, 256)
        for r in range(b):
            p = parse(text_of(inputs[r]))  # the question is in the input, so the answer can be resolved
            answer = p.distractor if wrong else p.answer
            for k, c in enumerate(answer):
                if p.answer_start + k - 1 < length:
                    logits[r, p.answer_start + k - 1, ord(c)] = 50.0
        return logits

    return model


@TASKS
def test_an_oracle_scores_one_at_every_depth(spec):
    dm = module(spec)
    sets = eval_sets(dm, [300, 600], 3000)
    for length in (300, 600):
        blocks, mask, depths = sets.blocks[length], sets.masks[length], sets.depths[length]
        result = evaluate_length(reader(spec.parse), blocks, 300, mask=mask, depths=depths)
        assert result.accuracy == 1.0 and result.nll < 1e-6 and result.tokens == spec.scored * blocks.shape[0]
        assert result.accuracy_by_depth == {f"{d:g}": 1.0 for d in DEPTHS}
        uniform = evaluate_length(lambda t: torch.zeros(*t.shape, 256), blocks, 300, mask=mask, depths=depths)
        assert uniform.nll == pytest.approx(math.log(256), abs=1e-6)


def test_a_model_that_reads_the_wrong_needle_fails_multikey():
    dm = module(SPECS["multikey"])
    blocks, mask = dm.eval_blocks(600, 6000), dm.eval_mask(600, 6000)
    result = evaluate_length(reader(parse_multikey, wrong=True), blocks, 300, mask=mask,
                             depths=dm.eval_depths(600, 6000))
    assert result.accuracy < 0.4  # distinct values: only chance digit matches


# --- errors -----------------------------------------------------------------------------------------


@TASKS
def test_too_short_lengths(spec):
    dm = module(spec)
    n = dm.min_length
    with pytest.raises(DataError) as err:
        dm.eval_blocks(n - 1, 10 * n)
    msg = one_line(err)
    assert f"{n - 1} cannot hold" in msg and f"minimum is {n}" in msg
    with pytest.raises(DataError) as err:
        module(spec, seq_len=n - 1)
    assert one_line(err).startswith(f"seq_len={n - 1} cannot hold") and f">= {n}" in one_line(err)
    assert module(spec, seq_len=n).train_dataset()[0][0].shape == (n,)  # the minimum itself works
    with pytest.raises(DataError) as err:
        module(spec).eval_depths(n - 1, 1000)
    one_line(err)


def test_min_lengths_follow_the_counts():
    assert MultiKeyNeedleDataModule(seq_len=600, n_keys=8).min_length > MultiKeyNeedleDataModule().min_length
    with pytest.raises(DataError, match=r"seq_len=300 cannot hold the 16 needles .*use seq_len >= "):
        MultiKeyNeedleDataModule(seq_len=300, n_keys=16)


MK, MV, VT = SPECS["multikey"], SPECS["multivalue"], SPECS["tracking"]


@pytest.mark.parametrize(
    "spec, kw, name",
    [
        (MK, {"n_keys": 0}, "n_keys"),
        (MK, {"n_keys": 17}, "n_keys"),
        (MK, {"n_keys": True}, "n_keys"),
        (MK, {"digits": 2}, "digits"),
        (MK, {"digits": 33}, "digits"),
        (MK, {"depths": []}, "depths"),
        (MK, {"depths": [0.5, 1.5]}, "depths"),
        (MK, {"depths": [-0.1]}, "depths"),
        (MK, {"seq_len": 0}, "seq_len"),
        (MV, {"n_values": 0}, "n_values"),
        (MV, {"digits": 40}, "digits"),
        (MV, {"depths": [float("nan")]}, "depths"),
        (VT, {"hops": 0}, "hops"),
        (VT, {"n_chains": 0}, "n_chains"),
        (VT, {"digits": 1}, "digits"),
        (VT, {"depths": [2]}, "depths"),
        (VT, {"batch_size": 0}, "batch_size"),
        (MV, {"seed": -1}, "seed"),
    ],
    ids=lambda v: v.make.__name__ if isinstance(v, Spec) else None,
)
def test_bad_arguments_raise_one_line(spec, kw, name):
    with pytest.raises(DataError) as err:
        module(spec, **kw)
    assert one_line(err).startswith(name)

"""Formal languages, one example per row: every answer checked by a solver written here (Python's own arithmetic,
a count of b's), the suite's grammar, the curriculum and its resumption, and scoring that reads the answer only
(padding never scored, never able to change an answer, and a row's width never telling its size)."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from accrot.errors import DataError
from accrot.model import ModelConfig, Transformer
from accrot.position import SchemeConfig
from data_modules.examples import LengthCurriculum, scaled_accuracy
from data_modules.formal import FormalLanguageDataModule

IGNORE = -100
START, QUERY, PAD = 0xFD, ord("="), 0x00
EXPRESSION = re.compile(r"[0-4+\-*()]+")


def solve(task: str, text: str) -> str:
    """The answer a problem's text implies, from the task's stated rules (not the generator's code)."""
    if task == "parity":
        assert set(text) <= {"a", "b"}
        return str(text.count("b") % 2)
    assert EXPRESSION.fullmatch(text), text
    return str(eval(text) % 5)  # Python: * before + and -, left to right, unary minus, a non-negative remainder


def parse_row(x: torch.Tensor, y: torch.Tensor) -> tuple[str, str, int]:
    """``(problem text, the scored answer, its index)`` of inputs ``x`` and targets ``y``; checks the layout."""
    scored = (y != IGNORE).nonzero().flatten().tolist()
    assert len(scored) == 1, "exactly one scored target per row: the answer"
    t = scored[0]
    b = x.tolist()
    assert b[0] == START and b[t] == QUERY
    assert all(v == PAD for v in b[t + 2:]), "only padding after the answer"
    assert t + 1 == len(b) or b[t + 1] == y[t].item(), "the answer is the next input byte"
    return bytes(b[1:t]).decode(), chr(y[t].item()), t


@pytest.mark.parametrize("task", ["parity", "modarith", "modarith-brackets"])
def test_every_answer_matches_an_independent_solver(task):
    dm = FormalLanguageDataModule(task=task, train_lengths=[3, 40])
    train = dm.train_dataset()
    sizes = Counter()
    for j in range(400):
        x, y = train[j]
        assert x.shape == (dm.seq_len,) and y.shape == (dm.seq_len,)
        text, answer, _ = parse_row(x, y)
        assert answer == solve(task, text)
        sizes[len(text)] += 1
    assert min(sizes) >= 3 and max(sizes) <= 40
    if task == "modarith":
        assert all(n % 2 for n in sizes), "an expression of numbers and operators has odd length"
    assert len(sizes) >= (18 if task == "modarith" else 36), "sizes drawn across the whole range"
    for n in (40, 64, 101, 256):
        inputs, targets, made = dm.eval_examples(n, 30)
        assert made == (n if task != "modarith" or n % 2 else n - 1)
        assert inputs.shape == (30, made + 2)
        answers = Counter()
        for x, y in zip(inputs, targets, strict=True):
            text, answer, t = parse_row(x, y)
            assert len(text) == made and t == made + 1
            assert answer == solve(task, text)
            answers[answer] += 1
        assert len(answers) >= 2, "more than one class at every length"


def test_the_solvers_break_on_a_changed_rule():
    # a solver that ignored precedence, or took Python's sign of the remainder, would disagree with the data
    dm = FormalLanguageDataModule(task="modarith")
    left_to_right = 0
    for j in range(200):
        text, answer, _ = parse_row(*dm.train_dataset()[j])
        v = int(text[0])
        for op, d in zip(text[1::2], text[2::2], strict=True):
            v = {"+": v + int(d), "-": v - int(d), "*": v * int(d)}[op]
        left_to_right += str(v % 5) != answer
    assert left_to_right > 20
    from data_modules.formal import _value

    assert _value(b"1-1-1") == 4 and _value(b"1+2*3") == 2  # the suite's own examples, through the generator's rule


def test_bracket_expressions_follow_the_suites_grammar():
    task = FormalLanguageDataModule(task="modarith-brackets").task
    g = torch.Generator().manual_seed(0)
    assert [len(task._expression(g, n)) for n in range(1, 60)] == list(range(1, 60)), "exactly n symbols"
    shapes = Counter()
    for _ in range(300):
        text = bytes(task._expression(g, 7)).decode()
        assert text.count("(") == text.count(")") and "*" not in text
        shapes[re.sub(r"[0-4]", "d", re.sub(r"(?<=[d0-4)])[+-]", "?", text))] += 1
    # size 7 = ( left op right ), left uniform in 1..3, right = 4 - left: (d?(d)), (-d?-d), ((d)?d)
    assert set(shapes) == {"(d?(d))", "(-d?-d)", "((d)?d)"}, shapes
    assert min(shapes.values()) > 70


def test_curriculum_moves_with_the_step_and_resumes():
    dm = FormalLanguageDataModule(task="parity", curriculum=[[0, 3, 5], [3, 6, 10], [6, 11, 20]], batch_size=4)
    assert dm.seq_len == 20 + 2
    loader = dm.train_dataloader()
    batches = list(zip(range(9), loader, strict=False))
    for step, (x, y) in batches:
        lo, hi = dm.curriculum.at(step)
        assert x.shape == (4, hi + 2), "a batch is padded to its stage's longest row"
        for xi, yi in zip(x, y, strict=True):
            text, answer, _ = parse_row(xi, yi)
            assert lo <= len(text) <= hi and answer == solve("parity", text)
    # a run restored after 4 trained batches continues with batch 4 of the same schedule
    resumed = dm.train_dataloader()
    resumed.load_state_dict({"epoch": 0, "batches": 4})
    for (step, (x, y)), (x2, y2) in zip(batches[4:], resumed, strict=False):
        assert torch.equal(x, x2) and torch.equal(y, y2), step


def test_a_global_batch_is_the_same_rows_under_any_world_size():
    one = FormalLanguageDataModule(task="modarith", batch_size=4).train_dataloader()
    first = next(iter(one))[0]
    from data_modules.examples import ExampleSampler, ExampleSamples

    dm = FormalLanguageDataModule(task="modarith", batch_size=2)
    dataset = ExampleSamples(dm.task, dm.seed, dm.curriculum, rows=4)
    shards = [list(ExampleSampler(dataset, 2, 0, num_replicas=2, rank=r))[:2] for r in range(2)]
    assert sorted(shards[0] + shards[1]) == [0, 1, 2, 3]
    assert torch.equal(torch.stack([dataset[j][0] for j in range(4)]), first)


@pytest.mark.parametrize("scheme", [{}, {"rotation": "rope"}, {"rotation": "path"},
                                    {"rotation": "accum", "increments": "learned"}, {"far_mass": "alibi"}])
def test_padding_is_never_scored_and_cannot_change_an_answer(scheme):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=2,
                                    scheme=SchemeConfig(**scheme))).eval()
    dm = FormalLanguageDataModule(task="modarith-brackets", train_lengths=[3, 12], batch_size=8)
    x, y = next(iter(dm.train_dataloader()))
    with torch.no_grad():
        padded = model(x)  # [B, T, V]
        loss = F.cross_entropy(padded.flatten(0, 1), y.flatten(), ignore_index=IGNORE)
        alone = []
        for i, (xi, yi) in enumerate(zip(x, y, strict=True)):
            t = int((yi != IGNORE).nonzero())
            alone.append(F.cross_entropy(model(xi[None, : t + 1])[0, t], yi[t]))
            # other padding bytes: the answer's logits do not move
            noisy = xi.clone()
            noisy[t + 2:] = torch.randint(256, (max(0, noisy.numel() - t - 2),))
            assert torch.allclose(model(noisy[None])[0, t], padded[i, t], atol=1e-5)
    assert torch.allclose(loss, torch.stack(alone).mean(), atol=1e-5), "the loss is the mean over answers only"


def test_width_never_tells_the_size():
    dm = FormalLanguageDataModule(task="parity", train_lengths=[3, 40], batch_size=16)
    x, y = next(iter(dm.train_dataloader()))
    sizes = {parse_row(xi, yi)[2] - 1 for xi, yi in zip(x, y, strict=True)}
    assert len(sizes) > 5 and x.shape[1] == 42, "every row of a batch padded to the range's longest"
    # evaluation examples are never training examples: a disjoint seed stream
    train = {bytes(dm.train_dataset()[j][0].tolist()).rstrip(b"\0") for j in range(2000)}
    inputs, targets, n = dm.eval_examples(12, 200)
    evals = {bytes(row.tolist()) + bytes([int(t[t != IGNORE])]) for row, t in zip(inputs, targets, strict=True)}
    assert len(evals) > 150 and len(train & evals) < 5  # 2^12 strings: a few coincide by chance only


def test_evaluation_blocks_hold_one_example_scored_on_its_answer():
    dm = FormalLanguageDataModule(task="parity")
    blocks, mask, targets = dm.eval_blocks(84, 84 * 3), dm.eval_mask(84, 84 * 3), dm.eval_targets(84, 84 * 3)
    assert blocks.shape == (3, 85) and mask.sum(1).tolist() == [1, 1, 1]
    for b, m, t in zip(blocks, mask, targets, strict=True):
        i = int(m.nonzero())
        text = bytes(b[1:i].tolist()).decode()
        assert len(text) == 82 and chr(t[i].item()) == solve("parity", text)


def test_scaled_accuracy():
    assert scaled_accuracy(0.5, 2) == 0.0 and scaled_accuracy(1.0, 5) == 1.0
    assert scaled_accuracy(0.6, 5) == pytest.approx(0.5)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"task": "dyck"}, "not a formal language"),
    ({"train_lengths": [40, 3]}, "shortest <= longest"),
    ({"train_lengths": [0, 3]}, "1 <= shortest"),
    ({"train_lengths": "3-40"}, "[shortest, longest]"),
    ({"curriculum": [[5, 3, 10]]}, "must start at step 0"),
    ({"curriculum": [[0, 3, 10], [0, 3, 12]]}, "not after stage 0"),
    ({"curriculum": [[0, 3]]}, "[first_step, shortest, longest]"),
    ({"curriculum": []}, "no stages"),
    ({"task": "parity", "operators": "+"}, "modarith"),
    ({"task": "modarith", "operators": "/"}, "distinct characters"),
])
def test_bad_settings_are_one_line(kwargs, needle):
    with pytest.raises(DataError) as err:
        FormalLanguageDataModule(**kwargs)
    msg = str(err.value)
    assert "\n" not in msg and needle in msg


def test_curriculum_parse_is_pure():
    c = LengthCurriculum.parse([[0, 3, 5], [10, 4, 9]], 1)
    assert c.at(0) == (3, 5) and c.at(9) == (3, 5) and c.at(10) == (4, 9) and c.at(10**6) == (4, 9)
    assert c.longest == 9 and c.shortest == 3


# --- the learnable protocol: dense prefix labels and a curriculum from size 1 ------------------------------------


def _prefix_solutions(task: str, text: str) -> dict[int, str]:
    """``{i: answer}`` for every prefix text[:i] that is a problem of its own, by the solver above."""
    if task == "parity":
        return {i: solve(task, text[:i]) for i in range(1, len(text) + 1)}
    return {i: solve(task, text[:i]) for i in range(1, len(text) + 1) if text[i - 1].isdigit()}


@pytest.mark.parametrize("task", ["parity", "modarith"])
def test_every_prefix_label_matches_an_independent_solver(task):
    dm = FormalLanguageDataModule(task=task, prefix_labels=True, curriculum=[[0, 1, 5], [2, 1, 40]], batch_size=16)
    checked = 0
    for _, (x, y) in zip(range(4), dm.train_dataloader(), strict=False):
        for xi, yi in zip(x, y, strict=True):
            b = xi.tolist()
            t = b.index(QUERY)  # the problem is b[1:t]; the answer is read at t
            text = bytes(b[1:t]).decode()
            want = _prefix_solutions(task, text)
            got = {i: chr(v) for i, v in enumerate(yi.tolist()) if v != IGNORE and i < t}
            assert got == want, (text, got)  # position i reads symbol i: its label is the answer of text[:i]
            assert chr(yi[t].item()) == solve(task, text)  # the final answer as before
            assert (yi[t + 1:] == IGNORE).all(), "padding is never scored"
            assert all(v == PAD for v in b[t + 2:])
            checked += len(want)
    assert checked > 200
    # the first stage draws sizes 1..5: below the published minimum of 3
    first = next(iter(dm.train_dataloader()))[0]
    assert first.shape[1] == 5 + 2 and min(r.tolist().index(QUERY) - 1 for r in first) < 3


def test_prefix_labels_cannot_leak_the_size_or_the_future():
    # a label depends on the symbols up to its position only: two rows sharing a prefix share its labels, whatever
    # their sizes and later symbols, and the inputs are the published rows exactly (labels are targets only)
    from data_modules.examples import split_row

    dm = FormalLanguageDataModule(task="modarith", prefix_labels=True)
    short = torch.tensor([START, *b"1+2*3", QUERY, ord("2"), PAD, PAD, PAD, PAD])
    long = torch.tensor([START, *b"1+2*3-4*4", QUERY, ord("0")])
    (_, ys), (xl, yl) = split_row(short, 5, dm.task), split_row(long, 9, dm.task)
    assert torch.equal(ys[:6], yl[:6]) and (ys[7:] == IGNORE).all()
    plain_x, plain_y = split_row(long, 9)
    assert torch.equal(plain_x, xl) and (plain_y != IGNORE).sum() == 1
    # evaluation is unchanged: one scored answer per row
    _, targets, _ = dm.eval_examples(9, 8)
    assert ((targets != IGNORE).sum(1) == 1).all()
    # a row's labels never say its size: the same prefix at two sizes has the same labels at every shared position
    g = FormalLanguageDataModule(task="parity", prefix_labels=True, train_lengths=[1, 40], batch_size=64)
    x, y = next(iter(g.train_dataloader()))
    for xi, yi in zip(x, y, strict=True):
        t = xi.tolist().index(QUERY)
        assert (yi[1:t] != IGNORE).all() and (yi[t + 1:] == IGNORE).all()


def test_the_prefix_labels_change_the_fingerprint_and_are_refused_where_undefined():
    a = FormalLanguageDataModule(task="parity")
    b = FormalLanguageDataModule(task="parity", prefix_labels=True)
    assert a.fingerprint != b.fingerprint and b.describe()["parameters"]["prefix_labels"] is True
    for kwargs, needle in (({"task": "modarith-brackets", "prefix_labels": True}, "modarith-brackets"),
                           ({"prefix_labels": "yes"}, "true or false")):
        with pytest.raises(DataError) as err:
            FormalLanguageDataModule(**kwargs)
        assert "\n" not in str(err.value) and needle in str(err.value)

"""State-tracking tasks: every answer checked by a solver written here from the documented rules (not the
generator's code), the documented statistics, an oracle scores 1 through the evaluation, solvers that break a
rule fail, determinism, eval ≠ train, errors."""

from __future__ import annotations

import itertools
import json
import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from accrot.cli import main
from accrot.evaluation import eval_sets, evaluate_length, evaluate_lengths
from data_modules import (
    DataError,
    FlipFlopDataModule,
    ModCountDataModule,
    NBackDataModule,
    WordProblemDataModule,
)

IGNORE = -100
START, HIDDEN = 0xFD, 0xFE  # the documented start byte of a query stream, and what the model reads for an answer
Solver = Callable[[list[int]], dict[int, int]]  # bytes x → {target index t: the byte target t must be}


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg
    return msg


# --- independent solvers: a left-to-right reading of the bytes -------------------------------------------
# Each takes a sequence x as the model reads it (a full block of ℓ + 1 bytes, or a model's input of ℓ bytes, which
# lacks the last answer), checks its layout, and returns the answer every query (flip-flop: every read) implies,
# keyed by the target index that scores it (the query's own index). A query stream starts with the start byte, and
# the byte after a query (the answer's place) is skipped: it is the hidden byte unless the answers are fed back.


def stream_start(x: list[int]) -> int:
    assert x[0] == START and START not in x[1:], "a query stream starts with its start byte, once"
    return 1


def solve_flipflop(x: list[int], first_write: bool = False) -> dict[int, int]:
    """Track the register: ``w`` sets it, ``r`` must print it. ``first_write``: a wrong reader that keeps the
    block's first write."""
    pad = 1 if x[0] == ord("\n") else 0
    assert ord("\n") not in x[pad:]
    ops, operands = x[pad::2], x[pad + 1 :: 2]
    assert ops[0] == ord("w"), "the first instruction is not a write"
    assert set(ops) <= set(b"wir") and set(operands) <= set(b"01")
    register, out = None, {}
    for j, op in enumerate(ops):
        t = pad + 2 * j
        if op == ord("r"):
            out[t] = register
        elif op == ord("w") and j < len(operands) and (register is None or not first_write):
            register = operands[j]
    return out


def solve_modcount(n: int) -> Solver:
    def solve(x: list[int]) -> dict[int, int]:
        ones, out, after_element = 0, {}, False
        i = stream_start(x)
        while i < len(x):
            if x[i] == ord("?"):
                assert after_element, "a query does not follow a bit"
                out[i] = ord("A") + ones % n
                i, after_element = i + 2, False
                continue
            assert x[i] in b"01", f"byte {x[i]} at {i} is neither a bit nor a query"
            ones += x[i] == ord("1")
            i, after_element = i + 1, True
        return out

    return solve


def inversions(p: tuple[int, ...]) -> int:
    return sum(p[i] > p[j] for i in range(len(p)) for j in range(i + 1, len(p)))


# the documented numbering: lexicographic order of the one-line notation; An = the even ones (inversion count)
PERMS = {f"S{n}": sorted(itertools.permutations(range(n))) for n in (3, 4, 5)}
PERMS |= {f"A{n}": [p for p in PERMS[f"S{n}"] if inversions(p) % 2 == 0] for n in (4, 5)}


def solve_word_problem(group: str, reversed_order: bool = False) -> Solver:
    """Move the objects by each permutation in turn: the state maps object i to where the moves so far put it
    (g_1 first). ``reversed_order``: a wrong solver that applies the newest permutation first."""
    perms = PERMS[group]
    degree = len(perms[0])

    def solve(x: list[int]) -> dict[int, int]:
        image, out = list(range(degree)), {}  # image[i] = (g_t ∘ … ∘ g_1)(i)
        i = stream_start(x)
        while i < len(x):
            if x[i] == 0xFF:
                assert i > 0 and x[i - 1] < len(perms), "a query does not follow a permutation"
                out[i] = 128 + perms.index(tuple(image))
                i += 2
                continue
            assert x[i] < len(perms), f"byte {x[i]} at {i} is not an element of {group}"
            g = perms[x[i]]
            image = [image[g[v]] for v in range(degree)] if reversed_order else [g[v] for v in image]
            i += 1
        return out

    return solve


def solve_nback(n_back: int, in_bytes: bool = False) -> Solver:
    """Keep the letters seen; a query answers the one n_back before the latest, upper-cased. ``in_bytes``: a wrong
    reader that counts bytes instead of letters."""

    def solve(x: list[int]) -> dict[int, int]:
        letters, out = [], {}
        i = stream_start(x)
        while i < len(x):
            if x[i] == ord("?"):
                assert len(letters) > n_back, "a query before n_back + 1 letters"
                back = x[i - 1 - n_back] if in_bytes else letters[-1 - n_back]
                out[i] = ord(chr(back).upper())
                i += 2
                continue
            assert ord("a") <= x[i] <= ord("z"), f"byte {x[i]} at {i} is neither a letter nor a query"
            letters.append(x[i])
            i += 1
        return out

    return solve


@dataclass(frozen=True)
class Task:
    id: str
    make: Callable[..., object]
    kwargs: dict
    solve: Solver
    min_length: int


TASK_LIST = [
    Task("flipflop", FlipFlopDataModule, {}, solve_flipflop, 3),
    Task("flipflop-dense", FlipFlopDataModule, {"eval_p_ignore": 0.1}, solve_flipflop, 3),
    Task("parity", ModCountDataModule, {}, solve_modcount(2), 3),
    Task("parity-fed", ModCountDataModule, {"answers_in_input": True}, solve_modcount(2), 3),
    Task("parity-spans", ModCountDataModule, {"query_rate": 0.25}, solve_modcount(2), 3),
    Task("mod5", ModCountDataModule, {"modulus": 5, "query_rate": 0.5}, solve_modcount(5), 3),
    Task("s3", WordProblemDataModule, {"group": "S3"}, solve_word_problem("S3"), 3),
    Task("s5", WordProblemDataModule, {}, solve_word_problem("S5"), 3),
    Task("a5", WordProblemDataModule, {"group": "A5"}, solve_word_problem("A5"), 3),
    Task("s4-all-fed", WordProblemDataModule, {"group": "S4", "elements": "all", "answers_in_input": True},
         solve_word_problem("S4"), 3),
    Task("a4", WordProblemDataModule, {"group": "A4", "query_rate": 0.5}, solve_word_problem("A4"), 3),
    Task("s5-all", WordProblemDataModule, {"elements": "all", "query_rate": 0.25}, solve_word_problem("S5"), 3),
    Task("a5-all", WordProblemDataModule, {"group": "A5", "elements": "all", "query_rate": 0.5},
         solve_word_problem("A5"), 3),
    Task("nback", NBackDataModule, {}, solve_nback(4), 7),
    Task("nback1", NBackDataModule, {"n_back": 1, "n_symbols": 2, "query_rate": 1.0}, solve_nback(1), 4),
]
TASKS = pytest.mark.parametrize("task", TASK_LIST, ids=[t.id for t in TASK_LIST])


def module(task: Task, **kw):
    return task.make(**{"seq_len": 32, "batch_size": 4, "val_blocks": 6, **task.kwargs, **kw})


def check_block(task: Task, x: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> dict[int, int]:
    """The solver's answers, read from what the model reads (``x``, ℓ or ℓ + 1 bytes), are exactly the scored
    targets, with the bytes ``targets [ℓ]`` holds there; the model reads each answer only if the task feeds it
    back (else the hidden byte), and every other target given is the next byte of ``x``."""
    answers = task.solve(x.tolist())
    assert sorted(answers) == mask.nonzero().squeeze(1).tolist(), "scored targets are not the queries"
    fed = task.kwargs.get("answers_in_input", False) or task.make is FlipFlopDataModule
    for t, byte in answers.items():
        assert targets[t] == byte, f"target {t} is {int(targets[t])}, the rules say {byte}"
        if t + 1 < len(x):
            assert x[t + 1] == (byte if fed else HIDDEN), f"the model reads {int(x[t + 1])} at answer {t + 1}"
    off = ~mask[: len(x) - 1] & (targets[: len(x) - 1] != IGNORE)  # unscored targets (training items: none)
    assert (targets[: len(x) - 1][off] == x[1:][off]).all()
    assert (x != HIDDEN).all() if fed else (x == HIDDEN).sum() == sum(t + 1 < len(x) for t in answers)
    return answers


# --- every answer, at every kind of length ---------------------------------------------------------------


@TASKS
@pytest.mark.parametrize("length", ["min", 33, 64, 500], ids=lambda v: f"L{v}")
def test_every_answer_is_what_the_rules_imply(task, length):
    dm = module(task)
    length = task.min_length if length == "min" else length
    blocks, mask = dm.eval_blocks(length, 8 * length), dm.eval_mask(length, 8 * length)
    targets = dm.eval_targets(length, 8 * length)
    assert blocks.shape == (8, length + 1) and blocks.dtype == targets.dtype == torch.int64
    assert mask.shape == targets.shape == (8, length) and mask.dtype == torch.bool
    assert blocks.min() >= 0 and blocks.max() < dm.vocab_size == 256
    for x, t, m in zip(blocks, targets, mask, strict=True):
        answers = check_block(task, x, t, m)
        assert length - 1 in answers, "the block does not end on an answer"


@TASKS
def test_training_items_follow_the_same_rules(task):
    dm = module(task)
    for i in (0, 1, 999_999):
        x, t = dm.train_dataset()[i]
        assert x.shape == t.shape == (32,) and x.dtype == t.dtype == torch.int64
        check_block(task, x, t, t != IGNORE)
    dm.setup("fit")
    inputs, targets = next(iter(dm.train_dataloader()))
    assert inputs.shape == targets.shape == (4, 32)
    for x, t in zip(inputs, targets, strict=True):
        check_block(task, x, t, t != IGNORE)
    val = list(dm.val_dataloader())
    blocks, mask = dm.eval_blocks(32, 6 * 32), dm.eval_mask(32, 6 * 32)
    assert torch.equal(torch.cat([b[0] for b in val]), blocks[:, :-1])  # validation = the first evaluation blocks
    assert torch.equal(torch.cat([b[1] for b in val]), torch.where(mask, dm.eval_targets(32, 6 * 32), IGNORE))


# --- the documented statistics ---------------------------------------------------------------------------


def within(count: int, trials: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(count - trials * p) <= sigmas * math.sqrt(trials * p * (1 - p)) + 1


@pytest.mark.parametrize("p_train, p_eval", [(0.8, 0.98), (0.8, 0.1), (0.3, 0.6)])
def test_flipflop_densities(p_train, p_eval):
    """Training sequences draw instructions at p_ignore, evaluation blocks at eval_p_ignore; writes and reads
    share the rest evenly; the first instruction writes and the last reads."""
    dm = FlipFlopDataModule(seq_len=128, p_ignore=p_train, eval_p_ignore=p_eval)
    train = torch.stack([torch.cat([x, t[-1:]]) for x, t in (dm.train_dataset()[i] for i in range(60))])
    for blocks, p in ((train, p_train), (dm.eval_blocks(1024, 40 * 1024), p_eval)):
        ops = blocks[:, 1::2]  # [N, k] opcodes (ℓ + 1 odd: one newline first)
        assert (blocks[:, 0] == ord("\n")).all() and (ops[:, 0] == ord("w")).all() and (ops[:, -1] == ord("r")).all()
        middle = ops[:, 1:-1]
        n = middle.numel()
        ignores, writes = int((middle == ord("i")).sum()), int((middle == ord("w")).sum())
        assert within(ignores, n, p), f"{ignores} ignores in {n} at p={p}"
        assert within(writes, n - ignores, 0.5), f"{writes} writes among {n - ignores} writes and reads"


def test_flipflop_sparse_reads_go_further_back_at_longer_lengths():
    """At the sparse density a block of L holds write–read distances up to L only; longer blocks hold longer ones."""
    dm = FlipFlopDataModule(seq_len=128)

    def distances(length: int) -> list[int]:
        out = []
        for x in dm.eval_blocks(length, 64 * 128).tolist():
            last = None
            for t in range(1, len(x), 2):
                last = t if x[t] == ord("w") else last
                if x[t] == ord("r"):
                    out.append(t - last)
        return out

    short, long = distances(128), distances(4096)
    assert max(short) < 128 < max(long)
    assert sum(long) / len(long) > 1.5 * sum(short) / len(short)


QUERY_TASKS = [t for t in TASK_LIST if t.make is not FlipFlopDataModule]


@pytest.mark.parametrize("task", QUERY_TASKS, ids=[t.id for t in QUERY_TASKS])
def test_a_query_follows_an_element_at_query_rate(task):
    """Away from the start and the end, an element is followed by a query with probability query_rate."""
    dm = module(task)
    rate, first = dm.query_rate, task.min_length - 1
    follows = total = 0
    for x in dm.eval_blocks(2000, 10 * 2000).tolist():
        query = 0xFF if task.make is WordProblemDataModule else ord("?")
        elements = 0
        for i in range(1, len(x) - 5):  # after the start byte
            if x[i] == query or (i > 0 and x[i - 1] == query):
                continue
            elements += 1
            if elements >= first:
                total += 1
                follows += x[i + 1] == query
    assert within(follows, total, rate), f"{follows} of {total} elements followed by a query, rate {rate}"


@pytest.mark.parametrize("group, order, even", [("S5", 120, {0, 1}), ("A5", 60, {0}), ("S3", 6, {0, 1}),
                                                ("A4", 12, {0})])
def test_word_problem_elements_cover_the_group(group, order, even):
    dm = WordProblemDataModule(seq_len=128, group=group, elements="all")
    blocks = dm.eval_blocks(2048, 20 * 2048)
    seen = set(blocks[blocks < 128].tolist())  # elements: bytes 0..order-1; answers 128 + k; queries 0xFF
    answers = set((dm.eval_targets(2048, 20 * 2048)[dm.eval_mask(2048, 20 * 2048)] - 128).tolist())
    assert seen == set(range(order)) and answers == set(range(order))
    assert {inversions(PERMS[group][k]) % 2 for k in seen | answers} == even


@pytest.mark.parametrize("group, moved, count", [("S5", 2, 10), ("A5", 3, 20), ("S3", 2, 3), ("S4", 2, 6),
                                                 ("A4", 3, 8)])
def test_word_problem_generators_are_transpositions_or_3_cycles_and_reach_the_group(group, moved, count):
    dm = WordProblemDataModule(seq_len=128, group=group, elements="generators")
    blocks = dm.eval_blocks(2048, 20 * 2048)
    seen = set(blocks[blocks < 128].tolist())
    assert len(seen) == count
    assert all(sum(p != i for i, p in enumerate(PERMS[group][k])) == moved for k in seen)
    answers = set((dm.eval_targets(2048, 20 * 2048)[dm.eval_mask(2048, 20 * 2048)] - 128).tolist())
    assert answers == set(range(len(PERMS[group])))  # they generate the whole group


# --- through the evaluation: an oracle scores 1, a solver that breaks a rule does not ---------------------


def oracle(solve: Solver) -> Callable[[torch.Tensor], torch.Tensor]:
    """A model ``[b, ℓ] → [b, ℓ, 256]`` that puts a large logit on the solver's answer at every query."""

    def model(inputs: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*inputs.shape, 256)
        for r, x in enumerate(inputs.tolist()):
            for t, byte in solve(x).items():
                logits[r, t, byte] = 50.0
        return logits

    return model


@TASKS
def test_an_oracle_scores_one_at_every_length(task):
    dm = module(task)
    sets = eval_sets(dm, [32, 256], 2048)  # what the callback and `accrot eval` pass on
    results = evaluate_lengths(oracle(task.solve), sets.blocks, 32, masks=sets.masks, targets=sets.targets)
    for length, result in zip((32, 256), results, strict=True):
        mask = sets.masks[length]
        assert result.accuracy == 1.0 and result.nll < 1e-6 and result.tokens == int(mask.sum())
        assert set(result.bucket_accuracy) <= {1.0, None} and result.bucket_accuracy[-1] == 1.0  # the last answer


@pytest.mark.parametrize(
    "make, solve, ceiling",
    [
        # the register is the latest write, not the first: at the dense density most reads differ
        (lambda: FlipFlopDataModule(seq_len=32, eval_p_ignore=0.1), lambda x: solve_flipflop(x, first_write=True), 0.7),
        # the order of the product matters (S5 and A5 are not abelian): applying the newest first is near chance
        (lambda: WordProblemDataModule(seq_len=32), solve_word_problem("S5", reversed_order=True), 0.3),
        (lambda: WordProblemDataModule(seq_len=32, group="A5"), solve_word_problem("A5", reversed_order=True), 0.3),
        (lambda: WordProblemDataModule(seq_len=32, elements="all", query_rate=0.25),
         solve_word_problem("S5", reversed_order=True), 0.3),
        # N-back counts letters: counting bytes misses whenever a query came in between
        (lambda: NBackDataModule(seq_len=32, query_rate=0.5), solve_nback(4, in_bytes=True), 0.6),
    ],
    ids=["flipflop-first-write", "s5-reversed", "a5-reversed", "s5-all-reversed", "nback-bytes"],
)
def test_a_solver_that_breaks_a_rule_fails(make, solve, ceiling):
    dm = make()
    blocks, mask = dm.eval_blocks(256, 256 * 64), dm.eval_mask(256, 256 * 64)
    result = evaluate_length(oracle(solve), blocks, 32, mask=mask, targets=dm.eval_targets(256, 256 * 64))
    assert result.accuracy < ceiling


def one_step_reader(n: int) -> Solver:
    """A local rule, no running state: the previous answer as read in the input (0 when the model cannot read it)
    plus the 1-bits since the previous query, mod n."""

    def solve(x: list[int]) -> dict[int, int]:
        last, since, out = 0, 0, {}
        i = stream_start(x)
        while i < len(x):
            if x[i] == ord("?"):
                out[i] = ord("A") + (last + since) % n
                shown = x[i + 1] if i + 1 < len(x) else HIDDEN
                last, since = (shown - ord("A") if shown != HIDDEN else 0), 0
                i += 2
                continue
            since += x[i] == ord("1")
            i += 1
        return out

    return solve


@pytest.mark.parametrize("modulus", [2, 3])
def test_answers_fed_back_make_the_state_a_one_step_lookup(modulus):
    """Known truth for the layout: when the model reads the answers, a rule that only composes the previous answer
    with the bits since it is exact at any length; with the answers hidden the same rule is near chance, so every
    answer needs the whole prefix."""
    for fed, (lo, hi) in ((True, (1.0, 1.0)), (False, (0.0, 1 / modulus + 0.1))):
        dm = ModCountDataModule(seq_len=32, modulus=modulus, answers_in_input=fed)
        blocks, mask, targets = dm.eval_blocks(2048, 2048 * 8), dm.eval_mask(2048, 2048 * 8), \
            dm.eval_targets(2048, 2048 * 8)
        result = evaluate_length(oracle(one_step_reader(modulus)), blocks, 32, mask=mask, targets=targets)
        assert lo <= result.accuracy <= hi, (fed, result.accuracy)


# --- determinism, eval ≠ train, records -------------------------------------------------------------------


@TASKS
def test_deterministic_per_seed_and_budget_free(task):
    a, b, c = module(task), module(task), module(task, seed=1)
    assert torch.equal(a.eval_blocks(50, 500), b.eval_blocks(50, 500))
    assert torch.equal(a.eval_mask(50, 500), b.eval_mask(50, 500))
    assert torch.equal(a.train_dataset()[7][0], b.train_dataset()[7][0]) and a.fingerprint == b.fingerprint
    assert not torch.equal(a.eval_blocks(50, 500), c.eval_blocks(50, 500)) and a.fingerprint != c.fingerprint
    assert torch.equal(a.eval_blocks(50, 100), a.eval_blocks(50, 500)[:2])  # block i does not depend on N


@TASKS
def test_evaluation_blocks_are_not_training_sequences(task):
    dm = module(task, seq_len=64)
    train = {tuple(dm.train_dataset()[i][0].tolist()) for i in range(300)}
    evals = {tuple(x[:-1].tolist()) for x in dm.eval_blocks(64, 64 * 300)}
    assert not train & evals


def test_records_name_the_task_and_pickle():
    dm = FlipFlopDataModule(seq_len=64, eval_p_ignore=0.1)
    dm.eval_blocks(64, 640)
    info = json.loads(json.dumps(dm.describe()))
    assert info["task"] == "flipflop" and info["parameters"] == {"p_ignore": 0.8, "eval_p_ignore": 0.1}
    assert info["eval_blocks"]["64"]["blocks"] == 10 and info["tokenizer"]["vocab_size"] == 256
    assert FlipFlopDataModule(seq_len=64).fingerprint != dm.fingerprint  # the evaluated density is part of the data
    words = WordProblemDataModule(seq_len=64, group="A5")
    assert json.loads(json.dumps(words.describe()))["parameters"] == {"group": "A5", "elements": "generators",
                                                                       "query_rate": 1.0, "answers_in_input": False}
    assert words.fingerprint != WordProblemDataModule(seq_len=64).fingerprint
    for dm in (words, NBackDataModule(seq_len=64), ModCountDataModule(seq_len=64, modulus=3)):
        ds = pickle.loads(pickle.dumps(dm.train_dataset()))  # DataLoader workers under spawn
        assert torch.equal(ds[3][0], dm.train_dataset()[3][0])


# --- errors ----------------------------------------------------------------------------------------------


@TASKS
def test_too_short_lengths(task):
    n = task.min_length
    dm = module(task)
    with pytest.raises(DataError) as err:
        dm.eval_blocks(n - 1, 10 * n)
    assert f"{n - 1} cannot hold" in one_line(err) and f"minimum is {n}" in one_line(err)
    with pytest.raises(DataError) as err:
        module(task, seq_len=n - 1)
    assert one_line(err).startswith(f"seq_len={n - 1} cannot hold") and f">= {n}" in one_line(err)


@pytest.mark.parametrize(
    "make, kw, name",
    [
        (FlipFlopDataModule, {"p_ignore": 0.0}, "p_ignore"),
        (FlipFlopDataModule, {"p_ignore": 1.0}, "p_ignore"),
        (FlipFlopDataModule, {"eval_p_ignore": 1.5}, "eval_p_ignore"),
        (FlipFlopDataModule, {"eval_p_ignore": float("nan")}, "eval_p_ignore"),
        (FlipFlopDataModule, {"eval_p_ignore": True}, "eval_p_ignore"),
        (ModCountDataModule, {"modulus": 1}, "modulus"),
        (ModCountDataModule, {"modulus": 27}, "modulus"),
        (ModCountDataModule, {"query_rate": 0.0}, "query_rate"),
        (ModCountDataModule, {"query_rate": 1.01}, "query_rate"),
        (WordProblemDataModule, {"group": "S6"}, "group"),
        (WordProblemDataModule, {"query_rate": -1}, "query_rate"),
        (WordProblemDataModule, {"elements": "swaps"}, "elements"),
        (WordProblemDataModule, {"group": "S2"}, "group"),
        (ModCountDataModule, {"answers_in_input": "yes"}, "answers_in_input"),
        (NBackDataModule, {"n_back": 0}, "n_back"),
        (NBackDataModule, {"n_symbols": 1}, "n_symbols"),
        (NBackDataModule, {"n_symbols": 27}, "n_symbols"),
        (NBackDataModule, {"seed": -1}, "seed"),
        (NBackDataModule, {"seq_len": 0}, "seq_len"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_bad_arguments_raise_one_line(make, kw, name):
    with pytest.raises(DataError) as err:
        make(**kw)
    assert one_line(err).startswith(f"{name}=")


def test_nback_too_far_back_for_the_training_length():
    with pytest.raises(DataError) as err:
        NBackDataModule(seq_len=128, n_back=200)
    assert one_line(err) == ("seq_len=128 cannot hold a nback sequence with its answer; use seq_len >= 203 "
                             "for n_back=200, or a smaller n_back")


# --- end to end ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["FlipFlopDataModule", "WordProblemDataModule"])
def test_fit_through_the_cli(task, tmp_path):
    rc = main(["fit", "--config", "tiny", f"--data=data_modules.{task}", "--trainer.fast_dev_run=true",
               "--wandb=disabled", "--trainer.enable_progress_bar=false", "--extrapolation.multipliers=[1,2]",
               "--extrapolation.budget_tokens=512", f"--root={tmp_path}"])
    assert rc == 0
    (path,) = tmp_path.glob("*/*/extrapolation.json")
    doc = json.loads(path.read_text())
    assert doc["data"]["task"] == {"FlipFlopDataModule": "flipflop", "WordProblemDataModule": "word_problem"}[task]
    first = doc["final"]["lengths"][0]
    assert first["length"] == 128 and first["tokens"] == doc["data"]["eval_blocks"]["128"]["scored"]  # answers only

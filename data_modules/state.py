"""State-tracking tasks: flip-flop, parity and counting mod n, word problems (S3 … S5, A4, A5), N-back recall.

What an accumulated transformation can carry across lengths. Accumulated SO(2) rotations commute, so they can
hold an abelian running state (a parity, a count mod n: an angle of 2π/n per 1-bit is an exact clock at any
length) and nothing more; products of Householder reflections (PaTH) do not commute and can hold a permutation
(the word problems: S3 is the smallest group that does not commute, A5's is NC¹-complete by Barrington's
theorem); flip-flop and N-back ask for a precise
read of one earlier token among a far set that grows with the length.

The four tasks share the machinery of :mod:`data_modules.synthetic` (their base class is its
:class:`SyntheticDataModule`): every sequence is generated on the CPU from a ``torch.Generator`` seeded by
``sha256("accrot.synthetic/<task>/<seed>/<split>/<length>/<index>")``, so training item i and evaluation block i
at length ℓ are the same in every process and for every model (block i does not depend on the budget); batches
are ``(inputs [B, T], targets [B, T])`` int64 with ``targets = -100`` off the answers; :meth:`eval_blocks` gives
``[N, ℓ + 1]`` bytes as the model reads them, :meth:`eval_targets` the ``[N, ℓ]`` targets and :meth:`eval_mask`
the scored ones (the targets are blocks[:, 1:] except at the answers the model does not read, below). Only the
answers are scored, so the evaluation reports the answers' accuracy (and NLL) per length and per position bucket.
Tokens are bytes (vocab 256); each task's encoding is below. Nothing is downloaded.

**Query streams** (parity / mod n, word problems, N-back). A sequence of n = ℓ + 1 bytes is the start byte 0xFD
(the origin the running state starts from: a relative scheme has no other way to find the beginning), then a stream
of *elements* (one byte each) with *queries* (the query byte, then the answer byte) between them. Left to right:
an element; then, with probability ``query_rate``, a query, provided the task's first query is due (N-back: after
n_back + 1 elements; the others: after one) and an element still fits between it and the end. The last two bytes
are always a query, so every sequence ends on an answer and a query always follows an element. The answer of a
query is a function of all the elements before it (the queries and answers do not count):

* **parity and counting mod n** (:class:`ModCountDataModule`, task ``modcount``; ``modulus=2`` is parity).
  Elements are uniform bits ``0``/``1``; the query byte is ``?``; the answer is the number of 1-bits so far,
  mod n, as a letter (``A`` = 0, ``B`` = 1, ...). ``^0110?C1?A`` for n = 3 (``^``: the start byte).
* **word problems** (:class:`WordProblemDataModule`, task ``word_problem``): S3, S4, S5 (every permutation of 3, 4,
  5 objects) and A4, A5 (the even ones). Elements are permutations of {0, …, k − 1}, uniform over the group or,
  with ``elements="generators"``, uniform over a generating set (S_k: the transpositions, one reflection each,
  the product a Householder path can carry token by token; A_k: the 3-cycles), numbered in lexicographic
  order of their one-line notation (p(0) … p(k − 1); S5: 01234 is 0, 01243 is 1, …, 43210 is 119; A_k: the even
  ones in the same order) and written as one byte, that number (0–119). The query byte is 0xFF. The answer is the
  running product g_t ∘ … ∘ g_2 ∘ g_1 of the elements so far (g_1 applied first: the state of the objects moved
  by each permutation in turn), as the byte 128 + its number. S3 is the smallest group that does not commute.
* **N-back recall** (:class:`NBackDataModule`, task ``nback``). Elements are uniform letters ``a``, ``b``, … of an
  alphabet of ``n_symbols``; the query byte is ``?``; the answer is the element n_back steps before the most
  recent one (n_back = 1: the one before it), in upper case: ``^abcd?B`` for n_back = 2. The distance in bytes to
  the recalled element is n_back + 1 plus two per query in between: reading it needs a count of elements, not of
  bytes.

**The model does not read the answers** (``answers_in_input=False``, the default): the answer byte is a target,
and what the model reads in its place is the byte 0xFE (``^0?■1?■1?■`` — ■ for 0xFE — with targets B, C, A at the
queries), so every answer is a function of the whole prefix of elements, as in the word-problem and parity
literature, where each prefix is labelled and nothing is fed back. With the answers fed back (``true``) a query
is the previous answer composed with the elements since it, a one-step lookup that any model with local attention
solves at every length (a test shows a rule that reads only the previous answer is exact there and at chance with
the answers hidden); that layout is kept for comparison only. What grows with the evaluation length is therefore
the prefix each answer needs: up to 64× L elements at 64× L.

Defaults are what a tiny model can be asked at L = 128 in a few hundred steps: every element is answered
(``query_rate=1``, the dense labels of the literature: the most training signal per sequence), the word problems
drawn from their generators; N-back queries a quarter of the letters.

**Flip-flop language modelling** (:class:`FlipFlopDataModule`, task ``flipflop``; Liu et al.'s FFL(p)).
A sequence is instructions of two bytes, an opcode ``w`` (write), ``i`` (ignore) or ``r`` (read) and an operand
``0``/``1`` (``w1i0i1r1w0r0``). Instruction 1 is a write and the last one a read; the others are i.i.d.: an
ignore with probability p (the ignore density), a write or a read with (1 − p)/2 each. Write and ignore operands
are uniform bits; a read's operand is the operand of the latest write, and it is the only scored target. A
block of ℓ + 1 bytes holds ⌊(ℓ + 1)/2⌋ instructions, after one newline byte when ℓ + 1 is odd (every even ℓ,
so every multiple of an even L).

Training sequences use ``p_ignore`` (0.8, the authors' training density) and evaluation blocks ``eval_p_ignore``
(0.98 by default: the authors' sparse out-of-distribution density; their dense one is 0.1). The ablation
registers two data sets, ``flipflop`` (sparse evaluation) and ``flipflop-dense`` (0.1), rather than one with both
densities mixed: the evaluation scores one fixed set per length, and mixed in one set the dense reads (45 per
100 instructions against 1) would decide every length's accuracy, hiding the sparse reads the far-mass question
is about. Both train the same models (the same training density and seed); a checkpoint of one can be
evaluated at the other's density with ``accrot eval --ckpt CKPT --config CONFIG`` whose data names the other
``eval_p_ignore``.

What grows with the length: the instructions before each read (earlier writes of either bit, and ignores).
The distance from a read back to its write is geometric with mean 2/(1 − p) instructions, cut at the block's
first write: at the sparse density (mean 100 instructions = 200 bytes, beyond L = 128) a block of L holds
only distances up to L, and longer blocks hold longer ones, to a few L at 64× L; it does not grow in proportion
to ℓ (a read reveals the bit again, so distances ∝ ℓ would again leave O(1) reads per block).

References: B. Liu, J. T. Ash, S. Goel, A. Krishnamurthy, C. Zhang, "Exposing Attention Glitches with Flip-Flop
Language Modeling", NeurIPS 2023, arXiv:2306.00946 (FFL(p), the 0.8 / 0.98 / 0.1 densities). W. Merrill,
J. Petty, A. Sabharwal, "The Illusion of State in State-Space Models", ICML 2024, arXiv:2404.08819 (S5/A5 word
problems). D. A. M. Barrington, "Bounded-width polynomial-size branching programs recognize exactly those
languages in NC¹", JCSS 1989. M. Hahn, "Theoretical Limitations of Self-Attention in Neural Sequence Models",
TACL 2020 (parity). R. Grazzi et al., "Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues",
ICLR 2025, arXiv:2411.12537 (parity, counting mod n). W. K. Kirchner, "Age differences in short-term retention of
rapidly changing information", J. Exp. Psychol. 1958 (N-back).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch

from accrot.errors import DataError
from data_modules.streams import check_int
from data_modules.synthetic import SyntheticDataModule
from data_modules.tokenizer import ByteTokenizer

QUERY = ord("?")  # parity / mod n and N-back
WORD_QUERY = 0xFF  # word problems: every byte below 0xF8 is an element or an answer
START = 0xFD  # the first byte of every query stream: the origin the running state starts from
HIDDEN = 0xFE  # what the model reads in place of an answer it is not shown (no task uses this byte otherwise)
ANSWER_BASE = 128  # word problems: the answer to group element number k is the byte 128 + k
MAX_MODULUS = 26  # answers are the letters A..Z
MAX_SYMBOLS = 26  # N-back elements are the letters a..z
GROUPS = ("S3", "S4", "S5", "A4", "A5")  # the symmetric and alternating groups of 3 to 5 objects
ELEMENTS = ("all", "generators")
FLIP_OPS = {"write": ord("w"), "ignore": ord("i"), "read": ord("r")}
BIT = (ord("0"), ord("1"))
NEWLINE = ord("\n")


# ---------------------------------------------------------------------------------------------------
# the query-stream layout shared by parity / mod n, the word problems and N-back
# ---------------------------------------------------------------------------------------------------
def query_layout(u: list[float], n: int, rate: float, first: int) -> tuple[list[int], list[int]]:
    """``(element positions, query positions)`` of a sequence of ``n`` bytes (module docstring's rule).

    ``u`` holds at least n uniform draws (one per element is used); ``first`` is how many elements come before
    the first query. A query at q occupies bytes q (query) and q + 1 (answer); the last one sits at n − 2.
    """
    elements, queries = [], []
    i = 1  # byte 0 is the start byte
    while i < n - 2:
        elements.append(i)
        i += 1
        # a query here must leave room for an element before the final query at n - 2
        if len(elements) >= first and i + 2 <= n - 3 and u[len(elements) - 1] < rate:
            queries.append(i)
            i += 2
    queries.append(n - 2)
    return elements, queries


class QueryStreamTask:
    """A task of the query-stream family: a subclass names its bytes and computes the answers.

    Subclass contract: ``query_rate``, ``query_byte``, ``first`` (elements before the first query),
    ``draw(g, n) -> [n] element indices``, ``element_bytes(e) -> [m] bytes``, ``answer_bytes(e, counts) -> [k]``
    (the answers of queries that follow ``counts[j]`` elements).
    """

    name: str
    vocab_size = 256
    query_rate: float
    query_byte: int
    first: int
    answers_in_input: bool

    @property
    def hidden_answer(self) -> int | None:
        """The byte the model reads in place of every answer (None: it reads the answers; module docstring)."""
        return None if self.answers_in_input else HIDDEN

    @property
    def min_length(self) -> int:
        return self.first + 2  # n = ℓ + 1 bytes: the start byte, `first` elements, the final query and its answer

    def sample(self, g: torch.Generator, length: int, split: str, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x [ℓ+1] int64 bytes, mask [ℓ] bool)``; the rules do not depend on the split or the index."""
        n = length + 1
        u = torch.rand(n, generator=g).tolist()
        drawn = self.draw(g, n)  # [n] element indices; the first len(elements) are used
        elements, queries = query_layout(u, n, self.query_rate, self.first)
        e = drawn[: len(elements)]  # [m]
        q = torch.tensor(queries)  # [k]
        counts = torch.searchsorted(torch.tensor(elements), q)  # [k] elements before each query
        x = torch.full((n,), START, dtype=torch.long)  # byte 0 stays the start byte
        x[elements] = self.element_bytes(e)
        x[q] = self.query_byte
        x[q + 1] = self.answer_bytes(e, counts)
        mask = torch.zeros(length, dtype=torch.bool)
        mask[q] = True  # target index q is x[q + 1], the answer
        return x, mask


@dataclass(frozen=True)
class ModCountTask(QueryStreamTask):
    """Parity (modulus 2) and counting mod n of a bit stream (module docstring)."""

    modulus: int
    query_rate: float
    answers_in_input: bool = False

    name = "modcount"
    query_byte = QUERY
    first = 1

    def draw(self, g: torch.Generator, n: int) -> torch.Tensor:
        return torch.randint(2, (n,), generator=g)

    def element_bytes(self, e: torch.Tensor) -> torch.Tensor:
        return e + BIT[0]

    def answer_bytes(self, e: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        ones = torch.cat([torch.zeros(1, dtype=torch.long), e.cumsum(0)])  # [m + 1] ones among the first j
        return ones[counts] % self.modulus + ord("A")


def _is_even(p: tuple[int, ...]) -> bool:
    """A permutation is even iff n minus its number of cycles is even."""
    seen, cycles = set(), 0
    for start in range(len(p)):
        if start not in seen:
            cycles += 1
            j = start
            while j not in seen:
                seen.add(j)
                j = p[j]
    return (len(p) - cycles) % 2 == 0


@functools.cache
def group_table(group: str) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """``(elements, table)``: the group's permutations in lexicographic order and ``table[s][g]``, the number of
    g ∘ s (s applied first)."""
    degree = int(group[1:])
    perms = [p for p in itertools.permutations(range(degree)) if group[0] == "S" or _is_even(p)]  # lexicographic
    number = {p: k for k, p in enumerate(perms)}
    table = tuple(tuple(number[tuple(g[s[i]] for i in range(degree))] for g in perms) for s in perms)
    return tuple(perms), table


@functools.cache
def generators(group: str) -> tuple[int, ...]:
    """Numbers of the generating set: a symmetric group's transpositions (2 points moved), an alternating group's
    3-cycles (3 points moved)."""
    moved = 2 if group[0] == "S" else 3
    perms, _ = group_table(group)
    return tuple(k for k, p in enumerate(perms) if sum(p[i] != i for i in range(len(p))) == moved)


@functools.cache
def commuting_ceiling(group: str) -> float:
    """The best answer accuracy of any commuting (abelian) running state on the group's word problem: 1/|G'|.

    A state that composes commutatively can hold the product only up to the commutator subgroup G' (it factors
    through the abelianisation G/G'), so among the |G'| products with the same image it cannot tell which one is
    right: S_n' = A_n (the sign is all it holds: 1/3 for S3, 1/60 for S5), A4' = the Klein four-group (1/4), A5 is
    perfect (1/60: nothing beyond chance).
    """
    perms, table = group_table(group)
    inverse = [row.index(0) for row in table]  # table[s][g] = g ∘ s; the identity is number 0
    def compose(x: int, y: int) -> int:  # x ∘ y (y applied first)
        return table[y][x]

    n = len(perms)
    derived = {compose(compose(a, b), compose(inverse[a], inverse[b])) for a in range(n) for b in range(n)}
    while True:  # close the commutators under composition
        grown = derived | {compose(a, b) for a in derived for b in derived}
        if grown == derived:
            return 1 / len(derived)
        derived = grown


@dataclass(frozen=True)
class WordProblemTask(QueryStreamTask):
    """The S5 / A5 word problem: the running product of a stream of permutations (module docstring)."""

    group: str
    elements: str
    query_rate: float
    answers_in_input: bool = False

    name = "word_problem"
    query_byte = WORD_QUERY
    first = 1

    @property
    def order(self) -> int:
        return len(group_table(self.group)[0])

    def draw(self, g: torch.Generator, n: int) -> torch.Tensor:
        if self.elements == "all":
            return torch.randint(self.order, (n,), generator=g)
        pool = torch.tensor(generators(self.group))
        return pool[torch.randint(len(pool), (n,), generator=g)]

    def element_bytes(self, e: torch.Tensor) -> torch.Tensor:
        return e

    def answer_bytes(self, e: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        perms, table = group_table(self.group)
        state = 0  # the identity: the first in lexicographic order
        running = [state]  # running[j]: the product of the first j elements
        for k in e.tolist():
            state = table[state][k]
            running.append(state)
        return torch.tensor(running)[counts] + ANSWER_BASE


@dataclass(frozen=True)
class NBackTask(QueryStreamTask):
    """N-back recall: the element n_back steps before the most recent one (module docstring)."""

    n_back: int
    n_symbols: int
    query_rate: float
    answers_in_input: bool = False

    name = "nback"
    query_byte = QUERY

    @property
    def first(self) -> int:
        return self.n_back + 1

    def draw(self, g: torch.Generator, n: int) -> torch.Tensor:
        return torch.randint(self.n_symbols, (n,), generator=g)

    def element_bytes(self, e: torch.Tensor) -> torch.Tensor:
        return e + ord("a")

    def answer_bytes(self, e: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return e[counts - 1 - self.n_back] + ord("A")  # counts - 1: the most recent element


# ---------------------------------------------------------------------------------------------------
# flip-flop
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlipFlopTask:
    """Flip-flop language FFL(p) (module docstring); ``p_ignore`` for training, ``eval_p_ignore`` otherwise."""

    p_ignore: float
    eval_p_ignore: float

    name = "flipflop"
    vocab_size = 256
    min_length = 3  # "w0r0": one write and one read

    def sample(self, g: torch.Generator, length: int, split: str, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x [ℓ+1] int64 bytes, mask [ℓ] bool)``; the split picks the density."""
        p = self.p_ignore if split == "train" else self.eval_p_ignore
        k = (length + 1) // 2  # instructions
        pad = (length + 1) % 2  # one leading newline when ℓ + 1 is odd
        u = torch.rand(k, generator=g)  # [k]
        op = torch.where(u < p, 1, torch.where(u < p + (1 - p) / 2, 0, 2))  # [k] 0 write, 1 ignore, 2 read
        op[0], op[-1] = 0, 2
        bit = torch.randint(2, (k,), generator=g)  # [k]
        pos = torch.arange(k)
        latest = torch.cummax(torch.where(op == 0, pos, -1), 0).values  # [k] index of the latest write (>= 0)
        bit = torch.where(op == 2, bit[latest], bit)
        codes = torch.tensor([FLIP_OPS["write"], FLIP_OPS["ignore"], FLIP_OPS["read"]])
        pairs = torch.stack([codes[op], bit + BIT[0]], 1).reshape(-1)  # [2k]: opcode, operand, ...
        x = torch.cat([torch.full((pad,), NEWLINE), pairs])  # [ℓ + 1]
        mask = torch.zeros(length, dtype=torch.bool)
        mask[pad + 2 * pos[op == 2]] = True  # target index of a read's opcode byte = its operand
        return x, mask


# ---------------------------------------------------------------------------------------------------
# the data modules
# ---------------------------------------------------------------------------------------------------
def _check_rate(name: str, value: object, closed: bool) -> float:
    """A probability in (0, 1), or (0, 1] with ``closed``; one line otherwise (NaN fails every comparison)."""
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not (number and (0 < value <= 1 if closed else 0 < value < 1)):
        raise DataError(f"{name}={value!r} is not valid; use a number in (0, 1{']' if closed else ')'}")
    return float(value)


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise DataError(f"{name}={value!r} is not valid; use true or false")
    return value


class StateTaskDataModule(SyntheticDataModule):
    """What the state-tracking modules share beyond :class:`SyntheticDataModule`: bytes, and a training length
    checked against the task's shortest sequence at construction."""

    def _init_task(self, task) -> None:
        if self.seq_len < task.min_length:
            raise DataError(f"seq_len={self.seq_len} cannot hold a {task.name} sequence with its answer; "
                            f"use seq_len >= {task.min_length}{self._why_short()}")
        self.task = task
        self.tokenizer = ByteTokenizer()

    def _why_short(self) -> str:
        return ""

    def _check_length(self, name: str, length: int) -> None:
        check_int(name, length, 1)
        if length < self.task.min_length:
            raise DataError(f"{name} {length} cannot hold a {self.task.name} sequence with its answer; "
                            f"the minimum is {self.task.min_length}{self._why_short()}")


class FlipFlopDataModule(StateTaskDataModule):
    """Flip-flop language modelling: read the latest written bit among ignores; reads are the scored targets.

    Generation rules and the choice of one evaluated density per data module: module docstring.

    Args:
        seq_len: training length T (at least 3: one write and one read).
        p_ignore: the ignore density of training sequences, in (0, 1) (0.8: the authors' training density).
        eval_p_ignore: the ignore density of the evaluation blocks and the per-epoch validation, in (0, 1)
            (0.98: the authors' sparse density; 0.1: their dense one).
        batch_size, seed, num_workers, val_blocks: as in :class:`TokenStreamDataModule`.
    """

    def __init__(
        self,
        seq_len: int = 128,
        p_ignore: float = 0.8,
        eval_p_ignore: float = 0.98,
        batch_size: int = 16,
        seed: int = 0,
        num_workers: int = 0,
        val_blocks: int = 32,
    ) -> None:
        task = FlipFlopTask(p_ignore=_check_rate("p_ignore", p_ignore, closed=False),
                            eval_p_ignore=_check_rate("eval_p_ignore", eval_p_ignore, closed=False))
        super().__init__(seq_len, batch_size, num_workers, seed, val_blocks)
        self.p_ignore, self.eval_p_ignore = task.p_ignore, task.eval_p_ignore
        self._init_task(task)


class ModCountDataModule(StateTaskDataModule):
    """Parity (``modulus=2``) and counting mod n of a bit stream, answered at query positions.

    Generation rules: module docstring.

    Args:
        seq_len: training length T (at least 2: one bit, a query and its answer).
        modulus: n, 2..26 (the answers are the letters A..Z).
        query_rate: probability that a query follows a bit, in (0, 1] (1: every bit is answered; module docstring
            for the choice).
        answers_in_input: whether the model reads the answers (false: it reads the byte 0xFE in their place, so
            every answer needs the whole prefix; true: the leaky layout, where an answer is the previous one and
            the bits since; module docstring).
        batch_size, seed, num_workers, val_blocks: as in :class:`TokenStreamDataModule`.
    """

    def __init__(
        self,
        seq_len: int = 128,
        modulus: int = 2,
        query_rate: float = 1.0,
        answers_in_input: bool = False,
        batch_size: int = 16,
        seed: int = 0,
        num_workers: int = 0,
        val_blocks: int = 32,
    ) -> None:
        if isinstance(modulus, bool) or not isinstance(modulus, int) or not 2 <= modulus <= MAX_MODULUS:
            raise DataError(f"modulus={modulus!r} is not valid; use an integer in 2..{MAX_MODULUS} "
                            "(2 is parity; the answers are the letters A..Z)")
        task = ModCountTask(modulus=modulus, query_rate=_check_rate("query_rate", query_rate, closed=True),
                            answers_in_input=_check_flag("answers_in_input", answers_in_input))
        super().__init__(seq_len, batch_size, num_workers, seed, val_blocks)
        self.modulus, self.query_rate, self.answers_in_input = modulus, task.query_rate, answers_in_input
        self._init_task(task)


class WordProblemDataModule(StateTaskDataModule):
    """The S5 or A5 word problem: a stream of permutations, their running product answered at query positions.

    Generation rules and the byte encoding of the permutations: module docstring.

    Args:
        seq_len: training length T (at least 2: one permutation, a query and its answer).
        group: ``S5`` (all 120 permutations of five objects) or ``A5`` (the 60 even ones).
        elements: ``generators`` (uniform over S5's transpositions or A5's 3-cycles; the answers still range over
            the whole group) or ``all`` (uniform over the group).
        query_rate: probability that a query follows a permutation, in (0, 1] (1: every one is answered).
        answers_in_input: whether the model reads the answers (false: the byte 0xFE in their place; module
            docstring).
        batch_size, seed, num_workers, val_blocks: as in :class:`TokenStreamDataModule`.
    """

    def __init__(
        self,
        seq_len: int = 128,
        group: str = "S5",
        elements: str = "generators",
        query_rate: float = 1.0,
        answers_in_input: bool = False,
        batch_size: int = 16,
        seed: int = 0,
        num_workers: int = 0,
        val_blocks: int = 32,
    ) -> None:
        if group not in GROUPS:
            raise DataError(f"group={group!r} is not valid; choose one of {', '.join(GROUPS)}")
        if elements not in ELEMENTS:
            raise DataError(f"elements={elements!r} is not valid; choose one of {', '.join(ELEMENTS)}")
        task = WordProblemTask(group=group, elements=elements,
                               query_rate=_check_rate("query_rate", query_rate, closed=True),
                               answers_in_input=_check_flag("answers_in_input", answers_in_input))
        super().__init__(seq_len, batch_size, num_workers, seed, val_blocks)
        self.group, self.elements, self.query_rate = group, elements, task.query_rate
        self.answers_in_input = answers_in_input
        self._init_task(task)


class NBackDataModule(StateTaskDataModule):
    """N-back recall: the letter n_back steps before the most recent one, answered at query positions.

    Generation rules: module docstring.

    Args:
        seq_len: training length T (at least n_back + 2: n_back + 1 letters, a query and its answer).
        n_back: how far back the recalled letter is, counted in letters (queries do not count), >= 1.
        n_symbols: alphabet size, 2..26 (the letters a..z; answers in upper case).
        query_rate: probability that a query follows a letter (once n_back + 1 letters are in), in (0, 1].
        answers_in_input: whether the model reads the answers (false: the byte 0xFE in their place; module
            docstring).
        batch_size, seed, num_workers, val_blocks: as in :class:`TokenStreamDataModule`.
    """

    def __init__(
        self,
        seq_len: int = 128,
        n_back: int = 4,
        n_symbols: int = 8,
        query_rate: float = 0.25,
        answers_in_input: bool = False,
        batch_size: int = 16,
        seed: int = 0,
        num_workers: int = 0,
        val_blocks: int = 32,
    ) -> None:
        check_int("n_back", n_back, 1)
        if isinstance(n_symbols, bool) or not isinstance(n_symbols, int) or not 2 <= n_symbols <= MAX_SYMBOLS:
            raise DataError(f"n_symbols={n_symbols!r} is not valid; use an integer in 2..{MAX_SYMBOLS} "
                            "(the letters a..z)")
        task = NBackTask(n_back=n_back, n_symbols=n_symbols,
                         query_rate=_check_rate("query_rate", query_rate, closed=True),
                         answers_in_input=_check_flag("answers_in_input", answers_in_input))
        super().__init__(seq_len, batch_size, num_workers, seed, val_blocks)
        self.n_back, self.n_symbols, self.query_rate = n_back, n_symbols, task.query_rate
        self.answers_in_input = answers_in_input
        self._init_task(task)

    def _why_short(self) -> str:
        return f" for n_back={self.n_back}, or a smaller n_back"

"""Formal languages in the Chomsky-hierarchy suite's form: one problem per row, the answer one class.

The three tasks the state-tracking literature trains on lengths 3–40 and tests on 40–256 (Delétang et al., "Neural
Networks and the Chomsky Hierarchy", ICLR 2023; trained and scored that way by Grazzi et al., "Unlocking
State-Tracking in Linear RNNs Through Negative Eigenvalues", ICLR 2025). Each generator follows the suite's own
definition (its ``tasks/regular/parity_check.py``, ``tasks/regular/modular_arithmetic.py`` and
``tasks/dcf/modular_arithmetic_brackets.py``); the size n is the suite's length, the number of input symbols.

- **parity**: n symbols from {a, b}, each uniform; the answer is ``0`` when the number of b's is even, ``1`` when it
  is odd (two classes). An abelian running state: a rotation by π per b solves it at any length.
- **modarith** (no brackets): numbers 0..4 and operators alternating, ``d op d op … d`` (n odd: (n + 1) / 2 numbers),
  operators drawn from ``+ - *``; the answer is the expression's value mod 5 under the usual precedence (``*``
  before ``+`` and ``-``, left to right otherwise): ``1-1-1`` is 4, ``1+2*3`` is 2 (five classes).
- **modarith-brackets**: the suite's recursive expressions of exactly n symbols: 1 → ``d``, 2 → ``-d``, 3 →
  ``(d)``, 4 → ``(-d)``, n ≥ 5 → ``(`` left ``op`` right ``)`` with the left size drawn uniformly from 1..n − 4 and
  the right size n − 3 − left, operators ``+ -``; the answer is the value mod 5 (five classes). A context-free
  language: its state is a stack.

Rows, scoring, the curriculum and the seeding are :mod:`data_modules.examples`' (every generator is a function of the
item's own generator only, so an example is a function of (task, seed, split, index, size)).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from accrot.errors import DataError
from data_modules.examples import ExampleDataModule
from data_modules.tokenizer import ByteTokenizer

MODULUS = 5  # the suite's default for both arithmetic tasks
DIGITS = tuple(ord(str(d)) for d in range(MODULUS))


class ParityTask:
    name = "parity"
    classes = (ord("0"), ord("1"))
    min_size = 1

    def valid_size(self, size: int) -> int:
        return size

    def problem(self, g: torch.Generator, size: int) -> tuple[list[int], int]:
        bits = torch.randint(2, (size,), generator=g)
        return [ord("a") + int(b) for b in bits], self.classes[int(bits.sum()) % 2]

    def prefix_answers(self, symbols: Sequence[int]) -> list[int | None]:
        """``[n]``: the answer byte of every prefix s_1..s_i (the parity of its b's so far)."""
        out, odd = [], 0
        for s in symbols:
            odd ^= s == ord("b")
            out.append(self.classes[odd])
        return out


def _value(symbols: Sequence[int]) -> int:
    """The value mod 5 of an expression of digits, ``+ - *`` and brackets, precedence as usual (recursive descent)."""
    pos = 0

    def peek() -> int | None:
        return symbols[pos] if pos < len(symbols) else None

    def take() -> int:
        nonlocal pos
        pos += 1
        return symbols[pos - 1]

    def atom() -> int:
        c = take()
        if c == ord("-"):
            return -atom()
        if c == ord("("):
            v = expr()
            take()  # ")"
            return v
        return c - ord("0")

    def term() -> int:
        v = atom()
        while peek() == ord("*"):
            take()
            v = v * atom()
        return v

    def expr() -> int:
        v = term()
        while peek() in (ord("+"), ord("-")):
            v = v + term() if take() == ord("+") else v - term()
        return v

    return expr() % MODULUS


class _Arithmetic:
    """What the two arithmetic tasks share: digits 0..4 as the classes, and the operators drawn."""

    classes = DIGITS
    min_size = 1
    default_operators = "+-"

    def __init__(self, operators: str | None = None) -> None:
        self.operators = tuple(ord(c) for c in (operators or self.default_operators))

    def valid_size(self, size: int) -> int:
        return size


class ModArithTask(_Arithmetic):
    """Modular arithmetic without brackets (module docstring); ``operators`` a subset of ``+-*``."""

    name = "modarith"
    default_operators = "+-*"

    def valid_size(self, size: int) -> int:
        return size if size % 2 else size - 1

    def problem(self, g: torch.Generator, size: int) -> tuple[list[int], int]:
        n = self.valid_size(size)
        numbers = torch.randint(MODULUS, ((n + 1) // 2,), generator=g)
        ops = torch.randint(len(self.operators), ((n - 1) // 2,), generator=g)
        symbols = [DIGITS[int(numbers[0])]]
        for o, d in zip(ops.tolist(), numbers[1:].tolist(), strict=True):
            symbols += [self.operators[o], DIGITS[d]]
        return symbols, DIGITS[_value(symbols)]

    def prefix_answers(self, symbols: Sequence[int]) -> list[int | None]:
        """``[n]``: the value of every prefix that is an expression (it ends on a number), None after an operator."""
        return [DIGITS[_value(symbols[:i + 1])] if i % 2 == 0 else None for i in range(len(symbols))]


class ModArithBracketsTask(_Arithmetic):
    """Modular arithmetic with brackets: the suite's recursive expressions (module docstring)."""

    name = "modarith-brackets"

    def _expression(self, g: torch.Generator, n: int) -> list[int]:
        digit = DIGITS[int(torch.randint(MODULUS, (), generator=g))]
        if n == 1:
            return [digit]
        if n == 2:
            return [ord("-"), digit]
        if n == 3:
            return [ord("("), digit, ord(")")]
        if n == 4:
            return [ord("("), ord("-"), digit, ord(")")]
        left = 1 + int(torch.randint(n - 4, (), generator=g))
        op = self.operators[int(torch.randint(len(self.operators), (), generator=g))]
        return [ord("("), *self._expression(g, left), op, *self._expression(g, n - 3 - left), ord(")")]

    def problem(self, g: torch.Generator, size: int) -> tuple[list[int], int]:
        symbols = self._expression(g, size)
        return symbols, DIGITS[_value(symbols)]


TASKS = {"parity": ParityTask, "modarith": ModArithTask, "modarith-brackets": ModArithBracketsTask}


class FormalLanguageDataModule(ExampleDataModule):
    """One of the formal languages above, one problem per row, scored on its answer (:mod:`data_modules.examples`).

    Args:
        task: ``parity``, ``modarith`` or ``modarith-brackets``.
        train_lengths: ``[shortest, longest]`` problem size drawn uniformly per training example (the suite's
            training range is 3–40).
        curriculum: instead of ``train_lengths``, stages ``[[first_step, shortest, longest], …]`` (the first at step
            0): the sizes drawn move with the optimiser step, and a resumed run continues its stage.
        operators: the arithmetic tasks' operators (default: the suite's, ``+-*`` without brackets, ``+-`` with).
        prefix_labels: a deviation from the suite, training rows only: every prefix that is a problem of its own
            is labelled too (the target at the position reading s_i is the answer of s_1..s_i; an arithmetic prefix
            ending on an operator has none), as Merrill et al.'s and Grazzi et al.'s §5.2 word problems label every
            prefix. The inputs are unchanged and evaluation scores the final answer only. Not for the bracketed
            language, whose prefixes are mostly not expressions.
        batch_size, seed, num_workers, val_blocks: as in :class:`~data_modules.streams.TokenStreamDataModule`
            (validation reads ``val_blocks`` problems at the longest training size).
    """

    def __init__(
        self,
        task: str = "parity",
        train_lengths: list[int] = (3, 40),  # type: ignore[assignment]
        curriculum: list[list[int]] | None = None,
        operators: str | None = None,
        prefix_labels: bool = False,
        batch_size: int = 32,
        seed: int = 0,
        num_workers: int = 0,
        val_blocks: int = 64,
    ) -> None:
        if task not in TASKS:
            raise DataError(f"task={task!r} is not a formal language here; choose one of {', '.join(TASKS)}")
        if operators is not None:
            if task == "parity":
                raise DataError("operators= applies to modarith and modarith-brackets only, not parity")
            if not isinstance(operators, str) or not operators or set(operators) - set("+-*") \
                    or len(set(operators)) != len(operators):
                raise DataError(f"operators={operators!r} is not valid; use distinct characters of '+-*'")
        if not isinstance(prefix_labels, bool):
            raise DataError(f"prefix_labels={prefix_labels!r} is not valid; use true or false")
        if prefix_labels and not hasattr(TASKS[task], "prefix_answers"):
            raise DataError(f"prefix_labels=true is not defined for task={task!r} (its prefixes are not problems); "
                            "use it with parity or modarith")
        super().__init__(8, batch_size, num_workers, seed, val_blocks)  # seq_len: set from the lengths below
        self.task = TASKS[task]() if operators is None else TASKS[task](operators)
        self.prefix_labels = prefix_labels
        self.tokenizer = ByteTokenizer()
        self._init_lengths(list(train_lengths), curriculum)

    def task_parameters(self) -> dict:
        extra = {"operators": "".join(map(chr, self.task.operators))} if hasattr(self.task, "operators") else {}
        extra.update({"prefix_labels": True} if self.prefix_labels else {})  # absent: the suite's one label
        return {**super().task_parameters(), **extra, "modulus": MODULUS if self.task.name != "parity" else 2}

"""The word problems' answers against sympy's permutation groups (sympy ships with torch): the group's elements
enumerated by ``SymmetricGroup`` / ``AlternatingGroup`` (not by accrot's parity test), numbered as documented
(lexicographic order of the one-line notation), and the running product composed by sympy's ``Permutation``
arithmetic, where ``p * q`` applies p first. The documented answer, g_t ∘ … ∘ g_1 (g_1 applied first), is sympy's
``g_1 * g_2 * … * g_t``; the other order is tried too, and must fail, so a left/right mistake in the generator (or in
this oracle) cannot pass.
"""

from __future__ import annotations

import pytest

from accrot.evaluation import evaluate_length
from data_modules import WordProblemDataModule
from tests.data.test_state import oracle, stream_start
from tests.helpers.peers import peer

QUERY, ANSWER_BASE = 0xFF, 128  # the documented query byte and the first answer byte


def sympy_solver(group: str, newest_first: bool = False):
    """A solver (bytes → {query index: answer byte}) that composes with sympy; ``newest_first``: the other order."""
    combinatorics = peer("sympy.combinatorics", "sympy")
    degree = int(group[1:])
    G = (combinatorics.SymmetricGroup if group[0] == "S" else combinatorics.AlternatingGroup)(degree)
    elements = sorted(G.generate(), key=lambda p: p.array_form)  # the documented numbering
    number = {tuple(p.array_form): n for n, p in enumerate(elements)}
    identity = combinatorics.Permutation(list(range(degree)))

    def solve(x: list[int]) -> dict[int, int]:
        state, out = identity, {}
        i = stream_start(x)
        while i < len(x):
            if x[i] == QUERY:
                out[i] = ANSWER_BASE + number[tuple(state.array_form)]
                i += 2  # the answer's place
                continue
            g = elements[x[i]]
            state = g * state if newest_first else state * g  # state * g: g applied after the product so far
            i += 1
        return out

    return solve, len(elements)


GROUPS = [(g, e) for g in ("S3", "S4", "S5", "A4", "A5") for e in ("generators", "all")]


def accuracy(group: str, elements: str, newest_first: bool) -> float:
    dm = WordProblemDataModule(seq_len=32, group=group, elements=elements, query_rate=0.5)
    length, budget = 256, 256 * 32
    solve, _ = sympy_solver(group, newest_first)
    result = evaluate_length(oracle(solve), dm.eval_blocks(length, budget), 32, mask=dm.eval_mask(length, budget),
                             targets=dm.eval_targets(length, budget))
    return result.accuracy


@pytest.mark.parametrize("group, elements", GROUPS, ids=[f"{g}-{e}" for g, e in GROUPS])
def test_every_answer_is_sympys_product(group, elements):
    assert accuracy(group, elements, newest_first=False) == 1.0


@pytest.mark.parametrize("group", ["S3", "S4", "S5", "A4", "A5"])
def test_the_other_order_fails(group):
    """Composed newest first, sympy's products miss most answers of a group that does not commute (uniform
    elements: the two orders agree only where the running products happen to commute with the next element)."""
    assert accuracy(group, "all", newest_first=True) < 0.5


def test_sympy_enumerates_the_groups_of_the_documented_orders():
    for group, order in {"S3": 6, "S4": 24, "S5": 120, "A4": 12, "A5": 60}.items():
        assert sympy_solver(group)[1] == order

"""The pre-queue draw (``fairq.draw``): a permutation, uniformly random over its seeds,
not the arrival order, and reproducible from its seed (auditable). The statistical tests
use fixed seeds, so they give the same answer on every run."""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter

import pytest

from fairq.draw import draw_index, draw_order, draw_position


def seed(i: int) -> bytes:
    return hashlib.sha256(f"test seed {i}".encode()).digest()


@pytest.mark.parametrize("size", [*range(1, 40), 127, 128, 129, 1000, 4097])
def test_it_is_a_permutation_with_an_inverse(size: int) -> None:
    s = seed(size)
    order = draw_order(s, size)
    assert sorted(order) == list(range(size))
    assert [draw_index(s, size, p) for p in order] == list(range(size))


def test_known_answers() -> None:
    """Fixed vectors, so an auditor's own implementation can be checked against fairq's."""
    assert draw_order(bytes(32), 10) == [6, 5, 4, 0, 3, 7, 9, 8, 1, 2]
    assert draw_order(bytes(range(32)), 10) == [1, 8, 9, 0, 4, 2, 6, 3, 7, 5]


def test_every_order_is_equally_likely() -> None:
    """Over 24,000 seeds, each of the 24 orders of four fans comes up about 1,000 times
    (chi-square with 23 degrees of freedom, below its 0.1% critical value 49.7)."""
    counts = Counter(tuple(draw_order(seed(i), 4)) for i in range(24_000))
    assert set(counts) == set(itertools.permutations(range(4)))
    chi2 = sum((c - 1000) ** 2 / 1000 for c in counts.values())
    assert chi2 < 49.7, chi2


def test_the_first_to_arrive_lands_anywhere() -> None:
    """The fan who came first is not favoured: its place over 10,000 seeds is uniform
    over 10 places (chi-square, 9 degrees of freedom, 0.1% critical value 27.9)."""
    counts = Counter(draw_position(seed(i), 10, 0) for i in range(10_000))
    chi2 = sum((counts[p] - 1000) ** 2 / 1000 for p in range(10))
    assert chi2 < 27.9, chi2


def test_it_is_not_the_arrival_order() -> None:
    n = 2000
    order = draw_order(seed(7), n)
    d2 = sum((i - p) ** 2 for i, p in enumerate(order))
    rho = 1 - 6 * d2 / (n * (n * n - 1))
    assert abs(rho) < 0.1, rho  # no correlation between arrival and place
    fixed = sum(1 for i, p in enumerate(order) if i == p)
    assert fixed < 8  # about one fixed point, as in a random permutation
    assert draw_order(seed(8), n) != order  # another seed, another order


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        draw_position(b"short", 10, 0)
    with pytest.raises(ValueError):
        draw_position(seed(1), 10, 10)
    with pytest.raises(ValueError):
        draw_index(seed(1), 10, -1)

"""The body budget keeps room for ordinary calls: clients streaming large bodies share at most
seven eighths of it, so a flood of them cannot turn every small capture call away with 503s."""

from __future__ import annotations

import pytest

from zephon.capture.proxy._limits import SMALL_BODY_BYTES, BodyBudget, ClientRefused, _Hold

MIB = 2**20


def _held(budget: BodyBudget, size: int) -> _Hold:
    hold = _Hold(budget)
    hold.grow_to(size)
    return hold


def test_large_bodies_cannot_take_the_reserve_small_ones_still_can() -> None:
    budget = BodyBudget(64 * MIB, max_body=16 * MIB)
    big = [_held(budget, 16 * MIB) for _ in range(3)]
    with pytest.raises(ClientRefused) as refused:
        _held(budget, 16 * MIB)  # 64 MiB would fit the budget, not the large bodies' share
    assert refused.value.status == 503 and refused.value.headers["retry-after"] == "1"
    small = [_held(budget, 64 * 2**10) for _ in range(100)]
    assert budget.held == 48 * MIB + 100 * 64 * 2**10 and budget.large_held == 48 * MIB
    for hold in big + small:
        hold.release()
    assert (budget.held, budget.large_held) == (0, 0)


def test_a_body_read_in_chunks_counts_as_large_once_it_passes_the_small_size() -> None:
    budget = BodyBudget(8 * MIB, max_body=4 * MIB)
    hold = _held(budget, SMALL_BODY_BYTES)
    assert budget.large_held == 0
    hold.grow_to(SMALL_BODY_BYTES + 1)
    hold.grow_to(3 * MIB)
    assert (budget.held, budget.large_held) == (3 * MIB, 3 * MIB)
    with pytest.raises(ClientRefused):
        _held(budget, 5 * MIB)  # 3 + 5 MiB of large bodies is over the 7 MiB share
    hold.release()
    assert (budget.held, budget.large_held) == (0, 0)


def test_a_budget_the_size_of_one_body_still_admits_that_body() -> None:
    budget = BodyBudget(16 * MIB, max_body=16 * MIB)
    hold = _held(budget, 16 * MIB)
    with pytest.raises(ClientRefused):
        _held(budget, 1)
    hold.release()
    assert budget.held == 0

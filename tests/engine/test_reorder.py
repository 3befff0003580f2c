import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon._engine.handoff.reorder import ReorderBuffer
from zephon.errors import ReorderError


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=60).flatmap(lambda n: st.permutations(range(n))))
def test_random_completion_orders_release_in_sequence(order: list[int]) -> None:
    rb: ReorderBuffer[int] = ReorderBuffer()
    for _ in order:
        rb.dispatch()
    released: list[int] = []
    for seq in order:
        released.extend(rb.put(seq, seq * 10))
        # Nothing is released before every earlier sequence number has completed.
        assert released == [s * 10 for s in range(len(released))]
    assert released == [s * 10 for s in range(len(order))]
    rb.close()


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=40).flatmap(lambda n: st.permutations(range(n))))
def test_non_deterministic_releases_in_completion_order(order: list[int]) -> None:
    rb: ReorderBuffer[int] = ReorderBuffer(deterministic=False)
    for _ in order:
        rb.dispatch()
    released = [x for seq in order for x in rb.put(seq, seq)]
    assert released == order
    rb.close()


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=2, max_value=30).flatmap(
        lambda n: st.tuples(st.permutations(range(n)), st.integers(min_value=0, max_value=n - 1))
    )
)
def test_duplicate_sequence_number_is_an_error(case: tuple[list[int], int]) -> None:
    order, dup_at = case
    rb: ReorderBuffer[int] = ReorderBuffer()
    for _ in order:
        rb.dispatch()
    for seq in order[: dup_at + 1]:
        rb.put(seq, seq)
    with pytest.raises(ReorderError, match="completed twice"):
        rb.put(order[dup_at], 0)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=1, max_value=30).flatmap(
        lambda n: st.tuples(st.permutations(range(n)), st.integers(min_value=0, max_value=n - 1))
    )
)
def test_missing_sequence_number_is_reported_at_close(case: tuple[list[int], int]) -> None:
    order, missing = case
    rb: ReorderBuffer[int] = ReorderBuffer()
    for _ in order:
        rb.dispatch()
    for seq in order:
        if seq != missing:
            rb.put(seq, seq)
    with pytest.raises(ReorderError, match=f"first missing sequence number {missing}"):
        rb.close()


def test_unknown_sequence_number_is_an_error() -> None:
    rb: ReorderBuffer[int] = ReorderBuffer()
    rb.dispatch()
    with pytest.raises(ReorderError, match="never dispatched"):
        rb.put(5, 0)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(min_value=2, max_value=30).flatmap(
        lambda n: st.tuples(
            st.permutations(range(n)), st.sets(st.integers(min_value=0, max_value=n - 1))
        )
    )
)
def test_barriers_never_overtake_earlier_results_in_completion_order(
    case: tuple[list[int], set[int]],
) -> None:
    order, barriers = case
    rb: ReorderBuffer[int] = ReorderBuffer(deterministic=False)
    for _ in order:
        rb.dispatch()
    released: list[int] = []
    for seq in order:
        released.extend(rb.put(seq, seq, barrier=seq in barriers))
    assert sorted(released) == list(range(len(order)))
    for b in barriers:
        # Everything dispatched before a barrier was released before it.
        assert set(range(b)) <= set(released[: released.index(b)])
    rb.close()

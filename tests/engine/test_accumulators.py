import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon._engine.feed.fetch import FetchOp
from zephon._ops.batch import BatchOp
from zephon._ops.decode_text import DecodeTextOp
from zephon._ops.map_transform import FilterOp, MapTransformOp
from zephon._ops.tokenize import TokenizeOp
from zephon.ops import CountingAccumulator, OpContext, PassthroughAccumulator
from zephon.types import SampleMeta, SampleRecord


def rec(lane: int, chunk: int, offset: int) -> SampleRecord:
    return SampleRecord(SampleMeta((0, 0, offset), lane, chunk, offset), {"i": offset})


def offsets(batches):
    return [[(e.meta.lane_id, e.meta.chunk_offset) for e in b] for b in batches]


def test_counting_emits_per_lane_at_max_batch():
    acc = CountingAccumulator(3)
    ready = acc.push_many([rec(0, 0, 0), rec(1, 0, 0), rec(0, 0, 1), rec(1, 0, 1), rec(0, 0, 2)])
    assert offsets(ready) == [[(0, 0), (0, 1), (0, 2)]]
    assert acc.has_pending_data(1) and not acc.has_pending_data(0)


@settings(max_examples=200, deadline=None)
@given(
    max_batch=st.integers(1, 5),
    pushes=st.lists(st.lists(st.integers(0, 2), max_size=12), max_size=8),
)
def test_counting_groups_whole_pushes_like_one_element_at_a_time(max_batch, pushes):
    """Pushes of one lane take a slicing path, mixed ones a per-element path: both must cut
    exactly where pushing the same elements one by one does."""
    counters = {0: 0, 1: 0, 2: 0}
    groups = []
    for lanes in pushes:
        group = []
        for lane in lanes:
            group.append(rec(lane, 0, counters[lane]))
            counters[lane] += 1
        groups.append(group)
    whole, single = CountingAccumulator(max_batch), CountingAccumulator(max_batch)
    got, want = [], []
    for group in groups:
        got += offsets(whole.push_many(group))
        for elem in group:
            want += offsets(single.push_many([elem]))
    assert got == want
    assert offsets(whole.flush()) == offsets(single.flush())


def test_flush_of_one_lane_leaves_the_others_untouched():
    acc = CountingAccumulator(10)
    acc.push_many([rec(lane, 0, i) for i in range(3) for lane in (0, 1, 2)])
    out = acc.flush(reset=True, lane_id=1)
    assert offsets(out) == [[(1, 0), (1, 1), (1, 2)]]
    assert not acc.has_pending_data(1)
    assert acc.has_pending_data(0) and acc.has_pending_data(2)
    # The untouched lanes still hold exactly what they had, in order.
    assert offsets(acc.flush()) == [[(0, 0), (0, 1), (0, 2)], [(2, 0), (2, 1), (2, 2)]]


def test_has_pending_data_tells_the_truth():
    acc = CountingAccumulator(2)
    assert not acc.has_pending_data()
    acc.push_many([rec(0, 0, 0)])
    assert acc.has_pending_data() and acc.has_pending_data(0) and not acc.has_pending_data(1)
    assert acc.flush() != []
    assert not acc.has_pending_data()
    assert acc.flush() == []


def test_drop_last_turns_partial_buffers_into_tombstones():
    acc = CountingAccumulator(4, drop_last=True)
    acc.push_many([rec(0, 0, i) for i in range(6)])
    (dropped,) = acc.flush()
    assert [t.meta.is_tombstone for t in dropped] == [True, True]
    assert [t.meta.chunk_offset for t in dropped] == [4, 5]


def test_latency_bound_emits_partial_batch_when_due():
    acc = CountingAccumulator(100, max_latency_ms=1.0)
    acc.push_many([rec(0, 0, 0)])
    deadline = acc.next_deadline_ns()
    assert deadline is not None
    assert acc.poll(deadline - 1) == []
    assert offsets(acc.poll(deadline)) == [[(0, 0)]]
    assert acc.next_deadline_ns() is None


def test_passthrough_keeps_nothing():
    acc = PassthroughAccumulator()
    batch = [rec(0, 0, 0), rec(1, 0, 0)]
    assert acc.push_many(batch) == [batch]
    assert not acc.has_pending_data() and acc.flush(reset=True, lane_id=0) == []


@pytest.mark.parametrize(
    "op",
    [
        FetchOp([]),
        DecodeTextOp(),
        MapTransformOp(lambda p: p),
        FilterOp(lambda p: True),
        TokenizeOp("bytes"),
        BatchOp(4),
    ],
    ids=lambda op: op.name,
)
def test_builtin_ops_disable_latency_bound_when_deterministic(op):
    ctx = OpContext(op_name=op.name, op_index=0)
    det = op.accumulator(deterministic=True, ctx=ctx)
    assert isinstance(det, CountingAccumulator)
    assert det.max_latency_ns is None
    det.push_many([rec(0, 0, 0)])
    assert det.next_deadline_ns() is None and det.poll(2**62) == []
    if not isinstance(op, BatchOp):
        nondet = op.accumulator(deterministic=False, ctx=ctx)
        assert isinstance(nondet, CountingAccumulator)
        assert nondet.max_latency_ns is not None and nondet.max_latency_ns > 0


def test_batch_accumulator_releases_epoch_once_old_records_left():
    acc = BatchOp(3).accumulator(deterministic=True, ctx=OpContext(op_name="batch", op_index=0))
    acc.push_many([rec(0, 0, 0), rec(0, 0, 1)])
    assert not acc.try_epoch_reset(1, 0)
    ready = acc.push_many([rec(0, 1, 0), rec(0, 1, 1)])
    assert offsets(ready) == [[(0, 0), (0, 1), (0, 0)]]
    assert acc.try_epoch_reset(1, 0)  # only chunk 1 records remain buffered

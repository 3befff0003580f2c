import gc
import pickle

import pytest

from zephon.types import (
    SampleBatch,
    SampleMeta,
    SampleRecord,
    flush_sentinel,
    is_control,
    spawn_child,
    tombstones_for_record,
)


def _rec(lane: int, chunk: int, offset: int) -> SampleRecord:
    return SampleRecord(SampleMeta((0, 0, offset), lane, chunk, offset), {"x": offset})


def test_cursor_orders_by_chunk_then_offset_then_lineage():
    a, b = _rec(0, 0, 5), _rec(0, 1, 0)
    child = spawn_child(a, 0, {"x": 1}, is_last=False)
    assert a.cursor < child.cursor < b.cursor


def test_fan_out_only_last_child_closes_parent():
    rec = _rec(0, 0, 3)
    kids = [spawn_child(rec, i, None, is_last=(i == 2)) for i in range(3)]
    closing = [k.meta.contributors[0].is_last_child for k in kids]
    assert closing == [False, False, True]
    assert all(k.meta.contributors[0].cursor == rec.cursor for k in kids)
    assert [k.meta.lineage for k in kids] == [(0,), (1,), (2,)]


def test_tombstone_keeps_contributors_and_is_control():
    rec = _rec(1, 2, 3)
    (tomb,) = tombstones_for_record(rec, reason="filtered")
    assert tomb.meta.is_tombstone and is_control(tomb) and not is_control(rec)
    assert tomb.meta.contributors == rec.meta.contributors


def test_batch_rejects_mixed_lanes():
    with pytest.raises(ValueError, match="mixes lanes 0 and 1"):
        SampleBatch([_rec(0, 0, 0), _rec(1, 0, 0)])


def test_sentinel_is_control():
    s = flush_sentinel(3, 8)
    assert s.meta.is_sentinel and is_control(s) and s.meta.lane_id == 3


def test_records_metas_and_batches_pickle_to_equal_objects():
    metas = [
        SampleMeta((0, 1, i), 2, 7, i, (0, i), 1, {1: 1}, {"_contributors": ()}) for i in range(5)
    ]
    batch = SampleBatch([SampleRecord(m, {"ids": [i]}) for i, m in enumerate(metas)])
    for value in (metas[0], batch.records[0], batch, SampleBatch([])):
        copy = pickle.loads(pickle.dumps(value, protocol=5))
        assert copy == value and type(copy) is type(value)
    copy = pickle.loads(pickle.dumps(batch))
    assert [r.meta.tags for r in copy] == [m.tags for m in metas]
    assert copy.records[0].meta.tags is not copy.records[1].meta.tags


def test_records_and_metas_stay_out_of_the_cyclic_garbage_collector():
    """The engine makes one or more per record: tracked ones would drive collections."""
    record = _rec(0, 1, 2)
    assert not gc.is_tracked(record)
    assert not gc.is_tracked(record.meta)
    with pytest.raises(AttributeError):
        record.meta.lane_id = 3  # type: ignore[misc]
    assert record.meta == SampleMeta((0, 0, 2), 0, 1, 2)
    assert record == _rec(0, 1, 2)


def test_batch_names_both_lanes_it_mixes():
    with pytest.raises(ValueError, match="mixes lanes 0 and 4"):
        SampleBatch([_rec(0, 0, 0), _rec(0, 0, 1), _rec(4, 0, 2)])

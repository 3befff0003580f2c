import gc
import pickle

import pytest

from zephon.types import (
    TAG_CONTRIBUTORS,
    TAG_CUT_TOKENS,
    TAG_ERROR,
    TAG_PACKING,
    TAG_TOMBSTONE,
    EndOfData,
    FlushSentinel,
    SampleBatch,
    SampleCursor,
    SampleMeta,
    SampleRecord,
    SnapshotMarker,
    Tombstone,
    control_as_tags,
    control_from_tags,
    cut_note,
    end_of_data,
    flush_sentinel,
    is_control,
    snapshot_marker,
    spawn_child,
    tombstone_meta,
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


def test_each_constructor_builds_its_typed_control_record():
    rec = _rec(1, 2, 3)
    rec = SampleRecord(rec.meta, {"input_ids": [5, 6, 7, 8]})
    assert flush_sentinel(3, 8).meta.control == FlushSentinel(8)
    assert end_of_data(2).meta.control == EndOfData()
    assert snapshot_marker(1, 4, 9).meta.control == SnapshotMarker((4, 9))
    assert tombstone_meta(rec.meta).control == Tombstone()
    (tomb,) = tombstones_for_record(rec, reason="filtered: short")
    assert tomb.meta.control == Tombstone("filtered: short", dropped_tokens=4)
    assert tomb.meta.tags == {TAG_CONTRIBUTORS: rec.meta.contributors}
    note = cut_note(rec, reason="truncate", tokens=2)
    assert note.meta.control == Tombstone("truncate", cut_tokens=2)
    assert note.meta.contributors == () and note.meta.cursor == rec.meta.cursor
    assert rec.meta.control is None


def test_only_control_records_are_control_whatever_their_tags():
    packed = SampleRecord(_rec(0, 1, 2).meta.with_tags(**{TAG_PACKING: {"total_length": 3}}), 1)
    child = spawn_child(_rec(0, 1, 2), 0, {"x": 1}, is_last=True)
    assert not any(is_control(r) for r in (packed, child, _rec(0, 0, 0)))
    marker, eod = snapshot_marker(0, 1, 2), end_of_data(0)
    note = cut_note(packed, reason="truncate", tokens=1)
    assert all(is_control(r) for r in (marker, eod, note, flush_sentinel(0, 1)))
    assert [(r.meta.is_tombstone, r.meta.is_sentinel) for r in (marker, eod, note, packed)] == [
        (False, False),
        (False, True),
        (True, False),
        (False, False),
    ]


def test_control_records_are_frozen_untracked_and_pickle_with_their_batch():
    controls = [
        flush_sentinel(0, 8),
        end_of_data(0),
        SampleRecord(
            snapshot_marker(0, 4, 1).meta.with_control(
                SnapshotMarker((4, 1), SampleCursor(3, 2, (1,), (0, 0, 5)))
            ),
            None,
        ),
        *tombstones_for_record(SampleRecord(_rec(0, 2, 3).meta, {"ids": [1, 2]}), reason="x"),
    ]
    for rec in controls:
        assert not gc.is_tracked(rec.meta.control)
        assert pickle.loads(pickle.dumps(rec)) == rec
    batch = SampleBatch([_rec(0, 0, 1), *controls, _rec(0, 0, 2)])
    copy = pickle.loads(pickle.dumps(batch, protocol=5))
    assert [r.meta for r in copy] == [r.meta for r in batch]
    assert [r.meta.control for r in copy][1:-1] == [r.meta.control for r in controls]
    with pytest.raises(AttributeError):
        controls[0].meta.control.boundary_chunk_id = 3  # type: ignore[misc,union-attr]


def test_control_tags_round_trip_and_older_tag_form_becomes_typed():
    cursor = SampleCursor(3, 2, (), (0, 0, 5))
    kinds = [
        FlushSentinel(8),
        EndOfData(),
        SnapshotMarker((4, 1)),
        SnapshotMarker((4, 1), cursor),
        Tombstone(),
        Tombstone("skipped: bad row", 0, None, {"row": 2}),
        Tombstone("pack", dropped_tokens=9),
        Tombstone("truncate", cut_tokens=3),
    ]
    for kind in kinds:
        tags, back = control_from_tags({"user": 1, **control_as_tags(kind)})
        assert (tags, back) == ({"user": 1}, kind)
    plain = {"user": 1}
    assert control_from_tags(plain) == (plain, None)
    meta = _rec(0, 1, 2).meta.with_tags(**{TAG_TOMBSTONE: True, TAG_ERROR: "filtered"})
    assert meta.control == Tombstone("filtered") and meta.tags == {}
    noted = meta.with_tags(**{TAG_CUT_TOKENS: 4, "user": 2})
    assert noted.control == Tombstone("filtered", cut_tokens=4) and noted.tags == {"user": 2}
    assert noted.with_tags(other=1).control == noted.control

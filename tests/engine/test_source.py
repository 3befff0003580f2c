"""The source's pointer records are the records the SampleMeta constructor would build."""

from __future__ import annotations

import pickle
from typing import Any

from zephon import Dataset, StaticMixtureWorkSource
from zephon._engine.feed.source import SnapshotPolicy, SourceFeeder, pointer_records
from zephon.types import SampleMeta, SampleRecord, SnapshotMarker


def test_pointer_records_equal_constructed_records_in_every_field():
    rows = [(0, 3, 7), (2, 0, 1), (1, 1, 99)]
    got = pointer_records(rows, lane_id=5, chunk_id=11, first_offset=40)
    expected = [
        SampleRecord(SampleMeta(row, 5, 11, 40 + i, (), row[0]), None) for i, row in enumerate(rows)
    ]
    assert got == expected
    for record, want in zip(got, expected, strict=True):
        assert isinstance(record, SampleRecord)
        for name in SampleMeta.__struct_fields__:  # a new field must be set there too
            assert getattr(record.meta, name) == getattr(want.meta, name)
        assert record.meta.tags is not want.meta.tags  # each record has its own tags dict
        assert pickle.loads(pickle.dumps(record)) == want
        assert hash(record.meta.cursor) == hash(want.meta.cursor)


def _feeder(lead: int | None) -> Any:
    rows = [{"id": i} for i in range(300)]
    source = StaticMixtureWorkSource(
        [Dataset.from_records("a", rows, shard_size=50)], chunk_size=40, seed=1
    )
    lanes = [(lane, source.clone_for_lane(lane, 3)) for lane in range(3)]
    feeder = SourceFeeder(lanes, interleave=16, snapshots=SnapshotPolicy(1, 8))
    if lead is not None:
        feeder.lead_with(lead)
    return feeder


def test_a_lead_lane_is_fed_first_and_no_lane_stream_changes() -> None:
    def streams(lead: int | None) -> tuple[list[int], dict[int, list[Any]]]:
        order: list[int] = []
        by_lane: dict[int, list[Any]] = {}
        for items in _feeder(lead):
            lane = items[0].meta.lane_id
            order.append(lane)
            by_lane.setdefault(lane, []).extend(
                (item.meta.cursor, type(item.meta.control).__name__) for item in items
            )
        return order, by_lane

    plain_order, plain = streams(None)
    led_order, led = streams(2)
    assert plain_order[:3] == [0, 1, 2] and led_order[:3] == [2, 0, 1]
    assert led == plain  # every lane's records, markers and sentinels, in the same order
    assert any(name == "SnapshotMarker" for lane in led.values() for _, name in lane)


def test_a_cut_inside_a_chunk_closes_the_slice_before_it() -> None:
    """So the marker reaches the consumer with the records before it, not with the next
    slice (a checkpoint can then restart at it one slice sooner)."""
    cuts = 0
    for items in _feeder(None):
        for i, item in enumerate(items):
            control = item.meta.control
            if isinstance(control, SnapshotMarker) and control.position[1] > 0:
                cuts += 1
                assert i == len(items) - 1
                assert items[i - 1].meta.chunk_offset == control.position[1] - 1
    assert cuts > 10

"""StageCore's ride mode: a snapshot marker stays inside the lane's micro-batch and comes back
out exactly where a stage that split the micro-batch at the cut would have put it."""

from __future__ import annotations

from typing import Any

from zephon._engine.feed.source import pointer_records
from zephon._engine.plan.driver_chain import run_tasks
from zephon._engine.state.stage import MarkerMode, StageCore, place_markers
from zephon.ops import BaseOp, CountingAccumulator, OpTraits
from zephon.types import SampleRecord, StreamItem, snapshot_marker, tombstone_meta


class Twice(BaseOp):
    """Element-wise: every record with an even offset leaves twice, every odd one not at all."""

    name = "twice"

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, elementwise=True)

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return [e for e in elems for _ in range(2 if e.meta.chunk_offset % 2 == 0 else 0)]


def records(chunk: int, first: int, n: int) -> list[StreamItem]:
    return pointer_records([(0, 0, first + i) for i in range(n)], 0, chunk, first)


def positions(items: list[StreamItem]) -> list[Any]:
    """Each item's position; a control element's (marker or tombstone) marked ``M``."""
    return [
        ("M", i.meta.chunk_id, i.meta.chunk_offset)
        if i.meta.control is not None
        else (i.meta.chunk_id, i.meta.chunk_offset)
        for i in items
    ]


def core(mode: str, size: int = 8) -> StageCore:
    return StageCore(
        Twice(), CountingAccumulator(size), stalls_sentinels=False, marker_mode=MarkerMode(mode)
    )


def test_markers_go_before_the_first_output_at_or_after_their_cut():
    out = Twice().process_many([*records(0, 0, 4), *records(1, 0, 2)])
    cuts = [snapshot_marker(0, 0, 1), snapshot_marker(0, 0, 2), snapshot_marker(0, 1, 0)]
    got = positions(place_markers(out, cuts))
    assert got == [
        (0, 0),
        (0, 0),
        ("M", 0, 1),
        ("M", 0, 2),
        (0, 2),
        (0, 2),
        ("M", 1, 0),
        (1, 0),
        (1, 0),
    ]
    assert positions(place_markers([], cuts[:1])) == [("M", 0, 1)]


def test_a_riding_marker_leaves_in_the_order_a_split_micro_batch_gives():
    items = [*records(0, 0, 3), snapshot_marker(0, 0, 3), *records(0, 3, 5)]
    split, riding = core("flush"), core("ride")
    split_tasks, ride_tasks = split.feed(items), riding.feed(items)
    assert [len(t.work) for t in split_tasks if t.work] == [3]  # the rest waits for more
    assert [len(t.work) for t in ride_tasks] == [8]  # one micro-batch, the marker inside
    split_out = run_tasks(split, split_tasks) + run_tasks(split, split.finish())
    ride_out = run_tasks(riding, ride_tasks) + run_tasks(riding, riding.finish())
    assert positions(ride_out) == positions(split_out)
    assert ("M", 0, 3) in positions(ride_out)


def test_a_tombstone_never_overtakes_a_riding_marker():
    dropped = SampleRecord(tombstone_meta(records(0, 9, 1)[0].meta), None)
    items = [*records(0, 0, 2), snapshot_marker(0, 0, 2), *records(0, 2, 1), dropped]
    for mode in ("flush", "ride"):
        stage = core(mode)
        out = run_tasks(stage, stage.feed(items)) + run_tasks(stage, stage.finish())
        got = positions(out)
        assert got.index(("M", 0, 9)) > got.index(("M", 0, 2)), mode  # the tombstone: last
        assert sorted(got, key=str) == sorted(
            [(0, 0), (0, 0), ("M", 0, 2), (0, 2), (0, 2), ("M", 0, 9)], key=str
        )


def test_markers_left_riding_at_the_end_leave_after_the_flush():
    stage = core("ride")
    tasks = stage.feed([*records(0, 0, 2), snapshot_marker(0, 0, 2)])
    out = run_tasks(stage, tasks) + run_tasks(stage, stage.finish())
    assert positions(out) == [(0, 0), (0, 0), ("M", 0, 2)]

"""The tail's record of each lane's newest restart point: what a checkpoint asks of it to
decide whether the partial batch saved at that cut has left since."""

from __future__ import annotations

from zephon._engine.handoff.tail import LaneMux
from zephon.types import SampleCursor, SampleMeta, SampleRecord, SnapshotMarker, snapshot_marker


def record(lane: int, offset: int) -> SampleRecord:
    return SampleRecord(SampleMeta((0, lane, offset), lane, 0, offset), {"offset": offset})


def test_a_lane_drains_its_restart_point_by_delivering_after_it() -> None:
    mux = LaneMux([0, 1], starts={0: (0, 0), 1: (0, 0)})
    assert mux.deliveries_since(0, (0, 0)) == 0  # the run's start, nothing delivered yet
    mux.add([record(0, 0), snapshot_marker(0, 0, 1), record(0, 1)])
    assert mux.pop() is not None  # lane 0's record 0
    assert mux.deliveries_since(0, (0, 0)) == 1
    mux.settle()  # the marker at the head of lane 0: cut (0, 1) reached, nothing after it yet
    assert mux.deliveries_since(0, (0, 1)) == 0 and mux.deliveries_since(0, (0, 0)) is None
    assert mux.cursor_at(0, (0, 1)) is None
    assert mux.pop() is None  # lane 1's turn, nothing there
    mux.add([record(1, 0)])
    assert mux.pop() is not None and mux.pop() is not None  # lane 1, then lane 0's record 1
    assert mux.deliveries_since(0, (0, 1)) == 1
    assert mux.replay_cursor[0] == record(0, 1).meta.cursor
    assert mux.cursor_at(0, (0, 1)) is None  # what the lane had at the cut
    assert mux.cursor_at(0, (0, 0)) == record(0, 1).meta.cursor  # not its restart point


def test_a_stamped_cut_and_a_restored_start_keep_their_replay_cursor() -> None:
    target = SampleCursor(0, 7, (), (0, 0, 7))
    mux = LaneMux([0], starts={0: (0, 4)}, delivered={0: 3}, replay_cursors={0: target})
    assert mux.deliveries_since(0, (0, 4)) == 0 and mux.cursor_at(0, (0, 4)) == target
    stamped = snapshot_marker(0, 0, 9)
    stamped = SampleRecord(stamped.meta.with_control(SnapshotMarker((0, 9), target)), None)
    mux.add([stamped])
    mux.settle()
    assert mux.deliveries_since(0, (0, 9)) == 0 and mux.cursor_at(0, (0, 9)) == target

"""replay_filter: after a restore, drop each lane's records up to its last delivered cursor.

The planner puts it right before ``batch`` (or last, without a batch), so the checkpoint cut
falls between whole batches. It matches the cursor by equality, which works for reordering
plans too, and it fails loudly if a lane's target can no longer appear, instead of silently
dropping everything after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from zephon.errors import CheckpointError
from zephon.ops import Accumulator, BaseOp, OpContext, OpTraits, Rebuild
from zephon.types import (
    FlushSentinel,
    LaneId,
    SampleCursor,
    SampleRecord,
    SnapshotMarker,
    StreamItem,
    tombstone_meta,
)

REPLAY_FILTER = "replay_filter"
"""The name of the engine's replay filter stage."""


def _missed(lane: int, target: SampleCursor, where: str) -> CheckpointError:
    return CheckpointError(
        f"replay of lane {lane} {where} without meeting the last delivered record "
        f"{tuple(target)}; the data or the pipeline changed since the checkpoint was taken"
    )


class ReplayFilterAccumulator(Accumulator):
    def __init__(self, targets: Mapping[LaneId, SampleCursor], *, monotone: bool) -> None:
        self.targets = dict(targets)
        self.monotone = monotone

    def push_many(self, elems: Sequence[StreamItem]) -> list[list[StreamItem]]:
        if not self.targets:
            return [list(elems)] if elems else []
        out: list[StreamItem] = []
        targets = self.targets
        for elem in elems:
            lane = elem.meta.lane_id
            target = targets.get(lane)
            if target is None:
                out.append(elem)
                continue
            cursor = elem.meta.cursor
            if cursor == target:
                del targets[lane]
            elif self.monotone and cursor > target:
                raise _missed(lane, target, f"reached {tuple(cursor)}")
            out.append(SampleRecord(tombstone_meta(elem.meta, reason="replayed"), None))
        return [out] if out else []

    def pending_target(self, lane: LaneId) -> SampleCursor | None:
        """The cursor this lane still waits for (None once met, or without a restore)."""
        return self.targets.get(lane)

    def on_marker(self, marker: StreamItem) -> None:
        """A sentinel or end-of-data for a lane: the target must have appeared by then (a
        snapshot marker may come first: a restore there re-delivers up to the target)."""
        lane = marker.meta.lane_id
        target = self.targets.get(lane)
        control = marker.meta.control
        if target is None or isinstance(control, SnapshotMarker):
            return
        if isinstance(control, FlushSentinel):
            boundary = control.boundary_chunk_id
            if target.chunk_id < boundary:
                raise _missed(lane, target, f"finished epoch {boundary}")
        else:
            raise _missed(lane, target, "ended")

    def flush(
        self, *, reset: bool = False, lane_id: LaneId | None = None
    ) -> list[list[StreamItem]]:
        if not reset and self.targets:
            lane, target = next(iter(self.targets.items()))
            raise _missed(lane, target, "ended")
        return []

    def has_pending_data(self, lane_id: LaneId | None = None) -> bool:
        return False


class ReplayFilterOp(BaseOp):
    """Inserted by the engine; drops replayed records with tombstones."""

    name = REPLAY_FILTER

    def __init__(self, targets: Mapping[LaneId, SampleCursor], *, monotone: bool) -> None:
        super().__init__()
        self.targets = dict(targets)
        self.monotone = monotone

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return ReplayFilterAccumulator(self.targets, monotone=self.monotone)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, runs_in_driver=True, rebuild=Rebuild.UNCHANGED)

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return elems

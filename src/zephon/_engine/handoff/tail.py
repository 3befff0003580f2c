"""Split the merged stream back into lanes and deliver them in strict round-robin.

A rank's output is then a function of its lanes' streams only, not of how the engine happened
to interleave them, which is what lets another number of ranks reproduce the same lanes.

The tail is also where delivery is known, so it keeps what a checkpoint needs per lane: the
cursor of the last delivered item (the replay cursor), how many items were delivered, and when
a whole epoch has been delivered (its flush sentinel reached the head of the lane's queue).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from zephon._engine.stats import REPLAYED, DropCounts
from zephon.types import (
    EndOfData,
    FlushSentinel,
    SampleBatch,
    SampleCursor,
    SnapshotMarker,
    StreamItem,
    Tombstone,
)

EpochCallback = Callable[[int, int], None]


def samples_in(item: StreamItem) -> int:
    """The source samples ``item`` completes: a packed row its segments' last pieces, a
    split sample's pieces one between them (the last), a batch its records'."""
    records = item.records if isinstance(item, SampleBatch) else (item,)
    done = 0
    for record in records:
        counts = record.meta.component_counts
        done += 1 if counts is None else sum(counts.values())
    return done


SnapshotCallback = Callable[[int, tuple[int, int]], None]
SkipCallback = Callable[[tuple[int, int, int], Mapping[str, Any]], None]


class LaneMux:
    """Buffers items per lane; ``pop`` returns the next one in lane round-robin."""

    def __init__(
        self,
        lanes: Sequence[int],
        *,
        on_epoch_delivered: EpochCallback | None = None,
        on_lane_done: Callable[[int], None] | None = None,
        replay_cursors: Mapping[int, SampleCursor | None] | None = None,
        delivered: Mapping[int, int] | None = None,
        turn: int = 0,
        finished: Iterable[int] = (),
        on_skip: SkipCallback | None = None,
        on_snapshot: SnapshotCallback | None = None,
        order: Sequence[int] | None = None,
        starts: Mapping[int, tuple[int, int]] | None = None,
    ) -> None:
        done = set(finished)
        # ``order``: the round-robin order of the unfinished lanes (a restored tail's), else
        # ``lanes`` without the finished ones
        self.order = [lane for lane in (lanes if order is None else order) if lane not in done]
        self._queues: dict[int, deque[StreamItem]] = {lane: deque() for lane in lanes}
        self._turn = turn % len(self.order) if self.order else 0
        self.ended = False
        self.tombstones = 0
        self.drops = DropCounts()
        # source samples whose outputs were all delivered or dropped here (a progress that
        # read-ahead, shuffle buffers and repeats cannot inflate); replays are not counted
        self.samples_done = 0
        # lane -> heap of (chunk id, offset, samples) of drops not yet done: a checkpoint taken
        # now restarts the lane before them, and the restored run drops them again
        self._drops: dict[int, list[tuple[int, int, int]]] = {}
        self.finished_lanes: set[int] = done
        self.replay_cursor: dict[int, SampleCursor | None] = {lane: None for lane in lanes}
        self.replay_cursor.update(replay_cursors or {})
        self.delivered: dict[int, int] = {lane: 0 for lane in lanes}
        self.delivered.update(delivered or {})
        # lane -> (the newest restart point, items delivered and the replay cursor when it was
        # reached): the run's start, then each snapshot marker's cut as it leaves the queue
        self._marks: dict[int, tuple[tuple[int, int], int, SampleCursor | None]] = {
            lane: ((start[0], start[1]), self.delivered[lane], self.replay_cursor.get(lane))
            for lane, start in (starts or {}).items()
        }
        self._on_epoch = on_epoch_delivered
        self._on_lane_done = on_lane_done
        self._on_skip = on_skip
        self._on_snapshot = on_snapshot

    def add(self, items: Iterable[StreamItem]) -> None:
        queues = self._queues
        for item in items:
            tomb = item.meta.control
            if tomb is None or not isinstance(tomb, Tombstone):
                queues[item.meta.lane_id].append(item)
                continue
            if tomb.cut_tokens is None:  # a cut note closes and drops nothing
                self.tombstones += 1
                if tomb.reason != REPLAYED:
                    meta = item.meta
                    drop = (meta.chunk_id, meta.chunk_offset, samples_in(item))
                    heapq.heappush(self._drops.setdefault(meta.lane_id, []), drop)
            self.drops.count(tomb)
            reason = tomb.reason or ""
            if self._on_skip is not None and (
                tomb.skipped is not None or reason.startswith("skipped:")
            ):
                self._on_skip(item.meta.sample_id, tomb.skipped or {"reason": reason})

    def _settle_head(self, lane: int) -> bool:
        """Consume markers at the head of ``lane``'s queue; False once the lane has ended."""
        queue = self._queues[lane]
        while queue:
            control = queue[0].meta.control
            if control is None:
                return True
            if isinstance(control, FlushSentinel):
                queue.popleft()
                boundary = control.boundary_chunk_id
                cursor = self.replay_cursor.get(lane)
                if self._on_epoch is not None and cursor is not None and cursor.chunk_id < boundary:
                    # Epoch eviction: everything before the boundary is delivered and will not
                    # be replayed, so there is nothing to skip there.
                    self.replay_cursor[lane] = None
                if self._on_epoch is not None:
                    self._on_epoch(lane, boundary)
            elif isinstance(control, SnapshotMarker):
                # Everything before the cut is delivered; a restore there re-delivers up to the
                # stamped cursor (the replay filter drops it again), or nothing.
                queue.popleft()
                self.replay_cursor[lane] = control.replay_cursor
                self._marks[lane] = (
                    control.position,
                    self.delivered[lane],
                    control.replay_cursor,
                )
                if self._on_snapshot is not None:
                    self._on_snapshot(lane, control.position)
            elif isinstance(control, EndOfData):
                queue.popleft()
                self.finished_lanes.add(lane)
                if self._on_lane_done is not None:
                    self._on_lane_done(lane)
                return False
            else:
                return True
        return True

    def lanes_with_drops(self) -> list[int]:
        """The lanes holding drops not yet counted as done (see :meth:`count_drops`)."""
        return [lane for lane, drops in self._drops.items() if drops]

    def count_drops(
        self, lane: int, restart: tuple[int, int], held: AbstractSet[tuple[int, int]]
    ) -> None:
        """Count as done the drops of ``lane`` before ``restart``, where a restore of the lane
        starts, except those of records a stage ``held`` there (a restore runs them again);
        all of them once the lane has ended."""
        drops = self._drops.get(lane)
        if not drops:
            return
        if lane in self.finished_lanes:
            self.samples_done += sum(drop[2] for drop in drops)
            drops.clear()
            return
        kept = []
        while drops and drops[0][:2] < restart:
            drop = heapq.heappop(drops)
            if drop[:2] in held:
                kept.append(drop)
            else:
                self.samples_done += drop[2]
        for drop in kept:
            heapq.heappush(drops, drop)

    def settle(self) -> None:
        """Consume markers already at the head of every lane (before a checkpoint)."""
        for lane in list(self.order):
            if not self._settle_head(lane):
                self._remove(lane)

    def deliveries_since(self, lane: int, position: tuple[int, int]) -> int | None:
        """Items ``lane`` delivered since it reached ``position``, its newest restart point
        (None when ``position`` is not that: an epoch boundary or a chunk start)."""
        mark = self._marks.get(lane)
        if mark is None or mark[0] != position:
            return None
        return self.delivered[lane] - mark[1]

    def mark(self, lane: int) -> tuple[tuple[int, int], int, SampleCursor | None] | None:
        """``lane``'s newest restart point, with the items it had delivered and its replay
        cursor then (what :meth:`deliveries_since` and :meth:`cursor_at` answer from)."""
        return self._marks.get(lane)

    def cursor_at(self, lane: int, position: tuple[int, int]) -> SampleCursor | None:
        """The replay cursor ``lane`` had when it reached ``position`` (its newest restart
        point), or its current one."""
        mark = self._marks.get(lane)
        if mark is not None and mark[0] == position:
            return mark[2]
        return self.replay_cursor.get(lane)

    def _remove(self, lane: int) -> None:
        index = self.order.index(lane)
        del self.order[index]
        if index < self._turn:
            self._turn -= 1
        if self.order:
            self._turn %= len(self.order)
        else:
            self._turn = 0

    def pop(self) -> StreamItem | None:
        """The next item, or None when the current lane needs more input (or all is done)."""
        while self.order:
            lane = self.order[self._turn]
            if not self._settle_head(lane):
                self._remove(lane)
                continue
            queue = self._queues[lane]
            if queue:
                item = queue.popleft()
                self._turn = (self._turn + 1) % len(self.order)
                self.replay_cursor[lane] = item.meta.cursor
                self.delivered[lane] += 1
                self.samples_done += samples_in(item)
                return item
            if not self.ended:
                return None
            # Stream over without an end marker for this lane (engine stopped): drop it.
            self._remove(lane)
        return None

    @property
    def turn(self) -> int:
        return self._turn

    @property
    def done(self) -> bool:
        return not self.order

    def buffered(self) -> int:
        return sum(len(q) for q in self._queues.values())

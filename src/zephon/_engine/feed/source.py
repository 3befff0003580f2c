"""Turn per-lane work sources into the engine's input stream of pointer records.

Each owned lane has its own work-source clone. Lanes take turns, a slice of ``interleave``
pointers at a time, so every lane makes progress and the tail's lane round-robin never waits
long. The interleaving does not affect output: each lane's output depends on its own stream
only, and the tail merges lanes in strict round-robin.

For checkpoints the feeder remembers, per lane, the work-source state *before* each admitted
chunk that is still in flight. The oldest one is all a checkpoint needs: restoring that state
regenerates every in-flight chunk, so no pointer list is ever saved.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zephon.types import (
    TAG_TARGET_MIXTURE,
    SampleMeta,
    SampleRecord,
    StreamItem,
    end_of_data,
    flush_sentinel,
    snapshot_marker,
)
from zephon.work import WorkChunk, WorkSource


def pointer_records(
    rows: Sequence[tuple[int, int, int]], lane_id: int, chunk_id: int, first_offset: int
) -> list[StreamItem]:
    """One payload-less record per pointer ``(dataset, shard, row)``, in stream order."""
    meta, record = SampleMeta, SampleRecord
    return [
        record(meta(row, lane_id, chunk_id, offset, (), row[0], None, {}), None)
        for offset, row in enumerate(rows, first_offset)
    ]


@dataclass(frozen=True)
class LaneStart:
    """Where a restored lane resumes: source state and the chunk id it regenerates first;
    ``offset`` records of that chunk are before the restored snapshot and are not re-read."""

    chunk_id: int
    source_state: Mapping[str, Any] | None
    offset: int = 0


@dataclass(frozen=True)
class SnapshotPolicy:
    """Where the feeder cuts a lane for an aligned snapshot: every ``every_chunks``-th chunk
    start and every ``every_records`` records inside a chunk, never at an epoch start (the
    flush there leaves nothing to save). ``every_chunks=0``: no snapshots."""

    every_chunks: int = 0
    every_records: int | None = None
    flush_every_k_chunks: int = 0

    def cuts(self, chunk_id: int, offset: int) -> bool:
        if not self.every_chunks:
            return False
        if offset == 0:
            k = self.flush_every_k_chunks
            return chunk_id % self.every_chunks == 0 and not (k and chunk_id % k == 0)
        return self.every_records is not None and offset % self.every_records == 0

    def next_cut(self, offset: int) -> int | None:
        """The first in-chunk cut after ``offset`` (None: none before the chunk ends)."""
        if not self.every_chunks or self.every_records is None:
            return None
        return (offset // self.every_records + 1) * self.every_records


@dataclass
class LaneState:
    lane_id: int
    source: WorkSource
    chunk: WorkChunk | None = None
    chunk_id: int = -1
    position: int = 0
    rows: list[tuple[int, int, int]] | None = None
    exhausted: bool = False
    # (chunk_id, source state before that chunk) for chunks not yet evicted, oldest first.
    inflight: deque[tuple[int, dict[str, Any]]] = field(default_factory=deque)
    # (next chunk id, source state from which that chunk will be generated).
    frontier: tuple[int, dict[str, Any]] = (0, {})
    # records of the first regenerated chunk already inside a restored snapshot
    resume_offset: int = 0
    resumed_at: tuple[int, int] | None = None
    # the source states this lane records leave out the configuration summary (every lane
    # of a feeder but its first: a checkpoint needs the summary once)
    lean: bool = False

    def source_state(self) -> dict[str, Any]:
        return self.source.lean_state_dict() if self.lean else self.source.state_dict()


class SourceFeeder:
    """Yields lists of pointer records, flush sentinels and end-of-data markers."""

    def __init__(
        self,
        lane_sources: Sequence[tuple[int, WorkSource]],
        *,
        flush_every_k_chunks: int = 0,
        interleave: int = 64,
        starts: Mapping[int, LaneStart] | None = None,
        snapshots: SnapshotPolicy | None = None,
    ) -> None:
        self.lanes = [
            LaneState(lane, src, lean=i > 0) for i, (lane, src) in enumerate(lane_sources)
        ]
        self._by_lane = {lane.lane_id: lane for lane in self.lanes}
        self.flush_every_k_chunks = flush_every_k_chunks
        self.interleave = max(1, interleave)
        self.snapshots = snapshots or SnapshotPolicy()
        self.samples_emitted = 0
        self.chunks_admitted = 0
        self._lead = 0  # index of the lane fed first in each round
        self._lock = threading.Lock()
        for lane_id, start in (starts or {}).items():
            lane = self._by_lane[lane_id]
            if start.source_state is not None:
                lane.source.load_state_dict(start.source_state)
            lane.frontier = (start.chunk_id, {})
            lane.resume_offset = start.offset
            lane.resumed_at = (start.chunk_id, start.offset)
        for lane in self.lanes:
            lane.frontier = (lane.frontier[0], lane.source_state())

    # -- chunk admission -------------------------------------------------------------------

    def _advance(self, lane: LaneState) -> bool:
        """Load the lane's next non-empty chunk; False when the lane is exhausted."""
        while True:
            cid, before = lane.frontier
            chunk = lane.source.next_chunk()
            if chunk is None:
                with self._lock:
                    lane.exhausted = True
                return False
            after = lane.source_state()
            with self._lock:
                lane.frontier = (cid + 1, after)
                if len(chunk) == 0:
                    continue  # an empty chunk still consumes its id, keeping ids aligned
                lane.inflight.append((cid, before))
            lane.chunk, lane.chunk_id, lane.position = chunk, cid, lane.resume_offset
            lane.resume_offset = 0
            lane.rows = list(zip(*chunk.pointers.T.tolist(), strict=True))  # sample ids
            self.chunks_admitted += 1
            return True

    def _slice(self, lane: LaneState) -> list[StreamItem]:
        if lane.chunk is None and not self._advance(lane):
            return [end_of_data(lane.lane_id)]
        rows = lane.rows
        assert rows is not None
        start = lane.position
        stop = min(start + self.interleave, len(rows))
        lane_id, chunk_id = lane.lane_id, lane.chunk_id
        cut = self.snapshots.next_cut(start)
        if cut is not None and cut < stop:
            stop = cut
        out = pointer_records(rows[start:stop], lane_id, chunk_id, start)
        if start == 0 and lane.chunk is not None and lane.chunk.target_mixture is not None:
            # Every chunk's first record carries its target (ensure_mixture reads it); stamping
            # each chunk, not only changes, keeps replay from an epoch start identical.
            first = out[0].meta
            target = dict(lane.chunk.target_mixture)
            out[0] = SampleRecord(first.with_tags(**{TAG_TARGET_MIXTURE: target}), None)
        if (chunk_id, start) == lane.resumed_at:
            lane.resumed_at = None  # the restored states are the ones after this cut
        elif start == 0 and self.snapshots.cuts(chunk_id, 0):
            out.insert(0, snapshot_marker(lane_id, chunk_id, 0))
        if stop < len(rows) and self.snapshots.cuts(chunk_id, stop):
            # A cut inside the chunk closes the slice before it, not opens the next one: the
            # marker then reaches the consumer with the records before it, and a checkpoint
            # taken there restores from this cut instead of the one before.
            out.append(snapshot_marker(lane_id, chunk_id, stop))
        lane.position = stop
        self.samples_emitted += len(out)
        if stop >= len(rows):
            k = self.flush_every_k_chunks
            if k and (chunk_id + 1) % k == 0:
                out.append(flush_sentinel(lane_id, chunk_id + 1))
            lane.chunk = None
            lane.rows = None
        return out

    def lead_with(self, lane_id: int) -> None:
        """Feed ``lane_id`` first in every round: the lane the consumer waits for first (a
        restored tail's turn). Lanes are independent, so the order never changes an output."""
        at = next((i for i, lane in enumerate(self.lanes) if lane.lane_id == lane_id), 0)
        self._lead = at

    def __iter__(self) -> Iterator[list[StreamItem]]:
        active = self.lanes[self._lead :] + self.lanes[: self._lead]
        while active:
            still: list[LaneState] = []
            for lane in active:
                items = self._slice(lane)
                if items:
                    yield items
                if not lane.exhausted:
                    still.append(lane)
            active = still

    # -- checkpoint support (called from the consumer thread) -----------------------------

    def evict_below(self, lane_id: int, chunk_id: int) -> None:
        """Forget in-flight chunks of ``lane_id`` below ``chunk_id``: they are delivered."""
        lane = self._by_lane[lane_id]
        with self._lock:
            inflight = lane.inflight
            while inflight and inflight[0][0] < chunk_id:
                inflight.popleft()

    def has_lane(self, lane_id: int) -> bool:
        return lane_id in self._by_lane

    def finish_lane(self, lane_id: int) -> None:
        """The lane's whole stream was delivered: nothing of it is in flight any more."""
        lane = self._by_lane.get(lane_id)
        if lane is not None:
            with self._lock:
                lane.inflight.clear()

    def lane_start(self, lane_id: int) -> tuple[int, dict[str, Any], bool]:
        """(first chunk id to regenerate, source state before it, lane exhausted)."""
        lane = self._by_lane[lane_id]
        with self._lock:
            if lane.inflight:
                cid, state = lane.inflight[0]
                return cid, state, False
            cid, state = lane.frontier
            return cid, state, lane.exhausted

    def inflight_counts(self) -> dict[int, int]:
        with self._lock:
            return {lane.lane_id: len(lane.inflight) for lane in self.lanes}

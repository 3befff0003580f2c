"""Turn per-lane work sources into the engine's input stream of pointer records.

Each owned lane has its own work-source clone. Lanes take turns, a slice of ``interleave``
pointers at a time, so every lane makes progress and the tail's lane round-robin never waits
long. The interleaving does not affect output: each lane's output depends on its own stream
only, and the tail merges lanes in strict round-robin.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from zephon.types import SampleMeta, SampleRecord, StreamItem, flush_sentinel
from zephon.work import WorkChunk, WorkSource


@dataclass
class LaneState:
    lane_id: int
    source: WorkSource
    next_chunk_id: int = 0
    chunk: WorkChunk | None = None
    chunk_id: int = -1
    position: int = 0
    rows: list[list[int]] | None = None
    exhausted: bool = False


class SourceFeeder:
    """Yields lists of pointer records (and flush sentinels) in lane round-robin."""

    def __init__(
        self,
        lane_sources: Sequence[tuple[int, WorkSource]],
        *,
        flush_every_k_chunks: int = 0,
        interleave: int = 64,
    ) -> None:
        self.lanes = [LaneState(lane, src) for lane, src in lane_sources]
        self.flush_every_k_chunks = flush_every_k_chunks
        self.interleave = max(1, interleave)
        self.samples_emitted = 0
        self.chunks_admitted = 0

    def _advance(self, lane: LaneState) -> bool:
        """Load the lane's next chunk; False when the lane is exhausted."""
        chunk = lane.source.next_chunk()
        if chunk is None or len(chunk) == 0:
            if chunk is not None:
                # An empty chunk still consumes a chunk id so ids stay aligned with the source.
                lane.next_chunk_id += 1
                return self._advance(lane)
            lane.exhausted = True
            return False
        lane.chunk = chunk
        lane.chunk_id = lane.next_chunk_id
        lane.next_chunk_id += 1
        lane.position = 0
        lane.rows = chunk.pointers.tolist()
        self.chunks_admitted += 1
        return True

    def _slice(self, lane: LaneState) -> list[StreamItem]:
        if lane.chunk is None and not self._advance(lane):
            return []
        rows = lane.rows
        assert rows is not None
        start = lane.position
        stop = min(start + self.interleave, len(rows))
        lane_id, chunk_id = lane.lane_id, lane.chunk_id
        out: list[StreamItem] = [
            SampleRecord(
                SampleMeta((r[0], r[1], r[2]), lane_id, chunk_id, offset, (), r[0]),
                None,
            )
            for offset, r in enumerate(rows[start:stop], start)
        ]
        lane.position = stop
        self.samples_emitted += len(out)
        if stop >= len(rows):
            k = self.flush_every_k_chunks
            if k and (chunk_id + 1) % k == 0:
                out.append(flush_sentinel(lane_id, chunk_id + 1))
            lane.chunk = None
            lane.rows = None
        return out

    def __iter__(self) -> Iterator[list[StreamItem]]:
        active = [lane for lane in self.lanes]
        while active:
            still: list[LaneState] = []
            for lane in active:
                items = self._slice(lane)
                if items:
                    yield items
                if not lane.exhausted:
                    still.append(lane)
            active = still

"""Two operators written only against the public API, as a user would write them.

``WindowSortOp`` reorders: it sorts each lane's records by token count inside windows of
``window`` records. ``GreedyPackOp`` packs whole records into bins of at most ``max_length``
tokens, first come first served. Both keep their buffers in a lane state that holds records
(``zephon.ops.HoldsRecords``): a checkpoint names those records by cursor, never by payload,
and the traits say how a restore rebuilds them, so a plan with these operators takes snapshots.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon.ops import Accumulator, BaseOp, MicroBatch, OpContext, OpTraits, Rebuild
from zephon.types import (
    TAG_CONTRIBUTORS,
    TAG_PACKING,
    LaneId,
    SampleMeta,
    SampleRecord,
    StreamItem,
)

Held = list[tuple[SampleRecord, int]]  # a lane's buffered records with their token counts


def token_count(record: StreamItem, field: str) -> int:
    return len(record.payload[field])


class _LaneBuffers(Accumulator):
    """Per-lane buffers of ``(record, length)``; the lane state is the buffer itself.

    Lengths are kept beside the records, so the payloads are read only at push: a restore
    gives the held records their payloads as they leave (``state_payloads_lazy``).
    """

    reads_payload = True
    state_holds_records = True
    state_payloads_lazy = True

    def __init__(self, field: str) -> None:
        self.field = field
        self.lanes: dict[LaneId, Held] = {}

    def state_dict(self, lane_id: LaneId) -> dict[str, Any]:
        return {"held": [[record, n] for record, n in self.lanes.get(lane_id, ())]}

    def load_state_dict(self, lane_id: LaneId, state: dict[str, Any]) -> None:
        self.lanes[lane_id] = [(record, int(n)) for record, n in state.get("held", ())]

    def has_pending_data(self, lane_id: LaneId | None = None) -> bool:
        if lane_id is None:
            return any(self.lanes.values())
        return bool(self.lanes.get(lane_id))

    def flush(self, *, reset: bool = False, lane_id: LaneId | None = None) -> list[MicroBatch]:
        lanes = sorted(self.lanes) if lane_id is None else [lane_id]
        return [self.emit(held) for lane in lanes if (held := self.lanes.pop(lane, None))]

    def emit(self, held: Held) -> MicroBatch:
        raise NotImplementedError


class WindowSortAccumulator(_LaneBuffers):
    def __init__(self, window: int, field: str) -> None:
        super().__init__(field)
        self.window = window

    def push_many(self, elems: Sequence[StreamItem]) -> list[MicroBatch]:
        ready: list[MicroBatch] = []
        for elem in elems:
            assert isinstance(elem, SampleRecord)
            held = self.lanes.setdefault(elem.meta.lane_id, [])
            held.append((elem, token_count(elem, self.field)))
            if len(held) >= self.window:
                ready.append(self.emit(held))
                self.lanes[elem.meta.lane_id] = []
        return ready

    def emit(self, held: Held) -> MicroBatch:
        return [record for record, _ in sorted(held, key=lambda pair: pair[1])]  # stable


class WindowSortOp(BaseOp):
    """Sorts each lane's records by length inside windows of ``window`` records."""

    name = "window_sort"

    def __init__(self, window: int, *, field: str = "input_ids") -> None:
        super().__init__()
        self.window = window
        self.field = field

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return WindowSortAccumulator(self.window, self.field)

    def traits(self) -> OpTraits:
        # records leave with the payload they came in with: a restore reads them again only
        return OpTraits(
            preserves_cursor_order=False, runs_in_driver=True, rebuild=Rebuild.UNCHANGED
        )

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return elems


class GreedyPackAccumulator(_LaneBuffers):
    def __init__(self, max_length: int, field: str) -> None:
        super().__init__(field)
        self.max_length = max_length

    def push_many(self, elems: Sequence[StreamItem]) -> list[MicroBatch]:
        ready: list[MicroBatch] = []
        for elem in elems:
            assert isinstance(elem, SampleRecord)
            lane = elem.meta.lane_id
            n = min(token_count(elem, self.field), self.max_length)
            held = self.lanes.setdefault(lane, [])
            if held and sum(m for _, m in held) + n > self.max_length:
                ready.append(self.emit(held))
                held = self.lanes[lane] = []
            held.append((elem, n))
        return ready

    def emit(self, held: Held) -> MicroBatch:
        return [record for record, _ in held]  # one bin: process_many joins it


class GreedyPackOp(BaseOp):
    """Packs whole records (cut to ``max_length``) into bins of at most ``max_length`` tokens.

    A bin is one micro-batch; ``process_many`` joins it into one record whose meta names the
    bin's segments, so a restore can rebuild a bin held downstream (``Rebuild.REASSEMBLE``).
    """

    name = "greedy_pack"

    def __init__(self, max_length: int, *, field: str = "input_ids") -> None:
        super().__init__()
        self.max_length = max_length
        self.field = field

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return GreedyPackAccumulator(self.max_length, self.field)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=False, rebuild=Rebuild.REASSEMBLE)

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        if not elems:
            return []
        segments = [
            (record, 0, min(token_count(record, self.field), self.max_length))
            for record in elems
            if isinstance(record, SampleRecord)
        ]
        meta = bin_meta(segments)
        return [SampleRecord(meta, self.reassemble(meta, segments))]

    def reassemble(
        self, meta: SampleMeta, segments: Sequence[tuple[SampleRecord, int, int]]
    ) -> dict[str, Any]:
        """The bin's payload from its records (``zephon.ops.Reassembles``)."""
        parts = [np.asarray(r.payload[self.field])[start:stop] for r, start, stop in segments]
        return {
            self.field: np.concatenate(parts).astype(np.int64),
            "lengths": np.array([stop - start for _, start, stop in segments], dtype=np.int64),
        }


def bin_meta(segments: Sequence[tuple[SampleRecord, int, int]]) -> SampleMeta:
    """A bin's meta: its first record's cursor (one level deeper), every record's
    contributors and sample counts, and the segments a restore reassembles it from."""
    first = segments[0][0].meta
    counts: dict[int, int] = {}
    for record, _, _ in segments:
        for component, n in record.meta.counts.items():
            counts[component] = counts.get(component, 0) + n
    tags = {
        TAG_CONTRIBUTORS: tuple(ref for r, _, _ in segments for ref in r.meta.contributors),
        TAG_PACKING: {"segments": tuple((r.meta.cursor, a, b) for r, a, b in segments)},
    }
    return SampleMeta(
        first.sample_id,
        first.lane_id,
        first.chunk_id,
        first.chunk_offset,
        (*first.lineage, 0),
        first.component_id,
        counts,
        tags,
    )

"""batch: group records of one lane into SampleBatch es of ``microbatch_size``."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import repeat
from typing import Any, cast

from zephon.errors import ConfigError
from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext, OpTraits
from zephon.types import LaneId, SampleBatch, SampleRecord, StreamItem


class BatchAccumulator(CountingAccumulator):
    """Counting accumulator that can release a stalled sentinel without a partial batch.

    Its lane state is the lane's partial batch (records named by meta in a checkpoint), so a
    snapshot marker passes it at once instead of waiting for the partial batch to leave: a
    restore then starts at the newest cut, not at the one before the last batch.
    """

    state_holds_records = True

    def try_epoch_reset(self, boundary_chunk_id: int, lane_id: LaneId) -> bool:
        # Equivalent to a fresh accumulator once every pre-boundary record has left.
        return all(e.meta.chunk_id >= boundary_chunk_id for e in self.pending(lane_id))

    def state_dict(self, lane_id: LaneId) -> dict[str, Any]:
        return {"held": list(self.pending(lane_id))}

    def load_state_dict(self, lane_id: LaneId, state: dict[str, Any]) -> None:
        self.set_pending(lane_id, state.get("held", ()))


class BatchOp(BaseOp):
    """Emits lane-pure batches. ``drop_last=True`` drops each lane's final partial batch
    (accounted by tombstones) and is the one operator allowed to stall a flush sentinel."""

    name = "batch"

    def __init__(self, microbatch_size: int, *, drop_last: bool = True) -> None:
        super().__init__()
        if microbatch_size < 1:
            raise ConfigError(f"batch: microbatch_size must be >= 1, got {microbatch_size}")
        self.microbatch_size = microbatch_size
        self.drop_last = drop_last

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return BatchAccumulator(self.microbatch_size, None, drop_last=self.drop_last)

    def traits(self) -> OpTraits:
        return OpTraits(
            preserves_cursor_order=True,
            runs_in_driver=True,
            stalls_sentinels=self.drop_last,
            batches=True,
        )

    def config(self) -> Mapping[str, Any]:
        return {"microbatch_size": self.microbatch_size, "drop_last": self.drop_last}

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        if not all(map(isinstance, elems, repeat(SampleRecord))):
            raise ConfigError("batch: input already batched; batch can appear only once")
        return [SampleBatch(cast(list[SampleRecord], elems))]

"""The operator authoring kit: subclass :class:`BaseOp`, pick or write an accumulator;
typed hooks for state and restore live in :mod:`zephon.ops.state`."""

from zephon.ops._base import BaseOp, OpContext, OpTraits
from zephon.ops.accumulators import (
    Accumulator,
    CountingAccumulator,
    MicroBatch,
    PassthroughAccumulator,
)
from zephon.ops.state import (
    HoldsRecords,
    LaneStateful,
    LazyPayloads,
    MarkerObserver,
    PendingTarget,
    Reassembles,
    Rebuild,
    check_accumulator,
)
from zephon.types import cut_note, spawn_child, tombstone_meta, tombstones_for_record

__all__ = [
    "Accumulator",
    "BaseOp",
    "CountingAccumulator",
    "HoldsRecords",
    "LaneStateful",
    "LazyPayloads",
    "MarkerObserver",
    "MicroBatch",
    "OpContext",
    "OpTraits",
    "PassthroughAccumulator",
    "PendingTarget",
    "Reassembles",
    "Rebuild",
    "check_accumulator",
    "cut_note",
    "spawn_child",
    "tombstone_meta",
    "tombstones_for_record",
]

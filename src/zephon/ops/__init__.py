"""The operator authoring kit: subclass :class:`BaseOp`, pick or write an accumulator."""

from zephon.ops._base import BaseOp, OpContext, OpTraits
from zephon.ops.accumulators import (
    Accumulator,
    CountingAccumulator,
    MicroBatch,
    PassthroughAccumulator,
)
from zephon.types import cut_note, spawn_child, tombstone_meta, tombstones_for_record

__all__ = [
    "Accumulator",
    "BaseOp",
    "CountingAccumulator",
    "MicroBatch",
    "OpContext",
    "OpTraits",
    "PassthroughAccumulator",
    "cut_note",
    "spawn_child",
    "tombstone_meta",
    "tombstones_for_record",
]

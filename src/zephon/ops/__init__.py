"""The operator authoring kit: subclass :class:`BaseOp`, pick or write an accumulator."""

from zephon.ops._base import BaseOp, OpContext, OpTraits
from zephon.ops.accumulators import (
    Accumulator,
    CountingAccumulator,
    MicroBatch,
    PassthroughAccumulator,
)
from zephon.types import spawn_child, tombstone_meta, tombstones_for_record

__all__ = [
    "Accumulator",
    "BaseOp",
    "CountingAccumulator",
    "MicroBatch",
    "OpContext",
    "OpTraits",
    "PassthroughAccumulator",
    "spawn_child",
    "tombstone_meta",
    "tombstones_for_record",
]

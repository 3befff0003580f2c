"""map_batch (a function over each ``SampleBatch``, after ``batch``) and materialize."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from zephon.errors import ContractError
from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext, OpTraits
from zephon.types import SampleBatch, StreamItem, tombstones_for_record

MATERIALIZE_MICRO_BATCH = 64


class MapBatchOp(BaseOp):
    """``fn(batch) -> SampleBatch`` (or ``None`` to drop the batch, its records tombstoned).

    The returned batch keeps the records' metas (``SampleBatch(records)`` of
    ``SampleRecord(r.meta, new_payload)``): that is what checkpoints and replay count.
    """

    name = "map_batch"

    def __init__(self, fn: Callable[[SampleBatch], SampleBatch | None], *, name: str | None = None):
        super().__init__(name=name)
        self.fn = fn

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=2)

    def config(self) -> Mapping[str, Any]:
        return {"fn": getattr(self.fn, "__qualname__", None) or repr(self.fn)}

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        out: list[StreamItem] = []
        for batch in elems:
            if not isinstance(batch, SampleBatch):
                raise ContractError(
                    f"{self.name} runs after batch(); it got a {type(batch).__name__}"
                )
            result = self.fn(batch)
            if result is None:
                out.extend(tombstones_for_record(batch, reason=f"dropped by {self.name}"))
                continue
            if not isinstance(result, SampleBatch) or result.ids != batch.ids:
                raise ContractError(
                    f"{self.name}: the function must return a SampleBatch of the same records "
                    "(same metas, new payloads) or None; rebuild it as "
                    "SampleBatch([SampleRecord(r.meta, new_payload) for r in batch.records])"
                )
            out.append(result)
        return out


class MaterializeOp(BaseOp):
    """A passthrough that starts a new stage: payloads are resolved (read from shared memory)
    here, so the operators after it get plain objects and their own micro-batching."""

    name = "materialize"

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        acc = CountingAccumulator(MATERIALIZE_MICRO_BATCH)
        acc.reads_payload = True
        return acc

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, runs_in_driver=True)

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return elems

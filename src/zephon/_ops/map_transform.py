"""map_transform and filter: per-record user functions; dropped records become tombstones."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import repeat
from operator import is_
from typing import Any

from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext, OpTraits
from zephon.types import SampleRecord, StreamItem, record_tokens, tombstone_meta

MAP_MICRO_BATCH = 64
MAP_LATENCY_MS = 3.0


def _fn_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


class MapTransformOp(BaseOp):
    """Applies ``fn(payload) -> payload``; ``None`` drops the record (a tombstone closes it)."""

    name = "map_transform"
    # micro-batch sizes cannot change the output (every runner and worker count agree)
    config_exclude = ("max_batch", "max_latency_ms")

    def __init__(
        self,
        fn: Callable[[Any], Any],
        *,
        drop_none: bool = True,
        max_batch: int = MAP_MICRO_BATCH,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self.fn = fn
        self.drop_none = drop_none
        self.max_batch = max_batch

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return CountingAccumulator(self.max_batch, None if deterministic else MAP_LATENCY_MS)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=1, elementwise=True)

    def config(self) -> Mapping[str, Any]:
        return {"fn": _fn_name(self.fn), "drop_none": self.drop_none}

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        fn = self.fn
        results = [fn(elem.payload) for elem in elems]
        record = SampleRecord
        if not self.drop_none or not any(map(is_, results, repeat(None))):
            return [record(elem.meta, result) for elem, result in zip(elems, results, strict=True)]
        return [
            record(elem.meta, result)
            if result is not None
            else record(
                tombstone_meta(elem.meta, reason="dropped by map", tokens=record_tokens(elem)),
                None,
            )
            for elem, result in zip(elems, results, strict=True)
        ]


class FilterOp(BaseOp):
    """Keeps records whose payload satisfies ``predicate``; the rest become tombstones."""

    name = "filter"
    # micro-batch sizes cannot change the output (every runner and worker count agree)
    config_exclude = ("max_batch", "max_latency_ms")

    def __init__(
        self,
        predicate: Callable[[Any], bool],
        *,
        max_batch: int = MAP_MICRO_BATCH,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self.predicate = predicate
        self.max_batch = max_batch

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return CountingAccumulator(self.max_batch, None if deterministic else MAP_LATENCY_MS)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=1, elementwise=True)

    def config(self) -> Mapping[str, Any]:
        return {"predicate": _fn_name(self.predicate)}

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        pred = self.predicate
        return [
            elem
            if pred(elem.payload)
            else SampleRecord(
                tombstone_meta(elem.meta, reason="filtered", tokens=record_tokens(elem)),
                None,
            )
            for elem in elems
        ]

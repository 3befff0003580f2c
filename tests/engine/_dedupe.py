"""A dedupe-by-text accumulator, with and without saved lane state (importable by workers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import xxhash

from zephon.ops import (
    Accumulator,
    BaseOp,
    MicroBatch,
    OpContext,
    OpTraits,
    Rebuild,
    tombstone_meta,
)
from zephon.types import SampleRecord, StreamItem


class ForgetfulDedupe(Accumulator):
    """Keeps a per-lane set of seen text hashes, but does not say so: restores are wrong."""

    reads_payload = True

    def __init__(self) -> None:
        self.seen: dict[int, set[str]] = {}

    def push_many(self, elems: Sequence[StreamItem]) -> list[MicroBatch]:
        out: MicroBatch = []
        for elem in elems:
            digest = xxhash.xxh64_hexdigest(elem.payload["text"].encode())
            seen = self.seen.setdefault(elem.meta.lane_id, set())
            if digest in seen:
                out.append(SampleRecord(tombstone_meta(elem.meta, reason="duplicate"), None))
            else:
                seen.add(digest)
                out.append(elem)
        return [out] if out else []

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[MicroBatch]:
        return []  # nothing is buffered; the seen set is state, not pending data

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        return False


class Dedupe(ForgetfulDedupe):
    """The same, with its lane state in checkpoints."""

    def state_dict(self, lane_id: int) -> list[str]:
        return sorted(self.seen.get(lane_id, ()))

    def load_state_dict(self, lane_id: int, state: list[str]) -> None:
        self.seen[lane_id] = set(state)


class DedupeOp(BaseOp):
    name = "dedupe"

    def __init__(self, *, remember: bool = True, rebuild: Rebuild | None = None) -> None:
        super().__init__()
        self.remember = remember
        self.rebuild = rebuild

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return Dedupe() if self.remember else ForgetfulDedupe()

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, runs_in_driver=True, rebuild=self.rebuild)

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return elems

    def config(self) -> dict[str, Any]:
        return {"remember": self.remember, "rebuild": self.rebuild and self.rebuild.name}

"""Shared helpers of the order-changing operators: data-derived hashes and closer tracking.

Randomness in shuffles is a pure function of a record's cursor and the user's seed
(:func:`cursor_hash`), never of an RNG advanced per call, so micro-batch boundaries and restarts
cannot change a permutation.

Operators that reorder records (shuffle, packing, mixture correction) can emit a base offset's
closing fragment (``is_last_child=True``) before a sibling fragment that is still buffered.
:class:`CloserTracker` moves the closing flag to whichever fragment of a base offset leaves
last, so "exactly one closer per base offset, and it is the last to leave" keeps holding after
the reordering.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import xxhash

from zephon.types import (
    TAG_CONTRIBUTORS,
    ContributorRef,
    SampleCursor,
    SampleMeta,
    SampleRecord,
)
from zephon.types import TAG_TARGET_MIXTURE as TAG_TARGET_MIXTURE

_MASK64 = (1 << 64) - 1
BaseKey = tuple[int, int]

# TAG_TARGET_MIXTURE (re-exported): the engine stamps each chunk's target mixture on the
# chunk's first record; order-changing operators carry it to what they emit, so
# ensure_mixture can follow it.


def cursor_hash(cursor: SampleCursor, seed: int) -> int:
    """A 64-bit hash of ``cursor`` under ``seed``: stable across processes and runs."""
    lineage = cursor.lineage
    sid = cursor.sample_id
    packed = struct.pack(
        f"<5q{len(lineage)}q",
        cursor.chunk_id,
        cursor.chunk_offset,
        sid[0],
        sid[1],
        sid[2],
        *lineage,
    )
    return xxhash.xxh3_64_intdigest(packed, seed=seed & _MASK64)


def mix(seed: int, *values: int) -> int:
    """A 64-bit hash of a few integers under ``seed`` (values may be negative)."""
    packed = struct.pack(f"<{len(values)}Q", *(v & _MASK64 for v in values))
    return xxhash.xxh3_64_intdigest(packed, seed=seed & _MASK64)


def _base(ref: ContributorRef) -> BaseKey:
    return (ref.cursor.chunk_id, ref.cursor.chunk_offset)


class CloserTracker:
    """Per-lane bookkeeping that keeps the closing contributor on the last fragment to leave.

    ``add`` every record when it enters the buffer and pass its refs through ``settle`` when it
    (or the output built from it) leaves. Records without an explicit contributor tag are 1:1
    records that own their base offset alone, so they cost nothing here.
    """

    __slots__ = ("_deferred", "_open")

    def __init__(self) -> None:
        self._open: dict[BaseKey, int] = {}
        self._deferred: set[BaseKey] = set()

    def add(self, meta: SampleMeta) -> None:
        refs = meta.tags.get(TAG_CONTRIBUTORS) if meta.tags else None
        if not refs:
            return
        opened = self._open
        for ref in refs:
            key = _base(ref)
            opened[key] = opened.get(key, 0) + 1

    def settle(self, meta: SampleMeta) -> tuple[ContributorRef, ...]:
        """The refs ``meta`` must carry when it leaves now (closing flags moved if needed)."""
        refs = meta.tags.get(TAG_CONTRIBUTORS) if meta.tags else None
        if not refs:
            return meta.contributors
        opened = self._open
        deferred = self._deferred
        out: list[ContributorRef] = []
        for ref in refs:
            key = _base(ref)
            remaining = opened.get(key, 1) - 1
            if remaining > 0:
                opened[key] = remaining
                if ref.is_last_child:
                    deferred.add(key)
                    ref = ContributorRef(ref.cursor, False)
            else:
                opened.pop(key, None)
                if key in deferred:
                    deferred.discard(key)
                    if not ref.is_last_child:
                        ref = ContributorRef(ref.cursor, True)
            out.append(ref)
        return tuple(out)

    def settled_record(self, record: SampleRecord) -> SampleRecord:
        """``record`` with settled contributors (the same object when nothing changes)."""
        meta = record.meta
        refs = meta.tags.get(TAG_CONTRIBUTORS) if meta.tags else None
        if not refs:
            return record
        settled = self.settle(meta)
        if settled == tuple(refs):
            return record
        return SampleRecord(meta.with_tags(**{TAG_CONTRIBUTORS: settled}), record.payload)

    def __bool__(self) -> bool:
        return bool(self._open) or bool(self._deferred)

    def state(self) -> dict[str, Any]:
        """Open base offsets (with fragment counts) and deferred closers, for a snapshot."""
        return {"open": dict(self._open), "deferred": list(self._deferred)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> CloserTracker:
        tracker = cls()
        tracker._open = {(int(c), int(o)): int(n) for (c, o), n in state["open"].items()}
        tracker._deferred = {(int(c), int(o)) for c, o in state["deferred"]}
        return tracker

    def deferred(self) -> list[BaseKey]:
        """The deferred closers alone: a buffer's open offsets follow from what it holds."""
        return list(self._deferred)

    @classmethod
    def of_buffer(cls, metas: Iterable[SampleMeta], deferred: Iterable[Any]) -> CloserTracker:
        """The tracker of a buffer holding ``metas``: each was added and not yet settled."""
        tracker = cls()
        for meta in metas:
            tracker.add(meta)
        tracker._deferred = {(int(c), int(o)) for c, o in deferred}
        return tracker


def settle_block(records: Iterable[SampleRecord]) -> list[SampleRecord]:
    """Settle closers inside one self-contained block that is emitted in the given order."""
    items = list(records)
    tracker = CloserTracker()
    for record in items:
        tracker.add(record.meta)
    return [tracker.settled_record(r) for r in items]

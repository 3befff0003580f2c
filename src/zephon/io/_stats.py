"""Per-shard I/O counters of this process: bytes fetched, requests, retries, cache events.

Counters are keyed by shard URL in one process-wide table, so every copy of a shard in this
process (threads, re-opened datasets) adds to the same numbers; :meth:`Dataset.stats` sums the
counters of its shards. Worker processes keep their own tables and hand the engine what each
micro-batch cost (:func:`io_totals` before and after), so ``pipeline.stats()`` sums them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass
class SourceStats:
    """What reading a dataset cost. ``bytes_fetched``/``requests`` count remote traffic only
    (ranged reads and whole-shard downloads); local files and cache hits are free."""

    bytes_fetched: int = 0
    requests: int = 0
    retries: int = 0
    cache_hits: int = 0
    cache_downloads: int = 0
    cache_evictions: int = 0
    cache_refetches: int = 0  # evicted, then needed again by the same process: thrashing

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __iadd__(self, other: SourceStats) -> SourceStats:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def __add__(self, other: SourceStats) -> SourceStats:
        out = SourceStats(**self.to_dict())
        out += other
        return out

    def __sub__(self, other: SourceStats) -> SourceStats:
        return SourceStats(
            **{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}
        )

    def any(self) -> bool:
        """Whether any counter is non-zero."""
        return any(getattr(self, f.name) for f in fields(self))


_LOCK = threading.Lock()
_TABLE: dict[str, SourceStats] = {}
_PROCESS = SourceStats()  # every URL of this process together


def count(url: str, **deltas: int) -> None:
    """Add ``deltas`` (field name -> amount) to the counters of ``url``."""
    with _LOCK:
        stats = _TABLE.get(url)
        if stats is None:
            stats = _TABLE[url] = SourceStats()
        for name, amount in deltas.items():
            setattr(stats, name, getattr(stats, name) + amount)
            setattr(_PROCESS, name, getattr(_PROCESS, name) + amount)


def io_totals() -> SourceStats:
    """Everything this process has read so far (a copy)."""
    with _LOCK:
        return SourceStats(**_PROCESS.to_dict())


def total(urls: Iterable[str]) -> SourceStats:
    """The sum of the counters of ``urls`` (each URL counted once)."""
    out = SourceStats()
    with _LOCK:
        for url in set(urls):
            stats = _TABLE.get(url)
            if stats is not None:
                out += stats
    return out

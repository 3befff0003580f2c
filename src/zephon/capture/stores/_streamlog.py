"""Prompt ledgers kept as append-only logs of deltas, with a per-client cache.

Why: a stream's ledger grows with every prompt, so storing it whole per move costs O(prompts)
per move. The file and SQL stores instead append one :class:`~zephon.capture.ledger.LedgerDelta`
per transaction (the members it moved, the prompts it issued) and each client caches the
ledger it last read together with how far into the log that was (its *mark*): under the
stream's lock a client reads only the deltas appended since, by any process, so a move costs
O(members moved). Replaying the deltas in order rebuilds exactly the ledger the decisions
produced. A failed transaction drops the cached ledger (the next one reads the log again).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import msgspec

from zephon.capture.ledger import LedgerDelta, StreamLedger

__all__ = ["StreamCache", "compact_after", "decode_delta", "replay", "run_tracked"]

_DELTA = msgspec.json.Decoder(LedgerDelta)


def compact_after(prompts: int) -> int:
    """Deltas after which a writer folds a stream's log into one stored ledger: that costs
    O(prompts) once per at least ``8 * prompts`` moves, so moves stay O(1) amortised and a
    client's first read stays O(prompts)."""
    return 1024 + 8 * prompts


def decode_delta(data: bytes) -> LedgerDelta:
    return _DELTA.decode(data)


def replay(ledger: StreamLedger, deltas: Iterable[bytes]) -> StreamLedger:
    """Apply encoded deltas to ``ledger`` in order (in place) and return it."""
    for data in deltas:
        ledger.apply_delta(decode_delta(data))
    return ledger


def run_tracked(ledger: StreamLedger, op: Any, *, write: bool) -> tuple[bytes | None, Any]:
    """Run ``op`` on ``ledger``: ``(encoded delta to append or None, op's result)``; a read
    (``write=False``) that changes the ledger is a bug and raises AssertionError."""
    ledger.track()
    try:
        result = op(ledger)
    finally:
        delta = ledger.take_delta()
    if delta is None:
        return None, result
    if not write:
        raise AssertionError(f"a read of stream {ledger.stream!r} changed its ledger")
    return msgspec.json.encode(delta), result


class StreamCache:
    """One client's ledgers by stream, each with its mark in the stream's log.

    ``lock`` serialises this client's stream transactions (the cached ledgers are mutated in
    place); take it after the stream's cross-process lock, never before."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._entries: dict[str, tuple[Any, StreamLedger]] = {}

    def get(self, stream: str) -> tuple[Any, StreamLedger] | None:
        return self._entries.get(stream)

    def put(self, stream: str, mark: Any, ledger: StreamLedger) -> None:
        self._entries[stream] = (mark, ledger)

    def drop(self, stream: str) -> None:
        self._entries.pop(stream, None)

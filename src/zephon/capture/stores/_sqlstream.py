"""The prompt ledgers of the SQL stores: a stored ledger per stream plus one row per move.

``capture_streams(stream, ledger)`` is the stream's lock row and holds its stored ledger:
empty, a whole :class:`~zephon.capture.ledger.StreamLedger` JSON (written by earlier
versions), or ``@<seq> <json>``, the ledger folded at move ``seq``.
``capture_stream_moves(stream, seq, delta)`` holds the moves after it, numbered without gaps.
A transaction reads only the first bytes of the stored ledger (its ``seq``), then the moves
after what this client has cached (:mod:`._streamlog`), and appends one row per move; after
:func:`~._streamlog.compact_after` moves a writer folds them into the stored ledger and
deletes them, in the same transaction.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from zephon.capture.ledger import StreamLedger
from zephon.capture.stores._fsutil import LogCorruptionError
from zephon.capture.stores._streamlog import (
    StreamCache,
    compact_after,
    decode_delta,
    run_tracked,
)

__all__ = ["SqlStreams"]

_HEAD = 32  # bytes read of the stored ledger: enough for "@<seq> "
_FOLDED = re.compile(rb"@(\d+) ")


def _base_seq(head: bytes) -> int:
    found = _FOLDED.match(head)
    return int(found.group(1)) if found else 0


class SqlStreams:
    """One SQL client's prompt ledgers (guarded by the client's lock)."""

    def __init__(self, q: Callable[[str], str], row_locks: bool, where: Callable[[], str]):
        self._q = q
        self._row_locks = row_locks
        self._where = where
        self.cache = StreamCache()

    def transact(
        self, cur: Any, stream: str, op: Any, write: bool
    ) -> tuple[Any, Callable[[], None]]:
        """Run ``op`` inside the caller's transaction: ``(its result, what to call once the
        transaction committed)``. The caller locks the stream's row first when writing."""
        sql = f"SELECT substr(ledger, 1, {_HEAD}) FROM capture_streams WHERE stream = ?"
        cur.execute(self._q(sql + (" FOR UPDATE" if write and self._row_locks else "")), (stream,))
        row = cur.fetchone()
        head = b"" if row is None or row[0] is None else bytes(row[0])
        base = _base_seq(head)
        hit = self.cache.get(stream)
        if hit is not None and int(hit[0]) >= base:
            seq, ledger = int(hit[0]), hit[1]
        else:
            seq, ledger = base, self._stored(cur, stream) if head else StreamLedger(stream=stream)
        seq = self._replay(cur, stream, ledger, seq)
        delta, result = run_tracked(ledger, op, write=write)
        if delta is not None:
            seq += 1
            cur.execute(
                self._q("INSERT INTO capture_stream_moves (stream, seq, delta) VALUES (?, ?, ?)"),
                (stream, seq, delta),
            )
            if seq - base > compact_after(len(ledger.prompts)):
                self._fold(cur, stream, ledger, seq)
        done = seq

        def committed() -> None:
            self.cache.put(stream, done, ledger)

        return result, committed

    def _stored(self, cur: Any, stream: str) -> StreamLedger:
        cur.execute(self._q("SELECT ledger FROM capture_streams WHERE stream = ?"), (stream,))
        data = bytes(cur.fetchone()[0])
        found = _FOLDED.match(data)
        return StreamLedger.from_json(data[found.end() :] if found else data)

    def _replay(self, cur: Any, stream: str, ledger: StreamLedger, seq: int) -> int:
        """Apply the moves after ``seq``; the number of the last one."""
        cur.execute(
            self._q(
                "SELECT seq, delta FROM capture_stream_moves WHERE stream = ? AND seq > ? "
                "ORDER BY seq"
            ),
            (stream, seq),
        )
        for number, data in cur.fetchall():
            if number != seq + 1:
                raise LogCorruptionError(
                    f"{self._where()}: stream {stream!r} lacks move {seq + 1} (next stored: "
                    f"{number}); rows of capture_stream_moves were deleted by something else"
                )
            ledger.apply_delta(decode_delta(bytes(data)))
            seq = number
        return seq

    def _fold(self, cur: Any, stream: str, ledger: StreamLedger, seq: int) -> None:
        cur.execute(
            self._q("UPDATE capture_streams SET ledger = ? WHERE stream = ?"),
            (b"@%d " % seq + ledger.to_json(), stream),
        )
        cur.execute(
            self._q("DELETE FROM capture_stream_moves WHERE stream = ? AND seq <= ?"),
            (stream, seq),
        )

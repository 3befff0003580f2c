"""What the sqlite and postgres stores share: two tables and one transaction per operation.

Schema (same columns in both databases)::

    capture_rollouts(rollout_id PRIMARY KEY, state)          -- RolloutState JSON (the truth)
    capture_entries(rollout_id, call_id, payload, PRIMARY KEY (rollout_id, call_id))
                                                              -- canonical entry bytes
    capture_streams(stream PRIMARY KEY, ledger)               -- lock row, stored ledger
    capture_stream_moves(stream, seq, delta, PRIMARY KEY (stream, seq))
                                                              -- moves after it (._sqlstream)

Every operation is one transaction: lock the rollout (sqlite: ``BEGIN IMMEDIATE``; postgres:
``SELECT ... FOR UPDATE`` on its row), load its state, let the pure state machine decide,
write the decided events (a put inserts its payload, retire deletes the payloads, delete
removes the row), save the new state and commit. A decision's error is raised only after the
commit, so a conflict's poisoning is durable. Repeated freezes are answered from a per-client
cache when the stored ``(snapshot_id, version)`` is unchanged, which costs one indexed read.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from zephon.capture.records import TokenCaptureSnapshot, TokenEntry, entry_key
from zephon.capture.stores._durable import (
    Decide,
    DurableStore,
    Offload,
    StreamOp,
)
from zephon.capture.stores._events import Delete, Event, Put, Retire
from zephon.capture.stores._sqlstream import SqlStreams
from zephon.capture.stores._state import RolloutState, Transition

__all__ = ["Cursor", "SqlStore"]

_MAX_SNAPSHOTS = int(os.environ.get("ZEPHON_CAPTURE_SNAPSHOT_CACHE", "64"))


class Cursor(Protocol):
    def execute(self, query: Any, params: Sequence[Any] = ...) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class SqlStore(DurableStore):
    """The shared transaction logic; subclasses provide connections and SQL dialect bits."""

    P = "?"  # parameter placeholder of the driver

    def __init__(self, *, offload: Offload = "thread") -> None:
        super().__init__(offload=offload)
        self._lock = threading.Lock()  # one connection per client; calls from threads queue
        # Recently frozen snapshots (bounded: each holds decoded entries).
        self._snapshots: OrderedDict[str, TokenCaptureSnapshot] = OrderedDict()
        self._streams = SqlStreams(self._q, self._row_locks, self.describe)  # under self._lock

    # -- dialect ----------------------------------------------------------------------------

    def _txn(self, write: bool) -> AbstractContextManager[Cursor]:
        """A cursor inside one transaction (exclusive for writes), committed on exit."""
        raise NotImplementedError

    def _lock_row(self, cur: Cursor, rollout_id: str) -> None:
        """Create the rollout's row if needed and lock it for this transaction."""
        raise NotImplementedError

    def _lock_stream(self, cur: Cursor, stream: str) -> None:
        """Create the stream's row (empty ledger) if needed; it is locked by the next
        ``SELECT ... FOR UPDATE`` (postgres) or by the write transaction (sqlite)."""
        raise NotImplementedError

    def _q(self, sql: str) -> str:
        return sql if self.P == "?" else sql.replace("?", self.P)

    @property
    def _row_locks(self) -> bool:
        """Whether ``SELECT ... FOR UPDATE`` exists (postgres; sqlite locks the database)."""
        return self.P != "?"

    # -- state ------------------------------------------------------------------------------

    def _load(self, cur: Cursor, rollout_id: str, *, for_update: bool) -> RolloutState | None:
        sql = "SELECT state FROM capture_rollouts WHERE rollout_id = ?"
        if for_update and self._row_locks:
            sql += " FOR UPDATE"
        cur.execute(self._q(sql), (rollout_id,))
        row = cur.fetchone()
        return None if row is None else RolloutState.from_json(bytes(row[0]))

    def _persist(
        self, cur: Cursor, rollout_id: str, state: RolloutState, events: Sequence[Event]
    ) -> None:
        for event in events:
            if isinstance(event, Put):
                cur.execute(
                    self._q(
                        "INSERT INTO capture_entries (rollout_id, call_id, payload) "
                        "VALUES (?, ?, ?)"
                    ),
                    (rollout_id, event.call_id, event.entry_bytes),
                )
            elif isinstance(event, Retire | Delete):
                cur.execute(
                    self._q("DELETE FROM capture_entries WHERE rollout_id = ?"), (rollout_id,)
                )
        state.apply_all(events)
        if state.is_empty():
            cur.execute(self._q("DELETE FROM capture_rollouts WHERE rollout_id = ?"), (rollout_id,))
        else:
            cur.execute(
                self._q("UPDATE capture_rollouts SET state = ? WHERE rollout_id = ?"),
                (state.to_json(), rollout_id),
            )

    def _locked_decision(
        self, cur: Cursor, rollout_id: str, decide: Decide
    ) -> tuple[RolloutState, Transition[Any]]:
        state = self._load(cur, rollout_id, for_update=True)
        if state is None:
            t = decide(RolloutState.empty(rollout_id))
            if not t.events:
                return RolloutState.empty(rollout_id), t
            self._lock_row(cur, rollout_id)
            state = self._load(cur, rollout_id, for_update=True)
            assert state is not None
        t = decide(state)
        if t.events:
            self._persist(cur, rollout_id, state, t.events)
        return state, t

    # -- primitives -------------------------------------------------------------------------

    def transact_rollout(
        self,
        rollout_id: str,
        decide: Decide,
        then: Callable[[RolloutState, Transition[Any]], Any] = lambda s, t: t.result,
        *,
        write: bool = True,
    ) -> Any:
        with self._lock:
            if write:
                with self._txn(True) as cur:
                    state, t = self._locked_decision(cur, rollout_id, decide)
            else:
                with self._txn(False) as cur:
                    state = self._load(cur, rollout_id, for_update=False) or RolloutState.empty(
                        rollout_id
                    )
                t = decide(state)
                if t.events:
                    raise AssertionError(f"read-only capture operation decided {t.events}")
        if t.error is not None:
            raise t.error
        return then(state, t)

    def transact_stream(self, stream: str, op: StreamOp, *, write: bool = True) -> Any:
        with self._lock:
            try:
                with self._txn(write) as cur:
                    if write:
                        self._lock_stream(cur, stream)
                    result, committed = self._streams.transact(cur, stream, op, write)
                committed()
                return result
            except BaseException:
                self._streams.cache.drop(stream)
                raise

    def freeze_rollout(self, rollout_id: str, snapshot_id: str) -> TokenCaptureSnapshot:
        with self._lock:
            # Fast path: already frozen and unchanged since this client's last snapshot.
            with self._txn(False) as cur:
                state = self._load(cur, rollout_id, for_update=False)
            cached = self._snapshots.get(rollout_id)
            if (
                state is not None
                and state.frozen
                and not state.retired
                and cached is not None
                and (cached.snapshot_id, cached.version) == (state.snapshot_id, state.version)
            ):
                return cached
            with self._txn(True) as cur:
                state, t = self._locked_decision(cur, rollout_id, lambda s: s.freeze(snapshot_id))
                if t.error is None:
                    # Decoded before the commit: a freeze that cannot be read does not fence.
                    payloads = self._payloads(cur, rollout_id)
                    snap = state.snapshot(
                        TokenEntry.from_json(payloads[c]) for c in state.entry_keys
                    )
            if t.error is not None:
                raise t.error
            self._snapshots[rollout_id] = snap
            self._snapshots.move_to_end(rollout_id)
            while len(self._snapshots) > _MAX_SNAPSHOTS:
                self._snapshots.popitem(last=False)
            return snap

    def peek_rollout(self, rollout_id: str) -> TokenCaptureSnapshot | None:
        with self._lock, self._txn(False) as cur:
            state = self._load(cur, rollout_id, for_update=False)
            if state is None or state.is_empty():
                return None
            state.read_snapshot().unwrap()
            payloads = self._payloads(cur, rollout_id)
        return state.snapshot(TokenEntry.from_json(payloads[c]) for c in state.entry_keys)

    def _payloads(self, cur: Cursor, rollout_id: str) -> dict[str, bytes]:
        cur.execute(
            self._q("SELECT call_id, payload FROM capture_entries WHERE rollout_id = ?"),
            (rollout_id,),
        )
        return {row[0]: bytes(row[1]) for row in cur.fetchall()}

    def fetch_lineage(
        self, rollout_id: str, select: Callable[[Mapping[str, str]], Iterable[str]]
    ) -> tuple[Mapping[str, str], Sequence[TokenEntry]]:
        with self._lock, self._txn(False) as cur:
            state = self._load(cur, rollout_id, for_update=False)
            keys = dict(state.entry_keys) if state is not None else {}
            wanted = [c for c in select(keys) if c in keys]
            rows: list[Any] = []
            if wanted:
                marks = ", ".join("?" for _ in wanted)
                cur.execute(
                    self._q(
                        "SELECT call_id, payload FROM capture_entries "
                        f"WHERE rollout_id = ? AND call_id IN ({marks})"
                    ),
                    (rollout_id, *wanted),
                )
                rows = cur.fetchall()
        payloads = {row[0]: bytes(row[1]) for row in rows}
        # A read-committed database may show the state and the payloads from two different
        # commits: a payload that is not the one the state names is left for the next look.
        return keys, [
            TokenEntry.from_json(payloads[c])
            for c in wanted
            if c in payloads and entry_key(payloads[c]) == keys[c]
        ]

    def state_of(self, rollout_id: str) -> RolloutState:
        """The rollout's stored state (tests, audit)."""
        with self._lock, self._txn(False) as cur:
            return self._load(cur, rollout_id, for_update=False) or RolloutState.empty(rollout_id)

    def entry_count(self) -> int:
        """Number of stored payload rows (tests: retire and delete must remove them)."""
        with self._lock, self._txn(False) as cur:
            cur.execute("SELECT count(*) FROM capture_entries")
            row = cur.fetchone()
            return int(row[0])


def iter_statements(script: str) -> Iterator[str]:
    for stmt in script.split(";"):
        if stmt.strip():
            yield stmt.strip()

"""A capture store written only against the public store contract (``zephon.capture.stores.base``).

``dbm:///DIR``: rollout states, entry payloads and RL ledgers are keys of one ``dbm.dumb``
file; every primitive opens it under an exclusive ``flock`` of ``DIR/lock``, so clients in any
thread or process of the machine see one backend. It is the proof that a store outside zephon
needs nothing private: the tests run zephon's conformance suite and its mutants on it.
"""

from __future__ import annotations

import dbm.dumb
import fcntl
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from zephon.capture.records import TokenCaptureSnapshot, TokenEntry
from zephon.capture.stores import StoreSpec
from zephon.capture.stores.base import (
    Decide,
    Delete,
    DurableStore,
    Event,
    Put,
    Retire,
    RolloutState,
    StreamOp,
    Then,
    Transition,
    decide_stream,
    transition_result,
)
from zephon.capture.testing import StoreKind

Db = Any  # a dbm.dumb database: a mutable mapping of bytes


def _rollout(rollout_id: str) -> bytes:
    return f"r/{rollout_id}".encode()


def _entry(rollout_id: str, call_id: str) -> bytes:
    return f"e/{rollout_id}/{call_id}".encode()


class DbmStore(DurableStore):
    """A client of the dbm capture store in ``directory``."""

    kind = "dbm"

    def __init__(self, directory: str, *, create: bool = True) -> None:
        super().__init__(offload="thread")
        if not create and not os.path.isdir(directory):
            raise FileNotFoundError(f"dbm capture store {directory} does not exist")
        os.makedirs(directory, exist_ok=True)
        self.directory = directory

    @classmethod
    def from_url(cls, url: str, *, create: bool = True) -> DbmStore:
        parts = urlsplit(url)
        if parts.scheme != "dbm" or not parts.path:
            raise ValueError(f"DbmStore needs a dbm:///DIR URL, got {url!r}")
        return cls(parts.path, create=create)

    def describe(self) -> str:
        return f"dbm store {self.directory}"

    @contextmanager
    def _db(self) -> Iterator[Db]:
        with open(os.path.join(self.directory, "lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with dbm.dumb.open(os.path.join(self.directory, "capture"), "c") as db:
                yield db

    # -- the primitives ---------------------------------------------------------------------

    def _decided(
        self, db: Db, rollout_id: str, decide: Decide, write: bool
    ) -> tuple[RolloutState, Transition[Any]]:
        raw = db.get(_rollout(rollout_id))
        state = RolloutState.empty(rollout_id) if raw is None else RolloutState.from_json(raw)
        t = decide(state)
        if t.events and not write:
            raise AssertionError(f"read-only capture operation decided {t.events}")
        if t.events:
            self._persist(db, state, t.events)
        if t.error is not None:
            raise t.error  # after persisting: a conflict's poisoning sticks
        return state, t

    def _persist(self, db: Db, state: RolloutState, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, Put):
                db[_entry(state.rollout_id, event.call_id)] = event.entry_bytes
            elif isinstance(event, Retire | Delete):
                for call_id in state.entry_keys:
                    del db[_entry(state.rollout_id, call_id)]
            state.apply(event)
        if state.is_empty():
            db.pop(_rollout(state.rollout_id), None)
        else:
            db[_rollout(state.rollout_id)] = state.to_json()

    def _entries(self, db: Db, state: RolloutState) -> list[TokenEntry]:
        return [TokenEntry.from_json(db[_entry(state.rollout_id, c)]) for c in state.entry_keys]

    def transact_rollout(
        self,
        rollout_id: str,
        decide: Decide,
        then: Then = transition_result,
        *,
        write: bool = True,
    ) -> Any:
        with self._db() as db:
            state, t = self._decided(db, rollout_id, decide, write)
            return then(state, t)

    def freeze_rollout(self, rollout_id: str, snapshot_id: str) -> TokenCaptureSnapshot:
        with self._db() as db:
            state, _ = self._decided(db, rollout_id, lambda s: s.freeze(snapshot_id), True)
            return state.snapshot(self._entries(db, state))

    def peek_rollout(self, rollout_id: str) -> TokenCaptureSnapshot | None:
        with self._db() as db:
            raw = db.get(_rollout(rollout_id))
            if raw is None:
                return None
            state = RolloutState.from_json(raw)
            state.read_snapshot().unwrap()
            return state.snapshot(self._entries(db, state))

    def fetch_lineage(
        self, rollout_id: str, select: Callable[[Mapping[str, str]], Iterable[str]]
    ) -> tuple[Mapping[str, str], Sequence[TokenEntry]]:
        with self._db() as db:
            raw = db.get(_rollout(rollout_id))
            keys = {} if raw is None else dict(RolloutState.from_json(raw).entry_keys)
            wanted = [c for c in select(keys) if c in keys]
            return keys, [TokenEntry.from_json(db[_entry(rollout_id, c)]) for c in wanted]

    def transact_stream(self, stream: str, op: StreamOp, *, write: bool = True) -> Any:
        with self._db() as db:
            key = f"s/{stream}".encode()
            new, result = decide_stream(stream, db.get(key), op)
            if new is not None and not write:
                raise AssertionError(f"a read of stream {stream!r} changed its ledger")
            if new is not None:
                db[key] = new
            return result


DBM_SPEC = StoreSpec("dbm", ("dbm",), DbmStore, "dbm:///DIR", "a test store (dbm.dumb)")
DBM_KIND = StoreKind("dbm", durable=True, fresh_url="dbm://{dir}/capture")

"""The in-process store: the durable store's surface over a named in-memory backend.

Why named backends: conformance needs several fresh clients over one shared backend, so every
``MemoryStore.from_url("memory://NAME")`` in a process talks to the same ``_Backend``. Why a
:class:`DurableStore`: the argument checks, batching and the state machine calls are the
durable stores' own code, so the conformance suite that passes on this store proves that code
too; only the three primitives (keep the decided events in memory, freeze, read) live here.
Calls run inline on the caller's loop (nothing blocks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from zephon.capture.ledger import StreamLedger
from zephon.capture.records import TokenCaptureSnapshot, TokenEntry
from zephon.capture.stores._durable import Decide, DurableStore, StreamOp
from zephon.capture.stores._events import Delete, Event, Put, Retire
from zephon.capture.stores._state import RolloutState, Transition
from zephon.capture.stores._streamlog import replay, run_tracked

__all__ = ["MemoryStore", "drop_memory_backend"]


class _Backend:
    """Shared state of one ``memory://NAME``: rollout states, payloads, the event log."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.RLock()
        self.states: dict[str, RolloutState] = {}
        self.payloads: dict[str, dict[str, TokenEntry]] = {}
        self.events: dict[str, list[Event]] = {}
        self.snapshots: dict[str, TokenCaptureSnapshot] = {}
        self.streams: dict[str, tuple[StreamLedger, list[bytes]]] = {}
        """Per stream: the live ledger and its log of encoded deltas, one per move."""


_BACKENDS: dict[str, _Backend] = {}
_BACKENDS_LOCK = threading.Lock()


def _backend(name: str) -> _Backend:
    with _BACKENDS_LOCK:
        backend = _BACKENDS.get(name)
        if backend is None:
            backend = _BACKENDS[name] = _Backend(name)
        return backend


def drop_memory_backend(name: str) -> None:
    """Forget the backend of ``memory://NAME`` (existing clients keep the old one)."""
    with _BACKENDS_LOCK:
        _BACKENDS.pop(name, None)


def _result(_state: RolloutState, t: Transition[Any]) -> Any:
    return t.result


class MemoryStore(DurableStore):
    """A client of an in-process capture backend (``memory://NAME``; ``memory://`` = "default")."""

    kind = "memory"

    def __init__(self, name: str = "default") -> None:
        super().__init__(offload="inline")
        self._backend = _backend(name)

    @classmethod
    def from_url(cls, url: str, *, create: bool = True) -> MemoryStore:
        """``memory://NAME`` (a backend of this process; ``create`` has nothing to create)."""
        parts = urlsplit(url)
        if parts.scheme != "memory":
            raise ValueError(f"MemoryStore needs a memory:// URL, got {url!r}")
        name = (parts.netloc + parts.path).strip("/") or "default"
        return cls(name)

    @property
    def name(self) -> str:
        return self._backend.name

    def describe(self) -> str:
        return f"memory store {self.name!r}"

    # -- primitives ----------------------------------------------------------------------

    def transact_rollout(
        self,
        rollout_id: str,
        decide: Decide,
        then: Callable[[RolloutState, Transition[Any]], Any] = _result,
        *,
        write: bool = True,
    ) -> Any:
        """Decide, persist (here: keep in memory), apply, then return or raise."""
        b = self._backend
        with b.lock:
            state = b.states.get(rollout_id) or RolloutState.empty(rollout_id)
            t = decide(state)
            if t.events:
                if not write:
                    raise AssertionError(f"read-only capture operation decided {t.events}")
                self._persist(rollout_id, t.events)
                state.apply_all(t.events)
                b.snapshots.pop(rollout_id, None)
                if state.is_empty():
                    b.states.pop(rollout_id, None)
                else:
                    b.states[rollout_id] = state
            if t.error is not None:
                raise t.error
            return then(state, t)

    def _persist(self, rollout_id: str, events: Sequence[Event]) -> None:
        b = self._backend
        log = b.events.setdefault(rollout_id, [])
        for event in events:
            if isinstance(event, Put):
                entry = TokenEntry.from_json(event.entry_bytes)
                b.payloads.setdefault(rollout_id, {})[event.call_id] = entry
                log.append(event.without_entry())
            else:
                if isinstance(event, Retire | Delete):
                    b.payloads.pop(rollout_id, None)
                log.append(event)
        if isinstance(events[-1], Delete):
            b.events.pop(rollout_id, None)

    def freeze_rollout(self, rollout_id: str, snapshot_id: str) -> TokenCaptureSnapshot:
        b = self._backend
        with b.lock:
            self.transact_rollout(rollout_id, lambda s: s.freeze(snapshot_id))
            cached = b.snapshots.get(rollout_id)
            if cached is None:
                cached = b.snapshots[rollout_id] = self._snapshot(b.states[rollout_id])
            return cached

    def peek_rollout(self, rollout_id: str) -> TokenCaptureSnapshot | None:
        b = self._backend
        with b.lock:
            state = b.states.get(rollout_id)
            if state is None:
                return None
            state.read_snapshot().unwrap()
            return self._snapshot(state)

    def _snapshot(self, state: RolloutState) -> TokenCaptureSnapshot:
        payloads = self._backend.payloads.get(state.rollout_id, {})
        return state.snapshot(payloads[cid] for cid in state.entry_keys)

    def transact_stream(self, stream: str, op: StreamOp, *, write: bool = True) -> Any:
        """Run ``op`` on the stream's live ledger and append what it changed to the stream's
        log: a move costs O(members moved), like the file store's append, never a rewrite of
        the whole ledger. A failed op leaves the ledger as its log rebuilds it."""
        b = self._backend
        with b.lock:
            ledger, log = b.streams.get(stream) or (StreamLedger(stream=stream), [])
            try:
                delta, result = run_tracked(ledger, op, write=write)
            except BaseException:
                if stream in b.streams:
                    b.streams[stream] = (replay(StreamLedger(stream=stream), log), log)
                raise
            if delta is not None:
                log.append(delta)
                b.streams[stream] = (ledger, log)
            return result

    def stream_log(self, stream: str) -> list[bytes]:
        """The stream's encoded deltas, oldest first (tests and audit)."""
        with self._backend.lock:
            return list(self._backend.streams.get(stream, (None, []))[1])

    def fetch_lineage(
        self, rollout_id: str, select: Callable[[Mapping[str, str]], Iterable[str]]
    ) -> tuple[Mapping[str, str], Sequence[TokenEntry]]:
        b = self._backend
        with b.lock:
            state = b.states.get(rollout_id)
            keys = dict(state.entry_keys) if state is not None else {}
            payloads = b.payloads.get(rollout_id, {})
            return keys, [payloads[c] for c in select(keys) if c in payloads]

    # -- inspection (tests, audit) -------------------------------------------------------

    def state_of(self, rollout_id: str) -> RolloutState:
        """A copy of the rollout's state (tests and audit)."""
        with self._backend.lock:
            state = self._backend.states.get(rollout_id)
            return state.copy() if state is not None else RolloutState.empty(rollout_id)

    def events_of(self, rollout_id: str) -> list[Event]:
        """The persisted events since the last delete (``Put`` without payload)."""
        with self._backend.lock:
            return list(self._backend.events.get(rollout_id, ()))

    def is_process_shared(self) -> bool:
        return False

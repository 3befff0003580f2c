"""The in-process reference store: sink, source, ledger and lineage view over a named backend.

Why named backends: conformance needs several fresh clients over one shared backend, so every
``MemoryStore.from_url("memory://NAME")`` in a process talks to the same ``_Backend``. The store
is the executable reference of the state machine in :mod:`._state`; durable stores must behave
identically apart from surviving the process.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from zephon.capture.lineage import IncrementalResolver, resolve_from_ledger
from zephon.capture.protocols import LineageResolution
from zephon.capture.records import (
    CaptureLedgerCommit,
    EngineRefusalRecord,
    ParentResolutionStatus,
    RolloutRemoval,
    TokenCaptureSnapshot,
    TokenEntry,
    validate_capture_keys,
    validate_rollout_id,
)
from zephon.capture.stores._admit import admit_entry
from zephon.capture.stores._events import Delete, Event, Put, Retire
from zephon.capture.stores._state import RolloutState, Transition

__all__ = ["MemoryStore", "drop_memory_backend"]

T = TypeVar("T")


class _Backend:
    """Shared state of one ``memory://NAME``: rollout states, payloads, the event log."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.RLock()
        self.states: dict[str, RolloutState] = {}
        self.payloads: dict[str, dict[str, TokenEntry]] = {}
        self.events: dict[str, list[Event]] = {}
        self.snapshots: dict[str, TokenCaptureSnapshot] = {}


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


def _model_authored(item: Any) -> bool:
    return isinstance(item, dict) and (
        item.get("role") == "assistant" or item.get("type") == "function_call"
    )


class MemoryStore:
    """A client of an in-process capture backend (``memory://NAME``; ``memory://`` = "default")."""

    def __init__(self, name: str = "default") -> None:
        self._backend = _backend(name)
        self._closed = False
        self._resolver: IncrementalResolver | None = None

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

    # -- plumbing ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"memory capture store {self.name!r} client is closed")

    def _transact(self, rollout_id: str, decide: Callable[[RolloutState], Transition[T]]) -> T:
        """Decide, persist (here: keep in memory), apply, then return or raise."""
        self._check_open()
        validate_rollout_id(rollout_id)
        b = self._backend
        with b.lock:
            state = b.states.get(rollout_id) or RolloutState.empty(rollout_id)
            t = decide(state)
            if t.events:
                self._persist(rollout_id, t.events)
                state.apply_all(t.events)
                b.snapshots.pop(rollout_id, None)
                if state.is_empty():
                    b.states.pop(rollout_id, None)
                else:
                    b.states[rollout_id] = state
        return t.unwrap()

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

    def state_of(self, rollout_id: str) -> RolloutState:
        """A copy of the rollout's state (tests and audit)."""
        with self._backend.lock:
            state = self._backend.states.get(rollout_id)
            return state.copy() if state is not None else RolloutState.empty(rollout_id)

    def events_of(self, rollout_id: str) -> list[Event]:
        """The persisted events since the last delete (``Put`` without payload)."""
        with self._backend.lock:
            return list(self._backend.events.get(rollout_id, ()))

    # -- sink ----------------------------------------------------------------------------

    async def put(self, entry: TokenEntry) -> None:
        canonical = admit_entry(entry)
        self._transact(entry.rollout_id, lambda s: s.put(entry.model_call_id, canonical))

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        self._transact(rollout_id, lambda s: s.mark_incomplete(model_call_id))

    async def fail_call(self, rollout_id: str, model_call_id: str) -> None:
        self._transact(rollout_id, lambda s: s.fail_call(model_call_id))

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        if not model_call_id:
            raise ValueError("begin_call needs a non-empty model_call_id")
        self._transact(rollout_id, lambda s: s.begin_call(model_call_id))

    async def record_engine_refusal(
        self,
        rollout_id: str,
        *,
        model_call_id: str,
        code: str,
        parent_call_id: str | None = None,
        parent_resolution: ParentResolutionStatus | str | None = None,
    ) -> None:
        record = EngineRefusalRecord.of(
            model_call_id=model_call_id,
            code=code,
            parent_call_id=parent_call_id,
            parent_resolution=parent_resolution,
        )
        self._transact(rollout_id, lambda s: s.record_engine_refusal(record))

    # -- source --------------------------------------------------------------------------

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        snapshot_id = uuid.uuid4().hex
        b = self._backend
        with b.lock:
            self._transact(rollout_id, lambda s: s.freeze(snapshot_id))
            cached = b.snapshots.get(rollout_id)
            if cached is not None:
                return cached
            state = b.states[rollout_id]
            payloads = b.payloads.get(rollout_id, {})
            snapshot = state.snapshot(payloads[cid] for cid in state.entry_keys)
            b.snapshots[rollout_id] = snapshot
            return snapshot

    async def peek(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Read the rollout as a freeze would show it, without freezing or fencing it."""
        b = self._backend
        with b.lock:
            state = b.states.get(rollout_id)
            if state is None:
                raise LookupError(f"no rollout {rollout_id!r} in memory store {self.name!r}")
            state.read_snapshot().unwrap()
            payloads = b.payloads.get(rollout_id, {})
            return state.snapshot(payloads[cid] for cid in state.entry_keys)

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        return self._transact(rollout_id, lambda s: s.drop(snapshot_id, version))

    def _remove(
        self, rollout_ids: str | Sequence[str], action: Literal["retire", "delete"]
    ) -> RolloutRemoval:
        self._check_open()
        keys = validate_capture_keys(rollout_ids)
        changed = [
            key
            for key in keys
            if self._transact(key, lambda s: s.retire() if action == "retire" else s.delete())
        ]
        return RolloutRemoval(action=action, capture_keys=tuple(keys), changed=tuple(changed))

    async def retire(self, rollout_ids: str | Sequence[str]) -> RolloutRemoval:
        return self._remove(rollout_ids, "retire")

    async def delete(self, rollout_ids: str | Sequence[str]) -> RolloutRemoval:
        return self._remove(rollout_ids, "delete")

    # -- ledger --------------------------------------------------------------------------

    async def record(self, commit: CaptureLedgerCommit) -> None:
        self._transact(commit.rollout_id, lambda s: s.ledger_record(commit))

    async def record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        self._transact(rollout_id, lambda s: s.ledger_record_failure(model_call_id, reason))

    async def manifest(self, rollout_id: str) -> dict[str, Any]:
        return self._transact(rollout_id, lambda s: s.read_manifest()).to_wire()

    async def has_rows(self, rollout_id: str) -> bool:
        return self._transact(rollout_id, lambda s: s.read_has_rows())

    async def close_admissions(self, rollout_id: str) -> dict[str, Any]:
        with self._backend.lock:
            self._transact(rollout_id, lambda s: s.close_admissions())
            return await self.manifest(rollout_id)

    async def refuse_call(self, rollout_id: str, model_call_id: str) -> None:
        self._transact(rollout_id, lambda s: s.refuse_call(model_call_id))

    # -- lineage -------------------------------------------------------------------------

    def _lineage_fetch(
        self, rollout_id: str, select: Callable[[Mapping[str, str]], Iterable[str]]
    ) -> tuple[Mapping[str, str], Sequence[TokenEntry]]:
        b = self._backend
        with b.lock:
            state = b.states.get(rollout_id)
            keys = dict(state.entry_keys) if state is not None else {}
            payloads = b.payloads.get(rollout_id, {})
            return keys, [payloads[c] for c in select(keys) if c in payloads]

    async def resolve(
        self, rollout_id: str, request_items: list[dict[str, Any]]
    ) -> LineageResolution:
        """Request-time parent resolution over committed entries; never guesses.

        ROOT when the request has no model-authored item; otherwise exactly one candidate whose
        fingerprint and recorded context match (see :mod:`zephon.capture.lineage`), else
        UNRESOLVED. Each client keeps an incremental cache that reads only new entries.
        """
        self._check_open()
        validate_rollout_id(rollout_id)
        if self._resolver is None:
            self._resolver = IncrementalResolver(self._lineage_fetch)
        res = self._resolver.resolve(rollout_id, request_items)
        if res.status is not ParentResolutionStatus.UNRESOLVED:
            return res
        commits = self._transact(
            rollout_id, lambda s: Transition(result=list(s.ledger_commits.values()))
        )
        return resolve_from_ledger(request_items, commits) or res

    def is_process_shared(self) -> bool:
        return False

    async def close(self) -> None:
        self._closed = True

"""The embedded default capture store: one append-only log file per rollout (``file:///dir``).

Layout: ``<dir>/<rollout_id>.log``. Line 1 is a header record; every later line is one event
of the state machine in :mod:`._state` (puts carry the entry's canonical bytes), framed with a
CRC-32 by :mod:`._fsutil`. Lifecycle transitions (intent, incomplete, refusal, freeze, ledger
rows) are log records like puts. ``retire`` (and a matching ``drop``) compacts the log into a
header plus one state record (the fence, snapshot id and version; records are gone) by an
atomic rename; ``delete`` unlinks the log.

Why it is fast: each process keeps, per rollout, the open descriptor, the replayed state, the
byte offset up to which it has replayed, and where each entry's record sits. Under the lock an
operation calls ``fstat``; if the size equals the cached offset nothing is read, otherwise only
the appended tail is parsed. A put is then: lock, fstat, SHA-256 of the canonical bytes, one
``write`` + ``fdatasync``, unlock. The descriptor keeps the inode alive, so a cached offset can
never be confused with a new file of the same inode number; a replaced or unlinked log shows
``st_nlink == 0`` and is reopened. Repeated freezes of an unchanged rollout return the cached
snapshot without reading the file.

Durability: ``put`` returns after ``fdatasync`` of the log; the directory is fsynced after the
log is created (before its first record is written) and after every rename or unlink.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec

from zephon.capture.records import TokenCaptureSnapshot, TokenEntry
from zephon.capture.stores._durable import Decide, DurableStore, Offload, parse_offload
from zephon.capture.stores._fsutil import (
    LogCorruptionError,
    Record,
    append_parts,
    close_quietly,
    frame,
    frame_parts,
    fsync_dir,
    lock_fd,
    open_locked,
    pread_exact,
    replace_durable,
    scan,
    unlink_durable,
    unlock_fd,
)
from zephon.capture.stores._state import (
    Delete,
    Event,
    Put,
    Retire,
    RolloutState,
    Transition,
    decode_event,
    encode_event,
)

__all__ = ["LOG_FORMAT", "FileStore"]

LOG_FORMAT = "zephon-capture-log"
LOG_VERSION = 1
_HEADER = b"H"
_EVENT = b"e"
_PUT = b"p"  # body: the Put event without payload, a tab, the entry's canonical bytes
_STATE = b"S"
_SUFFIX = ".log"
_MAX_HANDLES = int(os.environ.get("ZEPHON_FILE_STORE_HANDLES", "256"))


class _Header(msgspec.Struct):
    format: str
    version: int
    rollout_id: str


def _header(rollout_id: str) -> bytes:
    body = msgspec.json.encode(_Header(LOG_FORMAT, LOG_VERSION, rollout_id))
    return frame(_HEADER, body)


class _Handle:
    """This process's view of one rollout log (guarded by ``mutex``)."""

    __slots__ = (
        "fd",
        "index",
        "lines",
        "mutex",
        "offset",
        "path",
        "rollout_id",
        "snapshot",
        "state",
    )

    def __init__(self, rollout_id: str, path: str) -> None:
        self.rollout_id = rollout_id
        self.path = path
        self.mutex = threading.Lock()
        self.fd: int | None = None
        self.reset()

    def reset(self) -> None:
        """Forget everything read from the file (the descriptor is handled by the caller)."""
        self.offset = 0
        self.lines = 0
        self.state = RolloutState.empty(self.rollout_id)
        self.index: dict[str, tuple[int, int]] = {}
        self.snapshot: tuple[int, TokenCaptureSnapshot] | None = None

    def close(self) -> None:
        if self.fd is not None:
            close_quietly(self.fd)
            self.fd = None
        self.reset()

    # Declared for mypy: assigned in reset().
    state: RolloutState
    index: dict[str, tuple[int, int]]
    snapshot: tuple[int, TokenCaptureSnapshot] | None
    offset: int
    lines: int


_HANDLES: OrderedDict[tuple[str, str], _Handle] = OrderedDict()
_HANDLES_LOCK = threading.Lock()
_HANDLES_PID = os.getpid()


def _handle(directory: str, rollout_id: str) -> _Handle:
    """The process-wide handle of a rollout log (LRU-bounded; reset after fork)."""
    global _HANDLES_PID
    key = (directory, rollout_id)
    with _HANDLES_LOCK:
        if os.getpid() != _HANDLES_PID:  # forked: locks and descriptors are not ours to reuse
            _HANDLES.clear()
            _HANDLES_PID = os.getpid()
        h = _HANDLES.get(key)
        if h is not None:
            _HANDLES.move_to_end(key)
            return h
        h = _HANDLES[key] = _Handle(rollout_id, os.path.join(directory, rollout_id + _SUFFIX))
        if len(_HANDLES) > _MAX_HANDLES:
            for old_key, old in list(_HANDLES.items())[: len(_HANDLES) - _MAX_HANDLES]:
                if old.mutex.acquire(blocking=False):
                    try:
                        old.close()
                    finally:
                        old.mutex.release()
                    del _HANDLES[old_key]
                    _SNAPSHOT_HOLDERS.pop(id(old), None)
        return h


_SNAPSHOT_HOLDERS: OrderedDict[int, _Handle] = OrderedDict()
_MAX_SNAPSHOTS = int(os.environ.get("ZEPHON_CAPTURE_SNAPSHOT_CACHE", "64"))


def _remember_snapshot(h: _Handle) -> None:
    """Bound the memory of cached snapshots (each holds decoded entries): only the most recently
    frozen ``ZEPHON_CAPTURE_SNAPSHOT_CACHE`` rollouts of the process keep theirs."""
    with _HANDLES_LOCK:
        _SNAPSHOT_HOLDERS[id(h)] = h
        _SNAPSHOT_HOLDERS.move_to_end(id(h))
        while len(_SNAPSHOT_HOLDERS) > _MAX_SNAPSHOTS:
            _, old = _SNAPSHOT_HOLDERS.popitem(last=False)
            old.snapshot = None  # a reader that already holds the tuple keeps a valid snapshot


def reset_process_cache() -> None:
    """Close every cached log descriptor of this process (tests use it to mimic a restart)."""
    with _HANDLES_LOCK:
        for h in _HANDLES.values():
            with h.mutex:
                h.close()
        _HANDLES.clear()
        _SNAPSHOT_HOLDERS.clear()


class FileStore(DurableStore):
    """A client of the capture logs in one directory; any number of processes may share it."""

    kind = "file"

    def __init__(self, directory: str, *, offload: Offload = "thread") -> None:
        super().__init__(offload=offload)
        os.makedirs(directory, exist_ok=True)
        self.directory = os.path.realpath(directory)

    @classmethod
    def from_url(cls, url: str) -> FileStore:
        """``file:///abs/dir`` (optionally ``?offload=inline``)."""
        parts = urlsplit(url)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path:
            raise ValueError(
                f"file capture store URL {url!r} must look like file:///absolute/directory"
            )
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"offload"}
        if unknown:
            raise ValueError(f"file capture store URL {url!r}: unknown option(s) {sorted(unknown)}")
        return cls(unquote(parts.path), offload=parse_offload(query.get("offload"), url))

    def describe(self) -> str:
        return f"file store {self.directory}"

    def log_path(self, rollout_id: str) -> str:
        return os.path.join(self.directory, rollout_id + _SUFFIX)

    # -- locking and replay -------------------------------------------------------------

    def _lock_and_sync(self, h: _Handle, *, exclusive: bool, create: bool) -> bool:
        """Lock ``h``'s current log and catch up with its tail; False if there is no log."""
        while True:
            if h.fd is None:
                fd = open_locked(h.path, create=create, exclusive=exclusive)
                if fd is None:
                    h.reset()
                    return False
                h.reset()
                h.fd = fd
                st = os.fstat(fd)
            else:
                lock_fd(h.fd, exclusive)
                st = os.fstat(h.fd)
                if st.st_nlink == 0:  # replaced (retire) or unlinked (delete) by another holder
                    h.close()
                    continue
            if st.st_size != h.offset:
                self._catch_up(h, st.st_size, exclusive)
            return True

    def _catch_up(self, h: _Handle, size: int, exclusive: bool) -> None:
        assert h.fd is not None
        if size < h.offset:
            raise LogCorruptionError(
                f"capture log {h.path} shrank from {h.offset} to {size} bytes behind this "
                "store's back; something other than zephon modified it"
            )
        buf = pread_exact(h.fd, size - h.offset, h.offset, h.path)
        result = scan(buf, offset=h.offset, line=h.lines + 1, path=h.path)
        for rec in result.records:
            self._apply_record(h, rec)
            h.offset = rec.end
            h.lines = rec.line
        if result.records:
            h.snapshot = None
        if result.torn and exclusive:
            # A writer died mid-record: that record was never acknowledged. Cut it off so the
            # next record starts on a clean line.
            os.ftruncate(h.fd, h.offset)
            os.fdatasync(h.fd)

    def _apply_record(self, h: _Handle, rec: Record) -> None:
        try:
            if rec.line == 1 and rec.tag != _HEADER:
                raise ValueError("line 1 is not a zephon capture log header")
            if rec.tag == _PUT:
                # Only the small event before the tab is parsed; the payload is not (the
                # record's CRC already vouches for it).
                event = decode_event(rec.body[: rec.body.index(b"\t")])
                if not isinstance(event, Put):
                    raise ValueError(f"a put record holds a {type(event).__name__} event")
                h.index[event.call_id] = (rec.offset, rec.end)
                h.state.apply(event)
            elif rec.tag == _EVENT:
                event = decode_event(rec.body)
                if isinstance(event, Put):
                    raise ValueError("a put event outside a put record")
                if isinstance(event, Retire | Delete):
                    h.index.clear()
                h.state.apply(event)
            elif rec.tag == _HEADER:
                header = msgspec.json.decode(rec.body, type=_Header)
                if rec.line != 1 or header.format != LOG_FORMAT:
                    raise ValueError("unexpected header record")
                if header.version != LOG_VERSION or header.rollout_id != h.rollout_id:
                    raise ValueError(
                        f"log version {header.version} of rollout {header.rollout_id!r} "
                        f"(this reader handles version {LOG_VERSION} of {h.rollout_id!r})"
                    )
            elif rec.tag == _STATE:
                h.state = RolloutState.from_json(rec.body)
                h.index.clear()
            else:
                raise ValueError(f"unknown record tag {rec.tag!r}")
        except (ValueError, msgspec.DecodeError) as exc:
            raise LogCorruptionError(
                f"capture log {h.path} line {rec.line} (byte {rec.offset}) cannot be applied: "
                f"{exc}; restore the file or delete the rollout"
            ) from None

    # -- persisting ---------------------------------------------------------------------

    def _persist(self, h: _Handle, events: tuple[Event, ...]) -> None:
        assert h.fd is not None
        if any(isinstance(e, Retire | Delete) for e in events):
            self._rewrite(h, events)
            return
        parts: list[bytes] = []
        pos = h.offset
        if pos == 0:
            # The log was just created: make its directory entry durable before any record
            # that a caller could be told is durable.
            fsync_dir(self.directory)
            parts.append(_header(h.rollout_id))
            pos += len(parts[0])
        # Every transition of the state machine decides at most one event, so a torn batch
        # can never leave half a transition behind (the header is complete on its own).
        spans: list[tuple[Put, int, int]] = []
        for event in events:
            if isinstance(event, Put):
                line = frame_parts(
                    _PUT, encode_event(event.without_entry()), b"\t", event.entry_bytes
                )
            else:
                line = [frame(_EVENT, encode_event(event))]
            size = sum(len(b) for b in line)
            if isinstance(event, Put):
                spans.append((event, pos, pos + size))
            parts += line
            pos += size
        append_parts(h.fd, parts)
        for event, start, end in spans:
            h.index[event.call_id] = (start, end)
        h.state.apply_all(events)
        h.lines += len(events) + (1 if h.offset == 0 else 0)
        h.offset = pos
        h.snapshot = None

    def _rewrite(self, h: _Handle, events: tuple[Event, ...]) -> None:
        """Retire compacts the log to its fence; delete removes it."""
        state = h.state.copy()
        state.apply_all(events)
        if state.is_empty():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(h.path + ".tmp")  # a crashed retire's leftover, if any
            unlink_durable(self.directory, h.path)
            h.close()
            return
        data = _header(h.rollout_id) + frame(_STATE, state.to_json())
        replace_durable(self.directory, h.path, data)
        h.close()  # releases our lock on the detached inode; waiters will reopen
        try:
            h.fd = os.open(h.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except FileNotFoundError:  # deleted by another process right after our rename
            return
        h.state = state
        h.offset = len(data)
        h.lines = 2

    # -- the primitives -----------------------------------------------------------------

    def _op(
        self,
        rollout_id: str,
        decide: Decide,
        then: Callable[[_Handle, Transition[Any]], Any],
        *,
        write: bool,
    ) -> Any:
        h = _handle(self.directory, rollout_id)
        with h.mutex:
            exists = self._lock_and_sync(h, exclusive=write, create=False)
            try:
                t = decide(h.state)
                if t.events:
                    if not write:
                        raise AssertionError(f"read-only capture operation decided {t.events}")
                    if not exists:
                        self._lock_and_sync(h, exclusive=True, create=True)
                        t = decide(h.state)  # someone may have created it meanwhile
                    if t.events:
                        self._persist(h, t.events)
                if t.error is not None:
                    raise t.error
                return then(h, t)
            finally:
                if h.fd is not None:
                    unlock_fd(h.fd)

    def _transact(
        self,
        rollout_id: str,
        decide: Decide,
        then: Callable[[RolloutState, Transition[Any]], Any] = lambda s, t: t.result,
        *,
        write: bool = True,
    ) -> Any:
        return self._op(rollout_id, decide, lambda h, t: then(h.state, t), write=write)

    def _freeze(self, rollout_id: str, snapshot_id: str) -> TokenCaptureSnapshot:
        snap: TokenCaptureSnapshot = self._op(
            rollout_id, lambda s: s.freeze(snapshot_id), self._snapshot, write=True
        )
        return snap

    def _snapshot(self, h: _Handle, _t: Transition[Any]) -> TokenCaptureSnapshot:
        cached = h.snapshot
        if cached is not None and cached[0] == h.offset:
            return cached[1]
        state = h.state
        snap = TokenCaptureSnapshot(
            rollout_id=h.rollout_id,
            entries=tuple(self._read_entries(h, list(state.entry_keys))),
            incomplete=state.snapshot_incomplete(),
            snapshot_id=state.snapshot_id,
            version=state.version,
            engine_refusals=tuple(state.refusals),
        )
        h.snapshot = (h.offset, snap)
        _remember_snapshot(h)
        return snap

    def _read_entries(self, h: _Handle, call_ids: list[str]) -> list[TokenEntry]:
        if not call_ids:
            return []
        assert h.fd is not None
        spans = [h.index[c] for c in call_ids]
        lo = min(s[0] for s in spans)
        hi = max(s[1] for s in spans)
        buf = pread_exact(h.fd, hi - lo, lo, h.path)
        entries = []
        for start, end in spans:
            line = buf[start - lo : end - lo - 1]
            entries.append(TokenEntry.from_json(line[line.index(b"\t") + 1 :]))
        return entries

    def _lineage_fetch(
        self, rollout_id: str, select: Callable[[Mapping[str, str]], Iterable[str]]
    ) -> tuple[Mapping[str, str], Sequence[TokenEntry]]:
        def then(h: _Handle, _t: Transition[Any]) -> tuple[dict[str, str], list[TokenEntry]]:
            keys = dict(h.state.entry_keys)
            return keys, self._read_entries(h, [c for c in select(keys) if c in h.index])

        return self._op(  # type: ignore[no-any-return]
            rollout_id, lambda s: Transition(), then, write=False
        )

    # -- inspection (tests, audit) ------------------------------------------------------

    def state_of(self, rollout_id: str) -> RolloutState:
        """A copy of the rollout's current state as replayed from its log."""
        result: RolloutState = self._transact(
            rollout_id, lambda s: Transition(), lambda s, _t: s.copy(), write=False
        )
        return result

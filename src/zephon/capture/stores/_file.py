"""The embedded default capture store: one append-only log file per rollout (``file:///dir``).

Layout: ``<dir>/<rollout_id>.log``, in the format of :mod:`._filelog`: a header and two commit
slots, then one line per event of the state machine in :mod:`._state` (puts carry the entry's
canonical bytes), each framed with a CRC-32 by :mod:`._fsutil`. Lifecycle transitions (intent,
incomplete, refusal, freeze, ledger rows) are log records like puts. ``retire`` (and a
matching ``drop``) compacts the log into a head plus one state record (the fence, snapshot id
and version; records are gone) by an atomic rename; ``delete`` unlinks the log.

Why it is fast: each process keeps, per rollout, the open descriptor, the replayed state, the
byte offset up to which it has replayed, and where each entry's record sits. Under the lock an
operation calls ``fstat``; if the size equals the cached offset nothing is read, otherwise only
the head and the appended tail are parsed. A put is then: lock, fstat, SHA-256 of the canonical
bytes, one vector write of the record, one small write of its commit slot, one ``fdatasync``,
unlock. The descriptor keeps the inode alive, so a cached offset can never be confused with a
new file of the same inode number; a replaced or unlinked log shows ``st_nlink == 0`` and is
reopened. Repeated freezes of an unchanged rollout return the cached snapshot.

Damage: acknowledged data that is missing or altered is never skipped silently (see
:mod:`._filelog` for how the commit slots tell it from a torn write). ``retire`` and ``delete``
still work on a damaged log; they are how an operator clears it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from zephon.capture.records import TokenCaptureSnapshot, TokenEntry
from zephon.capture.stores._durable import (
    Decide,
    DurableStore,
    Offload,
    StreamOp,
    parse_offload,
)
from zephon.capture.stores._events import (
    LOST_TAIL,
    Delete,
    Event,
    MarkIncomplete,
    Put,
    Retire,
    decode_event,
    encode_event,
)
from zephon.capture.stores._filelog import (
    HEAD_READ,
    Head,
    judge,
    looks_like_capture_log,
    new_log,
    parse_head,
    slot_line,
)
from zephon.capture.stores._filestream import stream_transact
from zephon.capture.stores._fsio import OS_FS, FileSystem
from zephon.capture.stores._fsutil import (
    LogCorruptionError,
    Record,
    close_quietly,
    create_durable,
    frame,
    frame_parts,
    line_is_intact,
    open_locked,
    pread_exact,
    replace_durable,
    scan,
    unlink_durable,
)
from zephon.capture.stores._state import RolloutState, Transition
from zephon.capture.stores._streamlog import StreamCache

__all__ = ["FileStore", "reset_process_cache"]

_LOG = logging.getLogger("zephon.capture")
_EVENT = b"e"
_PUT = b"p"  # body: the Put event without payload, a tab, the entry's canonical bytes
_STATE = b"S"
_SUFFIX = ".log"
_MAX_HANDLES = int(os.environ.get("ZEPHON_FILE_STORE_HANDLES", "256"))


class _Handle:
    """This process's view of one rollout log (guarded by ``mutex``)."""

    __slots__ = (
        "fd",
        "head",
        "index",
        "lines",
        "mutex",
        "offset",
        "path",
        "rollout_id",
        "seq",
        "size",
        "snapshot",
        "stale",
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
        self.size = 0
        self.lines = 0
        self.seq = 0
        self.head: Head | None = None
        self.stale = False
        self.state = RolloutState.empty(self.rollout_id)
        self.index: dict[str, tuple[int, int]] = {}
        self.snapshot: tuple[int, TokenCaptureSnapshot] | None = None

    def close(self, fs: FileSystem) -> None:
        if self.fd is not None:
            close_quietly(fs, self.fd)
            self.fd = None
        self.reset()

    # Declared for mypy: assigned in reset().
    state: RolloutState
    index: dict[str, tuple[int, int]]
    snapshot: tuple[int, TokenCaptureSnapshot] | None
    head: Head | None
    offset: int
    size: int
    lines: int
    seq: int
    stale: bool


_HANDLES: OrderedDict[tuple[FileSystem, str, str], _Handle] = OrderedDict()
_HANDLES_LOCK = threading.Lock()
_HANDLES_PID = os.getpid()


def _handle(fs: FileSystem, directory: str, rollout_id: str) -> _Handle:
    """The process-wide handle of a rollout log (LRU-bounded; reset after fork)."""
    global _HANDLES_PID
    key = (fs, directory, rollout_id)
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
                        old.close(old_key[0])
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
        for (fs, _, _), h in _HANDLES.items():
            with h.mutex:
                h.close(fs)
        _HANDLES.clear()
        _SNAPSHOT_HOLDERS.clear()


def _event_line(event: Event) -> list[bytes]:
    if isinstance(event, Put):
        return frame_parts(_PUT, encode_event(event.without_entry()), b"\t", event.entry_bytes)
    return [frame(_EVENT, encode_event(event))]


class FileStore(DurableStore):
    """A client of the capture logs in one directory; any number of processes may share it.

    ``fs`` is the file-system seam (tests pass a recording one); ``create=False`` refuses a
    directory that does not exist instead of creating it (read-only tools).
    """

    kind = "file"

    def __init__(
        self,
        directory: str,
        *,
        offload: Offload = "thread",
        fs: FileSystem = OS_FS,
        create: bool = True,
    ) -> None:
        super().__init__(offload=offload)
        if create:
            os.makedirs(directory, exist_ok=True)
        elif not os.path.isdir(directory):
            raise FileNotFoundError(
                f"file capture store {directory} does not exist (check the path; a store is "
                "only created by a writer)"
            )
        self.directory = os.path.realpath(directory)
        self.fs = fs
        self._stream_cache = StreamCache()

    @classmethod
    def from_url(cls, url: str, *, create: bool = True) -> FileStore:
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
        offload = parse_offload(query.get("offload"), url)
        return cls(unquote(parts.path), offload=offload, create=create)

    def describe(self) -> str:
        return f"file store {self.directory}"

    def log_path(self, rollout_id: str) -> str:
        return os.path.join(self.directory, rollout_id + _SUFFIX)

    # -- locking and replay -------------------------------------------------------------

    def _lock_and_sync(self, h: _Handle, *, exclusive: bool) -> bool:
        """Lock ``h``'s current log and catch up with its tail; False if there is no log."""
        fs = self.fs
        while True:
            if h.fd is None:
                fd = open_locked(fs, h.path, exclusive=exclusive)
                h.reset()
                if fd is None:
                    return False
                h.fd = fd
            else:
                fs.lock(h.fd, exclusive)
            size, links = fs.size_and_links(h.fd)
            if links == 0:  # replaced (retire) or unlinked (delete) by another holder
                h.close(fs)
                continue
            if size != h.offset or h.head is None:
                self._catch_up(h, size, exclusive)
            return True

    def _catch_up(self, h: _Handle, size: int, exclusive: bool) -> None:
        assert h.fd is not None
        if size < h.offset:
            raise LogCorruptionError(
                f"capture log {h.path} shrank from {h.offset} to {size} bytes behind this "
                "store's back; restore it, or retire or delete the rollout",
                path=h.path,
                offset=size,
            )
        h.size = size
        head = parse_head(self.fs.pread(h.fd, HEAD_READ, 0), h.path, h.rollout_id)
        if h.head is None:
            h.head, h.offset, h.lines = head, head.start, 3
        h.seq = head.seq
        buf = pread_exact(self.fs, h.fd, size - h.offset, h.offset, h.path)
        end = self._apply_all(h, scan(buf, offset=h.offset, line=h.lines + 1).records)
        verdict = judge(head, end, size, h.path)
        if verdict == "lost_tail":
            self._lost_tail(h, head, exclusive)

    def _apply_all(self, h: _Handle, records: list[Record]) -> int:
        """Apply valid records in order; returns where the applied ones end."""
        for rec in records:
            try:
                self._apply_record(h, rec)
            except ValueError:
                return rec.offset  # checksummed but not ours to apply: damaged like a bad line
            h.offset = rec.end
            h.lines = rec.line
            h.snapshot = None
        return h.offset

    def _lost_tail(self, h: _Handle, head: Head, exclusive: bool) -> None:
        """The newest write is gone: in flight at a crash, or acknowledged and then damaged."""
        if h.state.retired:
            return
        mark = MarkIncomplete(reason=LOST_TAIL)
        _LOG.warning(
            "capture log %s: the write claimed up to byte %d ends at byte %d; it was in flight "
            "at a crash or was damaged after it was acknowledged, so rollout %r is marked "
            "incomplete",
            h.path,
            head.claimed,
            h.offset,
            h.rollout_id,
        )
        if exclusive:
            self._append(h, _event_line(mark))
            h.lines += 1
        else:  # a reader never writes: reflect the verdict, re-read on the next call
            h.stale = True
        h.state.apply(mark)
        h.snapshot = None

    def _apply_record(self, h: _Handle, rec: Record) -> None:
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
        elif rec.tag == _STATE:
            h.state = RolloutState.from_json(rec.body)
            h.index.clear()
        else:
            raise ValueError(f"unknown record tag {rec.tag!r}")

    # -- persisting ---------------------------------------------------------------------

    def _append(self, h: _Handle, parts: list[bytes]) -> None:
        """Write ``parts`` at the valid end, claim them in the next commit slot, sync once."""
        assert h.fd is not None and h.head is not None
        fs = self.fs
        end = h.offset + sum(len(p) for p in parts)
        seq = h.seq + 1
        fs.pwritev(h.fd, parts, h.offset)
        if h.size > end:  # a torn tail longer than this record
            fs.truncate(h.fd, end)
        fs.pwritev(h.fd, [slot_line(seq, end)], h.head.next_slot(seq))
        fs.datasync(h.fd)
        h.seq, h.offset, h.size = seq, end, end

    def _persist(self, h: _Handle, events: tuple[Event, ...]) -> None:
        if any(isinstance(e, Retire | Delete) for e in events):
            self._rewrite(h, events)
            return
        # Every transition of the state machine decides at most one event, so a torn batch
        # can never leave half a transition behind.
        parts: list[bytes] = []
        spans: list[tuple[str, int, int]] = []
        pos = h.offset
        for event in events:
            line = _event_line(event)
            size = sum(len(b) for b in line)
            if isinstance(event, Put):
                spans.append((event.call_id, pos, pos + size))
            parts += line
            pos += size
        self._append(h, parts)
        for call_id, start, end in spans:
            h.index[call_id] = (start, end)
        h.state.apply_all(events)
        h.lines += len(events)
        h.snapshot = None

    def _rewrite(self, h: _Handle, events: tuple[Event, ...]) -> None:
        """Retire compacts the log to its fence; delete removes it."""
        state = h.state.copy()
        state.apply_all(events)
        fs = self.fs
        if state.is_empty():
            fs.unlink(h.path + ".tmp")  # a crashed retire's leftover, if any
            unlink_durable(fs, self.directory, h.path)
            h.close(fs)
            return
        data = new_log(h.rollout_id, frame(_STATE, state.to_json()))
        replace_durable(fs, self.directory, h.path, data)
        h.close(fs)  # releases our lock on the detached inode; waiters will reopen
        try:
            h.fd = fs.open(h.path, os.O_RDWR)
        except FileNotFoundError:  # deleted by another process right after our rename
            return
        h.head = parse_head(data, h.path, h.rollout_id)
        h.state = state
        h.offset = h.size = len(data)
        h.lines = 4

    # -- the primitives -----------------------------------------------------------------

    def _op(
        self,
        rollout_id: str,
        decide: Decide,
        then: Callable[[_Handle, Transition[Any]], Any],
        *,
        write: bool,
        before: Callable[[_Handle], None] | None = None,
    ) -> Any:
        h = _handle(self.fs, self.directory, rollout_id)
        with h.mutex:
            try:
                exists = self._lock_and_sync(h, exclusive=write)
                if before is not None and exists:
                    before(h)
                t = decide(h.state)
                if t.events:
                    if not write:
                        raise AssertionError(f"read-only capture operation decided {t.events}")
                    if not exists and not self._create(h, t.events):
                        t = decide(h.state)  # another process created it meanwhile
                        if t.events:
                            self._persist(h, t.events)
                    elif exists:
                        self._persist(h, t.events)
                if t.error is not None:
                    raise t.error
                return then(h, t)
            finally:
                self._release(h)

    def _create(self, h: _Handle, events: tuple[Event, ...]) -> bool:
        """Create the log already holding ``events`` (one sync of the new file, one of the
        directory, like any first write must pay); False if another process created it first.
        Either way ``h`` is then locked on the log and caught up with it."""
        records = b"".join(b"".join(_event_line(e)) for e in events)
        created = create_durable(self.fs, self.directory, h.path, new_log(h.rollout_id, records))
        self._lock_and_sync(h, exclusive=True)
        return created

    def _release(self, h: _Handle) -> None:
        if h.fd is not None:
            self.fs.unlock(h.fd)
            if h.stale:
                h.close(self.fs)

    def remove_rollout(self, rollout_id: str, action: Literal["retire", "delete"]) -> bool:
        """Retire or delete, also when the log is damaged (how an operator clears it)."""
        try:
            return bool(super().remove_rollout(rollout_id, action))
        except LogCorruptionError:
            pass
        h = _handle(self.fs, self.directory, rollout_id)
        with h.mutex:
            h.close(self.fs)
            fd = open_locked(self.fs, h.path, exclusive=True)
            if fd is None:
                return False
            h.fd = fd
            try:
                if not looks_like_capture_log(self.fs.pread(fd, HEAD_READ, 0)):
                    raise LogCorruptionError(
                        f"{h.path} is not a zephon capture log; this store never modifies it: "
                        "move it out of the store directory",
                        path=h.path,
                        offset=0,
                    )
                self._salvage(h)
                _LOG.warning("capture log %s is damaged; %s it anyway", h.path, action)
                self._rewrite(h, (Retire(),) if action == "retire" else (Delete(),))
                return True
            finally:
                self._release(h)

    def _salvage(self, h: _Handle) -> None:
        """Replay the valid prefix of a damaged log into ``h.state`` (the fence it kept)."""
        assert h.fd is not None
        size = self.fs.size_and_links(h.fd)[0]
        try:
            head = parse_head(self.fs.pread(h.fd, HEAD_READ, 0), h.path, h.rollout_id)
        except LogCorruptionError:
            return  # an unreadable head: nothing to salvage
        buf = self.fs.pread(h.fd, max(0, size - head.start), head.start)
        h.head, h.offset, h.lines = head, head.start, 3
        self._apply_all(h, scan(buf, offset=head.start, line=4).records)
        h.state.apply(MarkIncomplete(reason=LOST_TAIL))

    def transact_rollout(
        self,
        rollout_id: str,
        decide: Decide,
        then: Callable[[RolloutState, Transition[Any]], Any] = lambda s, t: t.result,
        *,
        write: bool = True,
    ) -> Any:
        return self._op(rollout_id, decide, lambda h, t: then(h.state, t), write=write)

    def transact_stream(self, stream: str, op: StreamOp, *, write: bool = True) -> Any:
        return stream_transact(
            self.fs, self.directory, stream, op, write=write, cache=self._stream_cache
        )

    def freeze_rollout(self, rollout_id: str, snapshot_id: str) -> TokenCaptureSnapshot:
        read: list[list[TokenEntry]] = []

        def before(h: _Handle) -> None:
            # Read every entry before the first freeze is written: a freeze that fails to
            # read the rollout must not fence it.
            if not h.state.frozen and h.state.entry_keys:
                read.append(self._read_entries(h, list(h.state.entry_keys)))

        def then(h: _Handle, t: Transition[Any]) -> TokenCaptureSnapshot:
            return self._snapshot(h, t, read[0] if read else None)

        snap: TokenCaptureSnapshot = self._op(
            rollout_id, lambda s: s.freeze(snapshot_id), then, write=True, before=before
        )
        return snap

    def peek_rollout(self, rollout_id: str) -> TokenCaptureSnapshot | None:
        def then(h: _Handle, t: Transition[Any]) -> TokenCaptureSnapshot | None:
            return None if h.state.is_empty() else self._snapshot(h, t)

        return self._op(  # type: ignore[no-any-return]
            rollout_id, lambda s: s.read_snapshot(), then, write=False
        )

    def _snapshot(
        self, h: _Handle, _t: Transition[Any], entries: list[TokenEntry] | None = None
    ) -> TokenCaptureSnapshot:
        cached = h.snapshot
        if cached is not None and cached[0] == h.offset:
            return cached[1]
        if entries is None:
            entries = self._read_entries(h, list(h.state.entry_keys))
        snap = h.state.snapshot(entries)
        if not h.stale:
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
        buf = pread_exact(self.fs, h.fd, hi - lo, lo, h.path)
        entries = []
        for start, end in spans:
            line = buf[start - lo : end - lo]
            if not line_is_intact(line):
                raise LogCorruptionError(
                    f"capture log {h.path} is damaged at byte {start}: an acknowledged entry "
                    "changed after it was read; restore the file, or retire or delete the "
                    "rollout",
                    path=h.path,
                    offset=start,
                )
            entries.append(TokenEntry.from_json(line[line.index(b"\t") + 1 : -1]))
        return entries

    def fetch_lineage(
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
        result: RolloutState = self.transact_rollout(
            rollout_id, lambda s: Transition(), lambda s, _t: s.copy(), write=False
        )
        return result

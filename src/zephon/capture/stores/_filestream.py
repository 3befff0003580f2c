"""The prompt ledgers of a file store: one append-only, checksummed log per RL stream.

Layout: ``<dir>/<stream>.stream`` is a sequence of framed lines (CRC-32 each): tag ``D`` holds
one :class:`~zephon.capture.ledger.LedgerDelta` (what one transaction changed); a first line
tagged ``L`` holds a whole ledger (the format of earlier versions, read as the base the deltas
apply to). ``<dir>/<stream>.stream-lock`` carries the ``flock`` that orders the processes. A
move appends one line and syncs it before it returns, so it costs O(members moved), not
O(prompts); a client reads only the lines appended since its last look
(:mod:`._streamlog`). After :func:`~._streamlog.compact_after` delta lines a writer rewrites
the file as one base line (temp file, fsync, rename), so the file and a first read stay
O(prompts).

Crashes: a final line without its newline is a write that never completed (so never
acknowledged); readers ignore it and the next writer truncates it before appending. Any other
line that fails its checksum raises
:class:`~zephon.capture.stores._fsutil.LogCorruptionError` instead of reading as empty.
"""

from __future__ import annotations

import os
from typing import Any

from zephon.capture.ledger import StreamLedger
from zephon.capture.stores._durable import StreamOp
from zephon.capture.stores._fsio import FileSystem
from zephon.capture.stores._fsutil import (
    LogCorruptionError,
    frame,
    pread_exact,
    replace_durable,
    scan,
)
from zephon.capture.stores._streamlog import (
    StreamCache,
    compact_after,
    decode_delta,
    run_tracked,
)

__all__ = ["stream_transact"]

_BASE = b"L"
_DELTA = b"D"

Mark = tuple[tuple[int, int], int, int]
"""Where a client stopped reading a stream file: its identity, the end of its valid lines, and
how many delta lines follow the file's base (for compaction)."""


def _damaged(path: str, offset: int, why: str) -> LogCorruptionError:
    fix = "restore it from a backup or move it away to start the stream afresh"
    message = f"{path} is not an intact zephon stream ledger ({why} at byte {offset}); {fix}"
    return LogCorruptionError(message, path=path, offset=offset)


def _load(
    fs: FileSystem, fd: int, path: str, stream: str, cache: StreamCache
) -> tuple[StreamLedger, Mark, int]:
    """The ledger in the file, its mark ``(identity, end of the valid lines)`` and how many
    torn bytes follow (the cached ledger plus the lines appended since, when still valid)."""
    size = fs.size_and_links(fd)[0]
    ident = fs.identity(fd)
    hit = cache.get(stream)
    if hit is not None and hit[0][0] == ident and hit[0][1] <= size:
        ledger, start, deltas = hit[1], int(hit[0][1]), int(hit[0][2])
    else:
        ledger, start, deltas = StreamLedger(stream=stream), 0, 0
    buf = pread_exact(fs, fd, size - start, start, path) if size > start else b""
    found = scan(buf, offset=start, line=1)
    if found.torn and (found.followed or buf.endswith(b"\n")):
        raise _damaged(path, found.end, "a line fails its checksum or framing")
    for record in found.records:
        if record.tag == _BASE and record.offset == 0:
            ledger = StreamLedger.from_json(record.body)
        elif record.tag == _DELTA:
            ledger.apply_delta(decode_delta(record.body))
            deltas += 1
        else:
            raise _damaged(path, record.offset, f"an unexpected {record.tag!r} line")
    return ledger, (ident, found.end, deltas), found.torn


def _append(
    fs: FileSystem,
    directory: str,
    path: str,
    fd: int | None,
    mark: Mark | None,
    torn: int,
    delta: bytes,
) -> tuple[int, Mark]:
    """Append one delta line durably (creating the file, cutting a torn tail first)."""
    created = fd is None
    if fd is None or mark is None:
        fd = fs.open(path, os.O_RDWR | os.O_CREAT)
        mark = (fs.identity(fd), 0, 0)
    if torn:
        fs.truncate(fd, mark[1])  # the unfinished line of a writer that died
    line = frame(_DELTA, delta)
    fs.pwritev(fd, [line], mark[1])
    fs.datasync(fd)
    if created:
        fs.sync_dir(directory)
    return fd, (mark[0], mark[1] + len(line), mark[2] + 1)


def _compact(fs: FileSystem, directory: str, path: str, ledger: StreamLedger) -> Mark:
    """Replace the file by one base line holding ``ledger`` (atomically and durably: a crash
    leaves the old file or the new one, the same ledger either way)."""
    data = frame(_BASE, ledger.to_json())
    replace_durable(fs, directory, path, data)
    fd = fs.open(path, os.O_RDONLY)
    try:
        return (fs.identity(fd), len(data), 0)
    finally:
        fs.close(fd)


def _transact(
    fs: FileSystem,
    directory: str,
    path: str,
    stream: str,
    op: StreamOp,
    write: bool,
    cache: StreamCache,
) -> Any:
    try:
        fd: int | None = fs.open(path, os.O_RDWR)
    except FileNotFoundError:
        fd = None
    try:
        ledger, mark, torn = StreamLedger(stream=stream), None, 0
        if fd is not None:
            ledger, mark, torn = _load(fs, fd, path, stream, cache)
        delta, result = run_tracked(ledger, op, write=write)
        if delta is not None:
            fd, mark = _append(fs, directory, path, fd, mark, torn, delta)
            if mark[2] > compact_after(len(ledger.prompts)):
                mark = _compact(fs, directory, path, ledger)
        if mark is not None:
            cache.put(stream, mark, ledger)
        return result
    finally:
        if fd is not None:
            fs.close(fd)


def stream_transact(
    fs: FileSystem,
    directory: str,
    stream: str,
    op: StreamOp,
    *,
    write: bool,
    cache: StreamCache,
) -> Any:
    """Run ``op`` on the stream's ledger under its lock; append what it changed durably."""
    path = os.path.join(directory, stream + ".stream")
    lock_fd = fs.open(path + "-lock", os.O_RDWR | os.O_CREAT)
    try:
        fs.lock(lock_fd, write)
        with cache.lock:
            try:
                return _transact(fs, directory, path, stream, op, write, cache)
            except BaseException:
                cache.drop(stream)
                raise
    finally:
        fs.close(lock_fd)  # closing the descriptor releases the lock

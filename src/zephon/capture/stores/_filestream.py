"""The prompt ledgers of a file store: one checksummed JSON file per RL stream.

Layout: ``<dir>/<stream>.stream`` holds one framed line (tag ``L``, CRC-32, the
:class:`~zephon.capture.ledger.StreamLedger` JSON), replaced atomically and durably (temp file,
fsync, rename, fsync of the directory) by every change; ``<dir>/<stream>.stream-lock`` is never
replaced and carries the ``flock`` that orders the processes. A crash leaves the old or the new
file, never half of one; a file that fails its checksum raises
:class:`~zephon.capture.stores._fsutil.LogCorruptionError` instead of reading as empty.

Why a whole file per change: the first increment favours one obviously atomic step over
speed; a change costs writing the whole ledger (a few hundred bytes per prompt).
"""

from __future__ import annotations

import os
from typing import Any

from zephon.capture.stores._durable import StreamOp, decide_stream
from zephon.capture.stores._fsio import FileSystem
from zephon.capture.stores._fsutil import LogCorruptionError, frame, parse_line, replace_durable

__all__ = ["stream_transact"]

_TAG = b"L"


def _read(fs: FileSystem, path: str) -> bytes | None:
    try:
        fd = fs.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = fs.size_and_links(fd)[0]
        data = fs.pread(fd, size, 0) if size else b""
    finally:
        fs.close(fd)
    parsed = parse_line(data[:-1]) if data.endswith(b"\n") else None
    if parsed is None or parsed[0] != _TAG:
        raise LogCorruptionError(
            f"{path} is not an intact zephon stream ledger (checksum or framing fails); "
            "restore it from a backup or move it away to start the stream afresh",
            path=path,
            offset=0,
        )
    return parsed[1]


def stream_transact(
    fs: FileSystem, directory: str, stream: str, op: StreamOp, *, write: bool
) -> Any:
    """Run ``op`` on the stream's ledger under its lock; store the result durably if changed."""
    path = os.path.join(directory, stream + ".stream")
    lock_fd = fs.open(path + "-lock", os.O_RDWR | os.O_CREAT)
    try:
        fs.lock(lock_fd, write)
        new, result = decide_stream(stream, _read(fs, path), op)
        if new is not None:
            if not write:
                raise AssertionError(f"a read of stream {stream!r} changed its ledger")
            replace_durable(fs, directory, path, frame(_TAG, new))
        return result
    finally:
        fs.close(lock_fd)  # closing the descriptor releases the lock

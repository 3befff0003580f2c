"""Durable log files: line framing, scanning, and the durable create/replace/unlink steps.

A log is a sequence of lines ``<tag> <crc32 hex8> <body>\\n``. ``body`` never contains a
newline (it is compact JSON), so a line is the unit of atomicity. :func:`scan` reads valid lines
up to the first damaged one and reports where that is; whether the damage is a torn write that
was never acknowledged or lost acknowledged data is decided by the caller, which knows how far
the log was acknowledged (see :mod:`._filelog`).

Locking: writers hold ``flock(LOCK_EX)`` on the log file itself while they write and sync;
readers hold ``LOCK_SH``, so a reader never sees a record whose sync has not finished. A file
may be replaced (retire) or unlinked (delete) under the exclusive lock; every locker re-checks
the link count after acquiring the lock and reopens the path when its inode was detached.
Every operation goes through a :class:`~._fsio.FileSystem`.
"""

from __future__ import annotations

import contextlib
import os
import uuid
import zlib
from dataclasses import dataclass

from zephon._atomic import replace_through
from zephon.capture.stores._fsio import FileSystem
from zephon.errors import DataFormatError

__all__ = [
    "LogCorruptionError",
    "Record",
    "Scan",
    "close_quietly",
    "create_durable",
    "frame",
    "frame_parts",
    "line_is_intact",
    "open_locked",
    "pread_exact",
    "replace_durable",
    "scan",
    "unlink_durable",
]


class LogCorruptionError(DataFormatError):
    """A capture log lost or altered acknowledged data, or is not a capture log at all.

    ``path`` and ``offset`` say where: the file and the byte at which valid data ends.
    """

    def __init__(self, message: str, *, path: str = "", offset: int = -1) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


def frame(tag: bytes, body: bytes) -> bytes:
    """One log line: ``tag``, the CRC-32 of ``body`` as 8 hex digits, ``body``, newline."""
    return b"".join((tag, b" %08x " % zlib.crc32(body), body, b"\n"))


def frame_parts(tag: bytes, *body: bytes) -> list[bytes]:
    """:func:`frame` of ``b"".join(body)`` as buffers for ``writev`` (no copy of the body)."""
    crc = 0
    for part in body:
        crc = zlib.crc32(part, crc)
    return [tag + b" %08x " % crc, *body, b"\n"]


@dataclass(frozen=True, slots=True)
class Record:
    """One valid log line: where it starts (byte offset, 1-based line) and what it holds."""

    tag: bytes
    body: bytes
    offset: int
    line: int

    @property
    def end(self) -> int:
        """Offset just past this record's newline (where the next record starts)."""
        return self.offset + len(self.tag) + 10 + len(self.body) + 1


@dataclass(frozen=True, slots=True)
class Scan:
    """The valid records of a buffer, where they end, and how many bytes after are not valid.

    ``followed``: the invalid bytes hold more than one line (something was written after the
    damaged line, so it cannot be a single torn write).
    """

    records: list[Record]
    end: int
    lines: int
    torn: int
    followed: bool = False


def parse_line(line: bytes) -> tuple[bytes, bytes] | None:
    """``(tag, body)`` of a line without its newline, or None if framing or checksum is bad."""
    sp = line.find(b" ")
    if sp <= 0 or len(line) < sp + 10 or line[sp + 9 : sp + 10] != b" ":
        return None
    body = line[sp + 10 :]
    if line[sp + 1 : sp + 9] != b"%08x" % zlib.crc32(body):  # exact bytes: no case variants
        return None
    return line[:sp], body


def line_is_intact(line: bytes) -> bool:
    """Whether ``line`` (newline included) is one well-framed line with a matching checksum."""
    return line.endswith(b"\n") and parse_line(line[:-1]) is not None


def scan(buf: bytes, *, offset: int, line: int) -> Scan:
    """Parse the valid records in ``buf`` (file ``offset``, 1-based ``line``) up to the first
    line that is unterminated or fails its checksum."""
    records: list[Record] = []
    pos = 0
    size = len(buf)
    while pos < size:
        nl = buf.find(b"\n", pos)
        parsed = None if nl < 0 else parse_line(buf[pos:nl])
        if parsed is None:
            followed = nl >= 0 and nl + 1 < size
            return Scan(records, offset + pos, line - 1, size - pos, followed)
        records.append(Record(parsed[0], parsed[1], offset + pos, line))
        pos = nl + 1
        line += 1
    return Scan(records, offset + pos, line - 1, 0)


def pread_exact(fs: FileSystem, fd: int, size: int, offset: int, path: str) -> bytes:
    """Read exactly ``size`` bytes at ``offset`` (the caller knows they exist)."""
    chunks = []
    while size > 0:
        chunk = fs.pread(fd, size, offset)
        if not chunk:
            raise LogCorruptionError(
                f"capture log {path} ended early at byte {offset}: it was truncated by "
                "something other than this store; restore it or retire/delete the rollout",
                path=path,
                offset=offset,
            )
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def open_locked(fs: FileSystem, path: str, *, exclusive: bool) -> int | None:
    """Open the existing ``path`` and lock it; None when it does not exist.

    Loops while the locked inode turns out to be detached (replaced or unlinked by the holder
    of the previous lock), so the returned descriptor is the file currently at ``path``.
    """
    while True:
        try:
            fd = fs.open(path, os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            fs.lock(fd, exclusive)
            if fs.size_and_links(fd)[1] > 0:
                return fd
        except BaseException:
            fs.close(fd)
            raise
        fs.close(fd)


def _write_synced(fs: FileSystem, path: str, data: bytes) -> None:
    fd = fs.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        fs.pwritev(fd, [data], 0)
        fs.datasync(fd)
    finally:
        fs.close(fd)


def create_durable(fs: FileSystem, dir_path: str, path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data`` as one atomic, durable step; False if it exists.

    A temp file is written and synced, then hard-linked into place, so ``path`` never exists
    half-written and a concurrent creator's file is never overwritten.
    """
    tmp = f"{path}.{uuid.uuid4().hex[:12]}.new"
    _write_synced(fs, tmp, data)
    try:
        created = fs.link(tmp, path)
    finally:
        fs.unlink(tmp)
    fs.sync_dir(dir_path)
    return created


def replace_durable(fs: FileSystem, dir_path: str, path: str, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``: temp file, sync, rename, sync directory.

    The temp name is fixed (``<path>.tmp``): callers hold the exclusive lock of ``path``, and
    a later locker can only reach the renamed file, so two writers never share the temp file;
    a leftover from a crash is simply overwritten by the next replace.
    """
    replace_through(fs, path, data, tmp=f"{path}.tmp", directory=dir_path, mode=0o644)


def unlink_durable(fs: FileSystem, dir_path: str, path: str) -> bool:
    """Remove ``path`` if present and make the removal durable; True when a file was removed."""
    if not fs.unlink(path):
        return False
    fs.sync_dir(dir_path)
    return True


def close_quietly(fs: FileSystem, fd: int) -> None:
    with contextlib.suppress(OSError):
        fs.close(fd)

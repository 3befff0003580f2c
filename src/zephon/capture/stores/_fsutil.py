"""Durable append-only log files: framing, torn-tail recovery, flock and fsync helpers.

A log is a sequence of lines ``<tag> <crc32 hex8> <body>\\n``. ``body`` never contains a
newline (it is compact JSON), so a line is the unit of atomicity: a line without its newline,
or whose checksum does not match, at the very end of the file was torn by a crash while being
written (it was never acknowledged, so it is ignored and cut off by the next writer); the same
damage anywhere before the last line is corruption and is refused with the file and line.

Locking: writers hold ``flock(LOCK_EX)`` on the log file itself while they append and fsync;
readers hold ``LOCK_SH``, so a reader never sees a record whose fsync has not finished. A file
may be replaced (retire) or unlinked (delete) under the exclusive lock; every locker re-checks
``st_nlink`` after acquiring the lock and reopens the path when its inode was detached.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import zlib
from dataclasses import dataclass

from zephon.errors import DataFormatError

__all__ = [
    "LogCorruptionError",
    "Record",
    "Scan",
    "append_all",
    "append_parts",
    "frame",
    "frame_parts",
    "fsync_dir",
    "lock_fd",
    "open_locked",
    "pread_exact",
    "replace_durable",
    "scan",
    "unlink_durable",
    "unlock_fd",
]


class LogCorruptionError(DataFormatError):
    """A capture log is damaged before its last line (names the file and line)."""


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
    """The valid records of a buffer, where they end, and how many bytes after were torn."""

    records: list[Record]
    end: int
    lines: int
    torn: int


def _parse_line(line: bytes) -> tuple[bytes, bytes] | None:
    sp = line.find(b" ")
    if sp <= 0 or len(line) < sp + 10 or line[sp + 9 : sp + 10] != b" ":
        return None
    try:
        crc = int(line[sp + 1 : sp + 9], 16)
    except ValueError:
        return None
    body = line[sp + 10 :]
    if zlib.crc32(body) != crc:
        return None
    return line[:sp], body


def scan(buf: bytes, *, offset: int, line: int, path: str) -> Scan:
    """Parse the records in ``buf``, which starts at file ``offset`` on 1-based line ``line``.

    A damaged last line (missing newline or bad checksum, nothing after it) is reported as
    ``torn`` bytes; a damaged line with anything after it raises :class:`LogCorruptionError`.
    """
    records: list[Record] = []
    pos = 0
    size = len(buf)
    while pos < size:
        nl = buf.find(b"\n", pos)
        if nl < 0:
            return Scan(records, offset + pos, line - 1, size - pos)
        parsed = _parse_line(buf[pos:nl])
        if parsed is None:
            if nl + 1 == size:
                return Scan(records, offset + pos, line - 1, size - pos)
            raise LogCorruptionError(
                f"capture log {path} is corrupt at line {line} (byte {offset + pos}): bad "
                f"framing or checksum, and {size - nl - 1} more bytes follow, so this is not a "
                "torn final write; restore the file from a backup or delete the rollout"
            )
        records.append(Record(parsed[0], parsed[1], offset + pos, line))
        pos = nl + 1
        line += 1
    return Scan(records, offset + pos, line - 1, 0)


def append_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (a write may be short) and make it durable with ``fdatasync``."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    os.fdatasync(fd)


def append_parts(fd: int, parts: list[bytes]) -> None:
    """Append ``parts`` with one ``writev`` (falling back to a joined write if it is short),
    then ``fdatasync``. The file is opened with ``O_APPEND``, so a short vector write is
    completed by appending the rest."""
    total = sum(len(p) for p in parts)
    n = os.writev(fd, parts) if len(parts) <= 1024 else 0
    if n < total:
        append_all(fd, b"".join(parts)[n:])
    else:
        os.fdatasync(fd)


def pread_exact(fd: int, size: int, offset: int, path: str) -> bytes:
    """Read exactly ``size`` bytes at ``offset`` (the caller knows they exist)."""
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            raise LogCorruptionError(
                f"capture log {path} ended early at byte {offset}: it was truncated by "
                "something other than this store"
            )
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def fsync_dir(path: str) -> None:
    """Make a directory's entries (a created, renamed or removed file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_fd(fd: int, exclusive: bool) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)


def unlock_fd(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


def open_locked(path: str, *, create: bool, exclusive: bool) -> int | None:
    """Open ``path`` and lock it; None when it does not exist and ``create`` is false.

    Loops while the locked inode turns out to be detached (replaced or unlinked by the holder
    of the previous lock), so the returned descriptor is the file currently at ``path``.
    """
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    while True:
        try:
            fd = os.open(path, flags, 0o644)
        except FileNotFoundError:
            return None
        try:
            lock_fd(fd, exclusive)
            if os.fstat(fd).st_nlink > 0:
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def replace_durable(dir_path: str, path: str, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``: temp file, fsync, rename, fsync directory.

    The temp name is fixed (``<path>.tmp``): callers hold the exclusive lock of ``path``, and
    a later locker can only reach the renamed file, so two writers never share the temp file;
    a leftover from a crash is simply overwritten by the next replace.
    """
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        append_all(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(dir_path)


def unlink_durable(dir_path: str, path: str) -> bool:
    """Remove ``path`` if present and make the removal durable; True when a file was removed."""
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
        return False
    fsync_dir(dir_path)
    return True


def close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)

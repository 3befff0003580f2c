"""Replace a file whole: a reader, or a crash, sees the old file or the complete new one.

Checkpoints, manifests, shard indexes, rank hand-offs and the capture file store's logs are
all written this way: to a temporary name beside ``path``, then renamed over it
(:func:`replace_through` is the one sequence; :func:`write_atomic` runs it on :mod:`os`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Protocol

__all__ = ["TEMP_MARK", "FileOps", "replace_through", "write_atomic"]

TEMP_MARK = ".tmp-"
"""In the name of every temporary file :func:`write_atomic` writes (``.NAME.tmp-PID-HEX``): what a
kill mid-write leaves, which readers of a folder skip and writers may remove."""


class FileOps(Protocol):
    """The file operations of a replace: the capture file store passes its file-system seam
    here, so that a test records them and rebuilds what a power loss would leave."""

    def open(self, path: str, flags: int, mode: int = ...) -> int: ...
    def pwritev(self, fd: int, parts: list[bytes], offset: int) -> None: ...
    def datasync(self, fd: int) -> None: ...
    def close(self, fd: int) -> None: ...
    def replace(self, src: str, dst: str) -> None: ...
    def sync_dir(self, path: str) -> None: ...


class _Os:
    """:class:`FileOps` on :mod:`os`; ``datasync`` is a full ``fsync``."""

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def pwritev(self, fd: int, parts: list[bytes], offset: int) -> None:
        view = memoryview(b"".join(parts))
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n

    def datasync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_OS = _Os()


def replace_through(
    ops: FileOps,
    path: str,
    data: bytes,
    *,
    tmp: str,
    directory: str,
    durable: bool = True,
    exclusive: bool = False,
    mode: int = 0o666,
) -> None:
    """Write ``data`` to ``tmp``, sync it, rename it over ``path`` and sync ``directory`` (the
    folder of both), through ``ops``. ``exclusive``: ``tmp`` must not exist (a name of its own
    per writer); otherwise it is truncated (a fixed name, its writers serialised by a lock, a
    crash's leftover overwritten). Without ``durable`` nothing is synced."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = ops.open(tmp, flags, mode)
    try:
        ops.pwritev(fd, [data], 0)
        if durable:
            ops.datasync(fd)
    finally:
        ops.close(fd)
    ops.replace(tmp, path)
    if durable:
        ops.sync_dir(directory)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = True) -> None:
    """Write ``data`` (a ``str`` as UTF-8) to ``path`` through a temporary file and a rename,
    creating the folder. ``durable`` also syncs the file and its folder to disk, so a power
    loss right after keeps it (a cache file, cheap to rebuild, can skip that cost).

    The file gets the usual permissions (``0666`` less the umask), not ``mkstemp``'s ``0600``;
    on failure the temporary file is removed and the error raised.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    payload = data.encode() if isinstance(data, str) else data
    try:
        replace_through(
            _OS,
            str(target),
            payload,
            tmp=str(tmp),
            directory=str(target.parent),
            durable=durable,
            exclusive=True,
        )
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

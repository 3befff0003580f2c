"""The one seam through which the file store touches the file system.

Why a seam: durability claims are only as good as their test. Every operation the file store
performs on its directory (open, positional write, truncate, data sync, directory sync, link,
rename, unlink, lock) goes through a :class:`FileSystem`, so a test can record the exact
sequence and rebuild, at any cut point, what a power loss would have left on disk
(:mod:`zephon.capture.testing` ships that recorder). The default instance, :data:`OS_FS`,
forwards straight to :mod:`os` and :mod:`fcntl`.
"""

from __future__ import annotations

import errno
import fcntl
import os

__all__ = ["OS_FS", "FileSystem"]


class FileSystem:
    """Real file-system operations; subclasses may observe them (one method per syscall)."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def size_and_links(self, fd: int) -> tuple[int, int]:
        """``(st_size, st_nlink)`` of an open file (nlink 0: replaced or unlinked)."""
        st = os.fstat(fd)
        return st.st_size, st.st_nlink

    def identity(self, fd: int) -> tuple[int, int]:
        """``(st_dev, st_ino)`` of an open file: tells a file from one put in its place."""
        st = os.fstat(fd)
        return st.st_dev, st.st_ino

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def pwritev(self, fd: int, parts: list[bytes], offset: int) -> None:
        """Write all of ``parts`` at ``offset`` (short vector writes are completed)."""
        total = sum(len(p) for p in parts)
        done = os.pwritev(fd, parts, offset) if len(parts) <= 1024 else 0
        if done < total:
            view = memoryview(b"".join(parts))[done:]
            while view:
                n = os.pwrite(fd, view, offset + done)
                view = view[n:]
                done += n

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def datasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def sync_dir(self, path: str) -> None:
        """Make a directory's entries (created, renamed or removed names) durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def link(self, src: str, dst: str) -> bool:
        """Hard-link ``src`` as ``dst``; False if ``dst`` already exists."""
        try:
            os.link(src, dst)
        except FileExistsError:
            return False
        return True

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> bool:
        """Remove ``path``; False if it did not exist."""
        try:
            os.unlink(path)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            return False
        return True

    def lock(self, fd: int, exclusive: bool) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)

    def unlock(self, fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


OS_FS = FileSystem()
"""The file system itself."""

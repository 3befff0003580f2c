"""What a shard file is while a run reads it, so a file changed under a running run stops it.

A run reads each shard many times (one read per micro-batch), possibly from several processes.
A file replaced between two of those reads would mix rows of two files without any error, so
the file's identity is recorded once (:meth:`Blob.pin`) and compared on every fetch: size and
modification time everywhere, the inode on the machine that recorded it (a file renamed over
keeps neither), the ETag or version for object stores.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zephon.errors import DataFormatError

STAY_PUT = (
    "a run must read files that stay put: copy the corpus or write new files under new names, "
    "then start a new --checkpoint-dir"
)


@dataclass(frozen=True)
class FileIdentity:
    """Size, modification time, version (object stores) and inode (local files) of a file."""

    size: int
    mtime_ns: int
    version: str = ""
    inode: tuple[int, int] | None = None  # (st_dev, st_ino), valid on ``host`` only
    host: str = ""

    def same_file(self, other: FileIdentity) -> bool:
        """Whether ``other`` (taken later) is still this file."""
        if (self.size, self.mtime_ns, self.version) != (other.size, other.mtime_ns, other.version):
            return False
        if self.inode is None or other.inode is None or self.host != other.host:
            return True  # another machine numbers the inodes of a shared file its own way
        return self.inode == other.inode


def local_identity(size: int, mtime_ns: int, dev: int, ino: int) -> FileIdentity:
    return FileIdentity(size, mtime_ns, inode=(dev, ino), host=socket.gethostname())


def remote_identity(info: Mapping[str, Any]) -> FileIdentity:
    """An object's identity from the store's ``info``: size, modification time and the
    ETag, version or generation where the store gives one."""
    mtime = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
    if hasattr(mtime, "timestamp"):
        mtime = mtime.timestamp()
    version = next((str(info[k]) for k in _VERSION_KEYS if info.get(k)), "")
    return FileIdentity(int(info.get("size") or 0), int(float(mtime) * 1e9), version)


_VERSION_KEYS = ("ETag", "etag", "VersionId", "version_id", "generation")


def changed_error(url: str, pinned: FileIdentity, now: FileIdentity | None) -> DataFormatError:
    """The one-line error for a shard that is no longer the file the run started reading."""
    if now is None:
        what = "was deleted or moved away while the run was reading it"
        return DataFormatError(f"{url} {what}; {STAY_PUT}", location=url)
    replaced = pinned.inode is not None and now.inode is not None and pinned.inode != now.inode
    if replaced and pinned.host == now.host:
        what = "was replaced by another file"
    elif now.size < pinned.size:
        what = "was truncated"
    else:
        what = "changed"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now.mtime_ns / 1e9))
    return DataFormatError(
        f"{url} {what} while the run was reading it (size {pinned.size} -> {now.size} bytes, "
        f"modified at {when}); {STAY_PUT}",
        location=url,
    )


def stale_count_error(url: str, found: int, expected: int, *, indexed: bool) -> DataFormatError:
    """A shard whose row count is not the one the dataset was built with.

    ``indexed``: the count came from the folder's ``index.json`` (``zephon index``), so the
    index is stale; otherwise the run counted the rows itself and the file changed since.
    """
    if indexed:
        return DataFormatError(
            f"{url} has {found} rows but the dataset index says {expected}; the shard changed "
            "after `zephon index` ran: rebuild the index (zephon index FOLDER)",
            location=url,
        )
    return DataFormatError(
        f"{url} has {found} rows but had {expected} when the run counted them: the shard "
        f"changed while the run was reading it; {STAY_PUT}",
        location=url,
    )

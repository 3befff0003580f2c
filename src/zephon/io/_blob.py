"""The bytes of one shard: a local file, a remote object read by byte range, or a remote object
copied whole into the node cache.

Shard kinds read through a :class:`Blob` and never care which of the three it is: local files
(and cached copies) are read with ``os.pread`` on a descriptor leased from the process's bounded
pool (:mod:`zephon.io._descriptors`), remote objects with ranged requests
(:mod:`zephon.io._remote`). A blob pickles as its URL and options only.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any, TypeVar

from zephon.io._cache import CacheOptions, NodeCache
from zephon.io._descriptors import DESCRIPTORS
from zephon.io._paths import get_fs, split_protocol
from zephon.io._remote import RangeFile, fetch_range, remote_size, request, with_retries
from zephon.io._spans import LOCAL_GAP, REMOTE_GAP

T = TypeVar("T")
_STREAM_BUFFER = 8 << 20


class Blob:
    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        cache: CacheOptions | None = None,
    ) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.cache = cache
        self._init_transient()

    def _init_transient(self) -> None:
        self.protocol, self.path = split_protocol(self.url)
        self._fs: Any = None
        self._size: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options, "cache": self.cache}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.url = state["url"]
        self.storage_options = state["storage_options"]
        self.cache = state["cache"]
        self._init_transient()

    @property
    def remote(self) -> bool:
        return self.protocol != "file"

    @property
    def ranged(self) -> bool:
        """Whether reads go to the store as byte ranges (remote and not cached)."""
        return self.remote and self.cache is None

    @property
    def max_gap(self) -> int:
        """How far apart two spans may be and still share one read (see ``read_spans``)."""
        return REMOTE_GAP if self.ranged else LOCAL_GAP

    def filesystem(self) -> Any:
        if self._fs is None:
            self._fs = get_fs(self.protocol, self.storage_options)
        return self._fs

    def stamp(self) -> tuple[int, int]:
        """(size, mtime_ns) of the source; stores without an mtime give 0."""
        if not self.remote:
            st = os.stat(self.path)
            return st.st_size, st.st_mtime_ns
        info = with_retries(
            self.url,
            "stat",
            lambda: request(self.filesystem(), "info", self.url, "stat", self.path),
        )
        mtime = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
        if hasattr(mtime, "timestamp"):
            mtime = mtime.timestamp()
        return int(info.get("size") or 0), int(float(mtime) * 1e9)

    def size(self) -> int:
        if self._size is None:
            if self.remote:
                self._size = remote_size(self.filesystem(), self.path, self.url)
            else:
                self._size = os.path.getsize(self.path)
        return self._size

    def local(self, opener: Callable[[str], T]) -> T | None:
        """``opener(local_path)`` for local and cached shards (inside the cache pin, so the
        copy cannot be evicted before it is open); ``None`` for ranged remote shards."""
        if not self.remote:
            return opener(self.path)
        if self.cache is None:
            return None
        with NodeCache(self.cache).pinned(self.filesystem(), self.path, self.url) as path:
            return opener(path)

    def _open_local(self) -> int:
        fd = self.local(lambda p: os.open(p, os.O_RDONLY | os.O_CLOEXEC))
        if fd is None:
            raise AssertionError(f"{self.url} has no local copy")  # ranged: never leased
        return fd

    def read_range(self, start: int, end: int) -> bytes:
        if not self.ranged:
            with DESCRIPTORS.lease(self.url, self._open_local) as fd:
                return os.pread(fd, end - start, start)
        return fetch_range(self.filesystem(), self.path, self.url, start, end)

    def close(self) -> None:
        """Close this shard's descriptor now (it is opened again if read again)."""
        DESCRIPTORS.close(self.url)

    def file(self) -> Any:
        """A seekable binary file: a local one, or one whose every read is a ranged request."""
        opened = self.local(lambda p: open(p, "rb"))  # noqa: SIM115 (the caller closes it)
        if opened is not None:
            return opened
        return RangeFile(self.filesystem(), self.path, self.url, self.size())

    def stream(self) -> Any:
        """A buffered binary stream for one sequential pass (index building, decompression)."""
        raw = self.file()
        return raw if not isinstance(raw, RangeFile) else io.BufferedReader(raw, _STREAM_BUFFER)

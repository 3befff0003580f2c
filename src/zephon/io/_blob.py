"""The bytes of one shard: a local file, a remote object read by byte range, or a remote object
copied whole into the node cache.

Shard kinds read through a :class:`Blob` and never care which of the three it is: local files
(and cached copies) are read with ``os.pread`` on a descriptor leased from the process's bounded
pool (:mod:`zephon.io._descriptors`), remote objects with ranged requests
(:mod:`zephon.io._remote`). A blob pickles as its URL and options only.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from zephon.errors import DataFormatError
from zephon.io._cache import CacheOptions, NodeCache
from zephon.io._descriptors import DESCRIPTORS
from zephon.io._identity import (
    FileIdentity,
    changed_error,
    local_identity,
    remote_identity,
)
from zephon.io._paths import get_fs, split_protocol
from zephon.io._remote import RangeFile, fetch_range, request, with_retries
from zephon.io._spans import LOCAL_GAP, REMOTE_GAP

T = TypeVar("T")
_STREAM_BUFFER = 8 << 20
REMOTE_RECHECK_S = 10.0  # a request per shard and micro-batch would double a run's requests


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
        self.pinned: FileIdentity | None = None  # what the run started reading (see pin)
        self._init_transient()

    def _init_transient(self) -> None:
        self.protocol, self.path = split_protocol(self.url)
        self._fs: Any = None
        self._size: int | None = None
        self._next_check = 0.0  # remote: when the store is asked again (monotonic seconds)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "storage_options": self.storage_options,
            "cache": self.cache,
            "pinned": self.pinned,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.url = state["url"]
        self.storage_options = state["storage_options"]
        self.cache = state["cache"]
        self.pinned = state.get("pinned")
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
        found = self.identity()
        return found.size, found.mtime_ns

    def identity(self) -> FileIdentity:
        """The source's identity now (``FileNotFoundError`` when it is gone); a remote one is
        also what the run reads from then on when nothing was pinned yet (no second request)."""
        if not self.remote:
            st = os.stat(self.path)
            return local_identity(st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino)
        info = with_retries(
            self.url,
            "stat",
            lambda: request(self.filesystem(), "info", self.url, "stat", self.path),
        )
        found = remote_identity(info)
        if self.pinned is None:
            self.pinned = found
        return found

    def pin(self) -> None:
        """Record the local file's identity now, before the run reads it (every later fetch
        compares against it, in every process). Remote objects are pinned by the first request
        that asks for their size or stamp anyway; asking here would cost a request per shard."""
        if self.pinned is None and not self.remote:
            with contextlib.suppress(FileNotFoundError):  # the first read names the missing file
                self.pinned = self.identity()

    def check_unchanged(self) -> None:
        """Raise ``DataFormatError`` (naming the file and what happened) when the source is no
        longer the pinned file. One ``stat`` for a local file; a remote one asks the store at
        most every ``REMOTE_RECHECK_S`` seconds."""
        if self.remote:
            now = time.monotonic()
            if self.pinned is not None and now < self._next_check:
                return
            self._next_check = now + REMOTE_RECHECK_S
        pinned = self.pinned
        try:
            found = self.identity()
        except FileNotFoundError:
            if pinned is None:
                raise DataFormatError(f"shard {self.url} does not exist (was it moved?)") from None
            raise changed_error(self.url, pinned, None) from None
        if pinned is None:
            self.pinned = found
        elif not pinned.same_file(found):
            raise changed_error(self.url, pinned, found)

    def size(self) -> int:
        if self._size is None:
            if self.remote:
                self._size = self.identity().size
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


class OneBlob:
    """A shard kind stored in one blob ``_blob``: the blob is what a run pins and checks."""

    _blob: Blob

    def pin(self) -> None:
        self._blob.pin()

    def check_unchanged(self) -> None:
        self._blob.check_unchanged()

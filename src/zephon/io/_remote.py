"""Requests to object stores: byte ranges with retries and backoff, counted per shard.

Every remote read of a shard goes through :func:`fetch_range` (or :class:`RangeFile`, a file
object over it that pyarrow can read), so retries, error messages and the bytes-fetched counter
live in one place. A transient failure (any ``OSError`` that is not "missing" or "forbidden")
(or an error of the store's client library, such as a checksum mismatch) is retried
``$ZEPHON_IO_RETRIES`` times (default 5) with exponential backoff starting at
``$ZEPHON_IO_BACKOFF_S`` seconds (default 0.2, capped at 10 s); the client library's own retries
(botocore's, for S3) happen below ours.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from zephon.errors import DataError
from zephon.io._stats import count

T = TypeVar("T")

_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_MAX_DELAY_S = 10.0
# Store clients raise their own errors for what fsspec does not translate (a checksum mismatch,
# a dropped connection); those are transient too.
_CLIENT_MODULES = ("botocore", "aiobotocore", "aiohttp", "google", "azure", "urllib3", "requests")


def _transient(e: BaseException) -> bool:
    if isinstance(e, OSError):
        return not isinstance(e, _PERMANENT)
    return type(e).__module__.split(".", 1)[0] in _CLIENT_MODULES


def _policy() -> tuple[int, float]:
    return int(os.environ.get("ZEPHON_IO_RETRIES", "5")), float(
        os.environ.get("ZEPHON_IO_BACKOFF_S", "0.2")
    )


def with_retries(url: str, what: str, call: Callable[[], T]) -> T:
    """``call()``, retried with backoff on transient errors; a missing object or a refusal is
    raised at once as ``DataError`` naming ``url``."""
    retries, delay = _policy()
    attempt = 0
    while True:
        try:
            return call()
        except FileNotFoundError as e:
            raise DataError(f"{url} does not exist ({what}: {e}); check the bucket and key") from e
        except PermissionError as e:
            raise DataError(
                f"{url}: access denied ({what}: {e}); check the credentials "
                "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or storage_options)"
            ) from e
        except Exception as e:
            if not _transient(e):
                raise
            if attempt >= retries:
                raise DataError(
                    f"{url}: {what} failed after {attempt + 1} attempt(s): {e}; check the "
                    "endpoint (AWS_ENDPOINT_URL or storage_options) and the network, or raise "
                    "$ZEPHON_IO_RETRIES"
                ) from e
            count(url, retries=1)
            time.sleep(min(_MAX_DELAY_S, delay * 2**attempt))
            attempt += 1


def fetch_range(fs: Any, path: str, url: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the object ``path`` with one ranged request (and retries)."""
    data: bytes = with_retries(
        url, f"read bytes {start}-{end}", lambda: fs.cat_file(path, start=start, end=end)
    )
    count(url, bytes_fetched=len(data), requests=1)
    return data


def remote_size(fs: Any, path: str, url: str) -> int:
    info = with_retries(url, "stat", lambda: fs.info(path))
    return int(info.get("size") or 0)


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over ranged requests: every ``read`` is one request for
    exactly the bytes asked, so pyarrow fetches a Parquet footer and the column chunks it needs
    and nothing else."""

    def __init__(self, fs: Any, path: str, url: str, size: int) -> None:
        super().__init__()
        self._fs, self._path, self._url, self._size = fs, path, url, size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self._size, self._pos + len(view))
        if end <= self._pos:
            return 0
        data = fetch_range(self._fs, self._path, self._url, self._pos, end)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        if end <= self._pos:
            return b""
        data = fetch_range(self._fs, self._path, self._url, self._pos, end)
        self._pos += len(data)
        return data

    def size(self) -> int:
        return self._size

"""Requests to object stores: byte ranges with retries and backoff, counted per shard.

Every remote read of a shard goes through :func:`fetch_range` (or :class:`RangeFile`, a file
object over it that pyarrow can read), so retries, error messages and the bytes-fetched counter
live in one place. A transient failure (any ``OSError`` that is not "missing" or "forbidden")
(or an error of the store's client library, such as a checksum mismatch) is retried
``$ZEPHON_IO_RETRIES`` times (default 5) with exponential backoff starting at
``$ZEPHON_IO_BACKOFF_S`` seconds (default 0.2, capped at 10 s); the client library's own retries
(botocore's, for S3) happen below ours.

Every request to a store with an asynchronous client (s3, gcs, azure, http) has a deadline,
``$ZEPHON_IO_TIMEOUT_S`` seconds (default 60; 0 turns it off), over the whole request and the
client's own retries: a store that stops answering, or trickles its answer, ends in a timeout,
which is retried like any transient failure and then raised as ``DataError`` naming the URL.
Requests in flight are listed (:func:`open_requests`) for the line that says what a run waits
for, and a reader thread whose run is closing (:func:`abandon_reads`) gives its request up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
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


DEFAULT_TIMEOUT_S = 60.0
_SLICE_S = 0.25  # how often a waiting request looks at its deadline and at abandonment


def request_timeout() -> float | None:
    """Seconds one request may take (``$ZEPHON_IO_TIMEOUT_S``); None: no deadline."""
    value = float(os.environ.get("ZEPHON_IO_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    return value if value > 0 else None


class RequestTimeout(TimeoutError):
    """A request got no (complete) answer within its deadline; transient, so retried."""


# Requests in flight in this process: id -> (url, what, monotonic start).
_OPEN: dict[int, tuple[str, str, float]] = {}
_IDS = itertools.count()
_ABANDONED: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def open_requests() -> list[tuple[str, str, float]]:
    """(url, what, seconds open) of each request in flight in this process, oldest first."""
    now = time.monotonic()
    return [(url, what, now - t) for url, what, t in sorted(_OPEN.copy().values(), key=_age)]


def _age(entry: tuple[str, str, float]) -> float:
    return entry[2]


def abandon_reads(threads: Iterable[threading.Thread]) -> None:
    """Make the requests of ``threads`` give up within a fraction of a second (their run is
    closing: nobody waits for the answer). A thread stays marked until it ends."""
    _ABANDONED.update(threads)


def _abandoned() -> bool:
    return bool(_ABANDONED) and threading.current_thread() in _ABANDONED


class _Abandoned(Exception):
    pass


def request(fs: Any, method: str, url: str, what: str, *args: Any, **kwargs: Any) -> Any:
    """``fs.<method>(*args, **kwargs)`` within the request deadline, listed while open.

    An asynchronous filesystem runs the request on its event loop, cancelled at the deadline
    (or when the thread is abandoned); another is called directly (no deadline)."""
    key = next(_IDS)
    _OPEN[key] = (url, what, time.monotonic())
    try:
        method_async = getattr(fs, "_" + method, None)
        if not getattr(fs, "async_impl", False) or method_async is None:
            return getattr(fs, method)(*args, **kwargs)
        coro = method_async(*args, **kwargs)
        return _await(asyncio.run_coroutine_threadsafe(coro, fs.loop), request_timeout())
    finally:
        del _OPEN[key]


def _await(future: concurrent.futures.Future[Any], timeout: float | None) -> Any:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = _SLICE_S if deadline is None else min(_SLICE_S, deadline - time.monotonic())
        try:
            return future.result(timeout=max(0.0, left))
        except concurrent.futures.TimeoutError:
            if _abandoned():
                future.cancel()
                raise _Abandoned from None
            if deadline is not None and time.monotonic() >= deadline:
                future.cancel()
                raise RequestTimeout(
                    f"no answer within {timeout:g} s ($ZEPHON_IO_TIMEOUT_S)"
                ) from None


def _backoff(seconds: float) -> None:
    """Sleep before a retry, in slices, so that an abandoned reader leaves early."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if _abandoned():
            raise _Abandoned
        time.sleep(min(_SLICE_S, left))


def with_retries(url: str, what: str, call: Callable[[], T]) -> T:
    """``call()``, retried with backoff on transient errors; a missing object or a refusal is
    raised at once as ``DataError`` naming ``url``."""
    retries, delay = _policy()
    attempt = 0
    while True:
        try:
            return call()
        except _Abandoned:
            raise DataError(f"{url}: {what} given up: the run reading it is closing") from None
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
                    + (" or $ZEPHON_IO_TIMEOUT_S" if isinstance(e, RequestTimeout) else "")
                ) from e
            count(url, retries=1)
            try:
                _backoff(min(_MAX_DELAY_S, delay * 2**attempt))
            except _Abandoned:
                raise DataError(f"{url}: {what} given up: the run reading it is closing") from e
            attempt += 1


def fetch_range(fs: Any, path: str, url: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the object ``path`` with one ranged request (and retries)."""
    what = f"read bytes {start}-{end}"
    data: bytes = with_retries(
        url, what, lambda: request(fs, "cat_file", url, what, path, start=start, end=end)
    )
    count(url, bytes_fetched=len(data), requests=1)
    return data


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

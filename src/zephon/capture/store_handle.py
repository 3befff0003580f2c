"""A capture store that zephon either owns (opened from a URL) or borrows (an object passed in).

Why: the streaming source, the group operators and the TRL adapter accept a store URL and open
a client themselves, in the caller's process and again in every worker process. A client holds
connections (PostgreSQL), a database and a lock file (SQLite) or file handles, so whoever opened
it must close it: :meth:`StoreHandle.close` when an iteration ends or an operator is torn down,
and otherwise when the handle is garbage-collected or its process exits (a
``multiprocessing`` finaliser, which also runs in worker processes, where ``atexit`` does not).
A collected handle's client is closed by a closer thread, never by the garbage collector's own
call: that call can land in any thread at any allocation, even inside a thread pool's
``submit`` holding the pool's locks, which closing a client needs too (a deadlock).
A closed handle reopens on next use, so a pipeline can be iterated again. A store object the
caller passed in is theirs: the handle never closes it.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from multiprocessing.util import Finalize
from typing import Any

from zephon.capture.dataset import run_sync
from zephon.capture.stores import open_store

__all__ = ["StoreHandle"]


_log = logging.getLogger(__name__)

_collected: queue.SimpleQueue[Any] = queue.SimpleQueue()
"""Clients of collected handles, to close: ``SimpleQueue.put`` is safe in a finaliser (it is
reentrant and takes no lock another thread may hold)."""
_closer_lock = threading.Lock()
_closer_pid = -1  # the process whose closer thread runs (a forked child starts its own)


def _close(store: Any) -> None:
    run_sync(store.close())


def _close_logged(store: Any) -> None:
    try:
        _close(store)
    except Exception as error:  # nobody is left to raise to: say it
        _log.warning("closing the capture store client %r failed: %s", store, error)


def _closing() -> None:
    while True:
        _close_logged(_collected.get())


def _drain() -> None:
    """Close every client still waiting for the closer thread (at process exit)."""
    while True:
        try:
            store = _collected.get_nowait()
        except queue.Empty:
            return
        _close_logged(store)


def _start_closer() -> None:
    """This process's closer thread and exit drain, started once (outside any finaliser)."""
    global _closer_pid
    with _closer_lock:
        if _closer_pid == os.getpid():
            return
        _closer_pid = os.getpid()
        threading.Thread(target=_closing, name="zephon-store-closer", daemon=True).start()
        Finalize(None, _drain, exitpriority=5)  # after the handles' own (10) queued theirs


class StoreHandle:
    """The store at ``url`` (opened on first use, closed by :meth:`close`), or ``store``."""

    def __init__(self, *, url: str | None = None, store: Any = None) -> None:
        if (url is None) == (store is None):
            raise TypeError("StoreHandle takes a store URL or a store object, not both")
        self.url = url
        self._store = store
        self._finalizer: Finalize | None = None
        self._lock = threading.Lock()

    @property
    def owned(self) -> bool:
        """True when zephon opened the store (from the URL), so zephon closes it."""
        return self.url is not None

    @property
    def is_open(self) -> bool:
        """Whether a client of the store is open now (always, for a store passed in)."""
        return self._store is not None

    def get(self) -> Any:
        """The store client, opened from the URL if it is not open."""
        store = self._store
        if store is not None:
            return store
        with self._lock:
            if self._store is None:
                assert self.url is not None
                _start_closer()
                self._store = open_store(self.url)
                self._finalizer = Finalize(
                    self, _collected.put, args=(self._store,), exitpriority=10
                )
            return self._store

    def close(self) -> None:
        """Close the client zephon opened (a no-op for a store passed in, or when closed)."""
        with self._lock:
            finalizer, self._finalizer = self._finalizer, None
            if finalizer is not None:
                store, self._store = self._store, None
                finalizer.cancel()
                _close(store)

    def __getstate__(self) -> dict[str, Any]:
        """Travels as its URL (the receiving process opens its own client); a store passed
        in travels as itself, so it must pickle."""
        return {"url": self.url, "store": None if self.owned else self._store}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(url=state["url"], store=state["store"])  # type: ignore[misc]

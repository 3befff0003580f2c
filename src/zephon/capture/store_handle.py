"""A capture store that zephon either owns (opened from a URL) or borrows (an object passed in).

Why: the streaming source, the group operators and the TRL adapter accept a store URL and open
a client themselves, in the caller's process and again in every worker process. A client holds
connections (PostgreSQL), a database and a lock file (SQLite) or file handles, so whoever opened
it must close it: :meth:`StoreHandle.close` when an iteration ends or an operator is torn down,
and otherwise when the handle is garbage-collected or its process exits (a
``multiprocessing`` finaliser, which also runs in worker processes, where ``atexit`` does not).
A closed handle reopens on next use, so a pipeline can be iterated again. A store object the
caller passed in is theirs: the handle never closes it.
"""

from __future__ import annotations

import threading
from multiprocessing.util import Finalize
from typing import Any

from zephon.capture.dataset import run_sync
from zephon.capture.stores import open_store

__all__ = ["StoreHandle"]


def _close(store: Any) -> None:
    run_sync(store.close())


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
                self._store = open_store(self.url)
                self._finalizer = Finalize(self, _close, args=(self._store,), exitpriority=10)
            return self._store

    def close(self) -> None:
        """Close the client zephon opened (a no-op for a store passed in, or when closed)."""
        with self._lock:
            finalizer, self._finalizer = self._finalizer, None
            if finalizer is not None:
                self._store = None
                finalizer()

    def __getstate__(self) -> dict[str, Any]:
        """Travels as its URL (the receiving process opens its own client); a store passed
        in travels as itself, so it must pickle."""
        return {"url": self.url, "store": None if self.owned else self._store}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(url=state["url"], store=state["store"])  # type: ignore[misc]

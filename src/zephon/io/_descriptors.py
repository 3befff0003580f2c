"""Open files of shards, bounded per process.

A corpus of thousands of shards read through one descriptor each would hit ``ulimit -n`` (often
1,024, sometimes 256) long before its end, and a long-lived process would keep every shard it
ever read open. Reads lease an open handle (a raw descriptor, or a reader object that holds
one, such as a Parquet file) from a least-recently-used pool instead: at most ``cap`` stay
open when idle, an evicted one is closed as soon as its last reader returns it (never under a
read in flight, where the number could be reused for another file). Every format shares the
one pool, so the cap holds whatever mixture of formats a pipeline reads.
"""

from __future__ import annotations

import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

T = TypeVar("T")


def default_cap() -> int:
    """A quarter of the soft ``RLIMIT_NOFILE``, between 8 and 128: room for sockets, pipes,
    shared memory and the user's own files."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 128
    return max(8, min(128, soft // 4))


class _Entry:
    __slots__ = ("closer", "evicted", "handle", "users")

    def __init__(self, handle: Any, closer: Callable[[Any], None]) -> None:
        self.handle = handle
        self.closer = closer
        self.users = 0
        self.evicted = False

    def close(self) -> None:
        self.closer(self.handle)


class DescriptorPool:
    """Open handles keyed by shard, opened on demand and closed least recently used first."""

    def __init__(self, cap: int | None = None) -> None:
        self._cap = cap
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    @property
    def cap(self) -> int:
        """The given cap, else :func:`default_cap` now (a process may lower its limit after
        importing zephon)."""
        return self._cap if self._cap is not None else default_cap()

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's readers are gone, its lock may have been held at
        the fork, and the copied descriptors are the child's own to close."""
        self._lock = threading.Lock()
        for entry in self._open.values():
            with suppress(Exception):
                entry.close()
        self._open.clear()

    def _take(self, key: str) -> _Entry | None:
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                self._open.move_to_end(key)
                entry.users += 1
            return entry

    def _insert(self, key: str, new: _Entry) -> _Entry:
        closing = []
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:  # another thread opened it meanwhile
                closing.append(new)
                self._open.move_to_end(key)
            else:
                entry = self._open[key] = new
            entry.users += 1
            cap = self.cap
            while len(self._open) > cap:
                _old, victim = self._open.popitem(last=False)
                victim.evicted = True
                if victim.users == 0:
                    closing.append(victim)
        for old in closing:  # a closer may flush or talk to a store: not under the lock
            old.close()
        return entry

    def _give_back(self, entry: _Entry) -> None:
        with self._lock:
            entry.users -= 1
            last = entry.evicted and entry.users == 0
        if last:
            entry.close()

    @contextmanager
    def lease(
        self, key: str, opener: Callable[[], T], closer: Callable[[T], None] | None = None
    ) -> Iterator[T]:
        """The open handle of ``key`` (``opener()`` when not open), held until the ``with``
        block ends; ``closer`` closes it (``os.close``: the handle is a raw descriptor)."""
        entry = self._take(key)
        if entry is None:  # opened outside the lock: it may download
            entry = self._insert(key, _Entry(opener(), closer or os.close))
        try:
            yield entry.handle
        finally:
            self._give_back(entry)

    def close(self, key: str) -> None:
        """Close ``key``'s handle now (or when its readers are done): the shard is done."""
        with self._lock:
            entry = self._open.pop(key, None)
            if entry is None:
                return
            entry.evicted = True
            idle = entry.users == 0
        if idle:
            entry.close()


#: The pool of this process (every Blob shares it).
DESCRIPTORS = DescriptorPool()
os.register_at_fork(after_in_child=DESCRIPTORS.forget_after_fork)

"""Open descriptors of local shards, bounded per process.

A corpus of thousands of shards read through one descriptor each would hit ``ulimit -n`` (often
1,024, sometimes 256) long before its end, and a long-lived process would keep every shard it
ever read open. Reads lease a descriptor from a least-recently-used pool instead: at most
``cap`` stay open when idle, an evicted one is closed as soon as its last reader returns it
(never under a ``pread`` in flight, where the number could be reused for another file).
"""

from __future__ import annotations

import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def default_cap() -> int:
    """A quarter of the soft ``RLIMIT_NOFILE``, between 8 and 128: room for sockets, pipes,
    shared memory and the user's own files."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 128
    return max(8, min(128, soft // 4))


class _Entry:
    __slots__ = ("evicted", "fd", "users")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.users = 0
        self.evicted = False


class DescriptorPool:
    """Descriptors keyed by shard URL, opened on demand and closed least recently used first."""

    def __init__(self, cap: int | None = None) -> None:
        self.cap = cap if cap is not None else default_cap()
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's readers are gone, its lock may have been held at
        the fork, and the copied descriptors are the child's own to close."""
        self._lock = threading.Lock()
        for entry in self._open.values():
            os.close(entry.fd)
        self._open.clear()

    def _take(self, key: str) -> _Entry | None:
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                self._open.move_to_end(key)
                entry.users += 1
            return entry

    def _insert(self, key: str, fd: int) -> _Entry:
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:  # another thread opened it meanwhile
                os.close(fd)
                self._open.move_to_end(key)
            else:
                entry = self._open[key] = _Entry(fd)
            entry.users += 1
            while len(self._open) > self.cap:
                _old, victim = self._open.popitem(last=False)
                victim.evicted = True
                if victim.users == 0:
                    os.close(victim.fd)
            return entry

    def _give_back(self, entry: _Entry) -> None:
        with self._lock:
            entry.users -= 1
            if entry.evicted and entry.users == 0:
                os.close(entry.fd)

    @contextmanager
    def lease(self, key: str, opener: Callable[[], int]) -> Iterator[int]:
        """The descriptor of ``key`` (opened with ``opener`` when not open), held until the
        ``with`` block ends."""
        entry = self._take(key)
        if entry is None:
            entry = self._insert(key, opener())  # opened outside the lock: it may download
        try:
            yield entry.fd
        finally:
            self._give_back(entry)

    def close(self, key: str) -> None:
        """Close ``key``'s descriptor now (or when its readers are done): the shard is done."""
        with self._lock:
            entry = self._open.pop(key, None)
            if entry is not None:
                entry.evicted = True
                if entry.users == 0:
                    os.close(entry.fd)


#: The pool of this process (every Blob shares it).
DESCRIPTORS = DescriptorPool()
os.register_at_fork(after_in_child=DESCRIPTORS.forget_after_fork)

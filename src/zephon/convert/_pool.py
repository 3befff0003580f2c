"""Tasks shared by the driver process and a pool of ``workers - 1`` spawned processes.

Why the driver converts too: a spawned worker spends its first second or so importing zephon
and opening the plan, which the driver has already done, so the driver converts from the
first moment and the pool adds its cores as they come up. Tasks leave one queue one at a
time (a worker is handed its next task when it returns one), so whoever is free takes the
next; the order they finish in never reaches the output.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from zephon.convert._out import Out
from zephon.convert._plan import Plan, Task
from zephon.convert._shard import ConvertStopped, run_task

POLL_S = 0.2

Entry = dict[str, Any]


class SharedTasks:
    """``todo`` run by the calling process and ``processes`` pool workers started with
    ``init(plan)``, each task through ``target((task, out))``; use as a context manager."""

    def __init__(
        self,
        plan: Plan,
        todo: list[Task],
        out: Out,
        processes: int,
        init: Callable[[Plan], None],
        target: Callable[[tuple[Task, Out]], Entry],
    ) -> None:
        self._plan, self._out, self._target = plan, out, target
        self._count = len(todo)
        self._pending = deque(todo)
        self._lock = threading.Lock()
        self._open = True
        self._done: queue.SimpleQueue[Entry | BaseException] = queue.SimpleQueue()
        self._pool = multiprocessing.get_context("spawn").Pool(processes, init, (plan,))
        for _ in range(processes):
            self._hand_out()

    def _take(self) -> Task | None:
        with self._lock:
            return self._pending.popleft() if self._open and self._pending else None

    def _hand_out(self) -> None:
        """Give the pool the next task (called again from its result thread on each return)."""
        task = self._take()
        if task is not None:
            self._pool.apply_async(
                self._target,
                ((task, self._out),),
                callback=self._returned,
                error_callback=self._done.put,
            )

    def _returned(self, entry: Entry) -> None:
        self._done.put(entry)
        with contextlib.suppress(ValueError):  # the pool closed meanwhile (the call ends)
            self._hand_out()

    def results(self, stop: Callable[[], bool]) -> Iterator[Entry]:
        """Manifest entries as tasks finish, the driver's own between the pool's; raises a
        task's error, or :class:`ConvertStopped` when ``stop()`` says so."""
        for _ in range(self._count):
            entry = self._next(stop)
            if isinstance(entry, BaseException):
                raise entry
            yield entry

    def _next(self, stop: Callable[[], bool]) -> Entry | BaseException:
        while True:
            try:
                return self._done.get_nowait()
            except queue.Empty:
                pass
            if stop():
                raise ConvertStopped
            task = self._take()
            if task is not None:
                return run_task(self._plan, task, self._out, stop)
            try:
                return self._done.get(timeout=POLL_S)
            except queue.Empty:
                continue

    def __enter__(self) -> SharedTasks:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock:
            self._open = False
        self._pool.terminate()
        self._pool.join()

"""Worker pools that run ``process_many`` off the driver thread: threads, processes or Ray.

Every pool has the same two-method shape the driver needs: ``submit(elems) -> Future`` and
``shutdown()``. A pool may run a micro-batch more than once (a worker died) but completes each
future exactly once, so the driver's reorder buffer sees every sequence number once. Threads
are in :mod:`~zephon._engine.workers.thread_pool`, processes in
:mod:`~zephon._engine.workers.process_pool`, Ray actors in
:mod:`~zephon._engine.workers.ray_pool`.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future

from zephon._engine.workers.joins import CLOSE_WAIT_S
from zephon.errors import ZephonError
from zephon.types import StreamItem


class WorkerCrashedError(ZephonError):
    """A worker process (or Ray actor) kept dying while running one micro-batch."""


class WorkerStartError(WorkerCrashedError):
    """Worker processes cannot start (a script without a main guard); retrying cannot help."""


class WorkerPool:
    """``parallelism`` copies of one operator behind an executor."""

    executor: Executor

    def submit(self, elems: list[StreamItem]) -> Future[list[StreamItem]]:
        raise NotImplementedError

    def shutdown(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop the workers; ``wait_s`` bounds the wait where the pool can bound it."""
        self.executor.shutdown(wait=True, cancel_futures=True)

    def check_alive(self) -> None:
        """Raise when a thread the pool's futures depend on died (they would never end)."""

"""A worker pool of threads, each with its own copy of the operator."""

from __future__ import annotations

import copy
import itertools
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from zephon._engine.handoff import shm
from zephon._engine.state.stage import annotate, call_process_many
from zephon._engine.workers.joins import CLOSE_WAIT_S, join_all, stuck_operator_error
from zephon._engine.workers.pools import WorkerCrashedError, WorkerPool
from zephon.errors import ZephonError
from zephon.io import abandon_reads
from zephon.ops import BaseOp, OpContext
from zephon.types import StreamItem


class ThreadWorkerPool(WorkerPool):
    """Threads, each with its own deep copy of the operator (set up once per copy)."""

    def __init__(
        self, op: BaseOp, parallelism: int, ctx: OpContext, *, resolve_shm: bool = True
    ) -> None:
        self._op = op
        self._ctx = ctx
        # False when no stage runs in processes: no payload can hold a shared-memory handle
        self._resolve_shm = resolve_shm
        self._local = threading.local()
        self._counter = itertools.count()
        self._copies: list[BaseOp] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._busy: list[list[int]] = []  # per worker thread: ns spent in process_many
        self.executor = ThreadPoolExecutor(
            parallelism,
            thread_name_prefix=f"zephon-engine-worker-{op.name}",
            initializer=self._init,
        )

    def _init(self) -> None:
        worker = copy.deepcopy(self._op)
        worker.setup(replace(self._ctx, worker_index=next(self._counter)))
        self._local.op = worker
        self._local.busy = busy = [0]
        with self._lock:
            self._busy.append(busy)
            self._copies.append(worker)
            self._threads.append(threading.current_thread())

    def check_alive(self) -> None:
        with self._lock:
            dead = [t.name for t in self._threads if not t.is_alive()]
        if dead:
            raise WorkerCrashedError(
                f"operator {self._op.name!r}: worker thread {dead[0]} died (its error is "
                "logged above); the run stopped at the last delivered item: resume from there"
            )

    def _run(self, elems: list[StreamItem]) -> list[StreamItem]:
        op: BaseOp = self._local.op
        start = time.perf_counter_ns()
        try:
            if self._resolve_shm:
                shm.resolve_items(elems)
            return call_process_many(op, elems)
        except BaseException as exc:
            raise annotate(exc, op.name) from None
        finally:
            self._local.busy[0] += time.perf_counter_ns() - start

    def busy_ns(self) -> int:
        """Time the workers spent running micro-batches (not waiting for one), summed."""
        with self._lock:
            return sum(busy[0] for busy in self._busy)

    def submit(self, elems: list[StreamItem]) -> Future[list[StreamItem]]:
        return self.executor.submit(self._run, elems)

    def shutdown(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop the threads within ``wait_s``: a thread cannot be killed, so one still in
        ``process_many`` then (a call that never returns) is left running and reported."""
        # a read still waiting on a store (the run stopped while it stalled) gives up now
        abandon_reads(self._threads)
        self.executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            threads = list(zip(self._threads, self._copies, strict=True))
        stuck = join_all([t for t, _ in threads], wait_s)
        for thread, worker in threads:
            if thread not in stuck:
                worker.teardown()
        if stuck:
            raise ZephonError(stuck_operator_error(self._op.name, stuck, wait_s))

"""Worker pools that run ``process_many`` off the driver thread: threads or spawned processes."""

from __future__ import annotations

import copy
import itertools
import multiprocessing
import threading
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import replace

import cloudpickle

from zephon._engine.stage import annotate, call_process_many
from zephon.ops import BaseOp, OpContext
from zephon.types import StreamItem


class WorkerPool:
    """``parallelism`` copies of one operator behind an executor."""

    executor: Executor

    def submit(self, elems: list[StreamItem]) -> Future[list[StreamItem]]:
        raise NotImplementedError

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


class ThreadWorkerPool(WorkerPool):
    """Threads, each with its own deep copy of the operator (set up once per copy)."""

    def __init__(self, op: BaseOp, parallelism: int, ctx: OpContext) -> None:
        self._op = op
        self._ctx = ctx
        self._local = threading.local()
        self._counter = itertools.count()
        self._copies: list[BaseOp] = []
        self._lock = threading.Lock()
        self.executor = ThreadPoolExecutor(
            parallelism,
            thread_name_prefix=f"zephon-engine-worker-{op.name}",
            initializer=self._init,
        )

    def _init(self) -> None:
        worker = copy.deepcopy(self._op)
        worker.setup(replace(self._ctx, worker_index=next(self._counter)))
        self._local.op = worker
        with self._lock:
            self._copies.append(worker)

    def _run(self, elems: list[StreamItem]) -> list[StreamItem]:
        op: BaseOp = self._local.op
        try:
            return call_process_many(op, elems)
        except BaseException as exc:
            raise annotate(exc, op.name) from None

    def submit(self, elems: list[StreamItem]) -> Future[list[StreamItem]]:
        return self.executor.submit(self._run, elems)

    def shutdown(self) -> None:
        super().shutdown()
        for worker in self._copies:
            worker.teardown()


_WORKER_OP: BaseOp | None = None


def _process_init(op_bytes: bytes, ctx: OpContext) -> None:
    global _WORKER_OP
    op: BaseOp = cloudpickle.loads(op_bytes)
    identity = multiprocessing.current_process()._identity
    op.setup(replace(ctx, worker_index=(identity[-1] - 1) if identity else 0))
    _WORKER_OP = op


def _process_run(elems: list[StreamItem]) -> list[StreamItem]:
    op = _WORKER_OP
    assert op is not None, "worker process was not initialised"
    try:
        return call_process_many(op, elems)
    except BaseException as exc:
        raise annotate(exc, op.name) from None


class ProcessWorkerPool(WorkerPool):
    """Spawned processes; the operator travels with cloudpickle, so lambdas work."""

    def __init__(self, op: BaseOp, parallelism: int, ctx: OpContext) -> None:
        self.executor = ProcessPoolExecutor(
            parallelism,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_process_init,
            initargs=(cloudpickle.dumps(op), ctx),
        )

    def submit(self, elems: list[StreamItem]) -> Future[list[StreamItem]]:
        return self.executor.submit(_process_run, elems)

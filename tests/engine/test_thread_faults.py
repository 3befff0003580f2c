"""No engine thread dies alone: an exception raised into any of them (the source, a driver, a
process pool's serving thread, a pool worker between micro-batches) ends the run with an error
at the consumer, never with a consumer waiting forever for a thread that is gone.

The exception is raised into the running thread by the interpreter
(``PyThreadState_SetAsyncExc``), so it lands wherever that thread's Python code is at the
time, as a ``MemoryError`` does when memory runs out."""

from __future__ import annotations

import ctypes
import multiprocessing
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.engine._sources import GatedSource, RangeSource
from zephon import Dataset, Pipeline
from zephon._engine.workers.pools import WorkerCrashedError
from zephon.types import StreamItem

DEADLINE_S = 60.0


class Injected(Exception):
    """Raised into an engine thread from outside."""


def raise_in(thread: threading.Thread, exc: type[BaseException]) -> None:
    """Raise ``exc`` in ``thread`` at its next Python instruction (by thread id: the thread
    must be alive, or the id may be another's)."""
    assert thread.ident is not None
    hit = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(exc)
    )
    assert hit == 1, f"{thread.name} is not running"


def threads_named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def source(n: int = 20000) -> RangeSource:
    rows = [{"id": i, "text": f"document number {i}"} for i in range(n)]
    return RangeSource([Dataset.from_records("docs", rows, shard_size=500)], 50)


def gated_source(gate: threading.Event) -> GatedSource:
    """The rows of :func:`source` (400 chunks), held at chunk 40: far past the first item."""
    plain = source()
    return GatedSource(gate, 40, plain.datasets, plain.chunk_size)


def add_one(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "seen": payload["id"] + 1}


def drain(items: Iterator[StreamItem]) -> int:
    """Consume until the run ends (by an error), within the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    count = 0
    for _ in items:
        count += 1
        assert time.monotonic() < deadline, "the run neither ended nor failed"
    return count


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("runner", "prefix"),
    [
        ("threads", "zephon-engine-source"),
        ("threads", "zephon-engine-driver-"),
        ("process", "zephon-engine-driver-"),
        ("process", "zephon-engine-pool-"),
    ],
)
@pytest.mark.parametrize("error", [Injected, MemoryError])
def test_an_exception_raised_into_an_engine_thread_ends_the_run_with_it(runner, prefix, error):
    """The source is held past the first item until the exception is raised: every targeted
    thread is then alive with work left (the run's results can run ahead of the first item
    by the whole dataset, so without the gate the threads may have finished already)."""
    gate = threading.Event()
    pipe = Pipeline(gated_source(gate)).map_transform(add_one, parallelism=2)
    pipe = pipe.shuffle(64, seed=1).batch(8).options(runner=runner, queue_size=2)
    items = iter(pipe)
    next(items)  # running: every thread is started, and none can have ended
    targets = threads_named(prefix)
    assert targets
    # One thread only: the run then winds down, and a second target may have ended by the
    # time it is named; its thread id can already be a new thread's, which would die before
    # its start returns and leave the thread starting it waiting for ever.
    raise_in(targets[0], error)
    gate.set()
    with pytest.raises(error) as info:
        drain(items)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised in operator" in notes  # the thread's role is named
    assert threads_named("zephon-engine-") == []
    assert multiprocessing.active_children() == []


def idle(thread: threading.Thread) -> bool:
    """Whether a thread-pool worker waits for its next micro-batch."""
    frame = sys._current_frames().get(thread.ident or 0)
    return frame is not None and frame.f_code.co_name in ("get", "_worker")


@pytest.mark.timeout(180)
def test_a_pool_worker_that_dies_between_micro_batches_fails_the_run_naming_it():
    """Raised while a worker waits for work, the exception kills the executor's thread itself
    (no micro-batch is there to fail): the micro-batch it takes next would never end."""
    met, first_call = threading.Barrier(2, timeout=DEADLINE_S), threading.local()

    def add_one_once_both_workers_run(payload: dict[str, Any]) -> dict[str, Any]:
        """Each worker's first call waits for the other's: both threads start (one worker
        alone would leave the pool room to start a replacement for a killed one)."""
        if not getattr(first_call, "done", False):
            first_call.done = True
            met.wait()
        return add_one(payload)

    pipe = Pipeline(source()).map_transform(add_one_once_both_workers_run, parallelism=2)
    items = iter(pipe.batch(8).options(runner="threads", queue_size=1, max_inflight=2))
    next(items)  # the consumer now stops: backpressure idles the workers
    workers = threads_named("zephon-engine-worker-")
    assert len(workers) == 2
    deadline = time.monotonic() + DEADLINE_S
    while not all(idle(t) for t in workers):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for worker in workers:
        raise_in(worker, Injected)
    with pytest.raises(WorkerCrashedError, match=r"operator 'fetch\+map_transform': worker thread"):
        drain(items)
    assert threads_named("zephon-engine-") == []

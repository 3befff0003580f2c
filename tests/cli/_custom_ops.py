"""Importable helpers for YAML configs in the tests (``tests.cli._custom_ops:Name``)."""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path
from typing import Any

from zephon.ops import BaseOp, PassthroughAccumulator
from zephon.types import SampleRecord


class Tag(BaseOp):
    """Adds ``{field: value}`` to every payload."""

    name = "tag"

    def __init__(self, field: str, value: int = 1) -> None:
        self.field = field
        self.value = value

    def accumulator(self, *, deterministic: bool, ctx: Any) -> PassthroughAccumulator:
        return PassthroughAccumulator()

    def process_many(self, elems: list[SampleRecord]) -> list[SampleRecord]:
        return [SampleRecord(e.meta, {**e.payload, self.field: self.value}) for e in elems]


def short(payload: dict[str, Any]) -> bool:
    return len(payload["text"]) < 200


def slow_identity(payload: dict[str, Any]) -> dict[str, Any]:
    """Stands for real per-record work (about 1 ms), so a run lasts long enough to preempt."""
    time.sleep(0.001)
    return payload


def slow_record(payload: dict[str, Any]) -> dict[str, Any]:
    """About 10 ms per record: a process-runner run lasts seconds after its workers start."""
    time.sleep(0.01)
    return payload


def slow_step(batch: Any) -> Any:
    """Stands for a training step (about 3 ms a batch) right before the consumer: a run stays
    busy until its last batch, however far ahead of it the earlier operators have got."""
    time.sleep(0.003)
    return batch


def never(payload: dict[str, Any]) -> bool:
    """A filter predicate that rejects everything."""
    return False


def stall(payload: dict[str, Any]) -> dict[str, Any]:
    """Stands for a first batch that takes minutes (a cold cache, a long restore): says so by
    creating the file ``$ZEPHON_TEST_STALLED``, then works for two minutes."""
    marker = os.environ["ZEPHON_TEST_STALLED"]
    with open(marker, "a", encoding="utf-8"):
        pass
    time.sleep(120)
    return payload


def hungry(payload: dict[str, Any]) -> dict[str, Any]:
    """Asks the allocator for more memory than any machine has: a real ``MemoryError``, as an
    operator gets one when memory runs out."""
    bytearray(1 << 62)
    return payload


_HOARD: list[Any] = []


def hoard(payload: dict[str, Any]) -> dict[str, Any]:
    """Keeps 2 MiB for every record it sees, as a leaking operator does: under a memory limit
    (``ulimit -v``) the worker process running it runs out part-way through a run. The
    pages are never touched, so without a limit it costs address space, not memory."""
    import numpy as np

    _HOARD.append(np.zeros(2 << 20, dtype=np.uint8))
    return payload


def gate(payload: dict[str, Any]) -> dict[str, Any]:
    """Holds the run's records until ``$ZEPHON_TEST_GATE/open`` exists, after creating
    ``$ZEPHON_TEST_GATE/reached`` (see ``tests.engine._gate``)."""
    from tests.engine._gate import Gate

    return Gate(Path(os.environ["ZEPHON_TEST_GATE"]))(payload)


def hang_when_armed(payload: dict[str, Any]) -> dict[str, Any]:
    """A call that never returns once the file ``$ZEPHON_TEST_HANG_WHEN`` exists: it opens
    the FIFO ``$ZEPHON_TEST_HANG`` for reading, which nobody ever writes (a hung NFS read),
    or, when that variable is ``mutex``, locks a mutex it holds already, in C (a deadlocked C
    extension: no Python signal handler runs meanwhile), after creating the file
    ``$ZEPHON_TEST_HUNG``. Without the variables it passes records through."""
    when = os.environ.get("ZEPHON_TEST_HANG_WHEN")
    if when is not None and os.path.exists(when):
        how = os.environ["ZEPHON_TEST_HANG"]
        Path(os.environ["ZEPHON_TEST_HUNG"]).touch()  # says that it blocks now
        if how == "mutex":
            libc = ctypes.CDLL(None)
            mutex = ctypes.create_string_buffer(64)  # PTHREAD_MUTEX_INITIALIZER: zeros
            libc.pthread_mutex_lock(mutex)
            libc.pthread_mutex_lock(mutex)  # a normal mutex locked again: deadlock
        with open(how, "rb") as fifo:  # blocks: no writer
            fifo.read()
    return payload

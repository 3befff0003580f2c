"""The threads and process runners: a source thread and one driver thread per operator.

Each driver owns its operator's accumulator (so the accumulator is only ever called from one
thread), dispatches tasks to a worker pool, and releases results in sequence order. Drivers are
joined by bounded channels: a full channel blocks the producer, so a slow consumer stalls
everything back to the source (backpressure), which also bounds what is in flight.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import assert_never

from zephon._engine.handoff.messages import Data, Done, End, Failed, Stop, ThreadMessage
from zephon._engine.handoff.reorder import ReorderBuffer
from zephon._engine.handoff.shm import resolve_items
from zephon._engine.plan.driver_chain import DriverChain, run_tasks
from zephon._engine.state.stage import StageCore, Task, safe_annotate, task_result
from zephon._engine.stats import OpStats
from zephon._engine.workers.pools import WorkerCrashedError, WorkerPool
from zephon.errors import ZephonError
from zephon.types import StreamItem, Tombstone


def has_marker(items: list[StreamItem]) -> bool:
    """Whether ``items`` hold a sentinel or end-of-lane marker (not just tombstones)."""
    return any(not isinstance(item.meta.control, Tombstone) for item in items)


COALESCE_ITEMS = 256
COALESCE_PARTS = 4
"""A driver sends what it released as one message once this many items or micro-batches are
waiting, or before it blocks: one consumer wake-up then carries several micro-batches. The
message takes a channel slot per micro-batch, so what is in flight stays bounded as before."""
HELD_WINDOW = 4
"""A driver starts no micro-batch while this many times ``max_inflight`` are out of order: running
or finished but held behind an earlier one. One slow micro-batch then holds back a bounded number
of results in memory, not the rest of the run."""


class Stopped(Exception):
    """Raised inside engine threads when the consumer closed the pipeline."""


class Channel:
    """A driver's inbox. Data messages take one of ``capacity`` slots; control ones never block."""

    def __init__(self, capacity: int, stop: threading.Event) -> None:
        self.capacity = capacity
        self.queue: queue.SimpleQueue[ThreadMessage] = queue.SimpleQueue()
        # Free data slots as tokens: a C-level queue, where threading.Semaphore would run a
        # Python condition variable on every hand-off.
        self._slots: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(capacity):
            self._slots.put(None)
        self._stop = stop
        self.depth = 0  # data messages waiting (approximate; for stats)
        self.producer_stats: OpStats | None = None

    def put_data(self, items: list[StreamItem], parts: int = 1) -> None:
        """Send ``items``, which hold ``parts`` micro-batches: each takes a slot (up to the
        capacity), so coalescing micro-batches into one message bounds memory as before."""
        parts = max(1, min(parts, self.capacity))
        for _ in range(parts):
            try:
                self._slots.get_nowait()
            except queue.Empty:
                self._wait_for_slot()
        if self._stop.is_set():
            raise Stopped
        self.depth += 1
        self.queue.put(Data(items, parts))

    def _wait_for_slot(self) -> None:
        """Block until the consumer frees a slot (a stall), checking for a stop meanwhile."""
        start = time.perf_counter_ns()
        while True:
            try:
                self._slots.get(timeout=0.1)
                break
            except queue.Empty:
                if self._stop.is_set():
                    raise Stopped from None
        stats = self.producer_stats
        if stats is not None:
            stats.stalls += 1
            stats.stall_ns += time.perf_counter_ns() - start

    def release(self, parts: int = 1) -> None:
        """A :class:`Data` message of ``parts`` slots was taken off the queue."""
        self.depth -= 1
        for _ in range(parts):
            self._slots.put(None)

    def put(self, message: ThreadMessage) -> None:
        self.queue.put(message)


WATCH_S = 1.0
"""How long the consumer waits for output before it checks that every engine thread lives."""


class EngineThread(threading.Thread):
    """An engine thread that never dies unnoticed.

    ``work`` sends the thread's own end or error message downstream. Whatever escapes it (an
    error raised while reporting another, a ``MemoryError``, an exception raised into the
    thread from outside) is kept in ``fault``; the consumer, which checks its threads whenever
    output is slow to come (:data:`WATCH_S`), raises it rather than wait for a dead thread.
    """

    role = "engine"

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.fault: BaseException | None = None
        self.reported = False  # ``work`` returned: its last message is on its way

    def run(self) -> None:
        try:
            self.work()
            self.reported = True
        except BaseException as exc:  # kept without allocating: the slot already exists
            self.fault = exc

    def work(self) -> None:
        raise NotImplementedError

    def lost(self) -> bool:
        """Started, ended, and its last message may never have been sent; or a message it
        waits for was lost (``fault`` set while it runs)."""
        if self.fault is not None:
            return True
        return self.ident is not None and not self.reported and not self.is_alive()

    def death(self) -> BaseException:
        """The error a run ends with when this thread is :meth:`lost`."""
        fault = self.fault
        if fault is None:
            return ZephonError(
                f"engine thread {self.name} ({self.role}) ended without a message; its error "
                "is on stderr. The run stopped at the last delivered item: resume from there"
            )
        return safe_annotate(fault, self.role)


class SourceThread(EngineThread):
    role = "source"

    def __init__(
        self, feeder: Iterable[list[StreamItem]], out: Channel, stop: threading.Event
    ) -> None:
        super().__init__("zephon-engine-source")
        self.feeder = feeder
        self.out = out
        self.stop = stop

    def work(self) -> None:
        try:
            for items in self.feeder:
                self.out.put_data(items)
            self.out.put(End())
        except Stopped:
            pass
        except BaseException as exc:
            self.out.put(Failed(safe_annotate(exc, "source")))


class OpDriver(EngineThread):
    """Drives one operator: accumulator on this thread, ``process_many`` on the pool."""

    def __init__(
        self,
        core: StageCore,
        pool: WorkerPool | None,
        inbox: Channel,
        downstream: Channel,
        *,
        deterministic: bool,
        max_inflight: int,
        stop: threading.Event,
        count_work: bool = True,
        resolve_shm: bool = True,
        after: DriverChain | None = None,
        on_complete: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(f"zephon-engine-driver-{core.op.name}")
        self.role = core.op.name
        self.core = core
        self.pool = pool
        self.inbox = inbox
        self.downstream = downstream
        self.deterministic = deterministic
        self.max_inflight = max(1, max_inflight)
        self.window = HELD_WINDOW * self.max_inflight
        self.stop = stop
        self.reorder: ReorderBuffer[list[StreamItem]] = ReorderBuffer(deterministic=deterministic)
        self._passthrough: dict[int, Task] = {}  # dispatched tasks with controls to place
        self._dispatched_at: dict[int, int] = {}
        self._pending_inputs: deque[tuple[list[StreamItem], int]] = deque()  # items, slots
        self._ready: deque[Task] = deque()
        self._inflight = 0
        self._ended = False
        self._outbox: list[StreamItem] = []
        self._outbox_parts = 0
        self.stats = core.stats
        # False when no stage runs in processes: no payload can hold a shared-memory handle
        self.resolve_shm = resolve_shm
        # Driver stages riding on this thread: results go through them as they leave, in
        # order, saving a thread and a hand-off per micro-batch (see fusion.driver_chains).
        self.after = after
        # A fused chain counts its operators' work itself (see fusion.py).
        self.work_stats = core.stats if count_work else None
        # told of each completed micro-batch: moves worker share between "auto" stages
        self.on_complete = on_complete

    def work(self) -> None:
        try:
            self._loop()
        except Stopped:
            pass
        except BaseException as exc:
            with contextlib.suppress(Stopped):
                self._flush_outbox()  # what left before the error is delivered first
            # a pool's own errors (a worker that died or cannot start) name the operator already
            named = exc if isinstance(exc, WorkerCrashedError) else safe_annotate(exc, self.role)
            self.downstream.put(Failed(named))

    def _on_done(self, seq: int) -> Callable[[Future[list[StreamItem]]], None]:
        def callback(future: Future[list[StreamItem]]) -> None:
            try:
                self.inbox.put(Done(seq, future))
            except BaseException as exc:  # the driver would wait for it forever
                self.fault = exc

        return callback

    def _complete(self, seq: int, result: list[StreamItem], *, barrier: bool = False) -> None:
        released = self.reorder.put(seq, result, barrier=barrier)
        out: list[StreamItem] = []
        for part in released:
            out.extend(part)
        if out and self.after is not None:
            out = self._ride(out)
        if out:
            self._outbox.extend(out)
            self._outbox_parts += len(released)
            if len(self._outbox) >= COALESCE_ITEMS or self._outbox_parts >= COALESCE_PARTS:
                self._flush_outbox()

    def _flush_outbox(self) -> None:
        """Send what left in order since the last send, as one message."""
        if self._outbox:
            out, self._outbox = self._outbox, []
            parts, self._outbox_parts = self._outbox_parts, 0
            self.downstream.put_data(out, parts)

    def _ride(self, items: list[StreamItem]) -> list[StreamItem]:
        after = self.after
        assert after is not None
        if after.reads_payload and self.resolve_shm:
            resolve_items(items)
        return after.push(items)

    def _send(self, items: list[StreamItem]) -> None:
        """Send on what the riding chain's ``finish`` or ``poll`` emitted."""
        self._outbox.extend(items)
        self._flush_outbox()

    def _start(self, task: Task) -> bool:
        """Dispatch ``task``; True when it occupies a worker slot."""
        self.reorder.expect(task.seq)
        if not task.work:
            self._complete(task.seq, task.passthrough, barrier=has_marker(task.passthrough))
            return False
        if self.pool is None:
            core = self.core
            try:
                if self.resolve_shm:
                    resolve_items(task.work)
            except BaseException as exc:
                raise safe_annotate(exc, core.op.name) from None
            self._complete(task.seq, run_tasks(core, [task], count=self.work_stats is not None))
            return False
        if task.passthrough or task.inner:
            self._passthrough[task.seq] = task
        self._dispatched_at[task.seq] = time.perf_counter_ns()
        self.pool.submit(task.work).add_done_callback(self._on_done(task.seq))
        return True

    def _dispatch(self) -> None:
        """Start ready tasks while worker slots are free; feed inputs to make more ready."""
        core, ready, pending = self.core, self._ready, self._pending_inputs
        while True:
            while ready and self._has_room():
                self._inflight += self._start(ready.popleft())
            if ready or not pending or not self._has_room():
                return
            items, parts = pending.popleft()
            self.inbox.release(parts)
            if core.reads_payload and self.resolve_shm:
                resolve_items(items)
            ready.extend(core.feed(items))

    def _has_room(self) -> bool:
        """A worker slot is free and the results held out of order are within the window."""
        return self._inflight < self.max_inflight and self.reorder.outstanding < self.window

    def in_flight_for(self) -> float | None:
        """Seconds the oldest micro-batch on the pool has been out; None when none is (read
        from another thread for the line that says what a run waits for)."""
        try:
            oldest = next(iter(self._dispatched_at.values()), None)
        except RuntimeError:  # the driver changed it meanwhile: it is not stuck
            return None
        return None if oldest is None else (time.perf_counter_ns() - oldest) / 1e9

    def _timeout(self) -> float | None:
        """Seconds until the accumulator's latency deadline (non-deterministic mode only)."""
        if self.deterministic:
            return None
        deadlines = [self.core.next_deadline_ns()]
        if self.after is not None:
            deadlines.append(self.after.next_deadline_ns())
        due = [d for d in deadlines if d is not None]
        return max(0.0, (min(due) - time.monotonic_ns()) / 1e9) if due else None

    def _task_done(self, seq: int, future: Future[list[StreamItem]]) -> None:
        self._inflight -= 1
        result = future.result()  # re-raises the worker's exception, already annotated
        dispatched = self._dispatched_at.pop(seq)
        stats = self.work_stats
        if stats is not None:
            stats.micro_batches += 1
            stats.elements_out += len(result)
            stats.worker_ns += time.perf_counter_ns() - dispatched
        task = self._passthrough.pop(seq, None)
        if task is not None:
            result = task_result(task, result)
        self._complete(seq, result)
        if self.on_complete is not None:
            self.on_complete()

    def _loop(self) -> None:
        core = self.core
        finished = False
        while True:
            self._dispatch()
            if self._ended and not self._pending_inputs and not self._ready and not finished:
                self._ready.extend(core.finish())
                finished = True
                continue
            if finished and not self._ready and self._inflight == 0:
                self.reorder.close()
                if self.after is not None:
                    self._send(self.after.finish())
                self._flush_outbox()
                self.downstream.put(End())
                return
            if self.inbox.queue.empty():
                self._flush_outbox()  # before waiting: nothing ready may wait with us
            try:
                message = self.inbox.queue.get(timeout=self._timeout())
            except queue.Empty:
                now = time.monotonic_ns()
                self._ready.extend(core.poll(now))
                if self.after is not None:
                    self._send(self.after.poll(now))
                continue
            match message:
                case Data():
                    self._pending_inputs.append((message.items, message.parts))
                case Done():
                    self._task_done(message.seq, message.future)
                case End():
                    self._ended = True
                case Failed():
                    self._flush_outbox()
                    self.downstream.put(message)  # forward unchanged: the consumer raises it
                    return
                case Stop():
                    raise Stopped
                case _:
                    assert_never(message)

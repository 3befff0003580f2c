"""Process pools: a fleet of worker processes serving one or more stages.

Process pools are a *fleet* of worker processes that each hold the operators of one or more
stages. Workers are forked from a ``forkserver`` that has imported zephon, numpy and tokenizers
once (``spawn`` where there is no forkserver), never from the engine process itself: its threads
and the tokenizers' thread pool are not fork-safe. A worker then costs a fork instead of an
interpreter start and those imports (about 0.3 s of CPU each). By default one fleet serves
every process stage of an engine (``process_pool="shared"``), so start-up costs
max(parallelism) worker starts instead of the sum. A worker that dies (SIGKILL, OOM killer,
segfault) is respawned in its slot and the micro-batch it was running is sent again, up to
``max_worker_retries`` times; after that the future fails with :class:`WorkerCrashedError`
naming the operator. Numpy payloads travel through shared memory (see ``shm.py``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, assert_never

import cloudpickle

from zephon._engine.handoff import shm
from zephon._engine.handoff.columnar import ColumnarItems
from zephon._engine.handoff.messages import (
    REPLIES,
    REQUESTS,
    Failed,
    MessageError,
    Ok,
    Ready,
    Run,
    Unloaded,
)
from zephon._engine.plan.fusion import FusedOp
from zephon._engine.plan.projection import unwrapped
from zephon._engine.state.stage import annotate, safe_annotate
from zephon._engine.workers import oom
from zephon._engine.workers.joins import CLOSE_WAIT_S, join_all, stuck_error
from zephon._engine.workers.pools import WorkerCrashedError, WorkerPool, WorkerStartError
from zephon._engine.workers.process_slots import SetupFailed, WorkerSlots
from zephon._engine.workers.worker_registry import FLEETS
from zephon._engine.workers.worker_start import (
    MAIN_GUARD_EXIT,
    describe_exit,
    main_guard_message,
    retries_spent_message,
)
from zephon.errors import ConfigError, ZephonError
from zephon.io import SourceStats
from zephon.ops import BaseOp, OpContext
from zephon.types import StreamItem

log = logging.getLogger("zephon")


def _pickle_op(op: BaseOp, ctx: OpContext) -> bytes:
    try:
        blob: bytes = cloudpickle.dumps((op, ctx))
        return blob
    except Exception as exc:
        raise ConfigError(
            f"operator {op.name!r} cannot be sent to worker processes (runner='process'): "
            f"{type(exc).__name__}: {exc}. Keep no open files, locks, sockets or generators in "
            "its attributes (create them in setup()), or run it with runner='threads'"
        ) from exc


@dataclass
class _Job:
    stage: int
    elems: list[StreamItem]
    future: Future[list[StreamItem]]
    crashes: int = 0
    data: bytes | None = None
    keep: list[Any] = field(default_factory=list)


class _Tally:
    """What the workers count for the engine: the counters of fused chains (added to the
    engine-side ones), the I/O of each stage (bytes, requests, retries, cache events) and the
    time workers spent on it (what the rebalancer of ``parallelism="auto"`` reads)."""

    def __init__(self, specs: Mapping[int, tuple[BaseOp, OpContext]]) -> None:
        inner = {stage: unwrapped(op) for stage, (op, _) in specs.items()}
        self._counters = {
            stage: op.counters
            for stage, op in inner.items()
            if isinstance(op, FusedOp) and op.counters is not None
        }
        self._lock = threading.Lock()
        self._io: dict[int, SourceStats] = {}
        self._busy: dict[int, int] = {}

    def ran(self, stage: int, ns: int) -> None:
        """A worker spent ``ns`` on a micro-batch of ``stage`` (sending it to reading its reply)."""
        with self._lock:
            self._busy[stage] = self._busy.get(stage, 0) + ns

    def busy_ns(self, stage: int) -> int:
        with self._lock:
            return self._busy.get(stage, 0)

    def add(self, stage: int, reply: Ok) -> None:
        counters = self._counters.get(stage)
        if counters is not None and reply.counts is not None:
            counters.add(reply.counts)
        if reply.io is not None:
            with self._lock:
                self._io.setdefault(stage, SourceStats())
                self._io[stage] += SourceStats(**reply.io)

    def io(self, stage: int) -> SourceStats:
        with self._lock:
            return SourceStats(**self._io.get(stage, SourceStats()).to_dict())


class ProcessFleet:
    """Spawned worker processes hosting the operators of one or more stages.

    One thread per worker slot sends a micro-batch, waits for its result and, if the process
    died, respawns it and sends the same micro-batch again (bounded by ``max_retries``). The
    processes themselves (start, stop, kill, reap) are :class:`WorkerSlots`'.
    """

    def __init__(
        self,
        specs: Mapping[int, tuple[BaseOp, OpContext]],
        size: int,
        *,
        session: shm.ShmSession,
        max_retries: int,
        reuse: bool = False,
        deadline_s: float | None = None,
    ) -> None:
        self._names = {stage: op.name for stage, (op, _) in specs.items()}
        self._tally = _Tally(specs)
        blobs = {stage: (op.name, _pickle_op(op, ctx)) for stage, (op, ctx) in specs.items()}
        self._session = session
        self._max_retries = max_retries
        self._stopping = threading.Event()
        self._label = label = "+".join(sorted(set(self._names.values())))
        self._slots = WorkerSlots(
            blobs,
            size,
            session=session,
            reuse=reuse,
            stopping=self._stopping,
            deadline_s=deadline_s,
            watch_name=f"zephon-engine-watch-{label}",
        )
        self._watchdog = self._slots.watchdog
        oom.watch()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._ready = [False] * size
        self._setup_errors: list[BaseException | None] = [None] * size
        self.respawns = 0
        FLEETS.add(self)
        for slot in range(size):
            self._slots.spawn(slot)
        self._faults: list[BaseException | None] = [None] * size
        self._threads = [
            threading.Thread(
                target=self._serve_watched,
                args=(slot,),
                name=f"zephon-engine-pool-{label}-{slot}",
                daemon=True,
            )
            for slot in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def busy(self) -> list[tuple[str, int | None, float]]:
        """(operator, worker pid, seconds) of each micro-batch a worker is running now
        (operator "start-up": the worker is setting its operators up)."""
        return self._slots.busy(self._names)

    def pids(self) -> list[int]:
        """Process ids of the live workers (for tests and diagnostics)."""
        return self._slots.pids()

    def io(self, stage: int) -> SourceStats:
        """What the workers read for ``stage`` so far (a copy)."""
        return self._tally.io(stage)

    def busy_ns(self, stage: int) -> int:
        """Time the workers spent on ``stage``'s micro-batches, from sending one to reading its
        reply (waits for work and for the engine excluded), summed over the workers."""
        return self._tally.busy_ns(stage)

    def submit(self, stage: int, elems: list[StreamItem]) -> Future[list[StreamItem]]:
        future: Future[list[StreamItem]] = Future()
        if self._stopping.is_set():
            future.cancel()
            return future
        self._jobs.put(_Job(stage, elems, future))
        return future

    def _serve_watched(self, slot: int) -> None:
        try:
            self._serve(slot)
        except BaseException as exc:  # kept for check_alive, which ends the run with it
            self._faults[slot] = exc

    def check_alive(self) -> None:
        """Raise the error of a serving thread that died (its micro-batch would never end)."""
        if self._stopping.is_set():
            return
        for slot, thread in enumerate(self._threads):
            if thread.ident is not None and not thread.is_alive():
                fault = self._faults[slot]
                if fault is None:
                    fault = WorkerCrashedError(f"serving thread {thread.name} ended")
                raise safe_annotate(fault, self._label)

    def _serve(self, slot: int) -> None:
        encoder = self._session.encoder(f"p{slot}")
        self._ready[slot] = False
        while True:
            job = self._jobs.get()
            if job is None:
                break
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                self._run(slot, job, encoder)
            except BaseException as exc:  # e.g. a respawn failed: fail the job, never hang
                self._slots.abandon(slot)
                if job.future.done():  # not the job's error: this thread dies of it, and
                    raise  # check_alive ends the run with it (its callback may never have run)
                job.future.set_exception(safe_annotate(exc, self._names[job.stage]))
        self._slots.stop_worker(slot, self._ready[slot])

    def _run(self, slot: int, job: _Job, encoder: shm.Encoder) -> None:
        """Run ``job`` on the worker in ``slot``, respawning it as often as allowed."""
        name = self._names[job.stage]
        error = self._setup_errors[slot]
        if error is not None:
            job.future.set_exception(error)
            return
        if job.data is None:
            elems = ColumnarItems(job.elems, encoder.min_bytes)
            job.data, job.keep = encoder.dumps(REQUESTS.wire(Run(job.stage, elems)))
        while True:
            conn = self._slots.conns[slot]
            if conn is None:
                raise WorkerCrashedError(f"operator {name!r}: worker slot {slot} has no process")
            try:
                if not self._ready[slot]:
                    self._slots.await_ready(slot)
                    self._ready[slot] = True
                reply = self._exchange(slot, job, conn)
            except (EOFError, OSError):
                starting = not self._ready[slot]
                self._ready[slot] = False
                stall = self._watchdog.stall_of(slot)  # alive but silent: it was killed
                how = stall.describe() if stall is not None else None
                if self._crashed(slot, job, starting=starting, how=how):
                    return
                continue
            except SetupFailed as failed:  # an operator's setup raised in the worker
                error = annotate(failed.error, name)
                self._setup_errors[slot] = error
                job.future.set_exception(error)
                return
            self._finish(job, reply)
            return

    def _exchange(self, slot: int, job: _Job, conn: Connection) -> bytes:
        """Send ``job`` to the ready worker in ``slot`` and return its reply; the watchdog
        kills a worker past the stage's deadline, which ends either wait with an error."""
        assert job.data is not None
        watchdog = self._watchdog
        watchdog.begin(slot, job.stage)
        start = time.perf_counter_ns()
        try:
            conn.send_bytes(job.data)
            reply = conn.recv_bytes()
        finally:
            took = watchdog.end(slot)
            self._tally.ran(job.stage, time.perf_counter_ns() - start)
        watchdog.deadlines.observe(job.stage, took)
        return reply

    def _crashed(self, slot: int, job: _Job, *, starting: bool, how: str | None = None) -> bool:
        """The worker in ``slot`` died (or was killed as stalled: ``how`` says so); respawn
        it. True when ``job`` is finished (failed)."""
        code = self._slots.reap(slot)
        name = self._names[job.stage]
        if self._stopping.is_set():
            job.future.set_exception(
                WorkerCrashedError(f"operator {name!r}: worker stopped while the engine closed")
            )
            return True
        if starting and code == MAIN_GUARD_EXIT:
            job.future.set_exception(WorkerStartError(main_guard_message()))
            return True
        job.crashes += 1
        stalled, how = how is not None, how or describe_exit(code)
        self._slots.spawn(slot)
        self.respawns += 1
        if job.crashes > self._max_retries:
            why = retries_spent_message(
                how, job.crashes, self._max_retries, stalled=stalled, starting=starting
            )
            job.future.set_exception(WorkerCrashedError(f"operator {name!r}: {why}"))
            return True
        log.warning(
            "zephon: operator %r: worker process %d %s; respawned it and retrying the "
            "micro-batch (attempt %d of %d)",
            name,
            slot,
            how,
            job.crashes + 1,
            self._max_retries + 1,
        )
        return False

    def _finish(self, job: _Job, data: bytes) -> None:
        name = self._names[job.stage]
        try:
            reply = REPLIES.read(shm.loads(data))
        except BaseException as exc:
            job.future.set_exception(annotate(exc, name))
            return
        finally:
            job.data, job.keep, job.elems = None, [], []
        match reply:
            case Ok():
                self._tally.add(job.stage, reply)
                job.future.set_result(reply.out)
            case Failed():
                job.future.set_exception(annotate(reply.error, name))
            case Ready() | Unloaded():
                job.future.set_exception(
                    annotate(MessageError(f"a worker replied {reply!r} to a micro-batch"), name)
                )
            case _:
                assert_never(reply)

    def shutdown(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Cancel queued micro-batches, let running ones finish within ``wait_s``, stop every
        worker (at once when a serving thread died: its worker may be half-way through a
        request)."""
        self._stopping.set()
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.future.cancel()
        for _ in self._threads:
            self._jobs.put(None)
        deadline = time.monotonic() + wait_s
        for thread in self._threads:
            while thread.is_alive() and time.monotonic() < deadline:
                if any(fault is not None for fault in self._faults):
                    self.kill_all()  # a dead serving thread's worker may never answer
                thread.join(timeout=0.2)
        stuck = [t for t in self._threads if t.is_alive()]
        if stuck:  # waiting on a worker that never answers: killing it ends the wait
            self._slots.kill_busy(self._names, wait_s)
            stuck = join_all(stuck, CLOSE_WAIT_S)
        stuck += self._watchdog.stop()
        self._slots.reap_all()
        FLEETS.discard(self)
        if stuck:
            raise ZephonError(stuck_error(stuck, CLOSE_WAIT_S))

    def kill_all(self) -> None:
        """SIGKILL every worker and close the pipes, without waiting (also at interpreter
        exit, for a fleet never shut down: multiprocessing then joins its workers, and a
        worker waiting on an open pipe would never end)."""
        self._slots.kill_all()


class ProcessWorkerPool(WorkerPool):
    """One stage's view of a :class:`ProcessFleet` (which it owns when ``owns_fleet``)."""

    def __init__(self, fleet: ProcessFleet, stage: int, *, owns_fleet: bool) -> None:
        self.fleet = fleet
        self.stage = stage
        self.owns_fleet = owns_fleet

    def submit(self, elems: list[StreamItem]) -> Future[list[StreamItem]]:
        return self.fleet.submit(self.stage, elems)

    def shutdown(self, wait_s: float = CLOSE_WAIT_S) -> None:
        if self.owns_fleet:
            self.fleet.shutdown(wait_s)

    def check_alive(self) -> None:
        self.fleet.check_alive()

    def busy_ns(self) -> int:
        """Time the fleet's workers spent on this stage's micro-batches."""
        return self.fleet.busy_ns(self.stage)

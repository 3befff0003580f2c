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

import contextlib
import logging
import os
import pickle
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
    Load,
    MessageError,
    Ok,
    Ready,
    Run,
    Unload,
    Unloaded,
)
from zephon._engine.plan.fusion import FusedOp
from zephon._engine.plan.projection import unwrapped
from zephon._engine.state.stage import annotate, safe_annotate
from zephon._engine.workers import oom
from zephon._engine.workers.deadlines import STARTUP, StageDeadlines, Watchdog
from zephon._engine.workers.joins import CLOSE_WAIT_S, join_all, stuck_error
from zephon._engine.workers.pools import WorkerCrashedError, WorkerPool, WorkerStartError
from zephon._engine.workers.worker import worker_main
from zephon._engine.workers.worker_registry import FLEETS, keep_idle, take_idle
from zephon._engine.workers.worker_start import (
    MAIN_GUARD_EXIT,
    THREADS_VARIABLE,
    WORKER_NAME_PREFIX,
    describe_exit,
    main_guard_message,
    retries_spent_message,
    start_deaf_to_ctrl_c,
    usable_cores,
    worker_context,
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


class _SetupFailed(Exception):
    """An operator's ``setup`` raised in a worker (not a crash: respawning would not help)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class _Job:
    stage: int
    elems: list[StreamItem]
    future: Future[list[StreamItem]]
    crashes: int = 0
    data: bytes | None = None
    keep: list[Any] = field(default_factory=list)


class ProcessFleet:
    """Spawned worker processes hosting the operators of one or more stages.

    One thread per worker slot sends a micro-batch, waits for its result and, if the process
    died, respawns it and sends the same micro-batch again (bounded by ``max_retries``).
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
        # fused chains: the engine-side counters that the workers' counts are added to
        inner = {stage: unwrapped(op) for stage, (op, _) in specs.items()}
        self._counters = {
            stage: op.counters
            for stage, op in inner.items()
            if isinstance(op, FusedOp) and op.counters is not None
        }
        self._blobs = {stage: (op.name, _pickle_op(op, ctx)) for stage, (op, ctx) in specs.items()}
        self._session = session
        self._max_retries = max_retries
        self._reuse = reuse
        self._mp = worker_context()
        oom.watch()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._procs: list[Any] = [None] * size
        self._conns: list[Connection | None] = [None] * size
        self._ready = [False] * size
        self._setup_errors: list[BaseException | None] = [None] * size
        # The operators for a freshly spawned worker, sent by its serving thread: a worker
        # that is slow to start (or dies while starting) then never blocks the engine.
        self._pending_load: list[bytes | None] = [None] * size
        self.respawns = 0
        # I/O of the workers (bytes, requests, retries, cache events) by stage, summed
        self._io: dict[int, SourceStats] = {}
        FLEETS.add(self)
        label = "+".join(sorted(set(self._names.values())))
        self._watchdog = Watchdog(
            StageDeadlines(deadline_s), self._stopping, self._kill, f"zephon-engine-watch-{label}"
        )
        for slot in range(size):
            self._spawn(slot)
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

    # -- processes -------------------------------------------------------------------------

    def _spawn(self, slot: int) -> None:
        """Give ``slot`` a worker (an idle one when reusing) and send it the operators."""
        session = self._session
        load = pickle.dumps(
            REQUESTS.wire(
                Load(self._blobs, slot, session.prefix, session.min_bytes, self._environ())
            )
        )
        while self._reuse:
            idle = take_idle()
            if idle is None:
                break
            proc, parent = idle
            try:
                if not proc.is_alive():
                    raise OSError("idle worker died")
                parent.send_bytes(load)
            except OSError:
                parent.close()
                proc.join(timeout=5)
                continue
            with self._lock:
                self._procs[slot] = proc
                self._conns[slot] = parent
            return
        parent, child = self._mp.Pipe(duplex=True)
        proc = self._mp.Process(
            target=worker_main,
            args=(child, session.prefix, session.min_bytes),
            name=f"{WORKER_NAME_PREFIX}{slot}",
            daemon=True,
        )
        start_deaf_to_ctrl_c(proc)
        child.close()
        with self._lock:
            self._procs[slot] = proc
            self._conns[slot] = parent
            self._pending_load[slot] = load
            stopping = self._stopping.is_set()
        if stopping:  # respawned while the engine closed: shutdown may have passed this slot
            proc.kill()

    def _environ(self) -> dict[str, str]:
        """The environment a worker adopts: the engine process's, with a share of the cores
        for each worker's native thread pool unless the user set one."""
        environ = dict(os.environ)
        environ.setdefault(THREADS_VARIABLE, str(max(1, usable_cores() // len(self._procs))))
        return environ

    def _await_ready(self, slot: int) -> None:
        conn = self._conns[slot]
        assert conn is not None
        load = self._pending_load[slot]
        if load is not None:
            self._pending_load[slot] = None
            conn.send_bytes(load)
        # a worker stopped while starting would never answer: a deadline as for micro-batches
        self._watchdog.begin(slot, STARTUP)
        try:
            data = conn.recv_bytes()
        finally:
            took = self._watchdog.end(slot)
        self._watchdog.deadlines.observe(STARTUP, took)
        reply = REPLIES.read(pickle.loads(data))
        match reply:
            case Ready():
                return
            case Failed():
                raise _SetupFailed(reply.error)
            case Ok() | Unloaded():
                raise MessageError(f"a starting worker replied {reply!r:.80}")
            case _:
                assert_never(reply)

    def _reap(self, slot: int) -> int | None:
        proc, conn = self._procs[slot], self._conns[slot]
        if conn is not None:
            conn.close()
        if proc is None:
            return None
        try:
            proc.join(timeout=5)
        except ValueError:  # closed: reaped by a serving thread that died before forgetting it
            proc = None
        if proc is None:
            code = None
        elif proc.is_alive():
            proc.kill()
            proc.join(timeout=30)  # SIGKILL ends it; a loaded machine may take a while to reap
        if proc is not None:
            code = proc.exitcode
            if code is not None:
                proc.close()
            else:  # still not reaped: leave it to the resource tracker rather than fail the run
                log.warning("zephon: worker process %s did not exit after SIGKILL", proc.pid)
        with self._lock:
            self._procs[slot] = None
            self._conns[slot] = None
        return code

    def busy(self) -> list[tuple[str, int | None, float]]:
        """(operator, worker pid, seconds) of each micro-batch a worker is running now
        (operator "start-up": the worker is setting its operators up)."""
        out = []
        for slot, (stage, seconds) in self._watchdog.busy().items():
            proc = self._procs[slot]
            name = self._names.get(stage, "start-up")
            out.append((name, proc.pid if proc is not None else None, seconds))
        return out

    def pids(self) -> list[int]:
        """Process ids of the live workers (for tests and diagnostics)."""
        with self._lock:
            return [p.pid for p in self._procs if p is not None and p.pid is not None]

    # -- serving ---------------------------------------------------------------------------

    def io(self, stage: int) -> SourceStats:
        """What the workers read for ``stage`` so far (a copy)."""
        with self._lock:
            return SourceStats(**self._io.get(stage, SourceStats()).to_dict())

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
                label = "+".join(sorted(set(self._names.values())))
                fault = self._faults[slot]
                if fault is None:
                    fault = WorkerCrashedError(f"serving thread {thread.name} ended")
                raise safe_annotate(fault, label)

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
                self._abandon(slot)
                if job.future.done():  # not the job's error: this thread dies of it, and
                    raise  # check_alive ends the run with it (its callback may never have run)
                job.future.set_exception(safe_annotate(exc, self._names[job.stage]))
        self._stop_worker(slot, self._ready[slot])

    def _abandon(self, slot: int) -> None:
        """An error left the request in ``slot`` half sent or half read: kill its worker, so
        nothing waits on that pipe (the next micro-batch there respawns it)."""
        with self._lock:
            proc = self._procs[slot]
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.kill()

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
            conn = self._conns[slot]
            if conn is None:
                raise WorkerCrashedError(f"operator {name!r}: worker slot {slot} has no process")
            try:
                if not self._ready[slot]:
                    self._await_ready(slot)
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
            except _SetupFailed as failed:  # an operator's setup raised in the worker
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
        try:
            conn.send_bytes(job.data)
            reply = conn.recv_bytes()
        finally:
            took = watchdog.end(slot)
        watchdog.deadlines.observe(job.stage, took)
        return reply

    def _kill(self, slot: int) -> int | None:
        """SIGKILL the worker in ``slot`` (stopped or hung: it cannot exit by itself); its pid."""
        proc = self._procs[slot]
        if proc is None:
            return None
        with contextlib.suppress(Exception):
            proc.kill()
        pid: int | None = proc.pid
        return pid

    def _crashed(self, slot: int, job: _Job, *, starting: bool, how: str | None = None) -> bool:
        """The worker in ``slot`` died (or was killed as stalled: ``how`` says so); respawn
        it. True when ``job`` is finished (failed)."""
        code = self._reap(slot)
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
        self._spawn(slot)
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
                counters = self._counters.get(job.stage)
                if counters is not None and reply.counts is not None:
                    counters.add(reply.counts)
                if reply.io is not None:
                    with self._lock:
                        self._io.setdefault(job.stage, SourceStats())
                        self._io[job.stage] += SourceStats(**reply.io)
                job.future.set_result(reply.out)
            case Failed():
                job.future.set_exception(annotate(reply.error, name))
            case Ready() | Unloaded():
                job.future.set_exception(
                    annotate(MessageError(f"a worker replied {reply!r} to a micro-batch"), name)
                )
            case _:
                assert_never(reply)

    def _stop_worker(self, slot: int, ready: bool) -> None:
        conn, proc = self._conns[slot], self._procs[slot]
        if self._reuse and ready and conn is not None and proc is not None:
            try:
                conn.send_bytes(pickle.dumps(REQUESTS.wire(Unload())))
                reply = REPLIES.read(pickle.loads(conn.recv_bytes()))
                if isinstance(reply, Unloaded) and keep_idle(proc, conn):
                    with self._lock:
                        self._procs[slot] = None
                        self._conns[slot] = None
                    return
            except (EOFError, OSError, MessageError):
                pass
        if conn is not None:
            try:
                if not ready and self._pending_load[slot] is None:
                    self._await_ready(slot)
                self._pending_load[slot] = None
                conn.send_bytes(b"")
            except BaseException:
                pass
        self._reap(slot)

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
            for name, pid, seconds in self.busy():
                log.warning(
                    "zephon: operator %r did not return within %.0f s of the run closing "
                    "(worker pid %s, busy for %.0f s): killing its worker",
                    name,
                    wait_s,
                    pid,
                    seconds,
                )
            self.kill_all()
            stuck = join_all(stuck, CLOSE_WAIT_S)
        stuck += self._watchdog.stop()
        self.kill_all()
        for slot in range(len(self._procs)):
            self._reap(slot)
        FLEETS.discard(self)
        if stuck:
            raise ZephonError(stuck_error(stuck, CLOSE_WAIT_S))

    def kill_all(self) -> None:
        """SIGKILL every worker and close the pipes, without waiting (also at interpreter
        exit, for a fleet never shut down: multiprocessing then joins its workers, and a
        worker waiting on an open pipe would never end)."""
        self._stopping.set()
        with self._lock:
            procs = [p for p in self._procs if p is not None]
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.kill()


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

"""Worker pools that run ``process_many`` off the driver thread: threads, processes or Ray.

Every pool has the same two-method shape the driver needs: ``submit(elems) -> Future`` and
``shutdown()``. A pool may run a micro-batch more than once (a worker died) but completes each
future exactly once, so the driver's reorder buffer sees every sequence number once.

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
import copy
import itertools
import logging
import multiprocessing
import multiprocessing.util  # registers its exit hook before ours, so ours runs first
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Iterator, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext, SpawnContext
from typing import Any, assert_never

import cloudpickle

from zephon._engine import oom, shm
from zephon._engine.deadlines import STARTUP, StageDeadlines, Watchdog
from zephon._engine.fusion import FusedOp
from zephon._engine.joins import CLOSE_WAIT_S, join_all, stuck_error, stuck_operator_error
from zephon._engine.messages import (
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
    WorkerRequest,
)
from zephon._engine.projection import ProjectedOp, unwrapped
from zephon._engine.stage import annotate, call_process_many, safe_annotate
from zephon._exit import at_exit
from zephon.errors import ConfigError, ZephonError
from zephon.io import SourceStats, abandon_reads, io_totals
from zephon.ops import BaseOp, OpContext
from zephon.types import StreamItem

log = logging.getLogger("zephon")


class WorkerCrashedError(ZephonError):
    """A worker process (or Ray actor) kept dying while running one micro-batch."""


class WorkerStartError(WorkerCrashedError):
    """Worker processes cannot start (a script without a main guard); retrying cannot help."""


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
        try:
            if self._resolve_shm:
                shm.resolve_items(elems)
            return call_process_many(op, elems)
        except BaseException as exc:
            raise annotate(exc, op.name) from None

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


# -- process fleet -------------------------------------------------------------------------


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped responding"
    if exitcode == -signal.SIGKILL:
        return f"was killed by SIGKILL{oom.sigkill_hint()}"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _error_reply(exc: BaseException) -> bytes:
    """Pickle a :class:`Failed` reply; an exception that cannot be pickled becomes a
    RuntimeError carrying its traceback."""
    try:
        return pickle.dumps(REPLIES.wire(Failed(exc)), protocol=5)
    except Exception:
        text = "".join(traceback.format_exception(exc)).rstrip()
        error = RuntimeError(f"{type(exc).__name__}: {exc}\n{text}")
        return pickle.dumps(REPLIES.wire(Failed(error)), protocol=5)


#: Exit status of a worker process that found itself started while its parent's main module
#: was being imported (a script without an ``if __name__ == "__main__":`` guard).
MAIN_GUARD_EXIT = 87
WORKER_NAME_PREFIX = "zephon-worker-"


def check_not_bootstrapping() -> None:
    """Refuse to run a pipeline while a spawned process is importing its parent's main module.

    Spawned workers import the main script of the process that started them. A script that
    starts a pipeline at import time (no main guard) would start one in every worker, which
    would spawn workers of its own. A zephon worker exits at once with ``MAIN_GUARD_EXIT`` (its
    parent reports the fix); any other spawned process gets the same advice as an error.
    """
    process = multiprocessing.current_process()
    if not getattr(process, "_inheriting", False):
        return
    if process.name.startswith(WORKER_NAME_PREFIX):
        os._exit(MAIN_GUARD_EXIT)
    raise ZephonError(
        "a pipeline was started while this spawned process was importing its parent's main "
        'script; put the code that runs the pipeline under `if __name__ == "__main__":`'
    )


def _main_script() -> str:
    main = sys.modules.get("__main__")
    return str(getattr(main, "__file__", None) or "your main script")


def worker_context() -> ForkServerContext | SpawnContext:
    """The multiprocessing context that starts process workers.

    ``forkserver`` with zephon, numpy and tokenizers preloaded: the server pays the interpreter
    start and the imports once per engine process, and each worker is a fork of it. Platforms
    without a forkserver spawn every worker, and so does a process forked (``os.fork``, a
    DataLoader worker) from one that may have started a forkserver: it inherits the handle of
    a server that is not its child, which multiprocessing cannot use from there.
    """
    global _SERVER_OWNER
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    if _SERVER_OWNER not in (None, os.getpid()):
        return multiprocessing.get_context("spawn")
    _SERVER_OWNER = os.getpid()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


#: The process that asked for the forkserver context (so may own the server), if any.
_SERVER_OWNER: int | None = None


#: Imported once by the forkserver, so forked workers start with them (not ``__main__``: a
#: script without a main guard would run its pipeline in the server).
_PRELOAD = ["zephon._engine.pools", "tokenizers"]


#: The thread count of the tokenizers' pool (Rayon) in each worker: the cores divided by the
#: workers of the fleet unless set. Without it every worker starts a pool as wide as the
#: machine (on 2 cores with 2 workers a run was 17% slower).
THREADS_VARIABLE = "RAYON_NUM_THREADS"


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def adopt_environment(environ: Mapping[str, str]) -> None:
    """Make this worker's environment the engine process's as of the worker's start.

    A forked worker inherits the forkserver's environment from when the server started;
    operators must see what the engine process has now, as a spawned worker would.
    Variables a library read when the forkserver imported it (numpy's BLAS thread counts)
    keep their values from then.
    """
    for key in set(os.environ) - set(environ):
        del os.environ[key]
    for key, value in environ.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _start_deaf_to_ctrl_c(proc: Any) -> None:
    """Start ``proc`` with SIGINT blocked, a mask it keeps across fork and exec.

    Ctrl-C reaches the whole foreground process group. A forkserver still importing its
    preload modules, or a worker not yet in its loop, would die of it with a traceback on the
    terminal while the engine winds down; the engine decides when its workers stop. The
    resource tracker starts first: starting it unblocks SIGINT in the calling thread.
    """
    resource_tracker.ensure_running()
    with _ctrl_c_held():
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Hold a Ctrl-C that arrives in the block until it ends, then deliver it.

    Blocking SIGINT in this thread does not keep it out: another thread of the process (the
    tokenizers' pool) takes it, and Python raises KeyboardInterrupt in the main thread in
    the middle of a worker's start, after the fork and before its set-up was sent; the
    forked worker then dies of ``EOFError`` with a traceback on the terminal. Only the main
    thread runs Python's signal handlers, so only there is anything to hold.
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is None  # set outside Python: not ours to swap
    ):
        yield
        return
    arrived: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if arrived:
            signal.raise_signal(signal.SIGINT)  # to the handler the program had set


def _name_process(name: str) -> None:
    """Show ``name`` in ps and top (Linux; at most 15 characters are kept)."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(name[:15])


def _decode(data: bytes) -> WorkerRequest | bytes:
    """The request in ``data``, or the error reply when there is none: a segment it names is
    gone (a clear error for the engine rather than a worker dying as if out of memory), or
    it is no request."""
    try:
        return REQUESTS.read(shm.loads(data))
    except FileNotFoundError as exc:
        return _error_reply(shm.lost_segment(exc))
    except Exception as exc:
        return _error_reply(exc)


class _Worker:
    """A worker process's operators and shared-memory encoder, and what it does per request."""

    def __init__(self, prefix: str, min_bytes: int) -> None:
        self.prefix = prefix
        self.mine = f"{prefix}w{os.getpid()}-"
        self.encoder = shm.Encoder(self.mine, min_bytes)
        self.ops: dict[int, BaseOp] = {}
        self.failed = False  # an operator's setup raised: the worker exits after replying

    def handle(self, data: bytes) -> bytes:
        """The reply to one request (pickled); an error reply when it cannot be read."""
        message = _decode(data)
        if isinstance(message, bytes):
            return message
        match message:
            case Run():
                return self.run(self.ops[message.stage], message.elems)
            case Load():
                return self.load(message)
            case Unload():
                self.teardown()
                return pickle.dumps(REPLIES.wire(Unloaded(os.getpid())))
            case _:
                assert_never(message)

    def load(self, message: Load) -> bytes:
        """Set the operators up, each from its own pickle: an operator whose module cannot be
        imported here is named in the error like one whose ``setup`` raised."""
        self.prefix = message.prefix
        self.mine = f"{message.prefix}w{os.getpid()}-"
        self.encoder = shm.Encoder(self.mine, message.min_bytes)
        adopt_environment(message.environ)
        ops: dict[int, BaseOp] = {}
        current = "process worker start-up"
        try:
            for stage, (name, blob) in message.blobs.items():
                current = name
                op, ctx = cloudpickle.loads(blob)
                op.setup(replace(ctx, worker_index=message.worker_index))
                ops[stage] = op
        except BaseException as exc:
            self.failed = True
            return _error_reply(annotate(exc, current))
        self.ops = ops
        return pickle.dumps(REPLIES.wire(Ready(os.getpid())))

    def run(self, op: BaseOp, elems: list[StreamItem]) -> bytes:
        try:
            before = io_totals()
            out = call_process_many(op, elems)
            counts = op.take_counts() if isinstance(op, (FusedOp, ProjectedOp)) else None
            io = (io_totals() - before).to_dict()  # what reading this micro-batch cost
            reply = Ok(out, counts, io if any(io.values()) else None)
            data, _ = self.encoder.dumps(REPLIES.wire(reply))
            return data
        except BaseException as exc:
            return _error_reply(annotate(exc, op.name))

    def teardown(self) -> None:
        for op in self.ops.values():
            op.teardown()
        self.ops = {}

    def sweep(self) -> None:
        """The engine died (or is killing us): segments we wrote have no owner any more, and
        if the engine is gone, none of its session's files has."""
        for name in shm.segment_files(self.mine):
            shm._unlink(str(shm.shm_dir() / name))
        shm.sweep_session(self.prefix)


def _worker_main(conn: Connection, prefix: str, min_bytes: int) -> None:
    """A worker process: load operators, run micro-batches; unload and wait to be reused.

    Requests (:data:`~zephon._engine.messages.WorkerRequest`): :class:`Load` sets up the
    operators of an engine (the first request of every worker), :class:`Run` runs a
    micro-batch, :class:`Unload` tears the operators down (the worker then idles until the
    next load), and an empty message stops the worker.
    """
    # The engine process decides when to stop: Ctrl-C and a SIGTERM sent to the whole process
    # group (Slurm, ``kill -- -PGID``) reach the workers too, and a worker that died of one
    # would be respawned (or fail its micro-batch) while the engine is winding down gracefully.
    # A worker still ends when the engine does (its pipe closes) and on SIGKILL.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked while it started
    _name_process(multiprocessing.current_process().name)
    shm.enter_worker_mode()
    try:
        data = conn.recv_bytes()
    except (EOFError, OSError):
        return  # the engine stopped before sending the operators
    if not data:
        return
    worker = _Worker(prefix, min_bytes)
    while True:
        reply = worker.handle(data)
        try:
            conn.send_bytes(reply)
        except (EOFError, OSError):
            break
        if worker.failed:
            return
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            break  # the engine process is gone
        if not data:
            worker.teardown()
            return
    worker.sweep()


#: Fleets not shut down yet: killed at interpreter exit (this hook runs before
#: multiprocessing's own, registered when ``multiprocessing.util`` was imported above).
_FLEETS: weakref.WeakSet[ProcessFleet] = weakref.WeakSet()


def _kill_live_fleets() -> None:
    for fleet in list(_FLEETS):
        fleet.kill_all()


at_exit(_kill_live_fleets)

# Workers kept for reuse (``reuse_workers=True``): idle, operators torn down.
_IDLE: list[tuple[Any, Connection]] = []
_IDLE_LOCK = threading.Lock()
_MAX_IDLE = max(2, os.cpu_count() or 1)


def shutdown_idle_workers() -> None:
    """Stop the worker processes kept for reuse (also done at interpreter exit)."""
    with _IDLE_LOCK:
        idle = list(_IDLE)
        _IDLE.clear()
    for proc, conn in idle:
        with contextlib.suppress(OSError):
            conn.send_bytes(b"")
        conn.close()
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
        proc.close()


at_exit(shutdown_idle_workers)


def _forget_inherited_workers() -> None:
    """In a forked child: the idle workers and their pipes belong to the parent. Reusing one
    would share its pipe with the parent (and sibling forks); stopping them at exit would stop
    the parent's."""
    global _IDLE_LOCK
    _IDLE_LOCK = threading.Lock()  # another thread of the parent may have held it
    for _, conn in _IDLE:
        with contextlib.suppress(OSError):
            conn.close()  # this process's copy of the descriptor only
    _IDLE.clear()


os.register_at_fork(after_in_child=_forget_inherited_workers)


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
        _FLEETS.add(self)
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
            with _IDLE_LOCK:
                if not _IDLE:
                    break
                proc, parent = _IDLE.pop()
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
            target=_worker_main,
            args=(child, session.prefix, session.min_bytes),
            name=f"{WORKER_NAME_PREFIX}{slot}",
            daemon=True,
        )
        _start_deaf_to_ctrl_c(proc)
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
            job.data, job.keep = encoder.dumps(REQUESTS.wire(Run(job.stage, job.elems)))
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
            job.future.set_exception(
                WorkerStartError(
                    f"runner='process' starts worker processes that import {_main_script()}, "
                    "and that script starts a pipeline when it is imported; put the code that "
                    f"runs the pipeline in {_main_script()} under "
                    '`if __name__ == "__main__":`'
                )
            )
            return True
        job.crashes += 1
        stalled, how = how is not None, how or _describe_exit(code)
        self._spawn(slot)
        self.respawns += 1
        if job.crashes > self._max_retries:
            if stalled:
                why = (
                    f"a worker process {how}, on the same micro-batch {job.crashes} time(s) "
                    f"(max_worker_retries={self._max_retries}); the operator hangs on it (a "
                    "stalled read, a deadlock) or needs longer: fix it, or raise "
                    "worker_deadline_s in pipeline.options()"
                )
            elif starting:
                why = (
                    f"a worker process {how} while starting, before its operators were set "
                    f"up ({job.crashes} time(s)); its traceback is on stderr. A script that "
                    "starts a pipeline with runner='process' needs an "
                    "`if __name__ == '__main__':` guard (worker processes import it)"
                )
            else:
                why = (
                    f"a worker process {how} while running a micro-batch {job.crashes} "
                    f"time(s) (max_worker_retries={self._max_retries}); the micro-batch "
                    "probably crashes the worker (out of memory, a segfault in a native "
                    "library, an os._exit). Fix the operator, or raise max_worker_retries in "
                    "pipeline.options() if the crashes are transient"
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
                with _IDLE_LOCK:
                    keep = isinstance(reply, Unloaded) and len(_IDLE) < _MAX_IDLE
                    if keep:
                        _IDLE.append((proc, conn))
                if keep:
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
        _FLEETS.discard(self)
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

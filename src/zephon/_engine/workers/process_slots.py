"""The worker processes of a process fleet, one per slot: their life cycle.

A slot's worker is spawned from the ``forkserver`` (or taken idle when reusing workers), sent
its operators, awaited until they are set up, and at the end stopped, kept idle or reaped.
The fleet (``process_pool.py``) serves micro-batches on them; this module only starts and
ends them, so that a respawn, a kill by the watchdog and the close read in one place.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import threading
from multiprocessing.connection import Connection
from typing import Any, assert_never

from zephon._engine.handoff import shm
from zephon._engine.handoff.messages import (
    REPLIES,
    REQUESTS,
    Failed,
    Load,
    MessageError,
    Ok,
    Ready,
    Unload,
    Unloaded,
)
from zephon._engine.workers.deadlines import STARTUP, StageDeadlines, Watchdog
from zephon._engine.workers.worker import worker_main
from zephon._engine.workers.worker_registry import keep_idle, take_idle
from zephon._engine.workers.worker_start import (
    WORKER_NAME_PREFIX,
    native_threads,
    start_deaf_to_ctrl_c,
    worker_context,
)

log = logging.getLogger("zephon")


class SetupFailed(Exception):
    """An operator's ``setup`` raised in a worker (not a crash: respawning would not help)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class WorkerSlots:
    """A fixed number of slots, each holding one worker process and its pipe (or none).

    ``stopping`` is the fleet's: once set, a worker spawned into a slot is killed at once (the
    close may have passed that slot). The watchdog kills a slot's worker past its deadline.
    """

    def __init__(
        self,
        blobs: dict[int, tuple[str, bytes]],
        size: int,
        *,
        session: shm.ShmSession,
        reuse: bool,
        stopping: threading.Event,
        deadline_s: float | None,
        watch_name: str,
    ) -> None:
        self._blobs = blobs
        self._session = session
        self._reuse = reuse
        self._mp = worker_context()
        self._stopping = stopping
        self.lock = threading.Lock()
        self.procs: list[Any] = [None] * size
        self.conns: list[Connection | None] = [None] * size
        # The operators for a freshly spawned worker, sent by its serving thread: a worker
        # that is slow to start (or dies while starting) then never blocks the engine.
        self._pending_load: list[bytes | None] = [None] * size
        self.watchdog = Watchdog(StageDeadlines(deadline_s), stopping, self.kill, watch_name)

    def spawn(self, slot: int) -> None:
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
            with self.lock:
                self.procs[slot] = proc
                self.conns[slot] = parent
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
        with self.lock:
            self.procs[slot] = proc
            self.conns[slot] = parent
            self._pending_load[slot] = load
            stopping = self._stopping.is_set()
        if stopping:  # respawned while the engine closed: shutdown may have passed this slot
            proc.kill()

    def _environ(self) -> dict[str, str]:
        """The environment a worker adopts: the engine process's, with a share of the cores
        for each worker's native thread pool unless the user set one."""
        return {**os.environ, **native_threads(len(self.procs))}

    def await_ready(self, slot: int) -> None:
        """Send a fresh worker its operators (when not sent yet) and wait until it set them up;
        :class:`SetupFailed` when an operator's ``setup`` raised."""
        conn = self.conns[slot]
        assert conn is not None
        load = self._pending_load[slot]
        if load is not None:
            self._pending_load[slot] = None
            conn.send_bytes(load)
        # a worker stopped while starting would never answer: a deadline as for micro-batches
        self.watchdog.begin(slot, STARTUP)
        try:
            data = conn.recv_bytes()
        finally:
            took = self.watchdog.end(slot)
        self.watchdog.deadlines.observe(STARTUP, took)
        reply = REPLIES.read(pickle.loads(data))
        match reply:
            case Ready():
                return
            case Failed():
                raise SetupFailed(reply.error)
            case Ok() | Unloaded():
                raise MessageError(f"a starting worker replied {reply!r:.80}")
            case _:
                assert_never(reply)

    def reap(self, slot: int) -> int | None:
        """Close the pipe of ``slot``, wait for its worker to end (killing it if it does not)
        and forget both; the worker's exit code."""
        proc, conn = self.procs[slot], self.conns[slot]
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
        with self.lock:
            self.procs[slot] = None
            self.conns[slot] = None
        return code

    def busy(self, names: dict[int, str]) -> list[tuple[str, int | None, float]]:
        """(operator, worker pid, seconds) of each request a worker is running now, by the
        stages' operator ``names`` ("start-up": the worker is setting its operators up)."""
        out = []
        for slot, (stage, seconds) in self.watchdog.busy().items():
            proc = self.procs[slot]
            name = names.get(stage, "start-up")
            out.append((name, proc.pid if proc is not None else None, seconds))
        return out

    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        with self.lock:
            return [p.pid for p in self.procs if p is not None and p.pid is not None]

    def abandon(self, slot: int) -> None:
        """An error left the request in ``slot`` half sent or half read: kill its worker, so
        nothing waits on that pipe (the next micro-batch there respawns it)."""
        with self.lock:
            proc = self.procs[slot]
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.kill()

    def kill(self, slot: int) -> int | None:
        """SIGKILL the worker in ``slot`` (stopped or hung: it cannot exit by itself); its pid."""
        proc = self.procs[slot]
        if proc is None:
            return None
        with contextlib.suppress(Exception):
            proc.kill()
        pid: int | None = proc.pid
        return pid

    def stop_worker(self, slot: int, ready: bool) -> None:
        """End the worker of ``slot`` once its serving thread is done: kept idle for reuse
        when it unloads its operators, else told to exit and reaped."""
        conn, proc = self.conns[slot], self.procs[slot]
        if self._reuse and ready and conn is not None and proc is not None:
            try:
                conn.send_bytes(pickle.dumps(REQUESTS.wire(Unload())))
                reply = REPLIES.read(pickle.loads(conn.recv_bytes()))
                if isinstance(reply, Unloaded) and keep_idle(proc, conn):
                    with self.lock:
                        self.procs[slot] = None
                        self.conns[slot] = None
                    return
            except (EOFError, OSError, MessageError):
                pass
        if conn is not None:
            try:
                if not ready and self._pending_load[slot] is None:
                    self.await_ready(slot)
                self._pending_load[slot] = None
                conn.send_bytes(b"")
            except BaseException:
                pass
        self.reap(slot)

    def kill_all(self) -> None:
        """SIGKILL every worker without waiting (``stopping`` is set: none is respawned)."""
        self._stopping.set()
        with self.lock:
            procs = [p for p in self.procs if p is not None]
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.kill()

    def kill_busy(self, names: dict[int, str], wait_s: float) -> None:
        """Kill every worker when the close waited ``wait_s`` in vain, saying which operator
        each busy one was running (a worker that never answers ends its wait so)."""
        for name, pid, seconds in self.busy(names):
            log.warning(
                "zephon: operator %r did not return within %.0f s of the run closing "
                "(worker pid %s, busy for %.0f s): killing its worker",
                name,
                wait_s,
                pid,
                seconds,
            )
        self.kill_all()

    def reap_all(self) -> None:
        """Kill and reap every worker still held (the fleet's last step)."""
        self.kill_all()
        for slot in range(len(self.procs)):
            self.reap(slot)

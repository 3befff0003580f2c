"""``engine_process=True``: the whole engine in a child process (forked from the forkserver).

A training loop holds the GIL for most of each step; so does the engine's own Python work
(source, accumulators, reorder, tail). In one process they take turns. Here the child runs an
ordinary :class:`Engine` and sends each delivered item, together with the consumer position a
checkpoint records right after it, through the hand-off (``handoff.py``). The consumer keeps
the position of the last item it received, so ``checkpoint()`` is exact wherever the child
has got to, and stays exact after the child dies: the items received are delivered, the rest
is regenerated on restore.

A ``transform`` (``Pipeline.iter_training``'s ``to_training``) runs in the child on each item
before it is sent, so the consumer receives finished model inputs: their arrays and tensors
in one shared-memory segment per item, mapped without a copy.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import pickle
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any, assert_never

import cloudpickle

from zephon._engine.handoff import shm
from zephon._engine.handoff.handoff import Receiver, Sender
from zephon._engine.handoff.messages import HandoffEnd, HandoffError, HandoffItem, HandoffMessage
from zephon._engine.plan.compile import CompiledRun
from zephon._engine.plan.runner_traits import lookup
from zephon._engine.run import waiting
from zephon._engine.run.engine import Engine
from zephon._engine.state.position import Position
from zephon._engine.stats import RunStats
from zephon._engine.workers import oom
from zephon._engine.workers.worker_start import (
    MAIN_GUARD_EXIT,
    WORKER_NAME_PREFIX,
    adopt_environment,
    check_not_bootstrapping,
    describe_exit,
    main_script,
    worker_context,
)
from zephon._exit import at_exit
from zephon._running import running_operators
from zephon.checkpoints import LaneCheckpoint
from zephon.errors import ConfigError, EngineProcessError, WaitInterrupted, ZephonError
from zephon.types import StreamItem

PROCESS_NAME = f"{WORKER_NAME_PREFIX}engine"
STATS_EVERY_S = 0.5
ASK_WAIT_S = 5.0
"""How long the consumer waits for the engine process to say which operators it runs."""
_NO_SHM = 1 << 62
Transform = Callable[[StreamItem], Any]
"""What the child does to each item before sending it (model inputs from a batch)."""

log = logging.getLogger("zephon")


def _transferable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError carrying its traceback."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        text = "".join(traceback.format_exception(exc)).rstrip()
        return RuntimeError(f"{type(exc).__name__}: {exc}\n\nengine process traceback:\n{text}")


# -- positions: lane states are sent only when they change ----------------------------------

UNCHANGED = {"$unchanged": True}
"""Stands for "the lane's state of the previous position" in a sent position: the open state
of a buffer is large and stays the same until the next snapshot is delivered, the source
state until the next chunk."""


def _unchanged(state: Any) -> bool:
    """Whether a received state is :data:`UNCHANGED` (states may hold arrays: no ``==``)."""
    return type(state) is dict and len(state) == 1 and state.get("$unchanged") is True


def _same_lane(a: LaneCheckpoint, b: LaneCheckpoint) -> bool:
    """Whether ``b`` says what ``a`` said (states compared by identity: the engine returns the
    same object while a state stays)."""
    return (
        a.delivered == b.delivered
        and a.start_chunk_id == b.start_chunk_id
        and a.start_offset == b.start_offset
        and a.done == b.done
        and a.operator_state is b.operator_state
        and a.source_state is b.source_state
        and a.replay_cursor == b.replay_cursor
        and a.mixture == b.mixture
        and a.held_payloads == b.held_payloads
        and a.epoch == b.epoch
        and a.fingerprint == b.fingerprint
    )


def thin(position: Position, sent: dict[int, LaneCheckpoint]) -> Position:
    """``position`` with only the lanes whose checkpoint changed since the last one sent
    (``sent``: lane -> it), each operator and source state that is the object already sent
    replaced by :data:`UNCHANGED`. The first position sent has every lane."""
    lanes = []
    for lc in position.lanes:
        before = sent.get(lc.lane)
        if before is lc or (before is not None and _same_lane(before, lc)):
            continue
        sent[lc.lane] = lc
        same: dict[str, Any] = {}
        if before is not None:
            if lc.operator_state is not None and before.operator_state is lc.operator_state:
                same["operator_state"] = UNCHANGED
            if lc.source_state is not None and before.source_state is lc.source_state:
                same["source_state"] = UNCHANGED
        lanes.append(replace(lc, **same) if same else lc)
    return replace(position, lanes=lanes)


class Thickened:
    """The inverse of :func:`thin` on the consumer's side: the full position of the last thin
    one received, built only when asked for (most items' positions are never read)."""

    def __init__(self) -> None:
        self._lanes: dict[int, LaneCheckpoint] = {}  # every lane's latest, in the engine's order
        self._thin: Position | None = None
        self._full: Position | None = None

    def received(self, position: Position) -> None:
        lanes = self._lanes
        for lc in position.lanes:
            same: dict[str, Any] = {}
            if _unchanged(lc.operator_state):
                same["operator_state"] = lanes[lc.lane].operator_state
            if _unchanged(lc.source_state):
                same["source_state"] = lanes[lc.lane].source_state
            lanes[lc.lane] = replace(lc, **same) if same else lc
        self._thin, self._full = position, None

    def position(self) -> Position | None:
        """The full position received last (None before the first)."""
        if self._full is None and self._thin is not None:
            self._full = replace(self._thin, lanes=list(self._lanes.values()))
        return self._full


# -- the child -------------------------------------------------------------------------------


def _pump(engine: Engine, sender: Sender, transform: Transform | None) -> None:
    """Send every item (as ``transform`` makes it) with its position, then the end (or the
    error) and wait for the close."""
    items = engine.stream()
    track = engine.options.track_stats
    next_stats = time.monotonic() + STATS_EVERY_S
    sent: dict[int, LaneCheckpoint] = {}
    try:
        for item in items:
            stats = None
            if track and time.monotonic() >= next_stats:
                next_stats = time.monotonic() + STATS_EVERY_S
                stats = engine.snapshot()
            payload = item if transform is None else transform(item)
            message = HandoffItem(payload, thin(engine.position(), sent), stats, item.lane_id)
            if not sender.send(message):
                return
        final: HandoffMessage = HandoffEnd(thin(engine.position(), sent), engine.snapshot())
    except BaseException as exc:
        final = HandoffError(_transferable(exc), engine.snapshot())
    finally:
        items.close()
    if sender.send(final):
        sender.wait_closed()


def _answer_running(report: Connection) -> None:
    """Say which operators run now (``thread: operator``) each time the consumer asks: it
    asks before it kills an engine process that did not stop, to name what that is stuck in."""
    while True:
        try:
            report.recv_bytes()
            report.send_bytes(json.dumps(running_operators()).encode())
        except (EOFError, OSError):
            return


def child_main(
    conn: Connection, report: Connection, blobs: tuple[bytes, bytes], environ: dict[str, str]
) -> None:
    """The engine process: build the engine from the pickled pipeline and run it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the consumer decides when to stop
    threading.Thread(
        target=_answer_running, args=(report,), name="zephon-engine-report", daemon=True
    ).start()
    adopt_environment(environ)  # forked from the forkserver: its environment is older
    run: CompiledRun = cloudpickle.loads(blobs[0])
    transform: Transform | None = cloudpickle.loads(blobs[1])
    options = run.options
    session = shm.ShmSession(options.shm_min_bytes or _NO_SHM)
    recycle = options.shm_min_bytes is not None  # None: no shared memory at all
    sender = Sender(conn, session.encoder("h", recycle=recycle), options.queue_size)
    threading.Thread(target=sender.serve, name="zephon-engine-handoff", daemon=True).start()
    engine: Engine | None = None
    try:
        engine = Engine(run)
        _pump(engine, sender, transform)
    except BaseException as exc:
        if sender.send(HandoffError(_transferable(exc))):
            sender.wait_closed()
    finally:
        try:
            if engine is not None:
                engine.close()
        finally:
            session.close()
            conn.close()


# -- the consumer ----------------------------------------------------------------------------


def close_after(close: Callable[[], None], error: BaseException, what: str) -> None:
    """``close()`` after ``error``; a failure to close is noted on it rather than replacing it."""
    try:
        close()
    except Exception as exc:
        with contextlib.suppress(BaseException):
            error.add_note(f"closing {what} then failed too: {type(exc).__name__}: {exc}")


def _child_blobs(run: CompiledRun, transform: Transform | None) -> tuple[bytes, bytes]:
    """The pickles of what the child runs: the pipeline, and the transform of its items."""
    try:
        run_blob = cloudpickle.dumps(run.for_child())
    except Exception as exc:
        raise ConfigError(
            f"the pipeline cannot be sent to the engine process (engine_process=True): "
            f"{type(exc).__name__}: {exc}. Keep no open files, locks, sockets or generators "
            "in operators and sources (create them in setup()), or drop engine_process"
        ) from exc
    try:
        return run_blob, cloudpickle.dumps(transform)
    except Exception as exc:
        raise ConfigError(
            f"the transform {transform!r} cannot be sent to the engine process, which runs it "
            f"on each item: {type(exc).__name__}: {exc}. Pass a function that keeps no open "
            "files, locks or sockets, or use engine_process=False"
        ) from exc


_LIVE: weakref.WeakSet[EngineProcess] = weakref.WeakSet()


@at_exit
def _close_live() -> None:
    """Stop engine processes still running at exit (multiprocessing would wait for them)."""
    for engine in list(_LIVE):
        try:
            engine.close()
        except Exception as exc:
            log.warning("zephon: closing a pipeline left open at exit failed: %s", exc)


class EngineProcess:
    """The consumer's side of an engine running in a child process (same shape as Engine)."""

    def __init__(
        self,
        run: CompiledRun,
        transform: Transform | None = None,
        *,
        role: str = "the engine process (engine_process=True",
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.local = Engine(run)  # builds checkpoints (and stats before the child's first)
        remote = [s.op_name for s in run.plan.stages if not lookup(s.runner).in_engine_process]
        if remote:
            raise ConfigError(
                f"engine_process=True cannot run operators on Ray (placement='remote': "
                f"{remote}): Ray stages belong to the Ray session of the process that iterates; "
                "drop engine_process or keep those operators local"
            )
        options = run.options
        self._blobs = _child_blobs(run, transform)
        self.options = options
        self.stats = self.local.stats
        self._window = options.queue_size
        self._position = Thickened()
        self._last_stats: RunStats | None = None
        self._proc: Any = None
        self._pid: int | None = None
        self._conn: Connection | None = None
        self._report: Connection | None = None
        self._closed = False
        self.interrupt: Callable[[], bool] | None = None
        """Asked while the consumer waits for an item; True stops the wait (see _idle)."""
        self._interrupted = False
        self._last_log = time.monotonic()
        self._role = role  # how errors name this process, before ", pid N)"
        self._environ = dict(environ or {})  # set in the child on top of this environment

    @property
    def prepared(self) -> bool:
        return True

    @property
    def pid(self) -> int | None:
        """The engine process's id while it runs (for diagnostics and tests)."""
        return self._pid

    def checkpoint(self, *, held_records: bool = False) -> dict[str, Any]:
        """The position right after the last item received (the start before the first).

        The child sends operator states with records by meta only, so ``held_records`` adds
        no payloads here: a restore rebuilds those records (exactly, as from any checkpoint).
        """
        return self.local.checkpoint_at(self.position())

    def position(self) -> Position:
        """The position right after the last item received (the start before the first)."""
        position = self._position.position()
        if position is None:
            self.local.prepare()
            return self.local.position()
        return position

    def checkpoint_at(self, position: Position) -> dict[str, Any]:
        return self.local.checkpoint_at(position)

    def snapshot(self) -> RunStats:
        """The engine process's latest statistics (sent about every half second)."""
        return self._last_stats if self._last_stats is not None else self.local.snapshot()

    def _start(self) -> Receiver:
        mp = worker_context()
        oom.watch()
        parent, child = mp.Pipe(duplex=True)
        self._report, report = mp.Pipe(duplex=True)
        proc = mp.Process(
            target=child_main,
            args=(child, report, self._blobs, {**os.environ, **self._environ}),
            name=PROCESS_NAME,
            daemon=False,
        )
        proc.start()  # kept only once started: close() joins it
        self._proc, self._pid = proc, proc.pid
        child.close()
        report.close()
        self._conn = parent
        _LIVE.add(self)
        return Receiver(parent, self._window)

    def __iter__(self) -> Iterator[StreamItem]:
        try:
            for message in self.messages():
                self.received(message)
                if isinstance(message, HandoffItem):
                    yield message.item
        except Exception as exc:  # the run's error is the one the consumer sees
            self._close_after(exc)
            raise
        finally:
            self.close()

    def received(self, message: HandoffItem | HandoffEnd) -> None:
        """Take ``message``'s position as the consumer's: its item was handed out."""
        self._position.received(message.position)

    def messages(self) -> Iterator[HandoffItem | HandoffEnd]:
        """Start the engine process now and return its items and end, in order, as they
        arrive (its error is raised); :meth:`received` says which were handed out."""
        check_not_bootstrapping()
        return self._messages(self._start())

    def _messages(self, receiver: Receiver) -> Iterator[HandoffItem | HandoffEnd]:
        decode = functools.partial(shm.loads_resolved, released=receiver.released)
        while True:
            try:
                message = receiver.recv(decode, self._idle)
            except EOFError:
                raise self._died(receiver.received) from None
            except FileNotFoundError:
                # A message sent just before the child died names segments its workers
                # removed when they saw it go: that item was never handed over. (They
                # see it go as its pipes close, a moment before it can be reaped.)
                self._proc.join(timeout=10)
                if self._proc.exitcode is None:
                    raise
                raise self._died(receiver.received) from None
            match message:
                case HandoffItem():
                    if message.stats is not None:
                        self._last_stats = message.stats
                    yield message
                case HandoffEnd():
                    self._last_stats = message.stats
                    yield message
                    return
                case HandoffError():
                    if message.stats is not None:
                        self._last_stats = message.stats
                    raise message.error
                case _:
                    assert_never(message)

    def _close_after(self, error: BaseException) -> None:
        close_after(self.close, error, "the engine")

    def _idle(self, waited: float) -> None:
        """No item for ``waited`` seconds: say so every ``log_every_s``, and stop waiting when
        the caller's check asks to (the engine process is then stopped without delay)."""
        log_every = self.options.log_every_s
        if log_every is not None and time.monotonic() - self._last_log >= log_every:
            self._last_log = time.monotonic()
            log.info(
                "zephon: waiting %.0f s for the next item from the engine process (pid %s)",
                waited,
                self._pid,
            )
        try:
            waiting.stop_waiting(self.interrupt, waited)
        except WaitInterrupted:
            self._interrupted = True
            raise

    def _died(self, received: int) -> EngineProcessError:
        """The error for a child that went away without an end message."""
        proc = self._proc
        proc.join(timeout=30)
        code = proc.exitcode
        if code == MAIN_GUARD_EXIT:
            return EngineProcessError(
                f"{self._role}) could not start: {main_script()} starts the pipeline when "
                'imported; put that code under `if __name__ == "__main__":` (the process '
                "imports the main script)",
                exitcode=code,
            )
        return EngineProcessError(
            f"{self._role}, pid {proc.pid}) {describe_exit(code)}"
            f" after handing over {received} item(s). What you received stays "
            "delivered: pipeline.checkpoint() is the position right after it; restore that "
            "into a new pipeline (pipe.restore(state)) and iterate to go on from there",
            exitcode=code,
        )

    def close(self) -> None:
        """Stop the engine process and remove what it left; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        if self._conn is not None:
            self._conn.close()  # the child's signal to stop
        proc = self._proc
        if proc is None:
            return
        # after a stop the consumer is leaving: an engine stuck on an operator is not waited for
        wait_s = waiting.close_wait(self.interrupt, self._interrupted)
        proc.join(timeout=wait_s)
        running = self._ask_running() if proc.is_alive() else {}
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=30)
        prefix = f"{shm.NAME_PREFIX}{proc.pid}-"
        shm.forget_held(prefix)
        for name in shm.segment_files(prefix):
            with contextlib.suppress(FileNotFoundError):
                (shm.shm_dir() / name).unlink()
        if self._report is not None:
            self._report.close()
        if proc.exitcode is not None:
            proc.close()
        if running:
            raise ZephonError(_stuck_line(running, self._pid, wait_s))

    def _ask_running(self) -> dict[str, str]:
        """``thread: operator`` of what the engine process runs now ({} when it cannot say)."""
        report = self._report
        with contextlib.suppress(EOFError, OSError, ValueError):
            if report is not None:
                report.send_bytes(b"?")
                if report.poll(ASK_WAIT_S):
                    return dict(json.loads(report.recv_bytes()))
        return {}


def _stuck_line(running: dict[str, str], pid: int | None, wait_s: float) -> str:
    """The line that names the operators an engine process killed at close was inside."""
    operators = ", ".join(repr(op) for op in sorted(set(running.values())))
    threads = ", ".join(sorted(running))
    return (
        f"operator {operators} did not return within {wait_s:.0f} s of the run closing "
        f"(engine process pid {pid}, thread {threads}): a call it makes never returns "
        "(py-spy dump shows where while it hangs); the engine process was killed"
    )

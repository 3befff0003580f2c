"""The worker process: it loads operators, runs micro-batches and replies, until told to stop.

Everything here runs in the worker, never in the engine process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.util  # registers its exit hook before ours, so ours runs first
import os
import pickle
import signal
import traceback
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import assert_never

import cloudpickle

from zephon._engine.handoff import shm
from zephon._engine.handoff.columnar import ColumnarItems
from zephon._engine.handoff.messages import (
    REPLIES,
    REQUESTS,
    Failed,
    Load,
    Ok,
    Ready,
    Run,
    Unload,
    Unloaded,
    WorkerRequest,
)
from zephon._engine.plan.fusion import FusedOp
from zephon._engine.plan.projection import ProjectedOp
from zephon._engine.state.stage import annotate, call_process_many
from zephon._engine.workers.worker_start import adopt_environment
from zephon.io import io_totals
from zephon.ops import BaseOp
from zephon.types import StreamItem


def _error_reply(exc: BaseException) -> bytes:
    """Pickle a :class:`Failed` reply; an exception that cannot be pickled becomes a
    RuntimeError carrying its traceback."""
    try:
        return pickle.dumps(REPLIES.wire(Failed(exc)), protocol=5)
    except Exception:
        text = "".join(traceback.format_exception(exc)).rstrip()
        error = RuntimeError(f"{type(exc).__name__}: {exc}\n{text}")
        return pickle.dumps(REPLIES.wire(Failed(error)), protocol=5)


def _name_process(name: str) -> None:
    """Show ``name`` in ps and top (Linux; at most 15 characters are kept)."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(name[:15])


def decode_request(data: bytes) -> WorkerRequest | bytes:
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
        message = decode_request(data)
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
            items = ColumnarItems(out, self.encoder.min_bytes)
            reply = Ok(items, counts, io if any(io.values()) else None)
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


def worker_main(conn: Connection, prefix: str, min_bytes: int) -> None:
    """A worker process: load operators, run micro-batches; unload and wait to be reused.

    Requests (:data:`~zephon._engine.handoff.messages.WorkerRequest`): :class:`Load` sets up the
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

"""Engine messages on a real worker pipe: every request kind, shared memory, a foreign message."""

from __future__ import annotations

import os
import pickle

import cloudpickle
import numpy as np
import pytest

from zephon._engine.handoff import shm
from zephon._engine.handoff.messages import (
    HANDOFF,
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
from zephon._engine.workers.worker import worker_main
from zephon._engine.workers.worker_start import worker_context
from zephon.ops import BaseOp, OpContext
from zephon.types import SampleMeta, SampleRecord, StreamItem


class DoubleOp(BaseOp):
    """Doubles ``payload["x"]`` (a numpy array)."""

    name = "double"

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return [SampleRecord(e.meta, {"x": e.payload["x"] * 2}) for e in elems]


def test_a_worker_answers_every_request_kind_and_names_a_message_it_cannot_read():
    session = shm.ShmSession(min_bytes=1024)
    mp = worker_context()
    parent, child = mp.Pipe(duplex=True)
    proc = mp.Process(target=worker_main, args=(child, session.prefix, session.min_bytes))
    proc.start()
    child.close()
    try:
        op = DoubleOp()
        blob = cloudpickle.dumps((op, OpContext(op.name, 1)))
        load = Load({1: (op.name, blob)}, 0, session.prefix, session.min_bytes, dict(os.environ))
        parent.send_bytes(pickle.dumps(REQUESTS.wire(load)))
        assert REPLIES.read(pickle.loads(parent.recv_bytes())) == Ready(proc.pid)

        x = np.arange(4096, dtype=np.int64)  # 32 KiB: crosses in a shared-memory segment
        elems: list[StreamItem] = [SampleRecord(SampleMeta((0, 0, 0), 0, 0, 0), {"x": x})]
        data, keep = session.encoder("t").dumps(REQUESTS.wire(Run(1, elems)))
        assert len(data) < x.nbytes and keep  # the pickle names the segment, not the bytes
        parent.send_bytes(data)
        reply = REPLIES.read(shm.loads(parent.recv_bytes()))
        assert isinstance(reply, Ok)
        out = reply.out[0].payload["x"]
        assert isinstance(out, shm.ShmArrayRef)  # the worker's output came back the same way
        np.testing.assert_array_equal(out.resolve(), x * 2)

        parent.send_bytes(pickle.dumps(("run", 1, elems)))  # not a worker request
        reply = REPLIES.read(pickle.loads(parent.recv_bytes()))
        assert isinstance(reply, Failed) and isinstance(reply.error, MessageError)
        assert "not a worker request message: ('run', 1" in str(reply.error)

        parent.send_bytes(pickle.dumps(REQUESTS.wire(Unload())))  # the worker lived on
        assert REPLIES.read(pickle.loads(parent.recv_bytes())) == Unloaded(proc.pid)
        parent.send_bytes(b"")
        proc.join(timeout=30)
        assert proc.exitcode == 0
    finally:
        proc.kill()
        proc.join(timeout=30)
        parent.close()
        session.close()


@pytest.mark.parametrize(
    "wire",
    [(7, None), (-1, None), (0,), (0, 1, 2, 3, 4, 5), ("0", None), [1, None], None],
    ids=repr,
)
def test_a_wire_tuple_of_no_known_kind_or_arity_is_refused_by_name(wire):
    with pytest.raises(MessageError, match="not a hand-off message"):
        HANDOFF.read(wire)


def test_an_error_reply_round_trips_through_pickle_with_its_type_and_note():
    error = ValueError("bad row")
    error.add_note("raised in operator 'double'")
    reply = REPLIES.read(pickle.loads(pickle.dumps(REPLIES.wire(Failed(error)))))
    assert isinstance(reply, Failed) and type(reply.error) is ValueError
    assert reply.error.__notes__ == ["raised in operator 'double'"]

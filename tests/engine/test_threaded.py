"""Channels between engine threads: a message takes a slot per micro-batch it carries."""

from __future__ import annotations

import threading

import pytest

from zephon import Pipeline
from zephon._engine.feed.fetch import FETCH_MICRO_BATCH
from zephon._engine.handoff.messages import Data
from zephon._engine.run.threaded import HELD_WINDOW, Channel, Stopped
from zephon.types import SampleMeta, SampleRecord


def items(n: int) -> list[SampleRecord]:
    return [SampleRecord(SampleMeta((0, 0, i), 0, 0, i), None) for i in range(n)]


def test_a_coalesced_message_takes_one_slot_per_micro_batch_up_to_the_capacity():
    stop = threading.Event()
    channel = Channel(3, stop)
    channel.put_data(items(4), parts=2)
    assert channel._slots.qsize() == 1  # one slot left for the next message
    message = channel.queue.get_nowait()
    assert isinstance(message, Data) and (len(message.items), message.parts) == (4, 2)
    channel.release(message.parts)
    assert channel._slots.qsize() == 3
    channel.put_data(items(1), parts=10)  # more than the capacity: it takes them all
    message = channel.queue.get_nowait()
    assert isinstance(message, Data) and message.parts == 3 and channel._slots.qsize() == 0


def test_a_full_channel_gives_up_waiting_when_the_engine_stops():
    stop = threading.Event()
    channel = Channel(1, stop)
    channel.put_data(items(1))
    stop.set()
    with pytest.raises(Stopped):
        channel.put_data(items(1))


LOOK_S = 5.0  # how long the slow micro-batch lets the others run before it lets go


def test_one_slow_micro_batch_holds_back_a_bounded_number_of_results() -> None:
    """In deterministic order everything finished after a slow micro-batch waits for it in the
    reorder buffer. The driver starts no micro-batch once ``HELD_WINDOW x max_inflight`` are out,
    so the held results stay bounded instead of taking the whole run (here, 2,000 records: the
    others ran to the end within milliseconds before the window existed)."""
    from tests.engine.test_thread_faults import source
    from zephon._ops.map_transform import MapTransformOp

    # the other micro-batches of the window, and the records before the slow one in its own
    most = HELD_WINDOW * 2 * FETCH_MICRO_BATCH - 1
    lock = threading.Lock()
    others: list[int] = []
    ran_while_held: list[int] = []
    many = threading.Event()

    def hold_the_first(payload: dict[str, int]) -> dict[str, int]:
        if payload["id"] == 0:
            many.wait(LOOK_S)  # a look at how far the others get meanwhile
            with lock:
                ran_while_held.append(len(others))
        else:
            with lock:
                others.append(payload["id"])
                if len(others) > 2 * most:
                    many.set()
        return payload

    op = MapTransformOp(hold_the_first, max_batch=1)
    pipe = Pipeline(source(2000)).add_op(op, parallelism=2)  # fused with fetch's micro-batches
    ids = [item.payload["id"] for item in pipe.options(runner="threads", max_inflight=2)]
    assert ids == list(range(2000))
    assert ran_while_held[0] <= most, f"{ran_while_held} records ran behind the slow micro-batch"

"""Channels between engine threads: a message takes a slot per micro-batch it carries."""

from __future__ import annotations

import threading

import pytest

from zephon._engine.messages import Data
from zephon._engine.threaded import Channel, Stopped
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

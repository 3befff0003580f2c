"""The deadline of a process worker's answer: a floor, raised by what the stage was seen to take;
waiting on a real pipe that stays silent, answers, hangs up, or outlives the engine's close."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from zephon._engine.deadlines import (
    DECAY,
    SLOW_FACTOR,
    STOP_GRACE_S,
    StageDeadlines,
    Stalled,
    await_reply,
)


def test_the_floor_holds_until_a_slow_micro_batch_raises_the_deadline_of_its_stage_only():
    deadlines = StageDeadlines(2.0)
    assert deadlines.limit(0) == 2.0
    deadlines.observe(0, 0.05)  # fast: the floor still rules
    assert deadlines.limit(0) == 2.0
    deadlines.observe(0, 1.0)  # slow by nature: 10 x 1 s
    assert deadlines.limit(0) == pytest.approx(SLOW_FACTOR * 1.0)
    assert deadlines.limit(1) == 2.0
    for _ in range(200):  # recent micro-batches count: the slow one fades
        deadlines.observe(0, 0.01)
    assert deadlines.limit(0) == pytest.approx(max(2.0, SLOW_FACTOR * DECAY**200))


def test_no_floor_means_no_deadline():
    deadlines = StageDeadlines(None)
    deadlines.observe(0, 5.0)
    assert deadlines.limit(0) is None


def test_a_silent_peer_is_stalled_past_the_limit_and_an_answer_or_a_hang_up_returns():
    here, there = multiprocessing.Pipe()
    closing = threading.Event()
    start = time.monotonic()
    with pytest.raises(Stalled) as info:
        await_reply(here, 0.3, closing)
    assert time.monotonic() - start >= 0.3 and not info.value.closing
    assert "did not answer within 0.3 s" in info.value.describe(1234)
    assert "(pid 1234)" in info.value.describe(1234)
    there.send_bytes(b"reply")
    assert await_reply(here, 0.3, closing) < 0.3
    assert here.recv_bytes() == b"reply"
    there.close()
    await_reply(here, 10.0, closing)  # a hang-up returns at once: the read then says EOF
    with pytest.raises(EOFError):
        here.recv_bytes()


def test_once_the_engine_closes_a_busy_peer_is_given_up_after_the_grace():
    here, _there = multiprocessing.Pipe()
    closing = threading.Event()
    closing.set()
    start = time.monotonic()
    with pytest.raises(Stalled) as info:
        await_reply(here, None, closing)
    assert time.monotonic() - start >= STOP_GRACE_S
    assert info.value.closing and "still busy" in info.value.describe(None)

"""The deadline of a process worker's answer: a floor, raised by what the stage was seen to take;
the watchdog that kills a real process past it, or past the grace once the engine closes."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import pytest

from zephon._engine.workers.deadlines import (
    DECAY,
    SLOW_FACTOR,
    STOP_GRACE_S,
    StageDeadlines,
    Watchdog,
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


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "600"])


def test_the_watchdog_kills_a_worker_past_its_deadline_and_says_why():
    worker = sleeper()
    closing = threading.Event()
    killed: list[int] = []

    def kill(slot: int) -> int:
        killed.append(slot)
        worker.kill()
        return worker.pid

    watchdog = Watchdog(StageDeadlines(0.5), closing, kill, "test-watch")
    try:
        watchdog.begin(3, stage=0)
        watchdog.begin(4, stage=0)
        assert watchdog.end(4) < 0.5  # answered in time: never killed
        assert worker.wait(timeout=60) == -signal.SIGKILL  # a real SIGKILL, at the deadline
        stall = watchdog.stall_of(3)
        assert killed == [3] and stall is not None and not stall.closing
        assert stall.waited > 0.5 and watchdog.stall_of(3) is None  # read once
        assert f"(pid {worker.pid}) did not answer within 0.5 s" in stall.describe()
        assert watchdog.end(3) == 0.0  # the watchdog ended that exchange
    finally:
        watchdog.stop()


def test_once_the_engine_closes_a_busy_worker_is_given_up_after_the_grace():
    worker = sleeper()
    closing = threading.Event()
    watchdog = Watchdog(StageDeadlines(None), closing, lambda slot: worker.kill(), "test-watch")
    try:
        watchdog.begin(0, stage=0)
        assert watchdog.busy()[0][0] == 0
        closing.set()
        start = time.monotonic()
        assert worker.wait(timeout=60) == -signal.SIGKILL
        assert time.monotonic() - start >= STOP_GRACE_S
        stall = watchdog.stall_of(0)
        assert stall is not None and stall.closing and "still busy" in stall.describe()
    finally:
        watchdog.stop()

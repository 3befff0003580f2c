"""Bounded joins at close: a thread that will not stop is returned and named, never awaited
forever; threads that stop, or never started, are not."""

from __future__ import annotations

import threading

from zephon._engine.workers.joins import join_all, stuck_error


def test_a_thread_that_will_not_stop_is_returned_and_named_the_others_are_joined():
    release = threading.Event()
    stuck = threading.Thread(target=release.wait, name="zephon-engine-driver-slow")
    done = threading.Thread(target=lambda: None, name="zephon-engine-source")
    never = threading.Thread(target=lambda: None, name="zephon-engine-driver-unstarted")
    stuck.start()
    done.start()
    try:
        left = join_all([done, stuck, never], timeout=0.2)
        assert left == [stuck]
        assert not done.is_alive()
        line = stuck_error(left, 30.0)
        assert "zephon-engine-driver-slow did not stop within 30 s" in line
    finally:
        release.set()
        stuck.join()
    assert join_all([stuck], timeout=60.0) == []


def test_the_calling_thread_is_never_joined():
    assert join_all([threading.current_thread()], timeout=0.0) == []

"""Leave the process when a thread it would wait for at exit never ends.

A thread cannot be killed: an operator blocked for good in a call (a hung NFS read, a
deadlocked C extension) keeps its worker thread running, and the interpreter joins such
threads before it exits, forever. Once ``zephon run`` has written its checkpoint and its
summary (the state at the last delivered item does not depend on that thread), the command
leaves with ``os._exit`` and its exit code, after saying which threads it left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from zephon._running import running_operator
from zephon._startup import EXIT_CODES, STOP_SIGNALS, Startup

ENGINE_THREADS = "zephon-engine-"
"""The prefix of the engine's thread names: one alive after the run closed is stuck (thread
pools' workers are joined at exit even though they are daemons)."""


def blocking_threads() -> list[threading.Thread]:
    """The threads that would keep the process at exit: engine threads still running after
    the run closed, and any other thread that is not a daemon."""
    me = threading.current_thread()
    return [
        t
        for t in threading.enumerate()
        if t is not me and t.is_alive() and (not t.daemon or t.name.startswith(ENGINE_THREADS))
    ]


def leave_if_stuck(code: int) -> int:
    """Exit now with ``code`` when the command would otherwise wait at exit for a thread that
    never ends; else return ``code``. Only the ``zephon`` command itself leaves this way (a
    program calling ``main()`` keeps its process)."""
    stuck = blocking_threads()
    if not Startup.installed or not stuck:
        return code
    names = ", ".join(t.name for t in stuck)
    print(
        f"zephon run: exiting without waiting for thread(s) {names}: they run a call that "
        "never returns; the checkpoint is at the last delivered item",
        file=sys.stderr,
    )
    _leave(code)


STOP_GRACE_S = 15.0
"""How long after a stop signal the run may take to end by itself (a stalled wait ends in
a fraction of a second, closing leaves a stuck thread after ``STOPPED_WAIT_S``)."""

STOP_LIMIT_S = 25.0
"""When the command leaves after a stop signal, whatever its main thread is doing: within
the 30 s a supervisor (Kubernetes, Slurm) gives before SIGKILL."""


class StopWatch:
    """Ends a run whose main thread is stuck in an operator call after a stop signal.

    The inline runner runs operators on the main thread: one blocked for good there keeps the
    signal's flag from ever being looked at (a call blocked in C never even runs the Python
    handler). The watch hears the signal through the wakeup fd (written by the C handler,
    whatever the main thread does); when the run has not ended :data:`STOP_GRACE_S` later and
    its main thread is inside an operator's ``process_many``, ``take_over(operator, signum)``
    writes
    the checkpoint and the summary from the watch's thread (nothing moves the delivered
    position while that call lasts) and the process leaves with its exit code.
    """

    def __init__(self) -> None:
        self.take_over: Callable[[str, int], int] | None = None
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        self._previous = -1
        self._ended = threading.Event()

    def __enter__(self) -> StopWatch:
        self._previous = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="zephon-run-stop-watch", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        signal.set_wakeup_fd(self._previous)
        self._ended.set()
        with contextlib.suppress(OSError):
            self._write.send(b"\0")  # wakes the watch, which then returns

    def _watch(self) -> None:
        while not self._ended.is_set():
            byte = self._read.recv(1)
            if byte and byte[0] in STOP_SIGNALS and not self._ended.is_set():
                self._after_stop(byte[0])
                return

    def _after_stop(self, signum: int) -> None:
        signalled = time.monotonic()
        if self._ended.wait(STOP_GRACE_S):
            return
        main = threading.main_thread()
        while time.monotonic() - signalled < STOP_LIMIT_S:
            operator = running_operator(main)
            if operator is not None and self.take_over is not None:
                _leave(self.take_over(operator, signum))
            if self._ended.wait(0.25):
                return
        print(
            f"zephon run: warning: the run did not end within {STOP_LIMIT_S:.0f} s of the stop "
            "signal; leaving without a final checkpoint (the last one written holds)",
            file=sys.stderr,
        )
        _leave(EXIT_CODES[signum])


def _leave(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)

"""Leave the process when a thread it would wait for at exit never ends.

A thread cannot be killed: an operator blocked for good in a call (a hung NFS read, a
deadlocked C extension) keeps its worker thread running, and the interpreter joins such
threads before it exits, forever. Once ``zephon run`` has written its checkpoint and its
summary (the state at the last delivered item does not depend on that thread), the command
leaves with ``os._exit`` and its exit code, after saying which threads it left behind.
"""

from __future__ import annotations

import os
import sys
import threading

from zephon._startup import Startup


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
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

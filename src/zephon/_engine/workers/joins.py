"""Bounded joins for closing a run: a thread that will not stop is reported by name, never
waited for forever, and never keeps the rest of the run's resources from being released."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from zephon._running import running_operator

CLOSE_WAIT_S = 30.0
"""How long closing a run waits for each group of its threads (a loaded machine is slow)."""

STOPPED_WAIT_S = 10.0
"""How long closing a run that a stop interrupted waits for all its threads: its caller is
leaving (a stop signal asked), so a thread that still runs then is stuck and is left behind."""


def join_all(threads: Sequence[threading.Thread], timeout: float) -> list[threading.Thread]:
    """Join ``threads`` within ``timeout`` seconds in all; return those still running."""
    deadline = time.monotonic() + timeout
    me = threading.current_thread()
    for thread in threads:
        if thread.ident is not None and thread is not me:
            thread.join(max(0.0, deadline - time.monotonic()))
    return [t for t in threads if t.ident is not None and t is not me and t.is_alive()]


def _describe(thread: threading.Thread) -> str:
    operator = running_operator(thread)
    return thread.name if operator is None else f"{thread.name} (in operator {operator!r})"


def stuck_error(threads: Sequence[threading.Thread], timeout: float) -> str:
    """The line that reports threads :func:`join_all` left running."""
    names = ", ".join(_describe(t) for t in threads)
    return (
        f"engine thread(s) {names} did not stop within {timeout:.0f} s of the run closing; "
        "an operator or store call they run does not return (py-spy dump shows where)"
    )


def stuck_operator_error(op_name: str, threads: Sequence[threading.Thread], timeout: float) -> str:
    """The line that reports an operator whose ``process_many`` never returned."""
    names = ", ".join(t.name for t in threads)
    return (
        f"operator {op_name!r} did not return within {timeout:.0f} s of the run closing "
        f"(thread {names}): a call it makes never returns (py-spy dump shows where); the "
        "thread is left behind"
    )

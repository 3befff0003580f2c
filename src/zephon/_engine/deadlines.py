"""How long a process worker may take over one micro-batch before the engine calls it stalled.

A worker that is alive but silent (stopped by SIGSTOP, blocked on a hung NFS read, deadlocked
in a C extension) never dies, so the respawn of dead workers never sees it. Each reply is
awaited against a deadline of max(``worker_deadline_s``, ``SLOW_FACTOR`` x the slowest recent
micro-batch of that stage): an operator that is slow by nature raises its own deadline once it
has been seen, and a fast one is caught at the floor. A stalled worker is killed and its
micro-batch sent again, like one that died.
"""

from __future__ import annotations

import select
import threading
import time
from multiprocessing.connection import Connection

SLOW_FACTOR = 10.0
"""The deadline is at least this many times the slowest recent micro-batch of the stage."""
DECAY = 0.98
"""Per micro-batch, the remembered slowest time shrinks by this factor (recent ones count)."""
POLL_S = 0.5
"""How often a waiting serving thread looks at the clock and at the engine closing."""
STOP_GRACE_S = 5.0
"""Once the engine closes, a worker still busy after this long is killed, not awaited."""
STARTUP = -1
"""The "stage" of a worker's start-up (its operators' ``setup``), which has a deadline too."""


class Stalled(Exception):
    """No reply within the deadline (or within the grace once the engine closed)."""

    def __init__(self, waited: float, limit: float | None, *, closing: bool) -> None:
        super().__init__(f"no reply for {waited:.1f} s")
        self.waited = waited
        self.limit = limit
        self.closing = closing

    def describe(self, pid: int | None) -> str:
        """How the worker failed, for the line that reports it."""
        who = f"(pid {pid})" if pid is not None else "(no pid)"
        if self.closing:
            return f"{who} was still busy {STOP_GRACE_S:.0f} s after the engine began to close"
        return (
            f"{who} did not answer within {self.limit:.1f} s (max(worker_deadline_s, "
            f"{SLOW_FACTOR:.0f} x the slowest recent answer)); it was killed"
        )


class StageDeadlines:
    """The deadline of each stage's micro-batches, from its observed reply times."""

    def __init__(self, floor: float | None) -> None:
        self.floor = floor
        self._slowest: dict[int, float] = {}

    def limit(self, stage: int) -> float | None:
        """Seconds a micro-batch of ``stage`` may take; None: no deadline."""
        if self.floor is None:
            return None
        return max(self.floor, SLOW_FACTOR * self._slowest.get(stage, 0.0))

    def observe(self, stage: int, seconds: float) -> None:
        """A micro-batch of ``stage`` took ``seconds`` (serving threads race benignly here)."""
        self._slowest[stage] = max(seconds, DECAY * self._slowest.get(stage, 0.0))


def await_reply(conn: Connection, limit: float | None, closing: threading.Event) -> float:
    """Wait until ``conn`` has a reply (or is closed); the seconds waited.

    Raises :class:`Stalled` past ``limit``, or ``STOP_GRACE_S`` after ``closing`` is set.
    """
    start = time.monotonic()
    closing_since: float | None = None
    # a poll object, not conn.poll(): that builds a selector per call (about 80 us a reply)
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    slice_ms = int(1000 * (POLL_S if limit is None else min(POLL_S, limit)))
    while not poller.poll(slice_ms):  # ready, or the worker hung up (then recv raises)
        now = time.monotonic()
        if limit is not None and now - start > limit:
            raise Stalled(now - start, limit, closing=False)
        if closing.is_set():
            closing_since = closing_since or now
            if now - closing_since > STOP_GRACE_S:
                raise Stalled(now - start, limit, closing=True)
    return time.monotonic() - start

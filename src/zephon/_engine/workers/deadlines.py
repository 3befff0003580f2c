"""How long a process worker may take over one micro-batch before the engine calls it stalled.

A worker that is alive but silent (stopped by SIGSTOP, blocked on a hung NFS read, deadlocked
in a C extension) never dies, so the respawn of dead workers never sees it. Each exchange is
held to a deadline of max(``worker_deadline_s``, ``SLOW_FACTOR`` x the slowest recent
micro-batch of that stage): an operator that is slow by nature raises its own deadline once it
has been seen, and a fast one is caught at the floor. A stalled worker is killed and its
micro-batch sent again, like one that died.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from zephon._engine.workers.joins import CLOSE_WAIT_S, join_all

SLOW_FACTOR = 10.0
"""The deadline is at least this many times the slowest recent micro-batch of the stage."""
DECAY = 0.98
"""Per micro-batch, the remembered slowest time shrinks by this factor (recent ones count)."""
POLL_S = 0.5
"""How often the watchdog looks at the clock and at the engine closing."""
STOP_GRACE_S = 5.0
"""Once the engine closes, a worker still busy after this long is killed, not awaited."""
STARTUP = -1
"""The "stage" of a worker's start-up (its operators' ``setup``), which has a deadline too."""


class Stalled:
    """An exchange ended by the watchdog: no reply within the deadline (or within the grace
    once the engine closed)."""

    def __init__(self, waited: float, limit: float | None, *, closing: bool) -> None:
        self.waited = waited
        self.limit = limit
        self.closing = closing
        self.pid: int | None = None  # of the worker killed for it

    def describe(self) -> str:
        """How the worker failed, for the line that reports it."""
        pid = self.pid
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


class Watchdog:
    """Kills the worker of a slot whose exchange (send and reply) outlives its deadline.

    Serving threads mark each exchange (``begin`` / ``end``: a lock and a clock read, no
    system call per reply); one thread per fleet looks at them every ``POLL_S``. A send can
    block as well as a reply (a stopped worker does not drain its pipe), and killing the
    worker ends either wait with an error, which the serving thread then reads as a stall
    through :meth:`stall_of`. Once the engine closes, exchanges still running
    ``STOP_GRACE_S`` later are ended the same way.
    """

    def __init__(
        self,
        deadlines: StageDeadlines,
        closing: threading.Event,
        kill: Callable[[int], int | None],
        name: str,
    ) -> None:
        self.deadlines = deadlines
        self._closing = closing
        self._kill = kill
        self._lock = threading.Lock()
        self._busy: dict[int, tuple[int, float]] = {}  # slot -> (stage, monotonic start)
        self._stalls: dict[int, Stalled] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)
        self._thread.start()

    def begin(self, slot: int, stage: int) -> None:
        with self._lock:
            self._busy[slot] = (stage, time.monotonic())

    def end(self, slot: int) -> float:
        """The exchange of ``slot`` is over; its seconds (0 when the watchdog ended it)."""
        with self._lock:
            running = self._busy.pop(slot, None)
        return 0.0 if running is None else time.monotonic() - running[1]

    def stall_of(self, slot: int) -> Stalled | None:
        """Why the worker of ``slot`` was killed, if the watchdog killed it (once)."""
        with self._lock:
            return self._stalls.pop(slot, None)

    def busy(self) -> dict[int, tuple[int, float]]:
        """slot -> (stage, seconds) of each exchange running now."""
        now = time.monotonic()
        with self._lock:
            return {slot: (stage, now - t) for slot, (stage, t) in self._busy.items()}

    def stop(self) -> list[threading.Thread]:
        """End the watch and wait for its thread (a closed run leaves no engine thread);
        the thread when it did not stop in time."""
        self._done.set()
        return join_all([self._thread], CLOSE_WAIT_S)

    def _watch(self) -> None:
        closing_since: float | None = None
        while not self._done.wait(POLL_S):
            now = time.monotonic()
            if self._closing.is_set():
                closing_since = closing_since or now
            self.check(now, closing_since)

    def check(self, now: float, closing_since: float | None) -> None:
        """End every exchange past its deadline (or past the grace after ``closing_since``)."""
        with self._lock:
            for slot, (stage, start) in list(self._busy.items()):
                limit = self.deadlines.limit(stage)
                if limit is not None and now - start > limit:
                    stall = Stalled(now - start, limit, closing=False)
                elif closing_since is not None and now - closing_since > STOP_GRACE_S:
                    stall = Stalled(now - start, limit, closing=True)
                else:
                    continue
                del self._busy[slot]
                stall.pid = self._kill(slot)
                self._stalls[slot] = stall

"""What a run waits for while no item comes: the line ``log_every_s`` writes during a wait.

The consumer of a threaded run waits for the next item in slices of ``WAIT_SLICE_S``; after
each empty slice the engine may log this line (a timer, not only on delivery) and ask the
caller whether to stop waiting (:meth:`zephon.Pipeline.interrupt_when`). The line names the
stage most downstream that has a micro-batch out (upstream ones are only held back by it),
the process worker busy the longest, and the oldest request to a store in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from zephon._engine.run.threaded import OpDriver
from zephon._engine.workers.joins import CLOSE_WAIT_S, STOPPED_WAIT_S
from zephon._engine.workers.process_pool import ProcessWorkerPool
from zephon.errors import WaitInterrupted
from zephon.io import open_requests

if TYPE_CHECKING:
    from zephon._engine.run.runners import RunResources


def stop_waiting(check: Callable[[], bool] | None, waited: float) -> None:
    """Raise :class:`WaitInterrupted` when the caller's check (``interrupt_when``) says so."""
    if check is not None and check():
        raise WaitInterrupted(
            f"the iteration stopped after waiting {waited:.1f} s for its next item, as the "
            "check given to interrupt_when() asked"
        )


def close_wait(check: Callable[[], bool] | None, interrupted: bool) -> float:
    """How long closing a run waits for its threads: less once the caller's check asked to
    stop (it stopped a wait, or the caller left after it delivered an item), as the caller
    is leaving and a thread still running then is stuck."""
    if not interrupted and check is not None:
        try:
            interrupted = check()
        except Exception:  # the run's own error, if any, is the one to see
            interrupted = False
    return STOPPED_WAIT_S if interrupted else CLOSE_WAIT_S


def _busiest(resources: RunResources) -> tuple[str, float] | None:
    """(operator, seconds) of the most downstream stage with a micro-batch on its pool."""
    for thread in reversed(resources.threads):
        if isinstance(thread, OpDriver):
            seconds = thread.in_flight_for()
            if seconds is not None:
                return thread.core.op.name, seconds
    return None


def _longest_busy_worker(resources: RunResources) -> tuple[float, int | None, str] | None:
    """(seconds, pid, operator) of the process worker busy the longest with one exchange (a
    micro-batch, or its start-up): the one a stalled run most likely waits on."""
    fleets = {id(p.fleet): p.fleet for p in resources.pools if isinstance(p, ProcessWorkerPool)}
    runs = [(s, pid, op) for f in fleets.values() for op, pid, s in f.busy()]
    return max(runs, key=lambda run: run[0]) if runs else None


def describe(resources: RunResources, waited: float, retries: int) -> str:
    """``waiting 61 s for the next item: operator 'fetch' has had a micro-batch out for 60 s;
    worker pid 1234 busy for 60 s with 'fetch'; oldest open request: read bytes 0-99 of
    s3://b/k, 58 s; 2 request retries so far``."""
    parts: list[str] = []
    busiest = _busiest(resources)
    if busiest is None:
        parts.append("no operator has a micro-batch out (the source or a driver is busy)")
    else:
        name, seconds = busiest
        parts.append(f"operator {name!r} has had a micro-batch out for {seconds:.0f} s")
    worker = _longest_busy_worker(resources)
    if worker is not None:
        seconds, pid, op = worker
        parts.append(f"worker pid {pid} busy for {seconds:.0f} s with {op!r}")
    requests = open_requests()
    if requests:
        url, what, seconds = requests[0]
        parts.append(f"oldest open request: {what} of {url}, {seconds:.0f} s")
    if retries:
        parts.append(f"{retries} request retr{'y' if retries == 1 else 'ies'} so far")
    return f"waiting {waited:.0f} s for the next item: " + "; ".join(parts)

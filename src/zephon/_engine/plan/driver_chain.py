"""Driver operators (replay filter, batch, ...) riding on the driver thread before them.

An operator that ``runs_in_driver`` does trivial work on whichever thread drives it, so a thread
of its own only adds a channel hand-off, a thread wake-up and a GIL hand-over per micro-batch.
A chain of them runs on the driver thread of the worker stage just before: each in-order result
of that stage goes through the chain's operators one after the other, exactly as the inline
runner runs them, and what comes out is sent downstream.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from zephon._engine.state.stage import StageCore, Task, annotate, call_process_many, place_markers
from zephon.types import StreamItem


def run_tasks(core: StageCore, tasks: list[Task], *, count: bool = True) -> list[StreamItem]:
    """Run ``tasks`` of ``core`` on this thread, in order; results then passthrough.
    ``count=False``: the operator counts its own work (a fused chain)."""
    out: list[StreamItem] = []
    op = core.op
    stats = core.stats if count else None
    for task in tasks:
        if task.work:
            start = time.perf_counter_ns()
            try:
                result = call_process_many(op, task.work)
            except BaseException as exc:
                raise annotate(exc, op.name) from None
            if stats is not None:
                stats.worker_ns += time.perf_counter_ns() - start
                stats.micro_batches += 1
                stats.elements_out += len(result)
            out.extend(place_markers(result, task.inner) if task.inner else result)
        out.extend(task.passthrough)
    return out


class DriverChain:
    """Stage cores run back to back on the calling thread; every method returns the items
    that leave the chain's last operator."""

    def __init__(self, cores: Sequence[StageCore]) -> None:
        self.cores = list(cores)
        self.reads_payload = any(core.reads_payload for core in cores)

    def _through(self, first: int, items: list[StreamItem]) -> list[StreamItem]:
        for core in self.cores[first:]:
            if not items:
                break
            items = run_tasks(core, core.feed(items))
        return items

    def push(self, items: Sequence[StreamItem]) -> list[StreamItem]:
        """Items in stream order through every operator of the chain."""
        return self._through(0, list(items))

    def finish(self) -> list[StreamItem]:
        """End of stream: each operator's flush, through the operators after it."""
        out: list[StreamItem] = []
        for index, core in enumerate(self.cores):
            out.extend(self._through(index + 1, run_tasks(core, core.finish())))
        return out

    def poll(self, now_ns: int) -> list[StreamItem]:
        """What latency bounds release at ``now_ns`` (non-deterministic mode only)."""
        out: list[StreamItem] = []
        for index, core in enumerate(self.cores):
            out.extend(self._through(index + 1, run_tasks(core, core.poll(now_ns))))
        return out

    def next_deadline_ns(self) -> int | None:
        deadlines = [d for d in (c.next_deadline_ns() for c in self.cores) if d is not None]
        return min(deadlines) if deadlines else None

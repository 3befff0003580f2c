"""Consecutive driver operators (replay filter, batch, ...) run by one driver thread.

An operator that ``runs_in_driver`` does its work on its driver thread anyway, so a second
thread for the next one only adds a channel hand-off and a thread wake-up per micro-batch.
A chain runs its operators one after the other on each input, exactly as the inline runner
does, and hands the result on as one task.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from zephon._engine.stage import StageCore, Task, annotate, call_process_many
from zephon._engine.stats import OpStats
from zephon.types import StreamItem


def run_tasks(core: StageCore, tasks: list[Task]) -> list[StreamItem]:
    """Run ``tasks`` of ``core`` on this thread, in order; results then passthrough."""
    out: list[StreamItem] = []
    op = core.op
    stats = core.stats
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
            out.extend(result)
        out.extend(task.passthrough)
    return out


class DriverChain:
    """Stage cores run back to back; the driver sees one core whose tasks need no worker."""

    def __init__(self, cores: Sequence[StageCore]) -> None:
        self.cores = list(cores)
        self.op = cores[0].op  # names the driver thread
        self.stats: OpStats | None = cores[0].stats
        self.reads_payload = any(core.reads_payload for core in cores)
        self._next_seq = 0

    def _task(self, items: list[StreamItem]) -> list[Task]:
        if not items:
            return []
        seq = self._next_seq
        self._next_seq += 1
        return [Task(seq, [], items)]

    def _through(self, first: int, items: list[StreamItem]) -> list[StreamItem]:
        for core in self.cores[first:]:
            if not items:
                break
            items = run_tasks(core, core.feed(items))
        return items

    def feed(self, items: Sequence[StreamItem]) -> list[Task]:
        head = self.cores[0]
        return self._task(self._through(1, run_tasks(head, head.feed(items))))

    def finish(self) -> list[Task]:
        out: list[StreamItem] = []
        for index, core in enumerate(self.cores):
            out.extend(self._through(index + 1, run_tasks(core, core.finish())))
        return self._task(out)

    def poll(self, now_ns: int) -> list[Task]:
        out: list[StreamItem] = []
        for index, core in enumerate(self.cores):
            out.extend(self._through(index + 1, run_tasks(core, core.poll(now_ns))))
        return self._task(out)

    def next_deadline_ns(self) -> int | None:
        deadlines = [d for d in (c.next_deadline_ns() for c in self.cores) if d is not None]
        return min(deadlines) if deadlines else None

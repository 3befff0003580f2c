"""``lane_workers=N``: whole lanes in N worker processes; this process only merges their items.

A lane's stream is a function of its work source alone, so lanes can run apart. Worker ``w``
is an engine process (``engine_process.py``) over the rank's lanes ``w::N`` with every
operator inline: fetch, decode, tokenize, pack and batch in one process, nothing pickled
between stages. This process takes the finished items in the rank's own round-robin, so the
output is the rank's whatever ``N`` is, and its serial work is per item, not per document:
receive the item, and keep the position it came with.

Round-robin: each worker delivers its lanes in the rank's order restricted to them (started at
the lane the rank's turn reaches first, see :func:`view_run`), so the next item of the lane
whose turn it is comes from its worker next, or that lane has ended (its worker sends another
lane's item, or its end). The position after an item is the rank's: every lane's state as its
worker sent it after the last item of that lane's worker handed out here, and the rank's order
and turn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from zephon._engine.handoff.messages import HandoffEnd, HandoffItem
from zephon._engine.plan.compile import CompiledRun
from zephon._engine.plan.compile import compile as compile_run
from zephon._engine.run.engine import Engine
from zephon._engine.run.engine_process import EngineProcess, Transform, close_after
from zephon._engine.run.quarantine import drop_torn_tail
from zephon._engine.state.position import Position
from zephon._engine.stats import RunStats, summed
from zephon._engine.workers.worker_start import native_threads
from zephon.types import StreamItem


def _first_due(order: list[int], turn: int, counts: Callable[[int], bool]) -> int | None:
    """The first lane of the round-robin ``order`` from ``turn`` on that ``counts``."""
    return next((lane for lane in order[turn:] + order[:turn] if counts(lane)), None)


def view_run(run: CompiledRun, worker: int, order: list[int], turn: int) -> CompiledRun:
    """What lane worker ``worker`` runs: the rank's lanes ``worker::N``, every stage inline,
    resuming where ``run`` does with the rank's ``order`` and ``turn`` restricted to them.

    It may run two rounds of its lanes (or ``queue_size`` items) ahead of what was taken from
    it: an inline engine finishes its lanes' batches in bursts, and a smaller window stalls
    it while this process waits on another worker's lane."""
    count = run.plan.lane_workers
    lanes = run.lanes[worker::count]
    options = replace(
        run.options,
        lane_workers=None,
        runner="inline",
        _worker_share=(worker, count),
        queue_size=max(run.options.queue_size, 2 * len(lanes)),
    )
    resume = run.resume
    if resume is not None:
        mine = set(lanes)
        view_order = [lane for lane in order if lane in mine]
        first = _first_due(order, turn, lambda lane: lane in mine)
        resume = replace(
            resume,
            tail_lanes=lanes,
            tail_order=view_order,
            tail_turn=view_order.index(first) if first is not None else 0,
        )
    return compile_run(run.source, run.operators, options, resume)


class LaneWorkers:
    """The consumer's side of a run whose lanes run whole in worker processes (the shape of
    :class:`Engine`: iterate, ``position``, ``checkpoint``, ``snapshot``, ``close``)."""

    def __init__(self, run: CompiledRun, transform: Transform | None = None) -> None:
        self.local = Engine(run)  # the rank's tail order and turn, and its checkpoints
        if run.options.quarantine is not None:
            drop_torn_tail(Path(run.options.quarantine))
        self.local.prepare()
        mux = self.local.mux
        assert mux is not None
        self.options = run.options
        self.stats = self.local.stats
        self.interrupt: Callable[[], bool] | None = None
        count = run.plan.lane_workers
        self._order, self._turn = list(mux.order), mux.turn
        self._owner = {lane: i % count for i, lane in enumerate(run.lanes)}
        self._workers = [
            EngineProcess(
                view_run(run, w, self._order, self._turn),
                transform,
                role=f"lane worker {w} of {count} (lanes {run.lanes[w::count]}",
                environ=native_threads(count),
            )
            for w in range(count)
        ]
        self._delivered = 0

    @property
    def prepared(self) -> bool:
        return True

    @property
    def pids(self) -> list[int | None]:
        """The lane workers' process ids while they run (for diagnostics and tests)."""
        return [worker.pid for worker in self._workers]

    def position(self) -> Position:
        """The rank's position right after the last item handed out."""
        views = [worker.position() for worker in self._workers]
        lanes = sorted((lc for view in views for lc in view.lanes), key=lambda lc: lc.lane)
        done = {lc.lane for lc in lanes if lc.done}
        order = [lane for lane in self._order if lane not in done]
        due = _first_due(self._order, self._turn, lambda lane: lane not in done)
        return Position(lanes, order, order.index(due) if due is not None else 0)

    def checkpoint_at(self, position: Position) -> dict[str, Any]:
        return self.local.checkpoint_at(position)

    def checkpoint(self, *, held_records: bool = False) -> dict[str, Any]:
        """The rank's checkpoint right after the last item handed out (operator states hold
        their records by meta: a restore rebuilds them, as from any checkpoint)."""
        return self.checkpoint_at(self.position())

    def snapshot(self) -> RunStats:
        """The workers' latest statistics (each sends them about every half second), summed."""
        return summed([worker.snapshot() for worker in self._workers], self._delivered)

    def __iter__(self) -> Iterator[StreamItem]:
        for worker in self._workers:
            worker.interrupt = self.interrupt
        try:
            streams = [worker.messages() for worker in self._workers]
            yield from self._in_turn(streams)
        except Exception as exc:  # the run's error is the one the consumer sees
            close_after(self.close, exc, "the lane workers")
            raise
        finally:
            self.close()

    def _in_turn(self, streams: list[Iterator[HandoffItem | HandoffEnd]]) -> Iterator[Any]:
        """The workers' items in the rank's round-robin, then each worker's end."""
        ahead: list[HandoffItem | HandoffEnd | None] = [None] * len(streams)
        order = self._order
        while order:
            lane = order[self._turn]
            worker = self._owner[lane]
            message = ahead[worker] or next(streams[worker])
            if isinstance(message, HandoffItem) and message.lane == lane:
                ahead[worker] = None
                self._workers[worker].received(message)
                self._turn = (self._turn + 1) % len(order)
                self._delivered += 1
                yield message.item
                continue
            ahead[worker] = message  # another lane's item, or the end: this lane has ended
            del order[self._turn]
            self._turn = self._turn % len(order) if order else 0
        for worker, stream in enumerate(streams):
            message = ahead[worker] or next(stream)
            if not isinstance(message, HandoffEnd):
                raise RuntimeError(
                    f"lane worker {worker} sent an item of lane {message.lane} after its lanes "
                    "had ended"
                )
            self._workers[worker].received(message)

    def close(self) -> None:
        """Stop every lane worker; the first failure to close is raised after all are."""
        failure: Exception | None = None
        for worker in self._workers:
            try:
                worker.close()
            except Exception as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

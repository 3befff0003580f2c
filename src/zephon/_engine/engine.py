"""Run a compiled plan: source -> operators -> lane round-robin tail, with any runner."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from zephon._engine.plan import OpSpec, Plan, compile_plan, stalls_sentinels
from zephon._engine.pools import ProcessWorkerPool, ThreadWorkerPool, WorkerPool
from zephon._engine.source import SourceFeeder
from zephon._engine.stage import StageCore, Task, annotate, call_process_many
from zephon._engine.tail import LaneMux
from zephon._engine.threaded import DATA, END, ERROR, STOP, Channel, OpDriver, SourceThread
from zephon.errors import ZephonError
from zephon.options import RuntimeOptions
from zephon.types import StreamItem
from zephon.work import WorkSource, lanes_for_rank

log = logging.getLogger("zephon")


@dataclass
class RunStats:
    """What one iteration delivered and dropped."""

    delivered: int = 0
    tombstones: int = 0
    skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    samples_read: int = 0
    chunks: int = 0


class Engine:
    """One iteration of a pipeline. Not reusable: build a new one per ``iter(pipeline)``."""

    def __init__(self, source: WorkSource, specs: list[OpSpec], options: RuntimeOptions) -> None:
        self.source = source
        self.specs = specs
        self.options = options
        self.lanes = lanes_for_rank(
            options.dp_rank, options.dp_world_size, options.canonical_replicas, options.mapping
        )
        self.plan, self.contexts = compile_plan(specs, options, self.lanes)
        self.stats = RunStats()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pools: list[WorkerPool] = []
        self._inline_ops: list[StageCore] = []
        self._closed = False
        self.feeder: SourceFeeder | None = None

    @classmethod
    def explain(cls, source: WorkSource, specs: list[OpSpec], options: RuntimeOptions) -> Plan:
        lanes = lanes_for_rank(
            options.dp_rank, options.dp_world_size, options.canonical_replicas, options.mapping
        )
        return compile_plan(specs, options, lanes)[0]

    def _feeder(self) -> SourceFeeder:
        lane_sources = [
            (lane, self.source.clone_for_lane(lane, self.options.canonical_replicas))
            for lane in self.lanes
        ]
        return SourceFeeder(lane_sources, flush_every_k_chunks=self.plan.flush_every_k_chunks)

    def _cores(self) -> list[StageCore]:
        cores = []
        for spec, ctx in zip(self.specs, self.contexts, strict=True):
            acc = spec.op.accumulator(deterministic=self.options.deterministic, ctx=ctx)
            cores.append(StageCore(spec.op, acc, stalls_sentinels=stalls_sentinels(spec.op)))
        return cores

    def __iter__(self) -> Iterator[StreamItem]:
        mux = LaneMux(self.lanes)
        feeder = self.feeder = self._feeder()
        try:
            if self.options.runner == "inline":
                yield from self._run_inline(feeder, mux)
            else:
                yield from self._run_threaded(feeder, mux)
        finally:
            self.stats.samples_read = feeder.samples_emitted
            self.stats.chunks = feeder.chunks_admitted
            self.stats.tombstones = mux.tombstones
            self.stats.skipped = len(mux.errors)
            self.stats.skipped_examples = mux.errors[:10]
            self.close()
        if mux.errors:
            log.warning(
                "zephon: skipped %d malformed record(s) (on_error='skip'); first: %s",
                len(mux.errors),
                mux.errors[0],
            )

    def _deliver(self, mux: LaneMux) -> Iterator[StreamItem]:
        while True:
            item = mux.pop()
            if item is None:
                return
            self.stats.delivered += 1
            yield item

    # -- inline: everything on the calling thread (the reference runner) --------------------

    @staticmethod
    def _run_tasks(core: StageCore, tasks: list[Task]) -> list[StreamItem]:
        out: list[StreamItem] = []
        op = core.op
        for task in tasks:
            if task.work:
                try:
                    out.extend(call_process_many(op, task.work))
                except BaseException as exc:
                    raise annotate(exc, op.name) from None
            out.extend(task.passthrough)
        return out

    def _run_inline(self, feeder: SourceFeeder, mux: LaneMux) -> Iterator[StreamItem]:
        cores = self._cores()
        for core, ctx in zip(cores, self.contexts, strict=True):
            core.op.setup(ctx)
        self._inline_ops = cores
        run = self._run_tasks
        for items in feeder:
            outs = items
            for core in cores:
                outs = run(core, core.feed(outs))
                if not outs:
                    break
            mux.add(outs)
            yield from self._deliver(mux)
        for i, core in enumerate(cores):
            outs = run(core, core.finish())
            for later in cores[i + 1 :]:
                outs = run(later, later.feed(outs))
            mux.add(outs)
            yield from self._deliver(mux)
        mux.ended = True
        yield from self._deliver(mux)

    # -- threads / process: a source thread and one driver thread per operator --------------

    def _run_threaded(self, feeder: SourceFeeder, mux: LaneMux) -> Iterator[StreamItem]:
        stop = self._stop
        cores = self._cores()
        channels = [Channel(self.options.queue_size, stop) for _ in range(len(cores) + 1)]
        self._channels = channels
        for i, (core, stage) in enumerate(zip(cores, self.plan.stages, strict=True)):
            pool: WorkerPool | None = None
            ctx = self.contexts[i]
            if stage.runner == "threads":
                pool = ThreadWorkerPool(core.op, stage.parallelism, ctx)
            elif stage.runner == "process":
                pool = ProcessWorkerPool(core.op, stage.parallelism, ctx)
            else:
                core.op.setup(ctx)
                self._inline_ops.append(core)
            if pool is not None:
                self._pools.append(pool)
            self._threads.append(
                OpDriver(
                    core,
                    pool,
                    channels[i],
                    channels[i + 1],
                    deterministic=self.options.deterministic,
                    max_inflight=stage.max_inflight,
                    stop=stop,
                )
            )
        self._threads.insert(0, SourceThread(feeder, channels[0], stop))
        for thread in self._threads:
            thread.start()
        out = channels[-1]
        while True:
            message = out.queue.get()
            kind = message[0]
            if kind == DATA:
                out.release()
                mux.add(message[1])
                yield from self._deliver(mux)
            elif kind == END:
                mux.ended = True
                yield from self._deliver(mux)
                return
            elif kind == ERROR:
                raise message[1]

    def close(self) -> None:
        """Stop threads and workers; safe to call more than once and after early exit."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for channel in getattr(self, "_channels", []):
            channel.put((STOP,))
        for thread in self._threads:
            thread.join(timeout=30)
            if thread.is_alive():
                raise ZephonError(f"engine thread {thread.name} did not stop within 30 s")
        for pool in self._pools:
            pool.shutdown()
        for core in self._inline_ops:
            core.op.teardown()

"""Runners: how each drives a run (its worker pools and threads). One class per runner.

What the plan and the checks read of a runner (its option name, where a stage runs and how
wide, whether its stages fuse, ...) is its traits class in ``plan/runner_traits.py``; the
runner here subclasses it with the worker pools it builds and how it drives a run. Adding a
runner is adding a traits class to ``runner_traits.REGISTRY`` and its runner class to
:data:`RUNNERS_BY_NAME`. No runner changes what comes out: every one gives the inline
runner's output, byte for byte.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, assert_never

from zephon._engine.handoff.handoff import WAIT_SLICE_S
from zephon._engine.handoff.messages import Data, Done, End, Failed, MessageError, Stop
from zephon._engine.handoff.shm import ShmSession, resolve_items
from zephon._engine.plan.driver_chain import run_tasks
from zephon._engine.plan.fusion import Unit, build_units
from zephon._engine.plan.projection import projected
from zephon._engine.plan.runner_traits import (
    InlineTraits,
    ProcessTraits,
    RayTraits,
    RunnerTraits,
    ThreadsTraits,
    lookup,
)
from zephon._engine.run.rebalance import Rebalancer, pool_stages
from zephon._engine.run.threaded import Channel, EngineThread, OpDriver, SourceThread
from zephon._engine.state.stage import StageCore
from zephon._engine.workers.joins import CLOSE_WAIT_S, join_all, stuck_error
from zephon._engine.workers.pools import WorkerPool
from zephon._engine.workers.process_pool import ProcessFleet, ProcessWorkerPool
from zephon._engine.workers.thread_pool import ThreadWorkerPool
from zephon.errors import ZephonError
from zephon.io import SourceStats
from zephon.ops import BaseOp, OpContext
from zephon.types import StreamItem

if TYPE_CHECKING:
    from zephon._engine.feed.source import SourceFeeder
    from zephon._engine.handoff.tail import LaneMux
    from zephon._engine.plan.plan import Plan, StagePlan
    from zephon.options import RuntimeOptions


@dataclass(frozen=True)
class PoolSpec:
    """What a plan's worker pools are built from: every stage's operator and context (by
    stage index), the options, and the shared-memory session when a runner needs one."""

    ops: Sequence[BaseOp]
    contexts: Sequence[OpContext]
    options: RuntimeOptions
    session: ShmSession | None


@dataclass
class RunResources:
    """What a run started (threads, pools, shared memory, set-up operators); closed once."""

    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    pools: list[WorkerPool] = field(default_factory=list)
    shm: ShmSession | None = None
    set_up: list[StageCore] = field(default_factory=list)
    """Stages whose operator ran ``setup`` in this process (torn down at the close)."""
    channels: list[Channel] = field(default_factory=list)
    """Between the units of a threaded run (source first)."""
    inboxes: list[Channel | None] = field(default_factory=list)
    """Stage index -> the channel it reads (None inside a fused or chained unit)."""

    def process_io(self) -> dict[int, SourceStats]:
        """Dataset I/O of each process stage, summed over its workers."""
        out: dict[int, SourceStats] = {}
        for pool in self.pools:
            if isinstance(pool, ProcessWorkerPool):
                out[pool.stage] = out.get(pool.stage, SourceStats()) + pool.fleet.io(pool.stage)
        return out

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop the threads, shut the pools down, release shared memory, tear operators down;
        a thread still running after ``wait_s`` is left behind and reported."""
        self.stop.set()
        for channel in self.channels:
            channel.put(Stop())
        # a thread never started (starting it failed: that error is the run's) is skipped;
        # one that will not stop is reported once the pools and shared memory are released
        deadline = time.monotonic() + wait_s
        stuck = join_all(self.threads, wait_s)
        errors: list[str] = []
        try:
            for pool in self.pools:
                try:
                    pool.shutdown(max(1.0, deadline - time.monotonic()))
                except ZephonError as exc:
                    errors.append(str(exc))
        finally:
            if self.shm is not None:
                self.shm.close()
        if stuck:
            errors.insert(0, stuck_error(stuck, wait_s))
        if errors:
            raise ZephonError("; ".join(errors))

    def check_alive(self) -> None:
        """Raise the error of an engine thread or worker pool that died without reporting it
        (its consumers would wait for it forever)."""
        for thread in self.threads:
            if isinstance(thread, EngineThread) and thread.lost():
                raise thread.death()
        for pool in self.pools:
            pool.check_alive()

    def start_threads(self) -> None:
        """Start every engine thread; one that cannot start (no memory or threads left) is
        an error that says what to lower."""
        for thread in self.threads:
            try:
                thread.start()
            except RuntimeError as exc:
                raise ZephonError(
                    f"cannot start the engine thread {thread.name}: {exc}. The process is out "
                    "of memory or threads: lower the operators' parallelism, or raise the "
                    "limit (ulimit -v, ulimit -u, the container's memory)"
                ) from exc

    def teardown(self) -> None:
        for core in self.set_up:
            core.op.teardown()


@dataclass
class RunJob:
    """One run as a runner drives it: the engine's stages and where their output goes."""

    cores: list[StageCore]
    plan: Plan
    contexts: list[OpContext]
    options: RuntimeOptions
    feeder: SourceFeeder
    mux: LaneMux
    deliver: Callable[[LaneMux], Iterator[StreamItem]]
    """Pops what the tail can deliver (the engine counts, logs and evicts)."""
    resources: RunResources
    idle: Callable[[float], None] = field(default=lambda waited: None)
    """Called while the consumer has waited that many seconds for the next item, every
    ``WAIT_SLICE_S`` (the engine logs what it waits for, and may stop waiting by raising)."""


class Runner(RunnerTraits):
    """A runner: its traits (what the plan reads), the pools it builds and how it runs."""

    def pools(self, stages: Sequence[StagePlan], spec: PoolSpec) -> dict[int, WorkerPool]:
        """A worker pool per stage of this runner (by stage index)."""
        return {}

    def run(self, job: RunJob) -> Iterator[StreamItem]:
        """Feed the source through the stages and yield what the tail delivers."""
        raise NotImplementedError


class InlineRunner(InlineTraits, Runner):
    """Everything on the calling thread, stage after stage: the reference."""

    def run(self, job: RunJob) -> Iterator[StreamItem]:
        cores, feeder, mux = job.cores, job.feeder, job.mux
        for core, ctx in zip(cores, job.contexts, strict=True):
            core.op.setup(ctx)
        job.resources.set_up = cores
        clock = _IdleClock(job.idle)
        run = clock.timed(run_tasks)
        for items in feeder:
            outs = items
            for core in cores:
                outs = run(core, core.feed(outs))
                if not outs:
                    break
            mux.add(outs)
            yield from clock.deliver(job.deliver(mux))
        for i, core in enumerate(cores):
            outs = run(core, core.finish())
            for later in cores[i + 1 :]:
                outs = run(later, later.feed(outs))
            mux.add(outs)
            yield from clock.deliver(job.deliver(mux))
        mux.ended = True
        yield from clock.deliver(job.deliver(mux))


class _IdleClock:
    """The inline runner's wait: its consumer waits while the operators run on its thread, so
    ``idle`` is called between their calls, every ``WAIT_SLICE_S`` with no item delivered."""

    def __init__(self, idle: Callable[[float], None]) -> None:
        self._idle = idle
        self._since = self._checked = time.monotonic()

    def timed(self, call: Callable[[StageCore, Any], list[Any]]) -> Callable[..., list[Any]]:
        def timed_call(core: StageCore, tasks: Any) -> list[Any]:
            self._tick()
            outs = call(core, tasks)
            self._tick()
            return outs

        return timed_call

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._checked >= WAIT_SLICE_S:
            self._checked = now
            self._idle(now - self._since)

    def deliver(self, items: Iterator[StreamItem]) -> Iterator[StreamItem]:
        for item in items:
            yield item
            self._since = self._checked = time.monotonic()  # the consumer asks for the next


class DriverThreadsRunner(Runner):
    """A source thread and one driver thread per unit; each unit's work on its pool."""

    def pools(self, stages: Sequence[StagePlan], spec: PoolSpec) -> dict[int, WorkerPool]:
        return {s.index: self.pool(s, spec) for s in stages}

    def pool(self, stage: StagePlan, spec: PoolSpec) -> WorkerPool:
        """The worker pool of one of its stages (when each stage has a pool of its own)."""
        raise NotImplementedError

    def run(self, job: RunJob) -> Iterator[StreamItem]:
        res = job.resources
        cores = job.cores
        units = build_units(job.plan, cores, job.contexts, job.options.max_inflight)
        channels = [Channel(job.options.queue_size, res.stop) for _ in range(len(units) + 1)]
        res.channels = channels
        res.inboxes = [None] * len(cores)
        for i, unit in enumerate(units):
            channels[i + 1].producer_stats = cores[unit.end].stats
            res.inboxes[unit.first] = channels[i]
        _start_drivers(job, units, channels)
        res.threads.insert(0, SourceThread(job.feeder, channels[0], res.stop))
        res.start_threads()
        out, mux, deliver = channels[-1], job.mux, job.deliver
        get, idle = out.queue.get, job.idle
        since = checked = time.monotonic()
        while True:
            try:
                message = get(timeout=WAIT_SLICE_S)
            except queue.Empty:
                res.check_alive()  # no path waits on a thread that died
                idle(time.monotonic() - since)
                continue
            since = time.monotonic()
            if since - checked >= WAIT_SLICE_S:  # a thread may die while others carry on
                checked = since
                res.check_alive()
            match message:
                case Data():
                    out.release(message.parts)
                    if res.shm is not None:
                        resolve_items(message.items)
                    mux.add(message.items)
                    yield from deliver(mux)
                case End():
                    res.check_alive()  # nor does a run end well with a thread that died
                    mux.ended = True
                    yield from deliver(mux)
                    return
                case Failed():
                    raise message.error
                case Stop():
                    pass  # sent to every channel when the run closes; the consumer has left
                case Done():
                    raise MessageError(f"the run's output channel carried {message!r}")
                case _:
                    assert_never(message)


def _start_drivers(job: RunJob, units: list[Unit], channels: list[Channel]) -> None:
    """A pool and a driver thread per unit (a stage, or a fused chain of stages)."""
    res, cores = job.resources, job.cores
    ops = [c.op for c in cores]
    contexts = list(job.contexts)
    for unit in units:
        successor = cores[unit.last + 1].op if unit.last + 1 < len(cores) else None
        ships = lookup(unit.stage.runner).ships_payloads
        ops[unit.first] = projected(unit.core.op, successor) if ships else unit.core.op
        contexts[unit.first] = replace(
            contexts[unit.first], op_name=unit.core.op.name, num_workers=unit.stage.parallelism
        )
    shared = job.options.process_pool == "shared"
    balancer = None
    if not job.options.max_inflight:
        balancer = Rebalancer.of(units, job.plan.stages, cores, shared_fleet=shared)
    stages = pool_stages(units, job.plan.stages, balancer, shared_fleet=shared)
    pools, res.shm = build_pools(stages, ops, contexts, job.options)
    res.pools.extend(pools.values())
    for i, unit in enumerate(units):
        pool = pools.get(unit.first)
        on_driver = range(unit.first if pool is None else unit.last + 1, unit.end + 1)
        for index in on_driver:
            cores[index].op.setup(job.contexts[index])
            res.set_up.append(cores[index])
        driver = OpDriver(
            unit.core,
            pool,
            channels[i],
            channels[i + 1],
            deterministic=job.options.deterministic,
            max_inflight=unit.stage.max_inflight,
            stop=res.stop,
            count_work=not unit.fused,
            resolve_shm=res.shm is not None,
            after=unit.after,
            on_complete=None if balancer is None else balancer.completed,
        )
        res.threads.append(driver)
        if balancer is not None:
            busy = pool if isinstance(pool, (ThreadWorkerPool, ProcessWorkerPool)) else None
            balancer.attach(unit.first, driver, busy)


class ThreadsRunner(ThreadsTraits, DriverThreadsRunner):
    def pool(self, stage: StagePlan, spec: PoolSpec) -> WorkerPool:
        op, context = spec.ops[stage.index], spec.contexts[stage.index]
        return ThreadWorkerPool(
            op, stage.parallelism, context, resolve_shm=spec.session is not None
        )


class ProcessRunner(ProcessTraits, DriverThreadsRunner):
    def pools(self, stages: Sequence[StagePlan], spec: PoolSpec) -> dict[int, WorkerPool]:
        ops, contexts, options, session = spec.ops, spec.contexts, spec.options, spec.session
        assert session is not None  # shares_memory: build_pools made one
        shared = options.process_pool == "shared"
        groups = [list(stages)] if shared else [[s] for s in stages]
        pools: dict[int, WorkerPool] = {}
        for group in groups:
            fleet = ProcessFleet(
                {s.index: (ops[s.index], contexts[s.index]) for s in group},
                max(s.parallelism for s in group),
                session=session,
                max_retries=options.max_worker_retries,
                reuse=options.reuse_workers,
                deadline_s=options.worker_deadline_s,
            )
            for i, s in enumerate(group):
                pools[s.index] = ProcessWorkerPool(fleet, s.index, owns_fleet=i == 0)
        return pools


class RayRunner(RayTraits, DriverThreadsRunner):
    def pool(self, stage: StagePlan, spec: PoolSpec) -> WorkerPool:
        from zephon._engine.workers.ray_pool import RayWorkerPool

        op, context = spec.ops[stage.index], spec.contexts[stage.index]
        retries = spec.options.max_worker_retries
        return RayWorkerPool(op, stage.parallelism, context, max_retries=retries)


RUNNERS_BY_NAME: dict[str, Runner] = {
    runner.name: runner
    for runner in (InlineRunner(), ThreadsRunner(), ProcessRunner(), RayRunner())
}
"""Every runner by option name, in the order of ``runner_traits.REGISTRY``."""


def build_pools(
    stages: Sequence[StagePlan],
    ops: Sequence[BaseOp],
    contexts: Sequence[OpContext],
    options: RuntimeOptions,
) -> tuple[dict[int, WorkerPool], ShmSession | None]:
    """A pool per stage that runs on workers; driver stages get none.

    Returns the pools (by stage index) and the shared-memory session when a stage's runner
    needs one; the caller shuts the pools down, then closes the session.
    """
    groups: dict[str, list[StagePlan]] = {}
    for s in stages:
        if s.runner in RUNNERS_BY_NAME:
            groups.setdefault(s.runner, []).append(s)
    runners = sorted((RUNNERS_BY_NAME[name] for name in groups), key=lambda r: not r.shares_memory)
    pools: dict[int, WorkerPool] = {}
    session: ShmSession | None = None
    try:
        if any(r.shares_memory for r in runners):
            min_bytes = options.shm_min_bytes
            session = ShmSession(min_bytes if min_bytes is not None else 1 << 62)
        spec = PoolSpec(ops, contexts, options, session)
        for runner in runners:
            pools.update(runner.pools(groups[runner.name], spec))
    except BaseException:
        for pool in pools.values():
            pool.shutdown()
        if session is not None:
            session.close()
        raise
    return pools, session

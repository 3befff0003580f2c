"""Run a compiled plan: source -> operators -> lane round-robin tail, with any runner."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from typing import Any

from zephon._engine.driver_chain import run_tasks
from zephon._engine.fusion import Unit, build_units
from zephon._engine.global_order import regrouping
from zephon._engine.lane_state import has_lane_state
from zephon._engine.operator_states import OperatorStates
from zephon._engine.plan import (
    OpSpec,
    Plan,
    accumulators_for,
    compile_contexts,
    compile_plan,
    flush_every,
    is_monotone,
    stalls_sentinels,
)
from zephon._engine.pools import (
    ProcessWorkerPool,
    WorkerPool,
    build_pools,
    check_not_bootstrapping,
)
from zephon._engine.quarantine import Quarantine
from zephon._engine.replay_filter import ReplayFilterOp
from zephon._engine.shm import ShmSession, resolve_items
from zephon._engine.snapshots import SnapshotPlan, plan_snapshots
from zephon._engine.source import LaneStart, SnapshotPolicy, SourceFeeder
from zephon._engine.stage import StageCore
from zephon._engine.stats import LaneProgress, OpStats, RunStats
from zephon._engine.tail import LaneMux
from zephon._engine.threaded import DATA, END, ERROR, STOP, Channel, OpDriver, SourceThread
from zephon.checkpoints import format as ckpt
from zephon.errors import CheckpointError, ZephonError
from zephon.io import SourceStats, io_totals
from zephon.options import RuntimeOptions
from zephon.types import SampleCursor, StreamItem
from zephon.work import WorkSource, lanes_for_rank, source_fingerprint, source_seed

log = logging.getLogger("zephon")


def with_replay_filter(
    specs: list[OpSpec], targets: dict[int, SampleCursor], *, monotone: bool
) -> list[OpSpec]:
    """Insert the replay filter right before ``batch`` (or last without a batch)."""
    replay = OpSpec(ReplayFilterOp(targets, monotone=monotone), 1)
    for index, spec in enumerate(specs):
        if spec.op.traits().batches:
            return [*specs[:index], replay, *specs[index:]]
    return [*specs, replay]


def view_lanes(options: RuntimeOptions) -> list[int]:
    """The lanes this pipeline view runs: its rank's, or a DataLoader worker's share of them."""
    worker, workers = options._worker_share
    lanes = lanes_for_rank(
        options.dp_rank, options.dp_world_size, options.canonical_replicas, options.mapping
    )
    return lanes[worker::workers]


def pipeline_config(
    source: WorkSource, specs: list[OpSpec], options: RuntimeOptions, k: int
) -> dict[str, Any]:
    """Everything that shapes a lane's output; a checkpoint refuses any other."""
    config: dict[str, Any] = ckpt.to_jsonable(
        {
            "source": {
                "type": type(source).__name__,
                "fingerprint": source_fingerprint(source),
                "datasets": [
                    {"name": d.name, "shards": d.shard_count(), "rows": d.total()}
                    for d in source.datasets
                ],
            },
            "operators": [
                {"type": type(s.op).__name__, "name": s.op.name, "config": s.op.config()}
                for s in specs
            ],
            "canonical_replicas": options.canonical_replicas,
            "flush_every_k_chunks": k,
        }
    )
    if source.epoch:  # epoch 0 leaves the configuration (and old fingerprints) as they were
        config["epoch"] = source.epoch
    return config


_DATA_CHANGED_HINT = (
    "; the data changed since the checkpoint, so no position in it means the same records any "
    "more. To get past a bad record, keep the file as it was and resume with "
    "fetch: {on_error: skip} (skipped records are logged and quarantined), or restore the "
    "file to what it was; to train on the new data, start without --resume"
)


def _hint_for(diff: str) -> str:
    """What to do about a configuration difference a user is likely to make by accident."""
    if diff.startswith("source.datasets[") and (".rows:" in diff or ".shards:" in diff):
        return _DATA_CHANGED_HINT
    return ""


def plan_snapshots_for(
    specs: list[OpSpec], accs: list[Any], options: RuntimeOptions
) -> SnapshotPlan:
    """The snapshot plan of a plan that is not monotone, or why it takes none."""
    if not options.snapshot_every_chunks:
        return SnapshotPlan([], [], "snapshot_every_chunks=0")
    return plan_snapshots([s.op for s in specs], accs)


def snapshot_note(plan: SnapshotPlan, options: RuntimeOptions) -> str:
    """Where a restore starts, for ``explain()``."""
    if not plan.enabled:
        return f"snapshots off ({plan.reason}): a restore replays from the last flush"
    every = options.snapshot_every_chunks
    note = f"snapshots every {every} chunk{'s' if every > 1 else ''}"
    if options.snapshot_every_records is not None:
        note += f" and every {options.snapshot_every_records} records"
    return note + ": a restore starts at the newest delivered snapshot"


@dataclass(frozen=True)
class Position:
    """The consumer's position as a checkpoint records it, before encoding."""

    lanes: list[ckpt.LaneCheckpoint]
    order: list[int]
    turn: int


class Engine:
    """One iteration of a pipeline. Not reusable: build a new one per ``iter(pipeline)``."""

    def __init__(
        self,
        source: WorkSource,
        specs: list[OpSpec],
        options: RuntimeOptions,
        resume: ckpt.ParsedCheckpoint | None = None,
    ) -> None:
        self.source = source
        self.options = options
        self.lanes = view_lanes(options)
        self.monotone = is_monotone(specs)
        k = flush_every(options, self.monotone)
        self.config = pipeline_config(source, specs, options, k)
        self.config_fingerprint = ckpt.fingerprint(self.config)
        self.resume = resume
        targets: dict[int, SampleCursor] = {}
        if resume is not None:
            self._check_resume(resume)
            for lane in self.lanes:
                lc = resume.lanes[lane]
                if lc.replay_cursor is not None and not lc.done:
                    targets[lane] = lc.replay_cursor
        self.specs = with_replay_filter(specs, targets, monotone=self.monotone)
        self.contexts = compile_contexts(
            self.specs,
            options,
            self.lanes,
            source_seed=source_seed(source),
            epoch=source.epoch,
        )
        self.stats = RunStats()
        self.op_stats: list[OpStats] | None = None
        if options.track_stats:
            self.op_stats = [
                OpStats(name=ctx.op_name, runner=ctx.runner, parallelism=ctx.num_workers)
                for ctx in self.contexts
            ]
        self._accs = self._accumulators()
        self.plan = compile_plan(self.specs, options, self.lanes, self.contexts, self._accs)
        self._started_at = 0.0
        self._io_start = io_totals()
        self._last_log = 0.0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pools: list[WorkerPool] = []
        self._shm: ShmSession | None = None
        self._inline_ops: list[StageCore] = []
        self._closed = False
        self.feeder: SourceFeeder | None = None
        self.mux: LaneMux | None = None
        self.quarantine = Quarantine(options.quarantine)
        self._restart: dict[int, tuple[int, int]] = {}  # lane -> newest delivered restart point
        self._channels: list[Channel] = []  # threads / process runners: between the stages
        self._op_channels: list[Channel | None] = []  # stage index -> its inbox (stats)
        self.states = OperatorStates(
            self._lane_starts(), resume, self._state_key, self.plan.flush_every_k_chunks
        )
        self.snapshot_plan = SnapshotPlan([], [], "not prepared")

    def _check_resume(self, resume: ckpt.ParsedCheckpoint) -> None:
        diff = ckpt.first_difference(resume.config, self.config)
        if diff:
            raise CheckpointError(
                f"checkpoint was taken with another configuration: {diff}{_hint_for(diff)}"
            )
        missing = [lane for lane in self.lanes if lane not in resume.lanes]
        if missing:
            raise CheckpointError(
                f"checkpoint does not describe lanes {missing} of rank "
                f"{self.options.dp_rank}/{self.options.dp_world_size}; restore from the "
                "checkpoints of every rank merged with zephon.merge_checkpoints([...])"
            )

    @classmethod
    def explain(cls, source: WorkSource, specs: list[OpSpec], options: RuntimeOptions) -> Plan:
        lanes = view_lanes(options)
        monotone = is_monotone(specs)
        all_specs = with_replay_filter(specs, {}, monotone=monotone)
        contexts = compile_contexts(all_specs, options, lanes)
        accs = accumulators_for(all_specs, contexts, options)
        plan = compile_plan(all_specs, options, lanes, contexts, accs)
        if monotone:
            return plan
        return replace(
            plan, snapshots=snapshot_note(plan_snapshots_for(all_specs, accs, options), options)
        )

    def _feeder(self) -> SourceFeeder:
        replicas = self.options.canonical_replicas
        lanes = self.lanes
        starts: dict[int, LaneStart] = {}
        if self.resume is not None:
            # A finished lane is never regenerated: its data may be gone (retired rollouts).
            lanes = [lane for lane in lanes if not self.resume.lanes[lane].done]
            for lane in lanes:
                lc = self.resume.lanes[lane]
                starts[lane] = LaneStart(lc.start_chunk_id, lc.source_state, lc.start_offset)
        lane_sources = [(lane, self.source.clone_for_lane(lane, replicas)) for lane in lanes]
        k = self.plan.flush_every_k_chunks
        policy = None
        if self.snapshot_plan.enabled:
            policy = SnapshotPolicy(
                self.options.snapshot_every_chunks, self.options.snapshot_every_records, k
            )
        return SourceFeeder(lane_sources, flush_every_k_chunks=k, starts=starts, snapshots=policy)

    def _accumulators(self) -> list[Any]:
        """One accumulator per stage (with the live counters in its context)."""
        accs = []
        for i, (spec, ctx) in enumerate(zip(self.specs, self.contexts, strict=True)):
            stats = self.op_stats[i] if self.op_stats is not None else None
            if stats is not None:
                ctx = replace(ctx, services={**ctx.services, "stats": stats})
            accs.append(spec.op.accumulator(deterministic=self.options.deterministic, ctx=ctx))
        return accs

    def _cores(self) -> list[StageCore]:
        accs = self._accs
        modes = self.snapshot_plan.modes
        cores = []
        for i, (spec, acc) in enumerate(zip(self.specs, accs, strict=True)):
            log = self.states.attach(i, spec.op, acc) if has_lane_state(acc) else None
            cores.append(
                StageCore(
                    spec.op,
                    acc,
                    stalls_sentinels=stalls_sentinels(spec.op),
                    stats=self.op_stats[i] if self.op_stats is not None else None,
                    lanes=self.lanes,
                    state_log=log,
                    marker_mode=modes[i] if self.snapshot_plan.enabled else "pass",
                )
            )
        plan = self.snapshot_plan
        self.states.load([s.op for s in self.specs], self.contexts, plan.roles, plan.resolve_at)
        for index, core in enumerate(cores):
            core.resolve = self.states.resolver(index)
        return cores

    def _lane_starts(self) -> dict[int, tuple[int, int]]:
        """Where each fed lane (re)starts: the beginning, or the restored restart point."""
        if self.resume is None:
            return dict.fromkeys(self.lanes, (0, 0))
        return {
            lane: (lc.start_chunk_id, lc.start_offset)
            for lane, lc in self.resume.lanes.items()
            if lane in self.lanes and not lc.done
        }

    def _state_key(self, index: int) -> str:
        """A stage's key in ``operator_state``: its index in the configuration's operators
        (the engine's own replay filter, inserted before ``batch``, does not count)."""
        replay = next(i for i, s in enumerate(self.specs) if isinstance(s.op, ReplayFilterOp))
        return str(index - 1 if index > replay else index)

    def _restart_at(self, lane: int, position: tuple[int, int]) -> None:
        """Everything of ``lane`` before ``position`` is delivered: a restore may start there."""
        if position <= self._restart.get(lane, (-1, 0)):
            return
        self._restart[lane] = position
        assert self.feeder is not None
        self.feeder.evict_below(lane, position[0])
        self.states.forget_below(lane, position)

    def _evicted(self, lane: int, chunk_id: int) -> None:
        """Chunks of ``lane`` below ``chunk_id`` are delivered: forget what replays them."""
        self._restart_at(lane, (chunk_id, 0))

    def snapshot(self) -> RunStats:
        """Live statistics: totals, per-operator counters, per-lane progress."""
        stats = self.stats
        feeder, mux = self.feeder, self.mux
        if feeder is not None:
            stats.samples_read = feeder.samples_emitted
            stats.samples_refetched = self.states.refetched
            stats.chunks = feeder.chunks_admitted
        if mux is not None:
            stats.tombstones = mux.tombstones
            stats.dropped = mux.drops.copy()
            stats.skipped = self.quarantine.count
            stats.skipped_examples = list(self.quarantine.examples)
        if self._started_at:
            stats.elapsed_s = time.monotonic() - self._started_at
        self._count_io(stats)
        if self.op_stats is not None:
            if self._op_channels:
                for op_stats, channel in zip(self.op_stats, self._op_channels, strict=False):
                    op_stats.queue_depth = 0 if channel is None else max(0, channel.depth)
            stats.operators = [OpStats(**o.to_dict()) for o in self.op_stats]
        if feeder is not None and mux is not None:
            counts = feeder.inflight_counts()
            stats.lanes = {
                lane: LaneProgress(
                    delivered=mux.delivered[lane],
                    next_chunk_id=self._lane_start(lane)[0] + counts.get(lane, 0),
                    inflight_chunks=counts.get(lane, 0),
                    finished=lane in mux.finished_lanes,
                )
                for lane in self.lanes
            }
        return stats

    def _count_io(self, stats: RunStats) -> None:
        """The run's dataset I/O: this process's since the start (threads and inline stages,
        all counted on ``fetch``, the operator that reads datasets) plus each process stage's
        worker sums."""
        local = io_totals() - self._io_start
        by_stage: dict[int, SourceStats] = {0: local}
        for pool in self._pools:
            if isinstance(pool, ProcessWorkerPool):
                by_stage[pool.stage] = by_stage.get(pool.stage, SourceStats()) + pool.fleet.io(
                    pool.stage
                )
        total = SourceStats()
        for io in by_stage.values():
            total += io
        stats.io = total
        if self.op_stats is not None:
            for index, io in by_stage.items():
                if index < len(self.op_stats):
                    self.op_stats[index].set_io(io)

    def _mux(self, feeder: SourceFeeder) -> LaneMux:
        callbacks: dict[str, Any] = {
            "on_epoch_delivered": None if self.monotone else self._evicted,
            "on_lane_done": feeder.finish_lane,
            "on_skip": self.quarantine.add,
            "on_snapshot": self._restart_at if self.snapshot_plan.enabled else None,
        }
        resume = self.resume
        if resume is None:
            return LaneMux(self.lanes, **callbacks)
        lanes = {lane: resume.lanes[lane] for lane in self.lanes}
        finished = [lane for lane, lc in lanes.items() if lc.done]
        order, turn = self._resumed_turn(resume, finished)
        return LaneMux(
            self.lanes,
            replay_cursors={lane: lc.replay_cursor for lane, lc in lanes.items()},
            delivered={lane: lc.delivered for lane, lc in lanes.items()},
            finished=finished,
            order=order,
            turn=turn,
            **callbacks,
        )

    def _resumed_turn(
        self, resume: ckpt.ParsedCheckpoint, finished: list[int]
    ) -> tuple[list[int], int]:
        """The tail's lane order and turn after a restore: the saved ones on the same lanes,
        else the lane with the fewest deliveries goes first (elastic resume)."""
        if resume.tail_lanes == self.lanes:
            return [lane for lane in resume.tail_order if lane not in finished], resume.tail_turn
        order = [lane for lane in self.lanes if lane not in finished]
        counts = [resume.lanes[lane].delivered for lane in order]
        running = {lane: lc.delivered for lane, lc in resume.lanes.items() if not lc.done}
        opts = self.options
        why = regrouping(
            resume.world, running, opts.canonical_replicas, opts.dp_world_size, opts.mapping
        )
        if why is not None:
            log.warning(
                "zephon: every sample still comes exactly once, but %s "
                "(docs/guarantees.md#elastic-resume)",
                why,
            )
        return order, counts.index(min(counts)) if counts else 0

    def prepare(self) -> None:
        """Build the source feeder and tail without starting (for a checkpoint before data)."""
        if self.feeder is None:
            self.snapshot_plan = self._plan_snapshots()
            self._restart = self._lane_starts()
            self.feeder = self._feeder()
            self.mux = self._mux(self.feeder)

    def _plan_snapshots(self) -> SnapshotPlan:
        if self.monotone:
            return SnapshotPlan([], [], "the plan keeps cursor order (a restore replays a chunk)")
        return plan_snapshots_for(self.specs, self._accs, self.options)

    def _lane_start(self, lane: int) -> tuple[int, Any]:
        feeder = self.feeder
        assert feeder is not None
        if feeder.has_lane(lane):
            start_cid, state, _ = feeder.lane_start(lane)
            return start_cid, state
        assert self.resume is not None  # only lanes restored as finished are not fed
        lc = self.resume.lanes[lane]
        return lc.start_chunk_id, lc.source_state

    @property
    def prepared(self) -> bool:
        """Whether the feeder and tail exist (a checkpoint then describes this iteration)."""
        return self.feeder is not None

    def position(self) -> Position:
        """What a checkpoint records of the consumer's position (cheap: no encoding)."""
        feeder, mux = self.feeder, self.mux
        if feeder is None or mux is None:
            raise CheckpointError("the engine has not started")
        mux.settle()
        lanes = []
        for lane in self.lanes:
            start_cid, state = self._lane_start(lane)
            restart = self._restart.get(lane, (start_cid, 0))
            offset = restart[1] if restart[0] == start_cid else 0
            done = lane in mux.finished_lanes
            lanes.append(
                ckpt.LaneCheckpoint(
                    lane=lane,
                    start_chunk_id=start_cid,
                    source_state=state,
                    replay_cursor=mux.replay_cursor.get(lane),
                    delivered=mux.delivered[lane],
                    done=done,
                    operator_state=None
                    if done
                    else self._operator_state(lane, (start_cid, offset)),
                    start_offset=offset,
                )
            )
        return Position(lanes, list(mux.order), mux.turn)

    def checkpoint_at(self, position: Position) -> dict[str, Any]:
        """The checkpoint of ``position`` (taken by this engine or one of the same pipeline)."""
        world = {
            "canonical_replicas": self.options.canonical_replicas,
            "dp_rank": self.options.dp_rank,
            "dp_world_size": self.options.dp_world_size,
            "mapping": self.options.mapping,
        }
        return ckpt.build(
            self.config,
            world,
            position.lanes,
            self.lanes,
            position.order,
            position.turn,
            self.config_fingerprint,
        )

    def checkpoint(self) -> dict[str, Any]:
        """The consumer-visible state: what has been delivered, per lane (see checkpoint.py)."""
        return self.checkpoint_at(self.position())

    def _operator_state(self, lane: int, start: tuple[int, int]) -> dict[str, Any] | None:
        """Each stateful accumulator's lane state at the point a restore regenerates from."""
        if not self.states.logs:  # not iterated yet: a pending restore's state still holds
            if self.resume is None or lane not in self.resume.lanes:
                return None
            saved = self.resume.lanes[lane].operator_state
            return dict(saved) if saved is not None else None
        return self.states.at(lane, start)

    def __iter__(self) -> Iterator[StreamItem]:
        try:
            yield from self.stream()
        finally:
            self.snapshot()
            self.close()
        if self.quarantine.count:
            where = self.quarantine.path
            log.warning(
                "zephon: skipped %d unreadable record(s) (on_error='skip')%s",
                self.quarantine.count,
                f"; they are listed in {where}" if where is not None else "",
            )

    def stream(self) -> Generator[StreamItem, None, None]:
        """The delivered items; unlike ``iter()`` it leaves closing the engine to the caller
        (the engine process keeps shared memory alive until the consumer has mapped it)."""
        check_not_bootstrapping()
        self.prepare()
        feeder, mux = self.feeder, self.mux
        assert feeder is not None and mux is not None
        self._started_at = self._last_log = time.monotonic()
        self._io_start = io_totals()
        if self.options.runner == "inline":
            yield from self._run_inline(feeder, mux)
        else:
            yield from self._run_threaded(feeder, mux)

    def _deliver(self, mux: LaneMux) -> Iterator[StreamItem]:
        evict = None
        if self.monotone and self.feeder is not None:
            evict = self._evicted if self.states.logs else self.feeder.evict_below
        log_every = self.options.log_every_s
        while True:
            item = mux.pop()
            if item is None:
                return
            self.stats.delivered += 1
            if evict is not None:
                evict(item.meta.lane_id, item.meta.chunk_id)
            if log_every is not None and time.monotonic() - self._last_log >= log_every:
                self._last_log = time.monotonic()
                log.info("%s", self.snapshot().summary())
            yield item

    # -- inline: everything on the calling thread (the reference runner) --------------------

    def _run_inline(self, feeder: SourceFeeder, mux: LaneMux) -> Iterator[StreamItem]:
        cores = self._cores()
        for core, ctx in zip(cores, self.contexts, strict=True):
            core.op.setup(ctx)
        self._inline_ops = cores
        run = run_tasks
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

    def _start_drivers(
        self, cores: list[StageCore], units: list[Unit], channels: list[Channel]
    ) -> None:
        """A pool and a driver thread per unit (a stage, or a fused chain of stages)."""
        ops = [c.op for c in cores]
        contexts = list(self.contexts)
        for unit in units:
            ops[unit.first] = unit.core.op
            contexts[unit.first] = replace(
                contexts[unit.first], op_name=unit.core.op.name, num_workers=unit.stage.parallelism
            )
        pools, self._shm = build_pools([u.stage for u in units], ops, contexts, self.options)
        self._pools.extend(pools.values())
        for i, unit in enumerate(units):
            core = unit.core
            pool = pools.get(unit.first)
            on_driver = range(unit.first if pool is None else unit.last + 1, unit.end + 1)
            for index in on_driver:
                cores[index].op.setup(self.contexts[index])
                self._inline_ops.append(cores[index])
            self._threads.append(
                OpDriver(
                    core,
                    pool,
                    channels[i],
                    channels[i + 1],
                    deterministic=self.options.deterministic,
                    max_inflight=unit.stage.max_inflight,
                    stop=self._stop,
                    count_work=not unit.fused,
                    resolve_shm=self._shm is not None,
                    after=unit.after,
                )
            )

    def _run_threaded(self, feeder: SourceFeeder, mux: LaneMux) -> Iterator[StreamItem]:
        stop = self._stop
        cores = self._cores()
        units = build_units(self.plan, cores, self.contexts, self.options.max_inflight)
        channels = [Channel(self.options.queue_size, stop) for _ in range(len(units) + 1)]
        self._channels = channels
        self._op_channels = [None] * len(cores)
        for i, unit in enumerate(units):
            channels[i + 1].producer_stats = cores[unit.end].stats
            self._op_channels[unit.first] = channels[i]
        self._start_drivers(cores, units, channels)
        self._threads.insert(0, SourceThread(feeder, channels[0], stop))
        for thread in self._threads:
            thread.start()
        out = channels[-1]
        while True:
            message = out.queue.get()
            kind = message[0]
            if kind == DATA:
                out.release(message[2])
                if self._shm is not None:
                    resolve_items(message[1])
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
        for channel in self._channels:
            channel.put((STOP,))
        for thread in self._threads:
            thread.join(timeout=30)
            if thread.is_alive():
                raise ZephonError(f"engine thread {thread.name} did not stop within 30 s")
        try:
            for pool in self._pools:
                pool.shutdown()
        finally:
            if self._shm is not None:
                self._shm.close()
        self.quarantine.close()
        self.states.close()
        for core in self._inline_ops:
            core.op.teardown()

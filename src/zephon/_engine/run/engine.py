"""Run a compiled plan (``compile.py``) and checkpoint it: source -> operators -> lane
round-robin tail. How the stages run is the runner's business (``runners.py``)."""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from typing import Any

from zephon._engine.feed.source import LaneStart, SnapshotPolicy, SourceFeeder
from zephon._engine.handoff.tail import LaneMux
from zephon._engine.plan.compile import CompiledRun
from zephon._engine.plan.plan import stalls_sentinels
from zephon._engine.run import waiting
from zephon._engine.run.quarantine import Quarantine
from zephon._engine.run.runners import RUNNERS_BY_NAME, RunJob, RunResources
from zephon._engine.state.global_order import regrouping
from zephon._engine.state.lane_state import RestartPoint, has_lane_state
from zephon._engine.state.mixture_counts import MixtureCounts
from zephon._engine.state.operator_states import OperatorStates
from zephon._engine.state.position import Position
from zephon._engine.state.stage import MarkerMode, StageCore
from zephon._engine.stats import LaneProgress, OpStats, RunStats
from zephon._engine.workers.worker_start import check_not_bootstrapping
from zephon._exit import at_exit
from zephon.checkpoints import LaneCheckpoint
from zephon.checkpoints import format as ckpt
from zephon.errors import CheckpointError, WaitInterrupted
from zephon.io import SourceStats, io_totals
from zephon.types import SampleCursor, StreamItem
from zephon.work import MixtureStats, WorkSource, source_mixture

log = logging.getLogger("zephon")


class Engine:
    """One iteration of a pipeline. Not reusable: build a new one per ``iter(pipeline)``."""

    def __init__(self, run: CompiledRun) -> None:
        self.run = run
        self.source = run.source
        self.options = run.options
        self.lanes = run.lanes
        self.monotone = run.monotone
        self.config = run.config
        self.config_fingerprint = run.config_fingerprint
        self.resume = run.resume
        self.restored: dict[int, LaneCheckpoint] = (
            {} if run.resume is None else {lane: run.resume.lanes[lane] for lane in run.lanes}
        )
        """This view's lanes as the checkpoint being restored saved them (empty: no restore);
        the engine reads them nowhere else (the tail's order and turn come from ``resume``)."""
        self.specs = run.specs
        self.contexts = run.contexts
        self.plan = run.plan
        self.snapshot_plan = run.snapshot_plan
        self.stats = RunStats()
        self._accs, self.op_stats = run.accumulators()
        self._started_at = 0.0
        self._io_start = io_totals()
        self._last_log = 0.0
        self.resources = RunResources()
        self.interrupt: Callable[[], bool] | None = None
        """Asked while the consumer waits for an item; True stops the wait (see _idle)."""
        self.interrupted = False
        """The check stopped a wait: the caller is leaving, so closing waits less for threads
        (one still running then is stuck in a call that never returns, and is left behind)."""
        self._closed = False
        self.feeder: SourceFeeder | None = None
        self.mux: LaneMux | None = None
        self.mixture_target = mixture_target(self.source)
        self.mixture: MixtureCounts | None = None
        self.quarantine = Quarantine(self.options.quarantine)
        self._restart: dict[int, RestartPoint] = {}  # lane -> newest delivered restart point
        self._lane_positions: dict[int, tuple[tuple[Any, ...], LaneCheckpoint]] = {}
        """lane -> (what its last checkpoint was computed from, that checkpoint)"""
        self.states = OperatorStates(
            self._lane_starts(),
            None if run.resume is None else self.restored,
            run.state_key,
            self.plan.flush_every_k_chunks,
        )

    def _feeder(self) -> SourceFeeder:
        replicas = self.options.canonical_replicas
        lanes = self.lanes
        starts: dict[int, LaneStart] = {}
        if self.restored:
            # A finished lane is never regenerated: its data may be gone (retired rollouts).
            lanes = [lane for lane in lanes if not self.restored[lane].done]
            for lane in lanes:
                lc = self.restored[lane]
                starts[lane] = LaneStart(lc.start_chunk_id, lc.source_state, lc.start_offset)
        lane_sources = [(lane, self.source.clone_for_lane(lane, replicas)) for lane in lanes]
        k = self.plan.flush_every_k_chunks
        policy = None
        if self.snapshot_plan.enabled:
            policy = SnapshotPolicy(
                self.options.snapshot_every_chunks, self.options.snapshot_every_records, k
            )
        return SourceFeeder(lane_sources, flush_every_k_chunks=k, starts=starts, snapshots=policy)

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
                    marker_mode=self._marker_mode(modes[i]) if modes else MarkerMode.PASS,
                )
            )
        plan = self.snapshot_plan
        self.states.load([s.op for s in self.specs], self.contexts, plan.roles, plan.resolve_at)
        for index, core in enumerate(cores):
            core.resolve = self.states.resolver(index)
        return cores

    def _marker_mode(self, mode: MarkerMode) -> MarkerMode:
        """A stage's marker mode; markers ride inside micro-batches only where results leave
        in sequence order (completion order could let one overtake the data before it)."""
        if not self.snapshot_plan.enabled:
            return MarkerMode.PASS
        if mode is MarkerMode.RIDE and not self.options.deterministic:
            return MarkerMode.FLUSH
        return mode

    def _lane_starts(self) -> dict[int, RestartPoint]:
        """Where each fed lane (re)starts: the beginning, or the restored restart point."""
        if not self.restored:
            return dict.fromkeys(self.lanes, (0, 0))
        return {
            lane: (lc.start_chunk_id, lc.start_offset)
            for lane, lc in self.restored.items()
            if not lc.done
        }

    def _restart_at(self, lane: int, position: RestartPoint) -> None:
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
            for lane in mux.lanes_with_drops():
                restart = self._restart_point(lane)
                mux.count_drops(lane, restart, self.states.held_positions(lane, restart))
            stats.samples_done = mux.samples_done
            stats.dropped = mux.drops.copy()
            stats.skipped = self.quarantine.count
            stats.skipped_examples = list(self.quarantine.examples)
        if self._started_at:
            stats.elapsed_s = time.monotonic() - self._started_at
        if self.mixture is not None and self.mixture_target is not None:
            stats.mixture = self.mixture_target.counted(*self.mixture.totals())
        self._count_io(stats)
        if self.op_stats is not None:
            if self.resources.inboxes:
                for op_stats, channel in zip(self.op_stats, self.resources.inboxes, strict=False):
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
        by_stage: dict[int, SourceStats] = {0: io_totals() - self._io_start}
        for index, io in self.resources.process_io().items():
            by_stage[index] = by_stage.get(index, SourceStats()) + io
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
        callbacks["starts"] = self._lane_starts()
        resume, lanes = self.resume, self.restored
        if resume is None:
            return LaneMux(self.lanes, **callbacks)
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
        counts = [self.restored[lane].delivered for lane in order]
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
            self._restart = self._lane_starts()
            self.feeder = self._feeder()
            self.mux = self._mux(self.feeder)
            self.mixture = self._mixture_counts()
            if self.mux.order:
                self.feeder.lead_with(self.mux.order[self.mux.turn])

    def _mixture_counts(self) -> MixtureCounts | None:
        """The delivered-mixture counters, from the restored lanes' counts on a resume."""
        target = self.mixture_target
        if target is None:
            return None
        start = {lane: lc.mixture for lane, lc in self.restored.items() if lc.mixture is not None}
        return MixtureCounts(len(target.samples), self.lanes, start)

    def _lane_start(self, lane: int) -> tuple[int, Any]:
        feeder = self.feeder
        assert feeder is not None
        if feeder.has_lane(lane):
            start_cid, state, _ = feeder.lane_start(lane)
            return start_cid, state
        lc = self.restored[lane]  # only lanes restored as finished are not fed
        return lc.start_chunk_id, lc.source_state

    def _restart_point(self, lane: int, start_cid: int | None = None) -> tuple[int, int]:
        """Where a checkpoint taken now restarts ``lane``: its first chunk still held, and
        the offset in it when a snapshot cut falls there."""
        if start_cid is None:
            start_cid = self._lane_start(lane)[0]
        restart = self._restart.get(lane, (start_cid, 0))
        return (start_cid, restart[1] if restart[0] == start_cid else 0)

    @property
    def prepared(self) -> bool:
        """Whether the feeder and tail exist (a checkpoint then describes this iteration)."""
        return self.feeder is not None

    def position(self, *, held_records: bool = False) -> Position:
        """What a checkpoint records of the consumer's position (cheap: no encoding, unless
        ``held_records`` asks for the payloads of the records operators hold)."""
        feeder, mux = self.feeder, self.mux
        if feeder is None or mux is None:
            raise CheckpointError("the engine has not started")
        mux.settle()
        lanes = [self._lane_position(mux, lane, held_records) for lane in self.lanes]
        return Position(lanes, list(mux.order), mux.turn)

    def _lane_position(self, mux: LaneMux, lane: int, held_records: bool) -> LaneCheckpoint:
        """One lane's checkpoint; the one built before while nothing it is made of changed
        (a position is taken after every item an engine process sends, and most lanes of a
        lane worker did not move since the last)."""
        start_cid, state = self._lane_start(lane)
        offset = self._restart_point(lane, start_cid)[1]
        done = lane in mux.finished_lanes
        mixture = None if self.mixture is None else self.mixture.frozen(lane)
        # everything the checkpoint is computed from; the operator state at a restart point
        # never changes once recorded (OperatorStates.at caches it by the same point)
        key = (
            start_cid,
            offset,
            done,
            mux.delivered[lane],
            mux.replay_cursor.get(lane),
            mux.mark(lane),
            mixture,
            bool(self.states.logs),
        )
        cached = self._lane_positions.get(lane)
        if (
            not held_records
            and cached is not None
            and cached[1].source_state is state
            and cached[0] == key
        ):
            return cached[1]
        since = mux.deliveries_since(lane, (start_cid, offset))
        operator_state, payloads = (
            (None, False)
            if done
            else self._operator_state(lane, (start_cid, offset), held_records, drained=since != 0)
        )
        lc = ckpt.LaneCheckpoint(
            lane=lane,
            start_chunk_id=start_cid,
            source_state=state,
            replay_cursor=self._replay_cursor(mux, lane, (start_cid, offset), since),
            delivered=mux.delivered[lane],
            done=done,
            operator_state=operator_state,
            start_offset=offset,
            held_payloads=payloads,
            mixture=mixture,
        )
        if not held_records:
            self._lane_positions[lane] = (key, lc)
        return lc

    def _replay_cursor(
        self, mux: LaneMux, lane: int, start: RestartPoint, since: int | None
    ) -> SampleCursor | None:
        """The last delivered cursor, which a restore at ``start`` drops up to. When the one
        batch the lane delivered since the cut was the partial batch saved there (a flush
        emptied it), no record after the cut was delivered: the cursor is the cut's own."""
        cursor = mux.replay_cursor.get(lane)
        if since == 1 and cursor is not None and self.states.batched_at(lane, start, cursor):
            return mux.cursor_at(lane, start)
        return cursor

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
            self.mixture_target.target_json() if self.mixture_target is not None else None,
        )

    def checkpoint(self, *, held_records: bool = False) -> dict[str, Any]:
        """The consumer-visible state: what has been delivered, per lane (see checkpoint.py);
        ``held_records`` writes the payloads of the records operators hold as well."""
        return self.checkpoint_at(self.position(held_records=held_records))

    def _operator_state(
        self, lane: int, start: RestartPoint, held_records: bool, *, drained: bool
    ) -> tuple[dict[str, Any] | None, bool]:
        """Each stateful accumulator's lane state at the point a restore regenerates from,
        and whether it carries held records' payloads. ``drained``: the lane delivered since
        that point, so what batching stages held there has left (their state is empty)."""
        if not self.states.logs:  # not iterated yet: a pending restore's state still holds
            lc = self.restored.get(lane)
            if lc is None:
                return None, False
            saved = lc.operator_state
            return (dict(saved) if saved is not None else None), lc.held_payloads
        if held_records:
            return self.states.held_at(lane, start, drained=drained)
        return self.states.at(lane, start, drained=drained), False

    def __iter__(self) -> Iterator[StreamItem]:
        try:
            yield from self.stream()
        except Exception as exc:  # the run's error is the one the consumer sees
            self._close_after(exc)
            raise
        finally:
            if not self._closed:  # closed already after an error, or at interpreter exit
                self.snapshot()
                self.close()
        if self.quarantine.count:
            where = self.quarantine.path
            log.warning(
                "zephon: skipped %d unreadable record(s) (on_error='skip')%s",
                self.quarantine.count,
                f"; they are listed in {where}" if where is not None else "",
            )

    def _close_after(self, error: BaseException) -> None:
        """Close after ``error``; a failure to close is noted on it rather than replacing it."""
        try:
            self.snapshot()
            self.close()
        except Exception as exc:
            with contextlib.suppress(BaseException):
                error.add_note(f"closing the engine then failed too: {type(exc).__name__}: {exc}")

    def stream(self) -> Generator[StreamItem, None, None]:
        """The delivered items; unlike ``iter()`` it leaves closing the engine to the caller
        (the engine process keeps shared memory alive until the consumer has mapped it)."""
        check_not_bootstrapping()
        self.prepare()
        feeder, mux = self.feeder, self.mux
        assert feeder is not None and mux is not None
        self._started_at = self._last_log = time.monotonic()
        self._io_start = io_totals()
        _LIVE.add(self)
        job = RunJob(
            self._cores(),
            self.plan,
            self.contexts,
            self.options,
            feeder,
            mux,
            self._deliver,
            self.resources,
            self._idle,
        )
        yield from RUNNERS_BY_NAME[self.run.options.runner].run(job)

    def _deliver(self, mux: LaneMux) -> Iterator[StreamItem]:
        evict = None
        if self.monotone and self.feeder is not None:
            evict = self._evicted if self.states.logs else self.feeder.evict_below
        log_every = self.options.log_every_s
        mixture = self.mixture
        while True:
            item = mux.pop()
            if item is None:
                return
            self.stats.delivered += 1
            if mixture is not None:
                mixture.add(item)
            if evict is not None:
                evict(item.meta.lane_id, item.meta.chunk_id)
            if log_every is not None and time.monotonic() - self._last_log >= log_every:
                self._last_log = time.monotonic()
                log.info("%s", self.snapshot().summary())
            yield item

    def _idle(self, waited: float) -> None:
        """No item for ``waited`` seconds: say what the run waits for every ``log_every_s``,
        and stop waiting when the caller's check asks to (:class:`WaitInterrupted`)."""
        log_every = self.options.log_every_s
        if log_every is not None and time.monotonic() - self._last_log >= log_every:
            self._last_log = time.monotonic()
            retries = (io_totals() - self._io_start).retries
            retries += sum(s.retries for s in self.resources.process_io().values())
            log.info("zephon: %s", waiting.describe(self.resources, waited, retries))
        try:
            waiting.stop_waiting(self.interrupt, waited)
        except WaitInterrupted:
            self.interrupted = True
            raise

    def close(self) -> None:
        """Stop threads and workers; safe to call more than once and after early exit."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        self.source.interrupt()  # a source thread waiting for data would hold the close up
        self.resources.close(waiting.close_wait(self.interrupt, self.interrupted))
        self.quarantine.close()
        self.states.close()
        self.resources.teardown()
        self.source.release()


def mixture_target(source: WorkSource) -> MixtureStats | None:
    """What the source mixes, nothing delivered yet (None for fewer than two components):
    its target weights and unit, or no weights for a source without a target."""
    names = source.component_names()
    if len(names) < 2:
        return None
    spec = source_mixture(source)
    if spec is None:
        return MixtureStats.target(names, {}, "samples")
    return MixtureStats.target(names, spec.weights, spec.unit)


_LIVE: weakref.WeakSet[Engine] = weakref.WeakSet()
"""Engines being iterated (started, not closed)."""


@at_exit  # after the worker pools' exit hooks (imported first), so it runs before them
def _close_live_engines() -> None:
    """Close the engines of iterators still open at interpreter exit while their threads run.

    Left to the interpreter, the suspended iterator would be finalised after it froze the
    engine's daemon threads (closing would wait on them and print an ignored exception), and
    multiprocessing would join worker processes that a serving thread is reaping.
    """
    for engine in list(_LIVE):
        try:
            engine.close()
        except Exception as exc:
            log.warning("zephon: closing a pipeline left open at exit failed: %s", exc)

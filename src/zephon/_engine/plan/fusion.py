"""Operator fusion: adjacent element-wise operators run as one worker task.

Every hop between two operators costs a channel hand-off, a driver thread wake-up, a worker
dispatch and a reorder step per micro-batch, all under the GIL. For operators whose output is
the concatenation of what each element alone becomes (``OpTraits.elementwise``) and whose
accumulator only groups by count (no state, no payload inspection), the micro-batch
boundaries of the later operator cannot change what it emits. Such a chain is run on one
pool: the first operator's accumulator cuts micro-batches, and each worker task runs the
whole chain on its micro-batch, so the output is the same as unfused, element for element.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from zephon._engine.plan.driver_chain import DriverChain
from zephon._engine.state.lane_state import has_lane_state
from zephon._engine.state.stage import Resolver, StageCore, annotate, any_control, call_process_many
from zephon._engine.stats import OpStats
from zephon.ops import (
    Accumulator,
    BaseOp,
    CountingAccumulator,
    MarkerObserver,
    OpContext,
    OpTraits,
    PassthroughAccumulator,
)
from zephon.types import StreamItem, is_control

if TYPE_CHECKING:
    from zephon._engine.plan.plan import Plan, StagePlan


def fusible(op: BaseOp, acc: Accumulator) -> bool:
    """Whether ``op`` may share a worker task with a fusible neighbour (on a runner that
    fuses: ``Runner.fuses``)."""
    traits = op.traits()
    return (
        traits.elementwise
        and not traits.runs_in_driver
        and type(acc) in (CountingAccumulator, PassthroughAccumulator)
        and not has_lane_state(acc)
        and not isinstance(acc, MarkerObserver)
    )


def fusion_groups(flags: Sequence[bool], runners: Sequence[str]) -> list[list[int]]:
    """Consecutive stage indices that run as one task (groups of one are not fused)."""
    groups: list[list[int]] = []
    for index, ok in enumerate(flags):
        prev = groups[-1] if groups else None
        if ok and prev is not None and flags[prev[-1]] and runners[prev[-1]] == runners[index]:
            prev.append(index)
        else:
            groups.append([index])
    return groups


def single_worker_units(
    on_driver_ok: Sequence[bool], widths: Sequence[int], fused: Sequence[Sequence[int]]
) -> list[list[int]]:
    """Units (a fused chain, or one stage) of width one whose runner allows it
    (``on_driver_ok``, by stage: ``Runner.width_one_on_driver``): they run on their
    driver thread. One worker thread adds nothing the driver could not do itself, as it only
    waits for the result, but costs two thread wake-ups and GIL hand-overs per micro-batch."""
    heads = {group[0]: list(group) for group in fused}
    units: list[list[int]] = []
    index = 0
    while index < len(on_driver_ok):
        group = heads.get(index) or [index]
        if all(on_driver_ok[i] for i in group) and max(widths[i] for i in group) == 1:
            units.append(group)
        index = group[-1] + 1
    return units


def driver_chains(runners: Sequence[str], pooled: Sequence[bool]) -> list[list[int]]:
    """Runs of ``driver`` stages right after a stage on a worker pool (``pooled``, by stage):
    they run on that stage's driver thread, as its results leave in order, instead of on a
    thread of their own."""
    groups = fusion_groups([r == "driver" for r in runners], runners)
    return [g for g in groups if runners[g[0]] == "driver" and g[0] > 0 and pooled[g[0] - 1]]


@dataclass
class FusedCounters:
    """Per-operator worker counters of a fused chain, shared by every copy of it."""

    stats: list[OpStats | None]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, counts: list[tuple[int, int, int]]) -> None:
        with self.lock:
            for stats, (n_in, n_out, ns) in zip(self.stats, counts, strict=True):
                if stats is None or not n_in:
                    continue
                if stats is not self.stats[0]:  # the head's input is counted by its driver
                    stats.elements_in += n_in
                stats.elements_out += n_out
                stats.micro_batches += 1
                stats.worker_ns += ns


class FusedOp(BaseOp):
    """A chain of element-wise operators run as one ``process_many``.

    Records an operator turns into tombstones (or any control element it returns) skip the
    rest of the chain and leave before the later operators' output, as they would unfused.
    """

    name = "fused"

    def __init__(
        self,
        ops: Sequence[BaseOp],
        contexts: Sequence[OpContext],
        counters: FusedCounters | None,
    ) -> None:
        super().__init__(name="+".join(op.name for op in ops))
        self.ops = list(ops)
        self.contexts = list(contexts)
        self.counters = counters
        self._counts: list[tuple[int, int, int]] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        """A worker process's copy has no shared counters: it hands its counts back instead."""
        return (FusedOp, (self.ops, self.contexts, None))

    def take_counts(self) -> list[tuple[int, int, int]] | None:
        """``(in, out, ns)`` per operator of the last micro-batch run without shared counters
        (in a worker process); the engine adds them to its counters when the reply comes."""
        counts, self._counts = self._counts, None
        return counts

    def __deepcopy__(self, memo: dict[int, Any]) -> FusedOp:
        """A worker's copy copies the operators, never the shared counters (nor their lock)."""
        import copy

        return FusedOp(copy.deepcopy(self.ops, memo), self.contexts, self.counters)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, elementwise=True)

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return self.ops[0].accumulator(deterministic=deterministic, ctx=self.contexts[0])

    def setup(self, ctx: OpContext) -> None:
        for op, own in zip(self.ops, self.contexts, strict=True):
            op.setup(replace(own, worker_index=ctx.worker_index, num_workers=ctx.num_workers))

    def teardown(self) -> None:
        for op in self.ops:
            op.teardown()

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        controls: list[StreamItem] = []
        counts: list[tuple[int, int, int]] = []
        work = elems
        last = len(self.ops) - 1
        for index, op in enumerate(self.ops):
            if not work:
                counts.append((0, 0, 0))
                continue
            start = time.perf_counter_ns()
            try:
                out = call_process_many(op, work)
            except BaseException as exc:
                raise annotate(exc, op.name) from None
            counts.append((len(work), len(out), time.perf_counter_ns() - start))
            work = out
            if index < last and any_control(out):
                work = [item for item in out if not is_control(item)]
                if len(work) != len(out):
                    controls.extend(item for item in out if is_control(item))
        if self.counters is not None:
            self.counters.add(counts)
        else:
            self._counts = counts
        return [*controls, *work] if controls else work


@dataclass
class Unit:
    """What one driver thread runs: a stage, or a fused chain ``first..last`` as one stage."""

    core: StageCore
    stage: StagePlan
    first: int
    last: int
    after: DriverChain | None = None
    """Driver stages ``last + 1 ..`` that ride on this unit's driver thread (see
    ``driver_chains``)."""

    @property
    def end(self) -> int:
        """The last stage index the unit covers, riding driver stages included."""
        return self.last + (len(self.after.cores) if self.after is not None else 0)

    @property
    def fused(self) -> bool:
        """A fused worker chain (which counts its own work)."""
        return self.last > self.first


def _resolve_all(resolvers: Sequence[Resolver | None]) -> Resolver | None:
    """One payload resolver doing the work of ``resolvers`` (None where there is none); it
    says whether any of them still has records to resolve."""
    live = [resolve for resolve in resolvers if resolve is not None]
    if len(live) < 2:
        return live[0] if live else None

    def resolve_all(batch: Sequence[StreamItem]) -> bool:
        live[:] = [resolve for resolve in live if resolve(batch)]
        return bool(live)

    return resolve_all


def build_units(
    plan: Plan, cores: Sequence[StageCore], contexts: Sequence[OpContext], max_inflight: int | None
) -> list[Unit]:
    """One unit per stage, except that each of ``plan.fused`` becomes one unit and each of
    ``plan.chained`` rides on the unit before it; ``plan.on_driver`` units get no pool."""
    heads = {group[0]: group for group in plan.fused}
    chains = {group[0]: group for group in plan.chained}
    on_driver = {group[0] for group in plan.on_driver}
    units: list[Unit] = []
    index = 0
    while index < len(cores):
        chain = chains.get(index)
        if chain is not None and units:
            units[-1].after = DriverChain([cores[i] for i in chain])
            index = chain[-1] + 1
            continue
        group = heads.get(index) or [index]
        first, last = group[0], group[-1]
        core = cores[first]
        stage = plan.stages[first]
        if first in on_driver:
            stage = replace(stage, runner="driver")
        if len(group) > 1:
            width = max(plan.stages[i].parallelism for i in group)
            counters = FusedCounters([cores[i].stats for i in group])
            op = FusedOp([cores[i].op for i in group], [contexts[i] for i in group], counters)
            core = StageCore(
                op,
                core.acc,
                stalls_sentinels=False,
                stats=core.stats,
                lanes=core.lanes,
                marker_mode=core.marker_mode,
            )
            # restored records that get their payloads as they enter one of the group's
            # operators get them as they enter the group
            core.resolve = _resolve_all([cores[i].resolve for i in group])
            inflight = max_inflight or (1 if first in on_driver else 2 * width)
            stage = replace(stage, op_name=op.name, parallelism=width, max_inflight=inflight)
        units.append(Unit(core, stage, first, last))
        index = last + 1
    return units

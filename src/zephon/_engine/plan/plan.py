"""Compile an operator chain into stages: who runs each operator, how wide, with which queues."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import xxhash

from zephon._engine.plan.fusion import driver_chains, fusible, fusion_groups, single_worker_units
from zephon._engine.plan.runner_traits import REGISTRY, lookup
from zephon._engine.stats import OpStats
from zephon.errors import ConfigError
from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext
from zephon.options import RuntimeOptions

Resources = Mapping[str, float]
"""Ray resources each actor of a ``placement="remote"`` stage asks for, e.g. ``{"io": 1}``."""

#: Operators the engine adds itself, with what they do (the legend of ``str(plan)``).
ENGINE_OPS = {
    "fetch": "reads each chunk's rows",
    "replay_filter": "skips what was delivered before a restore",
}


@dataclass(frozen=True)
class OpSpec:
    """An operator as the user configured it (``resources``: sorted Ray resource requests).
    ``auto``: ``parallelism="auto"``, so compile sets ``parallelism`` and says ``why``."""

    op: BaseOp
    parallelism: int
    placement: str = "local"
    resources: tuple[tuple[str, float], ...] = ()
    auto: bool = False
    why: str = ""


def services(op_name: str, resources: tuple[tuple[str, float], ...]) -> dict[str, Any]:
    """The operator's services; ``"ray_resources"`` tells the Ray pool where actors go."""
    out: dict[str, Any] = {"logger": logging.getLogger(f"zephon.op.{op_name}")}
    if resources:
        out["ray_resources"] = dict(resources)
    return out


def ray_resources(
    op_name: str, resources: Resources | None, placement: str
) -> tuple[tuple[str, float], ...]:
    """``resources`` checked and frozen: only Ray actors ask for resources, never negative."""
    if not resources:
        return ()
    if placement != "remote":
        raise ConfigError(
            f"{op_name}: resources={dict(resources)!r} place Ray actors; add placement='remote'"
        )
    for name, amount in resources.items():
        if not isinstance(name, str) or not isinstance(amount, (int, float)) or amount < 0:
            raise ConfigError(
                f"{op_name}: resources must map names to amounts >= 0, got {name!r}: {amount!r}"
            )
    return tuple(sorted((name, float(amount)) for name, amount in resources.items()))


@dataclass(frozen=True)
class StagePlan:
    index: int
    op_name: str
    op_type: str
    runner: str
    parallelism: int
    micro_batch: int | None
    queue_size: int
    max_inflight: int
    preserves_cursor_order: bool
    stalls_sentinels: bool
    detail: str = ""
    auto: str = ""
    """How ``parallelism="auto"`` chose the worker count ("" for a count as configured)."""


@dataclass(frozen=True)
class Plan:
    """The compiled plan, as data (``to_dict``) and as text (``str``)."""

    runner: str
    deterministic: bool
    lanes: list[int]
    canonical_replicas: int
    dp_rank: int
    dp_world_size: int
    flush_every_k_chunks: int
    monotone: bool
    stages: list[StagePlan] = field(default_factory=list)
    fused: list[list[int]] = field(default_factory=list)
    """Groups of consecutive stage indices that run as one worker task."""
    chained: list[list[int]] = field(default_factory=list)
    """Runs of driver stages that ride on the driver thread of the worker stage before them."""
    on_driver: list[list[int]] = field(default_factory=list)
    """Thread-runner units of width one (a fused group or a stage): their work runs on their
    driver thread, without a pool."""
    snapshots: str = ""
    """Where a restore starts, for a plan that is not monotone (see ``compile.snapshot_note``)."""
    lane_workers: int = 0
    """Worker processes that each run whole lanes, every stage inline (0: none)."""
    lane_workers_why: str = ""
    """How that count was chosen."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _lane_worker_lines(self) -> list[str]:
        if not self.lane_workers:
            return []
        return [
            f"lane_workers={self.lane_workers}: each worker process runs lanes "
            f"w::{self.lane_workers} of {self.lanes} whole, every operator inline "
            f"({self.lane_workers_why})"
        ]

    def __str__(self) -> str:
        lines = [
            f"runner={self.runner} deterministic={self.deterministic} "
            f"lanes={self.lanes} (rank {self.dp_rank}/{self.dp_world_size}, "
            f"canonical_replicas={self.canonical_replicas})",
            f"monotone={self.monotone} flush_every_k_chunks={self.flush_every_k_chunks}",
            *self._lane_worker_lines(),
            f"{'#':>2} {'operator':<18} {'runner':<8} {'workers':>7} {'micro':>6} "
            f"{'queue':>5} {'inflight':>8} order",
        ]
        for s in self.stages:
            micro = "-" if s.micro_batch is None else str(s.micro_batch)
            order = "kept" if s.preserves_cursor_order else "changed"
            if s.stalls_sentinels:
                order += ", stalls sentinels"
            name = f"{s.op_name}*" if s.op_name in ENGINE_OPS else s.op_name
            lines.append(
                f"{s.index:>2} {name:<18} {s.runner:<8} {s.parallelism:>7} {micro:>6} "
                f"{s.queue_size:>5} {s.max_inflight:>8} {order}"
            )
            if s.detail:
                lines.append(f"   {s.op_name}: {s.detail}")
            if s.auto:
                lines.append(f"   {s.op_name}: {s.auto}")
        for group in self.fused:
            names = " + ".join(f"{i} {self.stages[i].op_name}" for i in group)
            lines.append(f"fused: {names} (one worker task per micro-batch)")
        for group in self.on_driver:
            names = " + ".join(f"{i} {self.stages[i].op_name}" for i in group)
            lines.append(f"on driver: {names} (width 1: no worker thread)")
        for group in self.chained:
            names = " + ".join(f"{i} {self.stages[i].op_name}" for i in group)
            before = self.stages[group[0] - 1]
            lines.append(
                f"chained: {names} (on the driver thread of {before.index} {before.op_name})"
            )
        return "\n".join(lines + self._legend())

    def _legend(self) -> list[str]:
        """What the table's jargon means, for a reader who has not read docs/concepts.md."""
        added = [
            f"{s.op_name} {ENGINE_OPS[s.op_name]}" for s in self.stages if s.op_name in ENGINE_OPS
        ]
        lines = [f"* added by the engine: {'; '.join(added)}"] if added else []
        lines.append(
            "order: kept = in input order, changed = reorders; "
            "stalls sentinels = holds a chunk's end marker until a batch fills"
        )
        if self.monotone:
            lines.append(
                "monotone: nothing reorders, so a restore replays at most one chunk per lane"
            )
        else:
            lines.append(
                f"not monotone: reordering operators flush every {self.flush_every_k_chunks} "
                f"chunks per lane; {self.snapshots or 'a restore replays from the last flush'}"
            )
        return lines


def stalls_sentinels(op: BaseOp) -> bool:
    """Whether ``op`` may hold a lane's flush sentinel back (its ``stalls_sentinels`` trait)."""
    return op.traits().stalls_sentinels


def op_seed(source_seed: int, index: int, name: str, epoch: int = 0) -> int:
    """A 63-bit seed per operator: the source's seed, the stage, the name and (from epoch 1
    on) the epoch, hashed."""
    key = f"{source_seed}:{index}:{name}" + (f":{epoch}" if epoch else "")
    return xxhash.xxh64_intdigest(key.encode()) >> 1


def is_monotone(specs: list[OpSpec]) -> bool:
    """No operator changes cursor order: a restore replays at most one chunk per lane."""
    return all(s.op.traits().preserves_cursor_order for s in specs)


def flush_every(options: RuntimeOptions, monotone: bool) -> int:
    """``flush_every_k_chunks`` resolved: 0 for monotone plans, 8 otherwise, or as given."""
    k = options.flush_every_k_chunks
    if k is None:
        return 0 if monotone else 8
    if k == 0 and not monotone:
        raise ConfigError(
            "flush_every_k_chunks=0 is not allowed for a plan with an order-changing operator "
            "(packing, shuffling, mixture correction): epochs need flush sentinels"
        )
    return k


def _runner_of(spec: OpSpec, options: RuntimeOptions) -> tuple[str, int]:
    """Where the operator's ``process_many`` runs, and how many copies."""
    return REGISTRY[options.runner].stage(spec.op, spec.placement, spec.parallelism)


def compile_contexts(
    specs: list[OpSpec],
    options: RuntimeOptions,
    lanes: list[int],
    *,
    source_seed: int = 0,
    epoch: int = 0,
) -> list[OpContext]:
    """Each operator's context: its runner, width, seed and services."""
    contexts = []
    for index, spec in enumerate(specs):
        op = spec.op
        runner, width = _runner_of(spec, options)
        contexts.append(
            OpContext(
                op_name=op.name,
                op_index=index,
                num_workers=width,
                deterministic=options.deterministic,
                runner=runner,
                seed=op_seed(source_seed, index, op.name, epoch),
                services=services(op.name, spec.resources if lookup(runner).remote else ()),
                lanes=tuple(lanes),
                epoch=epoch,
            )
        )
    return contexts


def accumulators_for(
    specs: list[OpSpec], contexts: list[OpContext], options: RuntimeOptions
) -> tuple[list[Accumulator], list[OpStats] | None]:
    """One fresh accumulator per stage, and (``track_stats``) the live counters each finds in
    its context's ``"stats"`` service."""
    stats = None
    if options.track_stats:
        stats = [
            OpStats(name=ctx.op_name, runner=ctx.runner, parallelism=ctx.num_workers, auto=s.why)
            for s, ctx in zip(specs, contexts, strict=True)
        ]
    accs = []
    for i, (spec, ctx) in enumerate(zip(specs, contexts, strict=True)):
        if stats is not None:
            ctx = replace(ctx, services={**ctx.services, "stats": stats[i]})
        accs.append(spec.op.accumulator(deterministic=options.deterministic, ctx=ctx))
    return accs, stats


def _stage(
    index: int, spec: OpSpec, ctx: OpContext, acc: Accumulator, options: RuntimeOptions
) -> StagePlan:
    op = spec.op
    return StagePlan(
        index=index,
        op_name=op.name,
        op_type=type(op).__name__,
        runner=ctx.runner,
        parallelism=ctx.num_workers,
        micro_batch=acc.max_batch if isinstance(acc, CountingAccumulator) else None,
        queue_size=options.queue_size,
        max_inflight=options.max_inflight or 2 * ctx.num_workers,
        preserves_cursor_order=op.traits().preserves_cursor_order,
        stalls_sentinels=stalls_sentinels(op),
        detail=op.describe(),
        auto=spec.why,
    )


def compile_plan(
    specs: list[OpSpec],
    options: RuntimeOptions,
    lanes: list[int],
    contexts: list[OpContext],
    accumulators: list[Accumulator],
) -> Plan:
    """Decide the stages, fusion and driver chains of ``specs`` with their contexts and the
    accumulators the run uses (a stage's micro-batch and fusibility come from them)."""
    monotone = is_monotone(specs)
    k = flush_every(options, monotone)
    stages = [
        _stage(i, spec, ctx, acc, options)
        for i, (spec, ctx, acc) in enumerate(zip(specs, contexts, accumulators, strict=True))
    ]
    can_fuse = [
        options.fuse
        and spec.placement == "local"
        and lookup(ctx.runner).fuses
        and fusible(spec.op, acc)
        and not stalls_sentinels(spec.op)
        for spec, ctx, acc in zip(specs, contexts, accumulators, strict=True)
    ]
    runners = [s.runner for s in stages]
    fused = [g for g in fusion_groups(can_fuse, runners) if len(g) > 1]
    widths = [s.parallelism for s in stages]
    on_driver_ok = [lookup(r).width_one_on_driver for r in runners]
    pooled = [lookup(r).pooled for r in runners]
    return Plan(
        runner=options.runner,
        deterministic=options.deterministic,
        lanes=lanes,
        canonical_replicas=options.canonical_replicas,
        dp_rank=options.dp_rank,
        dp_world_size=options.dp_world_size,
        flush_every_k_chunks=k,
        monotone=monotone,
        stages=stages,
        fused=fused,
        chained=driver_chains(runners, pooled) if options.fuse else [],
        on_driver=single_worker_units(on_driver_ok, widths, fused) if options.fuse else [],
    )

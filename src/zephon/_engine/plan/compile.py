"""Compile a pipeline into a :class:`CompiledRun`: the one place a plan is decided.

``explain()``, checkpoint validation, the engine and the engine process all start here, so
what ``explain()`` shows is what runs, and a restore is checked against the same
configuration the engine writes. Compiling is pure: it reads the source's metadata (dataset
names, shard and row counts), the operators' configuration and the cores this process may use
(for ``parallelism="auto"``), and touches nothing else; the same inputs give an equal
:class:`CompiledRun`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from zephon._engine.plan.auto import resolve_auto
from zephon._engine.plan.cores import usable_cores
from zephon._engine.plan.plan import (
    OpSpec,
    Plan,
    accumulators_for,
    compile_contexts,
    compile_plan,
    flush_every,
    is_monotone,
)
from zephon._engine.state.replay_filter import ReplayFilterOp
from zephon._engine.state.snapshots import SnapshotPlan, plan_snapshots, snapshots_off
from zephon._engine.stats import OpStats
from zephon.checkpoints import format as ckpt
from zephon.errors import CheckpointError, ConfigError
from zephon.ops import Accumulator, OpContext
from zephon.options import RuntimeOptions
from zephon.types import SampleCursor
from zephon.work import WorkSource, lanes_for_rank, source_fingerprint, source_seed

Built = tuple[list[Accumulator], list[OpStats] | None]
"""One accumulator per stage, and their live counters (None: ``track_stats`` is off)."""


class _Handoff:
    """What a compile built, for the first taker only; never pickled (an engine process
    builds its own), so no accumulator is shared between two engines."""

    __slots__ = ("value",)

    def __init__(self, value: Built | None) -> None:
        self.value = value

    def take(self) -> Built | None:
        value, self.value = self.value, None
        return value

    def __reduce__(self) -> tuple[type[_Handoff], tuple[None]]:
        return (_Handoff, (None,))


@dataclass(frozen=True)
class CompiledRun:
    """Everything decided before a run starts: what an :class:`Engine` runs and checkpoints.

    ``specs`` are the operators as they run: ``operators`` (as configured) with the engine's
    replay filter at ``replay_index``. The filter is a fresh object per compile, so equality
    compares where it sits and what it skips (``replay_targets``) instead.
    """

    source: WorkSource
    operators: list[OpSpec]
    options: RuntimeOptions
    resume: ckpt.ParsedCheckpoint | None
    lanes: list[int]
    """The lanes this pipeline view runs."""
    monotone: bool
    config: dict[str, Any]
    """Everything that shapes a lane's output; a checkpoint refuses any other."""
    config_fingerprint: str
    replay_index: int
    replay_targets: dict[int, SampleCursor]
    contexts: list[OpContext]
    plan: Plan
    snapshot_plan: SnapshotPlan
    specs: list[OpSpec] = field(compare=False)
    built: _Handoff = field(compare=False, repr=False, default_factory=lambda: _Handoff(None))

    def accumulators(self) -> Built:
        """Fresh accumulators for an engine: the ones the plan was decided with the first
        time (so an iteration builds each once), new ones after."""
        return self.built.take() or accumulators_for(self.specs, self.contexts, self.options)

    def state_key(self, index: int) -> str:
        """A stage's key in ``operator_state``: its index in the configuration's operators
        (the engine's own replay filter, inserted before ``batch``, does not count)."""
        return str(index - 1 if index > self.replay_index else index)

    def for_child(self) -> CompiledRun:
        """This run as the engine process runs it (it is the engine, not a consumer of one)."""
        return replace(self, options=replace(self.options, engine_process=False))


def compile(
    source: WorkSource,
    specs: list[OpSpec],
    options: RuntimeOptions,
    resume: ckpt.ParsedCheckpoint | None = None,
) -> CompiledRun:
    """The compiled run of ``specs`` over ``source``; raises ``CheckpointError`` when
    ``resume`` was taken with another configuration or lacks this view's lanes."""
    lanes = view_lanes(options)
    lane_workers, lane_workers_why = lane_worker_count(options, lanes)
    if lane_workers:  # each lane worker runs every stage inline; so does this plan
        options = replace(options, runner="inline", engine_process=False)
    monotone = is_monotone(specs)
    k = flush_every(options, monotone)
    config = pipeline_config(source, specs, options, k)
    targets: dict[int, SampleCursor] = {}
    if resume is not None:
        check_resume(resume, source, config, lanes, options)
        for lane in lanes:
            lc = resume.lanes[lane]
            if lc.replay_cursor is not None and not lc.done:
                targets[lane] = lc.replay_cursor
    all_specs, contexts, accs, stats, plan = _stages(
        source, with_replay_filter(specs, targets, monotone=monotone), options, lanes
    )
    snapshot_plan = _snapshot_plan(all_specs, accs, options, monotone)
    if not monotone:
        plan = replace(plan, snapshots=snapshot_note(snapshot_plan, options))
    if lane_workers:
        plan = replace(plan, lane_workers=lane_workers, lane_workers_why=lane_workers_why)
    return CompiledRun(
        source=source,
        operators=list(specs),
        options=options,
        resume=resume,
        lanes=lanes,
        monotone=monotone,
        config=config,
        config_fingerprint=ckpt.fingerprint(config),
        replay_index=next(i for i, s in enumerate(all_specs) if isinstance(s.op, ReplayFilterOp)),
        replay_targets=targets,
        contexts=contexts,
        plan=plan,
        snapshot_plan=snapshot_plan,
        specs=all_specs,
        built=_Handoff((accs, stats)),
    )


def _stages(
    source: WorkSource, specs: list[OpSpec], options: RuntimeOptions, lanes: list[int]
) -> tuple[list[OpSpec], list[OpContext], list[Accumulator], list[OpStats] | None, Plan]:
    """The specs with ``"auto"`` widths chosen, their contexts, accumulators and plan. Which
    stages fuse is known only with the plan, so a plan that fuses ``"auto"`` stages is built
    again with one share per fused group."""
    seed = source_seed(source)
    cores = usable_cores() if any(s.auto for s in specs) else None
    fused: list[list[int]] = []
    while True:
        resolved = specs
        if cores is not None:
            shared = options.process_pool == "shared"
            resolved = resolve_auto(specs, cores, options.runner, fused, shared_pool=shared)
        contexts = compile_contexts(
            resolved,
            options,
            lanes,
            source_seed=seed if isinstance(seed, int) else 0,
            epoch=source.epoch,
        )
        accs, stats = accumulators_for(resolved, contexts, options)
        plan = compile_plan(resolved, options, lanes, contexts, accs)
        regroup = [g for g in plan.fused if sum(resolved[i].auto for i in g) > 1]
        if fused or not regroup:
            return resolved, contexts, accs, stats, plan
        fused = plan.fused


def check_restore(
    source: WorkSource, specs: list[OpSpec], options: RuntimeOptions, resume: ckpt.ParsedCheckpoint
) -> None:
    """What :func:`compile` checks of ``resume``, without building the run."""
    config = pipeline_config(source, specs, options, flush_every(options, is_monotone(specs)))
    check_resume(resume, source, config, view_lanes(options), options)


def config_fingerprint(source: WorkSource, specs: list[OpSpec], options: RuntimeOptions) -> str:
    """The fingerprint of the configuration :func:`compile` would give (a checkpoint's)."""
    config = pipeline_config(source, specs, options, flush_every(options, is_monotone(specs)))
    return ckpt.fingerprint(config)


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


def lane_worker_count(options: RuntimeOptions, lanes: list[int]) -> tuple[int, str]:
    """How many lane worker processes run ``lanes`` (0: none), and why that many."""
    wanted = options.lane_workers
    if wanted is None or options._worker_share != (0, 1):  # a DataLoader worker runs inline
        return 0, ""
    if wanted != "auto":
        if wanted > len(lanes):
            raise ConfigError(
                f"lane_workers={wanted} but this rank runs {len(lanes)} lane(s) "
                f"(canonical_replicas={options.canonical_replicas}, "
                f"dp_world_size={options.dp_world_size}): a lane is the unit a worker runs, so "
                "use at most one worker per lane, raise canonical_replicas, or use 'auto'"
            )
        return wanted, "as configured"
    cores = usable_cores()
    count = max(1, min(cores.count, len(lanes)))
    return count, f"auto: {cores.count} usable cores ({cores.why}), {len(lanes)} lane(s)"


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


_SETTINGS_CHANGED_HINT = (
    "; resume with the settings the checkpoint was taken with, or start a new "
    "--checkpoint-dir (in Python: do not restore this checkpoint) to run the new ones"
)


def _hint_for(diff: str) -> str:
    """What to do about a configuration difference a user is likely to make by accident."""
    if diff.startswith("source.datasets[") and (".rows:" in diff or ".shards:" in diff):
        return _DATA_CHANGED_HINT
    return _SETTINGS_CHANGED_HINT


def _source_setting_diff(resume: ckpt.ParsedCheckpoint, source: WorkSource) -> str | None:
    """The source setting that changed (``source.seed: ...``) when only its fingerprint says
    so: a lane's saved source state carries the settings it hashed, the source has its own."""
    states = [lc.source_state for lc in resume.lanes.values() if lc.source_state is not None]
    saved = next((s["config"] for s in states if isinstance(s.get("config"), Mapping)), None)
    current = source.state_dict().get("config") if saved is not None else None
    if saved is None or not isinstance(current, Mapping):
        return None
    return ckpt.first_difference(dict(saved), ckpt.to_jsonable(current), "source")


def check_resume(
    resume: ckpt.ParsedCheckpoint,
    source: WorkSource,
    config: dict[str, Any],
    lanes: list[int],
    options: RuntimeOptions,
) -> None:
    """Refuse a checkpoint of another configuration, or one without this view's lanes."""
    diff = ckpt.first_difference(resume.config, config)
    if diff and diff.startswith("source.fingerprint:"):
        diff = _source_setting_diff(resume, source) or diff
    if diff:
        raise CheckpointError(
            f"checkpoint was taken with another configuration: {diff}{_hint_for(diff)}"
        )
    missing = [lane for lane in lanes if lane not in resume.lanes]
    if missing:
        raise CheckpointError(
            f"checkpoint does not describe lanes {missing} of rank "
            f"{options.dp_rank}/{options.dp_world_size}; restore from the "
            "checkpoints of every rank merged with zephon.merge_checkpoints([...])"
        )


def _snapshot_plan(
    specs: list[OpSpec], accs: list[Accumulator], options: RuntimeOptions, monotone: bool
) -> SnapshotPlan:
    """Which stages take snapshots and how, or why the plan takes none."""
    ops = [s.op for s in specs]
    if monotone:
        return snapshots_off(ops, accs, "the plan keeps cursor order (a restore replays a chunk)")
    if not options.snapshot_every_chunks:
        return snapshots_off(ops, accs, "snapshot_every_chunks=0")
    return plan_snapshots(ops, accs)


def snapshot_note(plan: SnapshotPlan, options: RuntimeOptions) -> str:
    """Where a restore starts, for ``explain()``."""
    if not plan.enabled:
        return f"snapshots off ({plan.reason}): a restore replays from the last flush"
    every = options.snapshot_every_chunks
    note = f"snapshots every {every} chunk{'s' if every > 1 else ''}"
    if options.snapshot_every_records is not None:
        note += f" and every {options.snapshot_every_records} records"
    return note + ": a restore starts at the newest delivered snapshot"

"""Aligned snapshots of a plan's open state, and rebuilding the records they name.

The feeder injects a snapshot marker into a lane at a cut (a chunk start, or every N records).
Markers travel in stream order like any control element; each stage acts on one by its marker
mode (``stage.MarkerMode``): stateful accumulators record their lane state, element-wise
stages first emit what they buffered, ``batch`` saves its partial batch. When
the marker reaches the tail everything before the cut is delivered, and a restore can start at
the cut: the source resumes there, each accumulator loads its state, and the replay filter drops
what was delivered after the cut.

States name their buffered records by meta only (``snapshot_codec``). A restore rebuilds each
named record's payload by re-running only those records, by sample id, through the operators
before the stage that held them: element-wise operators run as usual, packing reassembles a bin
from its segments, and shuffle and mixture correction leave payloads as they are. A plan with a
stage that cannot be rebuilt this way (an order-changing operator without state, or a stateful
one without a ``rebuild`` trait upstream of a buffering one) takes no snapshots, says why in
``explain()``, and restores from the last flush.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zephon._engine.state.lane_state import has_lane_state
from zephon._engine.state.replay_filter import ReplayFilterOp
from zephon._engine.state.stage import MarkerMode, call_process_many
from zephon._snapshot_codec import HeldRecord
from zephon.errors import ContractError
from zephon.ops import (
    Accumulator,
    BaseOp,
    CountingAccumulator,
    PassthroughAccumulator,
    Reassembles,
    Rebuild,
)
from zephon.ops.state import holds_records
from zephon.types import TAG_PACKING, SampleCursor, SampleMeta, SampleRecord, is_control

REBUILD_BATCH = 1024
Key = tuple[int, SampleCursor]  # (lane, cursor): cursors repeat across lanes
_PLAIN = (CountingAccumulator, PassthroughAccumulator)

__all__ = [
    "REBUILD_BATCH",
    "Rebuilder",
    "Role",
    "SnapshotPlan",
    "holds_records",
    "plan_snapshots",
    "snapshots_off",
]


class Role(enum.Enum):
    """How a record that left a stage is rebuilt when a restored snapshot names it.

    The first three are an operator's declared :class:`~zephon.ops.Rebuild` (or, for a plain
    element-wise operator, derived): ``RERUN`` runs ``process_many`` again, ``UNCHANGED``
    keeps the payload it came in with, ``REASSEMBLE`` builds it from segments. ``STATEFUL``:
    the output depends on lane state and nothing says how to rebuild it, so the stage must
    not feed a buffer. ``OPAQUE``: neither, so the plan takes no snapshots.
    """

    RERUN = "rerun"
    UNCHANGED = "unchanged"
    REASSEMBLE = "reassemble"
    STATEFUL = "stateful"
    OPAQUE = "opaque"


_DECLARED = {
    Rebuild.RERUN: Role.RERUN,
    Rebuild.UNCHANGED: Role.UNCHANGED,
    Rebuild.REASSEMBLE: Role.REASSEMBLE,
}


def _role(op: BaseOp, acc: Accumulator) -> Role:
    """``op``'s declared ``rebuild`` trait (it wins over everything derived), else
    ``STATEFUL`` for lane state, ``RERUN`` for a plain element-wise operator, or ``OPAQUE``."""
    traits = op.traits()
    if traits.rebuild is not None:
        return _DECLARED[traits.rebuild]
    if has_lane_state(acc):
        return Role.STATEFUL
    if traits.elementwise and type(acc) in _PLAIN:
        return Role.RERUN
    return Role.OPAQUE


@dataclass(frozen=True)
class SnapshotPlan:
    """Per stage: its marker mode and rebuild role; ``reason`` says why snapshots are off."""

    modes: list[MarkerMode]
    roles: list[Role]
    reason: str | None = None
    resolve_at: list[int] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return self.reason is None


def snapshots_off(ops: Sequence[BaseOp], accs: Sequence[Accumulator], reason: str) -> SnapshotPlan:
    """A plan that takes no snapshots (``reason``), with each stage's rebuild role all the
    same: provenance rebuilds the records a truncating operator cut from them."""
    roles = [_role(op, acc) for op, acc in zip(ops, accs, strict=True)]
    return SnapshotPlan([], roles, reason, resolve_points(ops, accs, roles))


def plan_snapshots(ops: Sequence[BaseOp], accs: Sequence[Accumulator]) -> SnapshotPlan:
    """Decide each stage's marker mode, or why this plan cannot take snapshots."""
    replay = next(i for i, op in enumerate(ops) if isinstance(op, ReplayFilterOp))
    roles = [_role(op, acc) for op, acc in zip(ops, accs, strict=True)]
    modes: list[MarkerMode] = []
    in_order = True  # every stage so far keeps its input in source order
    for i, (op, acc, role) in enumerate(zip(ops, accs, roles, strict=True)):
        in_order = (
            in_order
            and role is Role.RERUN
            and not has_lane_state(acc)
            and op.traits().preserves_cursor_order
        )
        if i == replay:
            modes.append(MarkerMode.REPLAY)
        elif has_lane_state(acc):
            modes.append(MarkerMode.SNAPSHOT)
        elif role is Role.RERUN:
            modes.append(MarkerMode.RIDE if in_order else MarkerMode.FLUSH)
        else:
            modes.append(MarkerMode.HOLD if i > replay else MarkerMode.PASS)
    reason = _why_off(ops, accs, roles, replay)
    return SnapshotPlan(modes, roles, reason, resolve_points(ops, accs, roles))


def _why_off(
    ops: Sequence[BaseOp], accs: Sequence[Accumulator], roles: Sequence[Role], replay: int
) -> str | None:
    """Why a restore could not rebuild what this plan's snapshots would name (None: it can).

    Only two things stop it, both named in ``explain()``: an operator before the replay filter
    that is not element-wise and keeps no lane state, and a stateful operator without a ``rebuild``
    trait whose records a later buffer holds (its output depends on a state the rebuild does
    not replay)."""
    for i, (op, acc, role) in enumerate(zip(ops, accs, roles, strict=True)):
        if i >= replay:
            return None
        if role is not Role.RERUN and not has_lane_state(acc):
            return f"operator {op.name!r} changes order without saving its state (state_dict)"
        buffer = next((j for j in range(i + 1, replay) if holds_records(accs[j])), None)
        if role is Role.STATEFUL and buffer is not None:
            return (
                f"stateful operator {op.name!r} feeds the buffering operator "
                f"{ops[buffer].name!r}, whose records a restore could not rebuild through it; "
                f"give {op.name!r} OpTraits(rebuild=Rebuild.UNCHANGED) if it only drops or "
                "reorders records (or Rebuild.RERUN if process_many makes its output)"
            )
    return None


def resolve_points(
    ops: Sequence[BaseOp], accs: Sequence[Accumulator], roles: Sequence[Role]
) -> list[int]:
    """Per stage ``i``: the stage whose emitted micro-batches give the records restored into
    ``i``'s state their payloads. That is the last stage before the first step that reads a
    payload, so records a shuffle hands to a mixture corrector, or the replay filter drops,
    are never rebuilt at all (only operators that pass payloads through unread are skipped)."""
    points = []
    for i in range(len(ops)):
        j = i
        while j + 1 < len(ops) and _passes_unread(ops[j], roles[j]) and _pushes_unread(accs[j + 1]):
            j += 1
        points.append(j)
    return points


def _passes_unread(op: BaseOp, role: Role) -> bool:
    """Whether ``op``'s ``process_many`` hands payloads on without reading them."""
    return role is Role.UNCHANGED


def _pushes_unread(acc: Accumulator) -> bool:
    """Whether ``acc`` inspects only metadata (its ``reads_payload`` contract)."""
    return not acc.reads_payload


def stand_in_meta(lane: int, cursor: SampleCursor) -> SampleMeta:
    """A stand-in meta for a record known by cursor only (payload rebuilds read no meta)."""
    chunk, offset, lineage, sid = cursor
    return SampleMeta(sid, lane, chunk, offset, lineage, sid[0])


class Rebuilder:
    """Rebuilds payloads of records named by restored snapshots (one restore, all lanes)."""

    def __init__(self, ops: Sequence[BaseOp], roles: Sequence[Role]) -> None:
        self.ops = list(ops)
        self.roles = list(roles)
        self.prefix = next(
            (i for i, role in enumerate(roles) if role is not Role.RERUN), len(roles)
        )
        self.fetched = 0  # base records read again

    def payloads(self, stage: int, held: Sequence[tuple[int, HeldRecord]]) -> dict[int, Any]:
        """``id(held record) -> payload`` as the records entered stage ``stage``."""
        wanted = {(lane, h.meta.cursor): h.meta for lane, h in held}
        rebuilt = self._inputs(stage, wanted)
        return {id(h): rebuilt[(lane, h.meta.cursor)] for lane, h in held}

    def _inputs(self, stage: int, wanted: Mapping[Key, SampleMeta | None]) -> dict[Key, Any]:
        if stage <= self.prefix:
            return self._from_source(stage, wanted)
        j = stage - 1
        role = self.roles[j]
        if role is Role.UNCHANGED:
            return self._inputs(j, wanted)
        if role is Role.REASSEMBLE:
            return self._assembled(j, wanted)
        if role is Role.RERUN:
            inputs = self._inputs(j, wanted)
            return self._run(j, {key: inputs[key] for key in wanted}, wanted)
        raise AssertionError(f"stage {j} ({self.ops[j].name}) cannot be rebuilt")

    def _from_source(self, stage: int, wanted: Mapping[Key, SampleMeta | None]) -> dict[Key, Any]:
        """Fetch the base records again and run them through the element-wise prefix."""
        bases: dict[Key, None] = {}
        for lane, cursor in wanted:
            bases[(lane, SampleCursor(cursor[0], cursor[1], (), cursor[3]))] = None
        self.fetched += len(bases)
        current: dict[Key, Any] = dict(bases)
        for j in range(stage):
            current = self._run(j, current, {})
        return {key: current[key] for key in wanted}

    def _run(
        self, j: int, inputs: Mapping[Key, Any], metas: Mapping[Key, SampleMeta | None]
    ) -> dict[Key, Any]:
        """Operator ``j`` over ``inputs`` in batches; outputs by ``(lane, cursor)``."""
        op = self.ops[j]
        keys = list(inputs)
        out: dict[Key, Any] = {}
        for start in range(0, len(keys), REBUILD_BATCH):
            batch = [
                SampleRecord(metas.get(key) or stand_in_meta(key[0], key[1]), inputs[key])
                for key in keys[start : start + REBUILD_BATCH]
            ]
            for item in call_process_many(op, list(batch)):
                if not is_control(item):
                    out[(item.meta.lane_id, item.meta.cursor)] = item.payload
        return out

    def _assembled(self, j: int, wanted: Mapping[Key, SampleMeta | None]) -> dict[Key, Any]:
        op = self.ops[j]
        if not isinstance(op, Reassembles):
            raise ContractError(
                f"operator {op.name!r} declares rebuild=Rebuild.REASSEMBLE but has no "
                "reassemble(meta, segments) method"
            )
        segments: dict[Key, list[tuple[SampleCursor, int, int]]] = {}
        for key, meta in wanted.items():
            if meta is None or TAG_PACKING not in meta.tags:
                raise AssertionError(f"packed record {key} has no packing metadata")
            segments[key] = list(meta.tags[TAG_PACKING]["segments"])
        need = {(key[0], seg[0]): None for key, segs in segments.items() for seg in segs}
        inputs = self._inputs(j, need)
        out: dict[Key, Any] = {}
        for key, segs in segments.items():
            parts = [
                (SampleRecord(stand_in_meta(key[0], cursor), inputs[(key[0], cursor)]), start, stop)
                for cursor, start, stop in segs
            ]
            meta = wanted[key]
            assert meta is not None
            out[key] = op.reassemble(meta, parts)
        return out

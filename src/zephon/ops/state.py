"""Typed hooks an accumulator or operator may implement, and how the engine reads them.

The runner knows an operator only through :class:`~zephon.ops.BaseOp`, its
:class:`~zephon.ops.OpTraits` and the protocols below; built-in operators use nothing else.
Each protocol is ``runtime_checkable``: the engine tests ``isinstance(acc, LaneStateful)``,
and mypy checks an implementation against the same definition. :func:`check_accumulator`
refuses a half-implemented hook (``state_dict`` without ``load_state_dict``, a misspelling)
instead of silently running without it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from zephon.errors import ContractError
from zephon.types import LaneId, SampleCursor, SampleMeta, SampleRecord, StreamItem


class Rebuild(enum.Enum):
    """How a record that left an operator is rebuilt when a restored snapshot names it.

    A snapshot saves held records by meta only; a restore re-reads their sources and runs them
    again through the operators before the stage that held them. Each of those operators says
    how: ``RERUN`` (``process_many`` again, element by element: an element-wise operator),
    ``UNCHANGED`` (the operator only reorders or drops: a record leaves with the payload it
    came in with) or ``REASSEMBLE`` (the record was built from segments of its inputs, named
    in its packing tag; the operator implements :class:`Reassembles`).
    """

    RERUN = "elementwise"
    UNCHANGED = "reorder"
    REASSEMBLE = "pack"


@runtime_checkable
class LaneStateful(Protocol):
    """An accumulator whose per-lane state is saved in checkpoints and snapshots.

    ``state_dict(lane)`` returns JSON-safe data (or held records, see :class:`HoldsRecords`);
    ``load_state_dict(lane, state)`` puts a fresh accumulator's lane in exactly that state.
    """

    def state_dict(self, lane_id: LaneId) -> Any: ...

    def load_state_dict(self, lane_id: LaneId, state: Any) -> None: ...


@runtime_checkable
class HoldsRecords(LaneStateful, Protocol):
    """A lane-stateful accumulator whose state contains the ``SampleRecord`` s it buffers.

    A checkpoint writes each held record as its meta (a cursor), never its payload; a restore
    rebuilds the payloads through the operators upstream (by their :class:`Rebuild`).
    """

    state_holds_records: bool


@runtime_checkable
class LazyPayloads(HoldsRecords, Protocol):
    """Held records whose payloads are read only at push: a restore fills them in as they
    leave (or never, for those dropped downstream) instead of before the first record."""

    state_payloads_lazy: bool


@runtime_checkable
class MarkerObserver(Protocol):
    """An accumulator told of each flush sentinel, end-of-data and snapshot marker of a lane
    (in stream order) before the runner acts on it."""

    def on_marker(self, marker: StreamItem) -> None: ...


@runtime_checkable
class PendingTarget(Protocol):
    """An accumulator that still waits, per lane, for a record with a given cursor (a
    snapshot marker passing it carries the cursor on, so a restore there can wait for it)."""

    def pending_target(self, lane: LaneId) -> SampleCursor | None: ...


@runtime_checkable
class Reassembles(Protocol):
    """An operator whose output records are built from segments of input records.

    The output's meta names its segments in ``meta.tags[TAG_PACKING]["segments"]`` as
    ``(input cursor, start, stop)``; ``reassemble`` rebuilds its payload from the input
    records of those cursors, given in the same order with their ``start``/``stop``.
    """

    def reassemble(
        self, meta: SampleMeta, segments: Sequence[tuple[SampleRecord, int, int]]
    ) -> Any: ...


_PAIRS = (("state_dict", "load_state_dict"), ("load_state_dict", "state_dict"))
_NEEDS_STATE = ("state_holds_records", "state_payloads_lazy")
_KNOWN = frozenset(
    {
        "state_dict",
        "load_state_dict",
        "state_holds_records",
        "state_payloads_lazy",
        "on_marker",
        "pending_target",
        "reads_payload",
    }
)
_NEAR = {
    "statedict": "state_dict",
    "state_dicts": "state_dict",
    "get_state": "state_dict",
    "load_state": "load_state_dict",
    "set_state": "load_state_dict",
    "load_state_dicts": "load_state_dict",
    "holds_records": "state_holds_records",
    "state_hold_records": "state_holds_records",
    "payloads_lazy": "state_payloads_lazy",
    "state_payload_lazy": "state_payloads_lazy",
    "onmarker": "on_marker",
    "on_markers": "on_marker",
    "pending_targets": "pending_target",
    "read_payload": "reads_payload",
    "reads_payloads": "reads_payload",
}


def check_accumulator(acc: object, op_name: str | None = None) -> None:
    """Raise ``ContractError`` naming ``op_name`` for a half-implemented or misspelled hook.

    Half-implemented: one of ``state_dict`` / ``load_state_dict`` without the other, or
    ``state_holds_records`` / ``state_payloads_lazy`` set without lane state. Misspelled: an
    attribute close to a hook name (``statedict``, ``load_state``, ``on_markers``, ...).
    """
    where = f"accumulator {type(acc).__name__}" + (f" of operator {op_name!r}" if op_name else "")
    names = set(dir(acc))
    for have, missing in _PAIRS:
        if have in names and missing not in names:
            raise ContractError(
                f"{where} defines {have} but not {missing}: lane state needs both, or a "
                "restore could not put the lane back"
            )
    stateful = isinstance(acc, LaneStateful)
    for flag in _NEEDS_STATE:
        if bool(getattr(acc, flag, False)) and not stateful:
            raise ContractError(
                f"{where} sets {flag} but has no lane state (state_dict and load_state_dict)"
            )
    if bool(getattr(acc, "state_payloads_lazy", False)) and not isinstance(acc, HoldsRecords):
        raise ContractError(f"{where} sets state_payloads_lazy without state_holds_records")
    for name in sorted(names - _KNOWN):
        hook = _NEAR.get(name.lower())
        if hook is not None and hook not in names:
            raise ContractError(f"{where} defines {name!r}: did you mean {hook!r}?")


def holds_records(acc: object) -> bool:
    """Whether ``acc``'s lane state names buffered records (written by meta, rebuilt later)."""
    return isinstance(acc, HoldsRecords) and bool(acc.state_holds_records)


def payloads_lazy(acc: object) -> bool:
    """Whether ``acc``'s held records get their payloads only as they leave it."""
    return isinstance(acc, LazyPayloads) and bool(acc.state_payloads_lazy)


__all__ = ["holds_records", "payloads_lazy"]

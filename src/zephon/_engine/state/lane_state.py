"""Snapshots of stateful accumulators at the points a lane can be restored from.

A restore regenerates a lane from a restart point and replays every record from there; each
stateful accumulator must then start from its state at that point, not from a fresh one.

In a monotone plan the restart point is the start of the lane's oldest chunk in flight: the
stage records ``state_dict(lane)`` just before it pushes the first record of a newer chunk,
a state that holds for every chunk start since the last record it saw (state only changes when
records are pushed). In a plan that changes order the restart points are the cuts of snapshot
markers (and epoch starts): the stage records the state as each marker passes. A checkpoint
asks for the state at its lane's restart point; older entries are forgotten as the tail
passes newer restart points.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

from zephon.errors import CheckpointError, ContractError
from zephon.ops import LaneStateful


def has_lane_state(accumulator: object) -> TypeGuard[LaneStateful]:
    """Whether ``accumulator`` keeps per-lane state (``zephon.ops.LaneStateful``)."""
    return isinstance(accumulator, LaneStateful)


def frozen_copy(state: Any, op_name: str) -> Any:
    """A JSON round trip: a copy later pushes cannot change, and proof that it is JSON-safe."""
    try:
        return json.loads(json.dumps(state))
    except (TypeError, ValueError) as exc:
        raise ContractError(
            f"accumulator of operator {op_name!r}: state_dict() must return JSON-safe data "
            f"(dicts, lists, str, int, float, bool, None): {exc}"
        ) from None


RestartPoint = tuple[int, int]
"""``(chunk id, offset)``: a cut in a lane's stream, before record ``offset`` of that chunk."""


class LaneStateLog:
    """Per lane: ``(first, last, state)`` entries over positions, oldest first (thread-safe).

    Two ways to fill it. In a monotone plan ``record`` is called before the first record of
    every newer chunk, and the entry holds for every chunk start since the last record. In a
    plan with snapshots ``record_cut`` is called as each snapshot marker passes the stage, and
    the entry holds at that cut only. ``freeze`` makes the copy later pushes cannot change.
    """

    def __init__(
        self,
        op_name: str,
        starts: Mapping[int, RestartPoint],
        freeze: Callable[[Any, str], Any] = frozen_copy,
    ) -> None:
        self.op_name = op_name
        self._freeze = freeze
        self._starts = dict(starts)
        self._last_chunk = {lane: start[0] - 1 for lane, start in starts.items()}
        self._entries: dict[int, deque[tuple[RestartPoint, RestartPoint, Any]]] = {
            lane: deque() for lane in starts
        }
        self._initial: dict[int, Any] = {}
        self._lock = threading.Lock()

    def set_initial(self, lane: int, state: Any) -> None:
        self._initial[lane] = self._freeze(state, self.op_name)

    def is_new_chunk(self, lane: int, chunk_id: int) -> bool:
        return chunk_id > self._last_chunk.get(lane, chunk_id)

    def record(self, lane: int, chunk_id: int, state: Any) -> None:
        """``state`` is the lane's state at the start of every chunk since the last record,
        up to ``chunk_id`` (called before the first record of ``chunk_id`` is pushed, and after
        the flush at an epoch boundary ``chunk_id``)."""
        last = self._last_chunk[lane]
        if chunk_id <= last:
            return
        entry = ((last + 1, 0), (chunk_id, 0), self._freeze(state, self.op_name))
        with self._lock:
            self._entries[lane].append(entry)
            self._last_chunk[lane] = chunk_id

    def record_cut(self, lane: int, position: RestartPoint, state: Any) -> None:
        """``state`` is the lane's state at the cut ``position`` (a snapshot marker passed)."""
        entry = (position, position, self._freeze(state, self.op_name))
        with self._lock:
            self._entries[lane].append(entry)
            self._last_chunk[lane] = max(self._last_chunk.get(lane, -1), position[0])

    def forget_below(self, lane: int, position: RestartPoint) -> None:
        """Positions below ``position`` are delivered: no restore starts there any more."""
        with self._lock:
            entries = self._entries.get(lane)
            while entries and entries[0][1] < position:
                entries.popleft()

    def state_at(self, lane: int, chunk_id: int, offset: int = 0) -> Any:
        """The lane's state at the cut ``(chunk_id, offset)`` (a checkpoint's restart point)."""
        position = (chunk_id, offset)
        with self._lock:
            if position == self._starts.get(lane):
                return self._initial.get(lane)  # where this run started: nothing pushed before
            for first, last, state in reversed(self._entries.get(lane, ())):
                if first <= position <= last:
                    return state
        raise CheckpointError(
            f"no saved state of operator {self.op_name!r} for lane {lane} at chunk {chunk_id}"
            + (f" offset {offset}" if offset else "")
        )

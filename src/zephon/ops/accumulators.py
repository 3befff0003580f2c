"""Accumulators: the serial half of an operator, deciding how elements group into micro-batches.

The runner calls an accumulator from one thread only, with elements in upstream order. Any
state that spans ``process_many`` calls lives here, keyed by lane, so that a lane's output is a
pure function of that lane's input. Flush sentinels call ``flush(reset=True, lane_id=lane)``;
afterwards the lane must be indistinguishable from a fresh accumulator.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from operator import attrgetter

from zephon.errors import ConfigError
from zephon.types import LaneId, StreamItem, tombstones_for_record

MicroBatch = list[StreamItem]
_LANE_OF = attrgetter("meta.lane_id")


class Accumulator(abc.ABC):
    """Groups incoming elements into micro-batches; see the module docstring for the contract."""

    reads_payload: bool = False
    """False: only metadata is inspected, so the runner may leave payloads unresolved."""

    @abc.abstractmethod
    def push_many(self, elems: Sequence[StreamItem]) -> list[MicroBatch]:
        """Consume ``elems`` (stream order) and return the micro-batches now ready."""

    @abc.abstractmethod
    def flush(self, *, reset: bool = False, lane_id: LaneId | None = None) -> list[MicroBatch]:
        """Emit what is buffered: every lane at end of stream, or one lane at a sentinel."""

    @abc.abstractmethod
    def has_pending_data(self, lane_id: LaneId | None = None) -> bool:
        """Whether a flush (of ``lane_id``, or of any lane) would produce anything."""

    def try_epoch_reset(self, boundary_chunk_id: int, lane_id: LaneId) -> bool:
        """Whether a stalled sentinel for ``lane_id`` can be released now (conservative)."""
        return not self.has_pending_data(lane_id)

    def poll(self, now_ns: int) -> list[MicroBatch]:
        """Micro-batches due by a latency bound at ``now_ns``; none unless latency is enabled."""
        return []

    def next_deadline_ns(self) -> int | None:
        """When ``poll`` will next have something to emit, or ``None``."""
        return None


class PassthroughAccumulator(Accumulator):
    """Forwards each pushed group as one micro-batch, immediately, keeping no state."""

    def push_many(self, elems: Sequence[StreamItem]) -> list[MicroBatch]:
        return [list(elems)] if elems else []

    def flush(self, *, reset: bool = False, lane_id: LaneId | None = None) -> list[MicroBatch]:
        return []

    def has_pending_data(self, lane_id: LaneId | None = None) -> bool:
        return False


class CountingAccumulator(Accumulator):
    """Per-lane buffers emitted at ``max_batch`` elements (or after ``max_latency_ms``).

    Lanes never share a micro-batch, so one lane's flush leaves the others untouched. With
    ``drop_last`` the partial buffers are not emitted at end of stream; tombstones account for
    the dropped records instead. Pass ``max_latency_ms=None`` when ``deterministic`` is set:
    a latency bound makes boundaries depend on the clock.
    """

    def __init__(
        self, max_batch: int, max_latency_ms: float | None = None, *, drop_last: bool = False
    ) -> None:
        if max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
        if max_latency_ms is not None and max_latency_ms <= 0:
            raise ConfigError(f"max_latency_ms must be positive or None, got {max_latency_ms}")
        self.max_batch = max_batch
        self.max_latency_ns = None if max_latency_ms is None else int(max_latency_ms * 1e6)
        self.drop_last = drop_last
        self._buffers: dict[LaneId, list[StreamItem]] = {}
        self._first_arrival_ns: dict[LaneId, int] = {}

    def push_many(self, elems: Sequence[StreamItem]) -> list[MicroBatch]:
        if not elems:
            return []
        lanes = list(map(_LANE_OF, elems))
        if lanes.count(lanes[0]) == len(lanes):  # one lane (the feeder's slices are)
            return self._push_lane(lanes[0], elems)
        ready: list[MicroBatch] = []
        buffers = self._buffers
        max_batch = self.max_batch
        track_latency = self.max_latency_ns is not None
        for elem in elems:
            lane = elem.meta.lane_id
            buf = buffers.get(lane)
            if buf is None:
                buf = buffers[lane] = []
            if track_latency and not buf:
                self._first_arrival_ns[lane] = time.monotonic_ns()
            buf.append(elem)
            if len(buf) >= max_batch:
                ready.append(buf)
                buffers[lane] = []
        if track_latency:
            ready.extend(self.poll(time.monotonic_ns()))
        return ready

    def _push_lane(self, lane: LaneId, elems: Sequence[StreamItem]) -> list[MicroBatch]:
        """``push_many`` of elements of one lane: whole slices, no per-element step."""
        buf = self._buffers.get(lane)
        if not buf:
            if self.max_latency_ns is not None:
                self._first_arrival_ns[lane] = time.monotonic_ns()
            buf = []
        buf.extend(elems)
        size = self.max_batch
        ready: list[MicroBatch] = []
        if len(buf) >= size:
            full = len(buf) - len(buf) % size
            ready = [buf[i : i + size] for i in range(0, full, size)]
            buf = buf[full:]
            if buf and self.max_latency_ns is not None:
                self._first_arrival_ns[lane] = time.monotonic_ns()
        self._buffers[lane] = buf
        if self.max_latency_ns is not None:
            ready.extend(self.poll(time.monotonic_ns()))
        return ready

    def poll(self, now_ns: int) -> list[MicroBatch]:
        if self.max_latency_ns is None:
            return []
        ready: list[MicroBatch] = []
        for lane, buf in self._buffers.items():
            if buf and now_ns - self._first_arrival_ns.get(lane, now_ns) >= self.max_latency_ns:
                ready.append(buf)
                self._buffers[lane] = []
        return ready

    def next_deadline_ns(self) -> int | None:
        if self.max_latency_ns is None:
            return None
        pending = [self._first_arrival_ns[lane] for lane, buf in self._buffers.items() if buf]
        return min(pending) + self.max_latency_ns if pending else None

    def flush(self, *, reset: bool = False, lane_id: LaneId | None = None) -> list[MicroBatch]:
        lanes = sorted(self._buffers) if lane_id is None else [lane_id]
        out: list[MicroBatch] = []
        for lane in lanes:
            buf = self._buffers.pop(lane, None)
            self._first_arrival_ns.pop(lane, None)
            if not buf:
                continue
            if self.drop_last:
                out.append(self._drop(buf))
            else:
                out.append(buf)
        return out

    def _drop(self, buf: list[StreamItem]) -> MicroBatch:
        dropped: MicroBatch = []
        for elem in buf:
            dropped.extend(tombstones_for_record(elem, reason="drop_last: partial batch"))
        return dropped

    def has_pending_data(self, lane_id: LaneId | None = None) -> bool:
        if lane_id is None:
            return any(self._buffers.values())
        return bool(self._buffers.get(lane_id))

    def pending(self, lane_id: LaneId) -> list[StreamItem]:
        """The buffered elements of ``lane_id`` (read-only view for subclasses and tests)."""
        return list(self._buffers.get(lane_id, ()))

    def set_pending(self, lane_id: LaneId, elems: Sequence[StreamItem]) -> None:
        """Make ``elems`` the buffer of ``lane_id`` (a subclass's ``load_state_dict``)."""
        self._first_arrival_ns.pop(lane_id, None)
        if not elems:
            self._buffers.pop(lane_id, None)
            return
        self._buffers[lane_id] = list(elems)
        if self.max_latency_ns is not None:
            self._first_arrival_ns[lane_id] = time.monotonic_ns()


__all__: list[str] = []  # its public names are exported by zephon.ops

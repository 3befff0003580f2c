"""The serial half of running one operator, shared by every runner.

:class:`StageCore` feeds elements to the operator's accumulator, handles control elements
(tombstones pass through, flush sentinels flush and reset one lane, ``batch(drop_last=True)``
may hold a sentinel back), and turns everything into sequence-numbered :class:`Task` s. A runner
executes the tasks that need work (``process_many``) wherever it likes and releases results
through a :class:`~zephon._engine.handoff.reorder.ReorderBuffer`; that is the whole
determinism story.
"""

from __future__ import annotations

import contextlib
import enum
import time
import traceback
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from zephon._engine.state.lane_state import LaneStateLog
from zephon._engine.stats import OpStats
from zephon.errors import OUT_OF_MEMORY_FIX, ContractError
from zephon.ops import (
    Accumulator,
    BaseOp,
    LaneStateful,
    MarkerObserver,
    PendingTarget,
    check_accumulator,
)
from zephon.types import (
    EndOfData,
    FlushSentinel,
    SampleBatch,
    SampleRecord,
    SnapshotMarker,
    StreamItem,
    Tombstone,
    is_control,
)

_CONTROL_OF = attrgetter("meta.control")
_ELEMENT_TYPES = frozenset({SampleRecord, SampleBatch})


def any_control(items: Sequence[StreamItem]) -> bool:
    """Whether any of ``items`` is a control element; C-level iteration, since every stage
    asks it of every micro-batch."""
    return any(map(_CONTROL_OF, items))


Resolver = Callable[[Sequence[StreamItem]], bool]
"""Gives the restored records of one emitted micro-batch their payloads; says whether any are
still waiting (see ``OperatorStates.resolver``)."""


@dataclass(slots=True)
class Task:
    """One micro-batch: ``work`` goes through ``process_many``; ``passthrough`` follows it;
    ``inner`` holds snapshot markers that ride inside it (see :func:`task_result`)."""

    seq: int
    work: list[StreamItem]
    passthrough: list[StreamItem] = field(default_factory=list)
    inner: list[StreamItem] | None = None

    @property
    def needs_worker(self) -> bool:
        return bool(self.work)


class UnsupportedElementError(ContractError, TypeError):
    """``process_many`` returned something that is not a SampleRecord or SampleBatch."""


def call_process_many(op: BaseOp, elems: list[StreamItem]) -> list[StreamItem]:
    """Run ``op.process_many`` (``process_one`` for a single element) and check the output."""
    out = op.process_one(elems[0]) if len(elems) == 1 else op.process_many(elems)
    if not isinstance(out, list):
        out = list(out)
    if _ELEMENT_TYPES.issuperset(map(type, out)):
        return out
    for item in out:
        if not isinstance(item, (SampleRecord, SampleBatch)):
            cls = type(item)
            raise UnsupportedElementError(
                f"Unsupported element type {cls.__name__!r} returned by operator {op.name!r}: "
                "process_many must return SampleRecord objects (or SampleBatch objects after "
                "batch); rebuild the payload and keep the meta, e.g. "
                "SampleRecord(elem.meta, new_payload)"
            )
    return out


def _position(item: StreamItem) -> tuple[int, int]:
    meta = item.meta
    return meta.chunk_id, meta.chunk_offset


def place_markers(result: list[StreamItem], markers: Sequence[StreamItem]) -> list[StreamItem]:
    """``result`` (in source order) with each marker before the first element at or after its
    cut: the order a stage that split the micro-batch at the marker would have emitted."""
    out: list[StreamItem] = []
    start = 0
    for marker in markers:
        at = bisect_left(result, _position(marker), lo=start, key=_position)
        out.extend(result[start:at])
        out.append(marker)
        start = at
    out.extend(result[start:])
    return out


def task_result(task: Task, result: list[StreamItem]) -> list[StreamItem]:
    """What ``task`` emits once ``process_many`` returned ``result``: riding markers in place,
    then the passthrough."""
    if task.inner:
        result = place_markers(result, task.inner)
    if task.passthrough:
        result = [*result, *task.passthrough]
    return result


def annotate(exc: BaseException, op_name: str) -> BaseException:
    """Name the operator on an exception raised in a worker, keeping its type and traceback."""
    if getattr(exc, "zephon_op_name", None) is None:
        with contextlib.suppress(AttributeError):
            exc.zephon_op_name = op_name  # type: ignore[attr-defined]
        tb = "".join(traceback.format_exception(exc)).rstrip()
        exc.add_note(f"raised in operator {op_name!r}; worker traceback:\n{tb}")
        if isinstance(exc, MemoryError):
            exc.add_note(f"operator {op_name!r}: {OUT_OF_MEMORY_FIX}")
    return exc


def safe_annotate(exc: BaseException, op_name: str) -> BaseException:
    """:func:`annotate`, or ``exc`` as it is where even that fails (no memory left, notes
    that are not a list): reporting an error must never raise another."""
    try:
        return annotate(exc, op_name)
    except BaseException:
        return exc


def _no_state(lane_id: int) -> None:
    return None


class MarkerMode(enum.Enum):
    """What a stage does when a snapshot marker of a lane reaches it.

    ``SNAPSHOT``: record the accumulator's lane state for that cut (a marker behind a flush
    sentinel the stage holds back waits, and records it once the lane has emptied). ``FLUSH``:
    an element-wise stage emits the lane's partial micro-batch first, so nothing pushed before
    the cut leaves after it. ``RIDE``: an element-wise stage whose input is in source order
    keeps the marker with the lane's partial micro-batch instead, and puts it back into that
    micro-batch's output by its cut (:func:`place_markers`): the same order, without halving
    the micro-batch at every cut. ``HOLD``: a stage after the replay filter without lane state
    keeps the marker until the lane's partial batch has left, and stamps it with that batch's
    cursor: a restore at the cut re-delivers up to there, and the replay filter drops it.
    ``REPLAY``: the replay filter stamps the marker with the cursor it still waits for.
    ``PASS``: nothing to do.
    """

    PASS = "pass"
    SNAPSHOT = "snapshot"
    FLUSH = "flush"
    RIDE = "ride"
    HOLD = "hold"
    REPLAY = "replay"


class StageCore:
    """Accumulator handling and sequence numbering for one operator (single-threaded)."""

    def __init__(
        self,
        op: BaseOp,
        accumulator: Accumulator,
        *,
        stalls_sentinels: bool,
        stats: OpStats | None = None,
        lanes: Sequence[int] = (),
        state_log: LaneStateLog | None = None,
        marker_mode: MarkerMode = MarkerMode.PASS,
    ) -> None:
        self.op = op
        self.marker_mode = marker_mode
        # A batching stage's state at a chunk start is never asked for: a restart there comes
        # after its lane delivered, which emptied what it held (see ``OpTraits.batches``).
        self._chunk_snapshots = (
            state_log is not None
            and marker_mode is not MarkerMode.SNAPSHOT
            and not op.traits().batches
        )
        # Markers wait behind a stalled sentinel (and, in hold mode, behind a partial batch):
        # track the lane's emitted micro-batches to stamp them when they leave.
        self._holds_markers = marker_mode is MarkerMode.HOLD or (
            marker_mode is MarkerMode.SNAPSHOT and stalls_sentinels
        )
        # hold mode: lane -> (micro-batches emitted, cursor of the last one's last element)
        self._last_out: dict[int, tuple[int, Any]] = {}
        self._held_at: dict[int, int] = {}  # id(held marker) -> lane's emitted count then
        # after a restore: gives restored records their payloads as they leave; False when
        # none is left (then unset)
        self.resolve: Resolver | None = None
        self.lanes = tuple(lanes)
        self.stats = stats
        self.acc = accumulator
        self.state_log = state_log
        check_accumulator(accumulator, op.name)
        self._state_of: Callable[[int], Any] = (
            accumulator.state_dict if isinstance(accumulator, LaneStateful) else _no_state
        )
        self.stalls_sentinels = stalls_sentinels
        self._next_seq = 0
        self._held: dict[int, deque[StreamItem]] = {}
        self._riding: dict[int, list[StreamItem]] = {}  # ride mode: lane -> markers
        self._on_marker = accumulator.on_marker if isinstance(accumulator, MarkerObserver) else None
        self._pending_target: Callable[[int], Any] | None = (
            accumulator.pending_target if isinstance(accumulator, PendingTarget) else None
        )

    def _task(self, work: list[StreamItem], passthrough: list[StreamItem] | None = None) -> Task:
        seq = self._next_seq
        self._next_seq += 1
        return Task(seq, work, passthrough if passthrough is not None else [])

    @property
    def reads_payload(self) -> bool:
        return self.acc.reads_payload

    def next_deadline_ns(self) -> int | None:
        return self.acc.next_deadline_ns()

    @property
    def dispatched(self) -> int:
        return self._next_seq

    def _tasks_for(self, batches: Sequence[list[StreamItem]], out: list[Task]) -> None:
        hold = self._holds_markers
        for mb in batches:
            if not mb:
                continue
            if self.resolve is not None and not self.resolve(mb):
                self.resolve = None
            if hold:
                lane = mb[-1].meta.lane_id
                count = self._last_out.get(lane, (0, None))[0]
                self._last_out[lane] = (count + 1, mb[-1].meta.cursor)
            if self._riding and (inner := self._riding.pop(mb[0].meta.lane_id, None)):
                task = self._task(mb)
                task.inner = inner
                out.append(task)
                continue
            if not any_control(mb):  # fast path: plain records only
                out.append(self._task(mb))
                continue
            work = [e for e in mb if not is_control(e)]
            if len(work) == len(mb):
                out.append(self._task(mb))
            else:
                out.append(self._task(work, [e for e in mb if is_control(e)]))

    def feed(self, items: Sequence[StreamItem]) -> list[Task]:
        """Push ``items`` (stream order) and return the tasks they make ready."""
        stats = self.stats
        if stats is None:
            return self._feed(items)
        start = time.perf_counter_ns()
        out = self._feed(items)
        stats.accumulator_ns += time.perf_counter_ns() - start
        return out

    def _feed(self, items: Sequence[StreamItem]) -> list[Task]:
        out: list[Task] = []
        if not any_control(items):  # fast path: no control element among them
            if items:
                self._push(items, out)
            return out
        run_start = 0
        n = len(items)
        i = 0
        while i < n:
            item = items[i]
            if item.meta.control is None:
                i += 1
                continue
            if run_start < i:
                self._push(items[run_start:i], out)
            j = i
            while j < n and is_control(items[j]):
                j += 1
            self._control(items[i:j], out)
            i = j
            run_start = j
        if run_start < n:
            self._push(items[run_start:n] if run_start else items, out)
        return out

    def _push(self, data: Sequence[StreamItem], out: list[Task]) -> None:
        if self.stats is not None:
            self.stats.elements_in += len(data)
        if self._chunk_snapshots:
            self._push_snapshotting(data, out)
        elif self._held and self._holds_markers:
            self._push_releasing(data, out)
            return
        else:
            self._tasks_for(self.acc.push_many(data), out)
        if self._held:
            self._release_held(out)

    def _push_releasing(self, data: Sequence[StreamItem], out: list[Task]) -> None:
        """Push one element at a time while markers are held, so each leaves right after the
        batch that empties its lane (not at the end of the run, when another has begun)."""
        for i, item in enumerate(data):
            self._tasks_for(self.acc.push_many([item]), out)
            self._release_held(out)
            if not self._held:
                if i + 1 < len(data):
                    self._tasks_for(self.acc.push_many(data[i + 1 :]), out)
                return

    def _push_snapshotting(self, data: Sequence[StreamItem], out: list[Task]) -> None:
        """Push ``data``, recording the lane state before the first record of each new chunk."""
        log = self.state_log
        assert log is not None
        acc = self.acc
        start = 0
        for i, item in enumerate(data):
            meta = item.meta
            if log.is_new_chunk(meta.lane_id, meta.chunk_id):
                if start < i:
                    self._tasks_for(acc.push_many(data[start:i]), out)
                    start = i
                log.record(meta.lane_id, meta.chunk_id, self._state_of(meta.lane_id))
        self._tasks_for(acc.push_many(data[start:] if start else data), out)

    def _snapshot_at_boundary(self, lane: int, boundary: int) -> None:
        """After an epoch boundary's flush: the state a replay from ``boundary`` starts with."""
        log = self.state_log
        if log is None:
            return
        if self._chunk_snapshots:
            log.record(lane, boundary, self._state_of(lane))
        else:
            log.record_cut(lane, (boundary, 0), self._state_of(lane))

    def _control(self, controls: Sequence[StreamItem], out: list[Task]) -> None:
        passthrough: list[StreamItem] = []
        for item in controls:
            control = item.meta.control
            if self._on_marker is not None and not isinstance(control, Tombstone):
                self._on_marker(item)
            if isinstance(control, SnapshotMarker):
                if passthrough:
                    out.append(self._task([], passthrough))
                    passthrough = []
                self._cut(item, control, out)
                continue
            if isinstance(control, EndOfData):
                if passthrough:
                    out.append(self._task([], passthrough))
                    passthrough = []
                self._end_lane(item, out)
                continue
            if not isinstance(control, FlushSentinel):
                if self._riding and item.meta.lane_id in self._riding:
                    if passthrough:  # a tombstone never overtakes a riding marker
                        out.append(self._task([], passthrough))
                        passthrough = []
                    self._flush_riding(item.meta.lane_id, out)
                passthrough.append(item)
                continue
            lane = item.meta.lane_id
            if self.stalls_sentinels and (lane in self._held or self.acc.has_pending_data(lane)):
                self._held.setdefault(lane, deque()).append(item)
                continue
            if passthrough:
                out.append(self._task([], passthrough))
                passthrough = []
            self._flush_lane(lane, out)
            for marker in self._held.pop(lane, ()):  # held markers were cut before the flush
                out.append(self._task([], [self._release_marker(marker, lane)]))
            self._snapshot_at_boundary(lane, control.boundary_chunk_id)
            out.append(self._task([], [item]))
        if passthrough:
            out.append(self._task([], passthrough))

    def _cut(self, marker: StreamItem, cut: SnapshotMarker, out: list[Task]) -> None:
        """A snapshot marker (``cut``, its control): act on it by ``marker_mode`` (see
        ``MarkerMode``)."""
        lane = marker.meta.lane_id
        mode = self.marker_mode
        # Behind a held sentinel the marker waits too (in snapshot mode the cut's state is
        # then recorded once the lane has emptied); in hold mode also behind a partial batch.
        waits = lane in self._held or (mode is MarkerMode.HOLD and self.acc.has_pending_data(lane))
        if waits and mode in (MarkerMode.SNAPSHOT, MarkerMode.HOLD):
            self._held.setdefault(lane, deque()).append(marker)
            self._held_at[id(marker)] = self._last_out.get(lane, (0, None))[0]
            return
        if mode is MarkerMode.SNAPSHOT and self.state_log is not None:
            self.state_log.record_cut(lane, cut.position, self._state_of(lane))
        elif mode is MarkerMode.FLUSH and self.acc.has_pending_data(lane):
            self._tasks_for(self.acc.flush(reset=True, lane_id=lane), out)
        elif mode is MarkerMode.RIDE and self.acc.has_pending_data(lane):
            self._riding.setdefault(lane, []).append(marker)
            return
        elif mode is MarkerMode.REPLAY:
            pending = self._pending_target
            target = pending(lane) if pending is not None else None
            if target is not None:
                stamped = SnapshotMarker(cut.position, target)
                marker = SampleRecord(marker.meta.with_control(stamped), None)
        out.append(self._task([], [marker]))

    def _flush_riding(self, lane: int, out: list[Task]) -> None:
        """Emit the lane's partial micro-batch with its riding markers (and any marker the
        flush left behind)."""
        self._tasks_for(self.acc.flush(reset=True, lane_id=lane), out)
        left = self._riding.pop(lane, None)
        if left:
            out.append(self._task([], left))

    def _end_lane(self, marker: StreamItem, out: list[Task]) -> None:
        """A lane's stream ended: emit everything of that lane, then the marker."""
        lane = marker.meta.lane_id
        self._flush_checked(lane, out, at="at the end of data")
        if self._riding and (left := self._riding.pop(lane, None)):
            out.append(self._task([], left))
        held = self._held.pop(lane, None) or ()
        for item in held:
            self._held_at.pop(id(item), None)  # the lane ends: no snapshot after this
        out.append(self._task([], [*held, marker]))

    def _flush_lane(self, lane: int, out: list[Task]) -> None:
        self._flush_checked(lane, out, at="at a flush sentinel")
        if self._riding and (left := self._riding.pop(lane, None)):
            out.append(self._task([], left))

    def _flush_checked(self, lane: int, out: list[Task], *, at: str) -> None:
        """``flush(reset=True, lane_id=lane)``, checking it emitted and reset only that lane.

        Data an accumulator kept after such a flush would never be delivered (the lane's
        stream has moved on, or ended), so breaking the rule is an error, never a silent loss.
        """
        acc = self.acc
        name = self.op.name
        others = [other for other in self.lanes if other != lane and acc.has_pending_data(other)]
        flushed = acc.flush(reset=True, lane_id=lane)
        for mb in flushed:
            for elem in mb:
                if elem.meta.lane_id != lane:
                    raise ContractError(
                        f"accumulator of operator {name!r} emitted a lane "
                        f"{elem.meta.lane_id} element {at} of lane {lane}; "
                        f"flush(reset=True, lane_id={lane}) must emit and reset that lane only"
                    )
        emptied = [other for other in others if not acc.has_pending_data(other)]
        if emptied:
            raise ContractError(
                f"accumulator of operator {name!r}: flush(reset=True, lane_id={lane}) {at} "
                f"also emptied lane(s) {emptied}; it must leave other lanes untouched"
            )
        self._tasks_for(flushed, out)
        if acc.has_pending_data(lane):
            raise ContractError(
                f"accumulator of operator {name!r} still has pending data for lane {lane} "
                f"after flush(reset=True, lane_id={lane}) {at}; the records it kept would "
                "never be delivered. A lane flush must emit everything of that lane and leave "
                "it as fresh as a new accumulator"
            )

    def _release_held(self, out: list[Task]) -> None:
        for lane in list(self._held):
            queue = self._held[lane]
            while queue:
                control = queue[0].meta.control
                if isinstance(control, SnapshotMarker):
                    if self.acc.has_pending_data(lane):
                        break
                    marker = self._release_marker(queue.popleft(), lane)
                    if self.marker_mode is MarkerMode.SNAPSHOT and self.state_log is not None:
                        self.state_log.record_cut(lane, control.position, self._state_of(lane))
                    out.append(self._task([], [marker]))
                    continue
                assert isinstance(control, FlushSentinel)  # only markers and sentinels are held
                boundary = control.boundary_chunk_id
                if not self.acc.try_epoch_reset(boundary, lane):
                    break
                self._snapshot_at_boundary(lane, boundary)
                out.append(self._task([], [queue.popleft()]))
            if not queue:
                del self._held[lane]

    def _release_marker(self, marker: StreamItem, lane: int) -> StreamItem:
        """A held marker leaves after the batch that emptied the lane: a restore at its cut
        re-delivers everything up to that batch's last record (the replay filter drops it)."""
        count, last = self._last_out.get(lane, (0, None))
        if last is None or count == self._held_at.pop(id(marker), count):
            return marker
        cut = marker.meta.control
        assert isinstance(cut, SnapshotMarker)
        return SampleRecord(marker.meta.with_control(SnapshotMarker(cut.position, last)), None)

    def poll(self, now_ns: int) -> list[Task]:
        """Tasks due by a latency bound (non-deterministic mode only)."""
        out: list[Task] = []
        self._tasks_for(self.acc.poll(now_ns), out)
        return out

    def finish(self) -> list[Task]:
        """End of stream: flush every lane, then release any held sentinels."""
        out: list[Task] = []
        self._tasks_for(self.acc.flush(reset=False, lane_id=None), out)
        for lane in sorted(self._riding):
            out.append(self._task([], self._riding[lane]))
        self._riding.clear()
        for lane in sorted(self._held):
            out.append(self._task([], list(self._held[lane])))
        self._held.clear()
        self._held_at.clear()
        return out

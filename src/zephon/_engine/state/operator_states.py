"""The lane states of a plan's stateful accumulators: loaded at a restore, logged at every
restart point while running, and written into checkpoints.

A state that names buffered records (``snapshot_codec``) is kept with the record objects while
running (cheap: the accumulator returns fresh containers) and encoded only when a checkpoint
asks for it. At a restore those records' payloads are rebuilt from the source first
(``snapshots.Rebuilder``), then every state is loaded.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from zephon._engine.state.lane_state import LaneStateLog, RestartPoint, frozen_copy
from zephon._engine.state.snapshots import Rebuilder, Role, holds_records
from zephon._snapshot_codec import (
    HeldPayloads,
    HeldRecord,
    decode,
    encode,
    fill,
    held_records,
    materialize,
    pack_state,
    unpack_state,
)
from zephon.checkpoints import LaneCheckpoint
from zephon.errors import CheckpointError
from zephon.ops import BaseOp, LaneStateful, OpContext
from zephon.ops.state import payloads_lazy
from zephon.types import TAG_PACKING, SampleCursor, SampleMeta, SampleRecord

# Tags of lazily restored records decoded only when their payload is rebuilt: a packed
# record's packing metadata (its segments) is most of its meta, and nothing reads it while
# the record waits in a shuffle or mixture buffer.
DEFERRED_TAGS = frozenset({TAG_PACKING})


class PendingPayload:
    """The payload of a restored record that is rebuilt when it leaves its accumulator."""

    __slots__ = ("index", "lane", "meta")

    def __init__(self, index: int, lane: int, meta: SampleMeta) -> None:
        self.index = index
        self.lane = lane
        self.meta = meta


def _shared(state: Any, op_name: str) -> Any:
    """States with records are fresh containers already; they are encoded at checkpoint."""
    return state


def _records_in(state: Any) -> Iterator[SampleRecord]:
    """The records a live lane state holds, at any depth."""
    if isinstance(state, SampleRecord):
        yield state
    elif isinstance(state, dict):
        for value in state.values():
            yield from _records_in(value)
    elif isinstance(state, list | tuple):
        for value in state:
            yield from _records_in(value)


class OperatorStates:
    """Every stateful stage's :class:`LaneStateLog`, by stage index."""

    def __init__(
        self,
        starts: Mapping[int, RestartPoint],
        restored: Mapping[int, LaneCheckpoint] | None,
        key_of: Callable[[int], str],
        flush_every_k_chunks: int,
    ) -> None:
        self.starts = dict(starts)
        self.restored = restored  # the restored checkpoint's lanes (None: no restore)
        self.key_of = key_of
        self.k = flush_every_k_chunks
        self.logs: dict[int, LaneStateLog] = {}
        self._records: set[int] = set()  # stages whose states hold records
        self._pending: list[tuple[int, BaseOp, LaneStateful, int, Any]] = []
        self.refetched = 0  # base records read again at the restore
        # stage -> restored records still waiting for payloads when they leave that stage
        self.lazy: dict[int, int] = {}
        self._rebuilder: Rebuilder | None = None
        self._set_up: list[tuple[BaseOp, OpContext]] = []
        self._ready: list[BaseOp] = []  # operator copies set up for the rebuild
        self._lock = threading.Lock()
        self._at: dict[int, tuple[RestartPoint, bool, dict[str, Any]]] = {}  # lane -> last encoded
        # batching stages (their held records all leave in the lane's next batch): lane ->
        # their empty state, which is theirs at a restart point the lane delivered after;
        # a checkpoint names such a stage only while it holds records
        self._drained: dict[int, dict[int, Any]] = {}
        self._held_positions: dict[int, tuple[RestartPoint, frozenset[tuple[int, int]]]] = {}

    def attach(self, index: int, op: BaseOp, acc: LaneStateful) -> LaneStateLog:
        """Start logging ``acc``'s lane states; queue the saved ones for :meth:`load`."""
        records = holds_records(acc)
        log = LaneStateLog(op.name, self.starts, _shared if records else frozen_copy)
        if records:
            self._records.add(index)
        self.logs[index] = log
        key = self.key_of(index)
        batches = op.traits().batches
        if batches:
            self._drained[index] = {lane: acc.state_dict(lane) for lane in self.starts}
        for lane in self.starts:
            if self.restored is None:
                log.set_initial(lane, acc.state_dict(lane))
                continue
            saved = self.restored[lane].operator_state or {}
            if key in saved:
                state = unpack_state(saved[key]) if records else saved[key]
                self._pending.append((index, op, acc, lane, state))
            elif self._untouched(lane) or (records and self._at_epoch_start(lane)) or batches:
                # a batching stage is named only while it holds records (and not at all in
                # checkpoints written before it had lane state): here it was empty
                log.set_initial(lane, acc.state_dict(lane))
            else:
                raise CheckpointError(
                    f"checkpoint holds no state of operator {op.name!r} (stage {index}) for "
                    f"lane {lane}, but its accumulator keeps state (state_dict); the checkpoint "
                    "was taken with another version of the operator"
                )
        return log

    def _untouched(self, lane: int) -> bool:
        """A checkpoint taken before the lane delivered anything (before the first item, when
        no accumulator exists yet to ask) holds no state: the initial one is the right one."""
        assert self.restored is not None
        return self.starts[lane] == (0, 0) and self.restored[lane].delivered == 0

    def _at_epoch_start(self, lane: int) -> bool:
        """A restore at an epoch start needs no buffer state: the flush there emptied it."""
        chunk, offset = self.starts[lane]
        return offset == 0 and (chunk == 0 or (self.k > 0 and chunk % self.k == 0))

    def load(
        self,
        ops: Sequence[BaseOp],
        contexts: Sequence[OpContext],
        roles: Sequence[Role],
        resolve_at: Sequence[int],
    ) -> None:
        """Load the queued saved states. Records a state names get their payloads rebuilt now
        (``state_payloads_lazy`` unset) or when they leave stage ``resolve_at[holder]`` (see
        :meth:`resolver`), so a restore waits neither for a whole shuffle buffer nor for
        records the replay filter drops."""
        decoded: list[tuple[int, LaneStateful, int, Any, Any]] = []
        eager: dict[int, list[tuple[int, HeldRecord]]] = {}
        payloads: dict[int, Any] = {}
        for index, _op, acc, lane, saved in self._pending:
            lazy = payloads_lazy(acc)
            defer = DEFERRED_TAGS if lazy else frozenset()
            state = decode(saved, defer) if index in self._records else saved
            named = held_records(state) if index in self._records else []
            if named and lazy:
                payloads.update((id(h), PendingPayload(index, lane, h.meta)) for h in named)
                point = resolve_at[index]
                self.lazy[point] = self.lazy.get(point, 0) + len(named)
            elif named:
                eager.setdefault(index, []).extend((lane, h) for h in named)
            decoded.append((index, acc, lane, state, saved))
        self._pending.clear()
        if eager or self.lazy:
            self._rebuilder = Rebuilder([copy.copy(op) for op in ops], roles)
            self._set_up = list(zip(self._rebuilder.ops, contexts, strict=True))
        if eager:
            payloads.update(self._rebuild(eager))
        for index, acc, lane, state, saved in decoded:
            if index in self._records:
                state = fill(state, payloads)
                self.logs[index].set_initial(lane, state)
            else:
                self.logs[index].set_initial(lane, saved)
            acc.load_state_dict(lane, state)

    def _rebuild(self, held: Mapping[int, Sequence[tuple[int, Any]]]) -> dict[int, Any]:
        """``id(record) -> payload`` for ``held`` records by the stage that holds them."""
        rebuilder = self._rebuilder
        assert rebuilder is not None
        with self._lock:
            while self._set_up and len(self._ready) < max(held):
                op, ctx = self._set_up[len(self._ready)]
                op.setup(ctx)
                self._ready.append(op)
            try:
                payloads: dict[int, Any] = {}
                for index in sorted(held):
                    payloads.update(rebuilder.payloads(index, held[index]))
            except Exception as exc:
                raise CheckpointError(
                    f"a record the checkpoint's operator state names could not be rebuilt "
                    f"({type(exc).__name__}: {exc}); the checkpoint is damaged, or the data or "
                    "the pipeline changed since it was taken"
                ) from exc
            self.refetched = rebuilder.fetched
        return payloads

    def resolver(self, index: int) -> Callable[[Sequence[Any]], bool] | None:
        """For stage ``index`` where lazily restored records get their payloads: a function
        that gives the records of one emitted micro-batch theirs, and says whether any are
        left (the records may have been held by an earlier stage)."""
        if not self.lazy.get(index):
            return None

        def resolve(batch: Sequence[Any]) -> bool:
            waiting = [r for r in batch if type(r.payload) is PendingPayload]
            if waiting:
                held: dict[int, list[tuple[int, HeldRecord]]] = {}
                named = []
                for record in waiting:
                    pending = record.payload
                    h = HeldRecord(materialize(pending.meta))
                    held.setdefault(pending.index, []).append((pending.lane, h))
                    named.append(h)
                rebuilt = self._rebuild(held)
                for record, h in zip(waiting, named, strict=True):
                    record.payload = rebuilt[id(h)]
                    record.meta = materialize(record.meta)
                self.lazy[index] -= len(waiting)
            return self.lazy[index] > 0

        return resolve

    def close(self) -> None:
        """Tear down the operator copies the rebuild set up."""
        with self._lock:
            ready, self._ready = self._ready, []
        for op in ready:
            op.teardown()

    def forget_below(self, lane: int, position: RestartPoint) -> None:
        for log in self.logs.values():
            log.forget_below(lane, position)

    def at(self, lane: int, position: RestartPoint, *, drained: bool = False) -> dict[str, Any]:
        """Each stateful stage's lane state at the restart point, as checkpoint JSON: the same
        object while the restart point stays (a state there never changes once recorded).
        ``drained``: the lane delivered since that point, so batching stages are empty."""
        cached = self._at.get(lane)
        if cached is not None and cached[0] == position:
            if cached[1] == drained:
                return cached[2]
            if drained:  # a batch left since: only the batching stages changed (to empty)
                batching = {self.key_of(index) for index in self._drained}
                out = {key: state for key, state in cached[2].items() if key not in batching}
                self._at[lane] = (position, drained, out)
                return out
        out = self._encode_at(lane, position, None, drained)
        self._at[lane] = (position, drained, out)
        return out

    def batched_at(self, lane: int, position: RestartPoint, cursor: SampleCursor) -> bool:
        """Whether a batching stage held the record of ``cursor`` at the restart point."""
        for index in self._drained:
            try:
                state = self.logs[index].state_at(lane, *position)
            except CheckpointError:  # no cut there: an epoch boundary or a chunk start
                continue
            if any(record.meta.cursor == cursor for record in _records_in(state)):
                return True
        return False

    def held_positions(self, lane: int, position: RestartPoint) -> frozenset[tuple[int, int]]:
        """The source positions ``(chunk id, offset)`` of the records the stages hold at the
        restart point ``position``: a restore there runs them again (cached while it stays)."""
        cached = self._held_positions.get(lane)
        if cached is not None and cached[0] == position:
            return cached[1]
        held: set[tuple[int, int]] = set()
        for index in self._records:
            try:
                state = self.logs[index].state_at(lane, *position)
            except CheckpointError:  # no cut there: an epoch boundary or a chunk start
                continue
            held.update((r.meta.chunk_id, r.meta.chunk_offset) for r in _records_in(state))
        out = frozenset(held)
        self._held_positions[lane] = (position, out)
        return out

    def held_at(
        self, lane: int, position: RestartPoint, *, drained: bool = False
    ) -> tuple[dict[str, Any], bool]:
        """:meth:`at` with the held records' payloads written too (not cached: asked for
        once per checkpoint file), and whether any record carries its payload."""
        held = HeldPayloads()
        out = self._encode_at(lane, position, held, drained)
        return out, held.written > 0

    def _encode_at(
        self, lane: int, position: RestartPoint, held: HeldPayloads | None, drained: bool
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for index, log in sorted(self.logs.items()):
            empty = self._drained.get(index)
            if empty is not None and drained:
                continue  # a batch left since: the batching stage is empty, so left out
            state = log.state_at(lane, *position)
            if empty is not None and state == empty[lane]:
                continue  # an empty batching stage is left out: a restore starts it empty
            if index in self._records:  # record metas: repetitive, so deflated when large
                before = held.written if held is not None else 0
                state = encode(state, f"operator {log.op_name!r} state_dict()", held)
                with_payloads = held is not None and held.written > before
                state = pack_state(state, payloads=with_payloads)
            out[self.key_of(index)] = state
        return out

"""Record identity and the elements that flow through a pipeline.

Every element carries a :class:`SampleMeta`. Its cursor ``(chunk_id, chunk_offset, lineage,
sample_id)`` totally orders the records of one lane and is their identity: the engine uses it
to release results in order, to replay after a restore and to account for every base offset
exactly once (an output or a tombstone closes it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple, TypeAlias

import msgspec

__all__ = [
    "RESERVED_TAGS",
    "TAG_BOUNDARY_CID",
    "TAG_CONTRIBUTORS",
    "TAG_CUT_TOKENS",
    "TAG_DROPPED_TOKENS",
    "TAG_END_OF_DATA",
    "TAG_ERROR",
    "TAG_FLUSH_SENTINEL",
    "TAG_PACKING",
    "TAG_SKIPPED",
    "TAG_SNAPSHOT",
    "TAG_SNAPSHOT_REPLAY",
    "TAG_TARGET_MIXTURE",
    "TAG_TOMBSTONE",
    "ChunkId",
    "ChunkOffset",
    "ContributorRef",
    "Control",
    "EndOfData",
    "FlushSentinel",
    "LaneId",
    "LineagePath",
    "SampleCursor",
    "SampleId",
    "SnapshotMarker",
    "StreamItem",
    "Tombstone",
    "end_of_data",
    "flush_sentinel",
    "is_control",
    "record_tokens",
    "records_of",
    "snapshot_marker",
]

SampleId: TypeAlias = tuple[int, int, int]
"""``(dataset_id, shard_id, index)``: where a sample lives, independent of how it is read."""
LaneId: TypeAlias = int
ChunkId: TypeAlias = int
ChunkOffset: TypeAlias = int
LineagePath: TypeAlias = tuple[int, ...]

# Reserved tag names. User tags must not start with an underscore.
TAG_CONTRIBUTORS = "_contributors"
# Control records (tombstones, sentinels, markers) are typed (``SampleMeta.control``); these
# tag names are the form checkpoints write them in (see control_as_tags), and older code's.
TAG_TOMBSTONE = "_tombstone"
TAG_FLUSH_SENTINEL = "_flush_sentinel"
TAG_BOUNDARY_CID = "_boundary_cid"  # FlushSentinel.boundary_chunk_id
TAG_END_OF_DATA = "_end_of_data"
TAG_ERROR = "_error"  # Tombstone.reason
TAG_DROPPED_TOKENS = "_dropped_tokens"  # Tombstone.dropped_tokens
TAG_CUT_TOKENS = "_cut_tokens"  # Tombstone.cut_tokens (a cut note)
#: Payload fields that hold token ids, in the order "auto" looks for them.
TOKEN_FIELDS = ("input_ids", "tokens", "token_ids", "ids")
TAG_PACKING = "_packing_metadata"
TAG_TARGET_MIXTURE = "_target_mixture"
TAG_SKIPPED = "_skipped"  # Tombstone.skipped
TAG_SNAPSHOT = "_snapshot"  # SnapshotMarker.position
TAG_SNAPSHOT_REPLAY = "_snapshot_replay"  # SnapshotMarker.replay_cursor
_CONTROL_TAGS = frozenset(
    {
        TAG_TOMBSTONE,
        TAG_FLUSH_SENTINEL,
        TAG_BOUNDARY_CID,
        TAG_END_OF_DATA,
        TAG_ERROR,
        TAG_DROPPED_TOKENS,
        TAG_CUT_TOKENS,
        TAG_SKIPPED,
        TAG_SNAPSHOT,
        TAG_SNAPSHOT_REPLAY,
    }
)
RESERVED_TAGS = frozenset({TAG_CONTRIBUTORS, TAG_PACKING, TAG_TARGET_MIXTURE}) | _CONTROL_TAGS


class SampleCursor(NamedTuple):
    """Identity and order of a record within its lane (tuple ordering is the stream order)."""

    chunk_id: ChunkId
    chunk_offset: ChunkOffset
    lineage: LineagePath
    sample_id: SampleId

    def key(self) -> tuple[int, int, tuple[int, ...], tuple[int, int, int]]:
        """A plain-tuple form, JSON-friendly once lists are accepted back."""
        return (self.chunk_id, self.chunk_offset, self.lineage, self.sample_id)

    def child(self, index: int) -> SampleCursor:
        return SampleCursor(
            self.chunk_id, self.chunk_offset, (*self.lineage, index), self.sample_id
        )


_NEW_TUPLE = tuple.__new__


class FlushSentinel(msgspec.Struct, frozen=True, gc=False):
    """A lane's epoch boundary: every accumulator flushes and resets the lane here, and the
    lane's chunks from ``boundary_chunk_id`` on start the next flush window."""

    boundary_chunk_id: ChunkId


class EndOfData(msgspec.Struct, frozen=True, gc=False):
    """The end of a lane's stream: every accumulator flushes that lane here."""


class SnapshotMarker(msgspec.Struct, frozen=True, gc=False):
    """A cut of a lane before record ``position[1]`` of chunk ``position[0]``.

    ``replay_cursor``: the last cursor a restore at this cut re-delivers (the replay filter
    drops it again); stamped by the stage that holds or replays the marker, else None."""

    position: tuple[ChunkId, ChunkOffset]
    replay_cursor: SampleCursor | None = None


class Tombstone(msgspec.Struct, frozen=True, gc=False):
    """A dropped record: it closes its contributors' offsets without delivering data.

    ``reason`` (``"category: detail"``) and ``dropped_tokens`` are what run summaries count
    drops by. A *cut note* (``cut_tokens`` set, no contributors) closes nothing: it counts
    tokens cut from a record that was delivered shorter. ``skipped``: where an unreadable
    record is and why (a fetch skip)."""

    reason: str | None = None
    dropped_tokens: int = 0
    cut_tokens: int | None = None
    skipped: Mapping[str, Any] | None = None


Control: TypeAlias = FlushSentinel | EndOfData | SnapshotMarker | Tombstone
"""What a control element is (``SampleMeta.control``); None on every ordinary record."""


class ContributorRef(NamedTuple):
    """A base record that contributed to an output; ``is_last_child`` closes its offset."""

    cursor: SampleCursor
    is_last_child: bool


class SampleMeta(msgspec.Struct, frozen=True, gc=False):
    """Identity, position and bookkeeping of one element. Immutable: derive, never mutate.

    A C-level struct the cyclic garbage collector does not track: the engine makes one or
    more per record, and tracked ones kept young-generation collections busy (and promoted
    in-flight records into full collections of the whole process). So a meta's ``tags`` must
    never refer back to the meta or its record.

    ``control`` is None on every record an operator sees; tombstones, flush sentinels, end of
    data and snapshot markers carry their kind and fields there, typed (see :data:`Control`).
    """

    sample_id: SampleId
    lane_id: LaneId
    chunk_id: ChunkId
    chunk_offset: ChunkOffset
    lineage: LineagePath = ()
    component_id: int = 0
    component_counts: Mapping[int, int] | None = None
    tags: Mapping[str, Any] = msgspec.field(default_factory=dict)
    control: Control | None = None

    @property
    def cursor(self) -> SampleCursor:
        # tuple.__new__: the named tuple without its Python-level __new__ (half the cost; the
        # engine reads a cursor several times per record)
        return _NEW_TUPLE(
            SampleCursor, (self.chunk_id, self.chunk_offset, self.lineage, self.sample_id)
        )

    @property
    def counts(self) -> Mapping[int, int]:
        """Samples per mixture component this element stands for (``{component: 1}`` at fetch)."""
        if self.component_counts is None:
            return {self.component_id: 1}
        return self.component_counts

    @property
    def is_tombstone(self) -> bool:
        return isinstance(self.control, Tombstone)

    @property
    def is_sentinel(self) -> bool:
        return isinstance(self.control, (FlushSentinel, EndOfData))

    @property
    def contributors(self) -> tuple[ContributorRef, ...]:
        """Base records this element accounts for; a 1:1 record closes its own cursor."""
        refs = self.tags.get(TAG_CONTRIBUTORS)
        if refs is None:
            return (ContributorRef(self.cursor, True),)
        return tuple(refs)

    def with_tags(self, **tags: Any) -> SampleMeta:
        """This meta with ``tags`` added. Control tags in the older form (``TAG_TOMBSTONE``,
        ``TAG_ERROR``, ...) become the typed ``control`` instead."""
        merged: Mapping[str, Any] = {**self.tags, **tags}
        control = self.control
        if not _CONTROL_TAGS.isdisjoint(tags):
            legacy = control_as_tags(control) if control is not None else {}
            merged, control = control_from_tags({**self.tags, **legacy, **tags})
        return msgspec.structs.replace(self, tags=merged, control=control)

    def with_control(self, control: Control | None) -> SampleMeta:
        """This meta with ``control`` as its control record (None: an ordinary record)."""
        return msgspec.structs.replace(self, control=control)

    def child(self, index: int, *, is_last_child: bool) -> SampleMeta:
        """Meta of the ``index``-th output of a fan-out; only the last child closes the parent."""
        parent_refs = self.contributors
        refs = tuple(
            ContributorRef(r.cursor, r.is_last_child and is_last_child) for r in parent_refs
        )
        tags = dict(self.tags)
        tags[TAG_CONTRIBUTORS] = refs
        return SampleMeta(
            self.sample_id,
            self.lane_id,
            self.chunk_id,
            self.chunk_offset,
            (*self.lineage, index),
            self.component_id,
            self.component_counts if is_last_child else {},
            tags,
            self.control,
        )


class SampleRecord(msgspec.Struct, gc=False):
    """One sample: its identity (``meta``) and its data (``payload``, usually a dict).

    Untracked by the cyclic garbage collector, like :class:`SampleMeta`: a payload must never
    refer back to its record (a cycle through the record would never be collected).
    """

    meta: SampleMeta
    payload: Any

    @property
    def lane_id(self) -> LaneId:
        return self.meta.lane_id

    @property
    def cursor(self) -> SampleCursor:
        return self.meta.cursor


_LANE_OF = attrgetter("meta.lane_id")


@dataclass(slots=True)
class SampleBatch:
    """Records of one lane that form a training micro-batch."""

    records: list[SampleRecord]
    # Where the batch's datasets are (names, files, lines): set by the pipeline that delivers
    # the batch, read by provenance(); never pickled (a batch crosses processes without it).
    _origin: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lanes = list(map(_LANE_OF, self.records))
        if lanes and lanes.count(lanes[0]) != len(lanes):
            other = next(lane for lane in lanes if lane != lanes[0])
            raise ValueError(
                f"SampleBatch mixes lanes {lanes[0]} and {other}; "
                "a batch must hold records of a single lane"
            )

    def __reduce__(self) -> tuple[Any, ...]:
        # Column by column: one list per meta field pickles several times faster than a
        # meta object per record (batches cross process boundaries whole).
        records = self.records
        if not records or any(type(r) is not SampleRecord for r in records):
            return (type(self), (records,))
        metas = [r.meta for r in records]
        if any(type(m) is not SampleMeta for m in metas):
            return (type(self), (records,))
        columns = tuple([getattr(m, name) for m in metas] for name in _META_FIELDS)
        return (_batch_from_columns, (type(self), columns, [r.payload for r in records]))

    @property
    def meta(self) -> SampleMeta:
        """The meta of the batch's last record: its cursor is the batch's replay position."""
        return self.records[-1].meta

    @property
    def lane_id(self) -> LaneId:
        return self.records[0].meta.lane_id

    @property
    def ids(self) -> list[SampleId]:
        return [r.meta.sample_id for r in self.records]

    @property
    def chunk_ids(self) -> list[ChunkId]:
        return [r.meta.chunk_id for r in self.records]

    @property
    def lineage_paths(self) -> list[LineagePath]:
        return [r.meta.lineage for r in self.records]

    @property
    def payloads(self) -> list[Any]:
        return [r.payload for r in self.records]

    @property
    def payload(self) -> Any:
        """The records' payloads (so code written for records also reads batches)."""
        return self.payloads

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[SampleRecord]:
        return iter(self.records)

    def provenance(self, origin: Any = None) -> Any:
        """Per row, the ordered segments it is made of: dataset, file and line (or row),
        sample id, lineage and token spans in the row and in the source document (see
        :mod:`zephon.provenance`). ``origin`` (a pipeline) is only needed for a batch that
        was pickled after delivery."""
        from zephon.provenance._extract import batch_provenance

        return batch_provenance(self, origin)

    def fingerprint(self) -> str:
        """A stable digest (32 hex digits) of the batch's training content: every field of
        every row's payload, never its metadata, so equal batches on any runner agree."""
        from zephon.provenance._extract import content_fingerprint

        return content_fingerprint(self)

    def to_training(self, **kwargs: Any) -> dict[str, Any]:
        """Model inputs (input_ids, labels, positions, masks, cu_seqlens); see zephon.training."""
        from zephon.training import to_training

        return to_training(self, **kwargs)


StreamItem: TypeAlias = SampleRecord | SampleBatch

_META_FIELDS: tuple[str, ...] = SampleMeta.__struct_fields__


def _batch_from_columns(
    cls: type[SampleBatch], columns: tuple[list[Any], ...], payloads: list[Any]
) -> SampleBatch:
    """Unpickle a batch pickled by columns (its records were one lane when it was pickled)."""
    batch = object.__new__(cls)
    batch._origin = None
    batch.records = [
        SampleRecord(SampleMeta(*values), payload)
        for values, payload in zip(zip(*columns), payloads, strict=True)
    ]
    return batch


def tombstone_meta(
    meta: SampleMeta, *, reason: str | None = None, tokens: int | None = None
) -> SampleMeta:
    """Meta of a tombstone that closes ``meta``'s contributors without delivering data.

    ``reason`` (``"category: detail"``) and ``tokens`` (how many the dropped record had) are
    what run summaries count drops by."""
    return msgspec.structs.replace(
        meta,
        tags={TAG_CONTRIBUTORS: meta.contributors},
        control=Tombstone(reason, int(tokens) if tokens else 0),
    )


def cut_note(record: StreamItem, *, reason: str, tokens: int) -> SampleRecord:
    """A control element telling the run summary that ``tokens`` of ``record`` were cut away
    (truncation) while ``record`` itself was delivered shorter. It closes nothing (no
    contributors); the summary counts it under ``cut_records`` / ``cut_tokens``."""
    control = Tombstone(reason, cut_tokens=int(tokens))
    meta = msgspec.structs.replace(record.meta, tags={TAG_CONTRIBUTORS: ()}, control=control)
    return SampleRecord(meta, None)


def record_tokens(record: StreamItem) -> int:
    """The tokens ``record`` holds, for drop counts: a packed row's real tokens, else the
    length of its first token field (``TOKEN_FIELDS``); 0 before tokenization. A batch sums
    its records."""
    if isinstance(record, SampleBatch):
        return sum(record_tokens(r) for r in record.records)
    packing = record.meta.tags.get(TAG_PACKING) if record.meta.tags else None
    if isinstance(packing, Mapping) and "total_length" in packing:
        return int(packing["total_length"])
    payload = record.payload
    if isinstance(payload, Mapping):
        for name in TOKEN_FIELDS:
            value = payload.get(name)
            if value is not None and hasattr(value, "__len__"):
                return len(value)
    return 0


def tombstones_for_record(record: StreamItem, *, reason: str | None = None) -> list[SampleRecord]:
    """Tombstones for everything ``record`` stands for (one per record of a batch), each with
    the tokens it held."""
    records = record.records if isinstance(record, SampleBatch) else [record]
    return [
        SampleRecord(tombstone_meta(r.meta, reason=reason, tokens=record_tokens(r)), None)
        for r in records
    ]


def spawn_child(record: SampleRecord, index: int, payload: Any, *, is_last: bool) -> SampleRecord:
    """One output of a fan-out: child lineage, and only the last child closes the parent."""
    return SampleRecord(record.meta.child(index, is_last_child=is_last), payload)


def flush_sentinel(lane_id: LaneId, boundary_chunk_id: ChunkId) -> SampleRecord:
    """A per-lane epoch boundary: every accumulator flushes and resets ``lane_id`` here."""
    meta = SampleMeta(
        (-1, -1, -1),
        lane_id,
        boundary_chunk_id,
        -1,
        (),
        -1,
        {},
        {},
        FlushSentinel(boundary_chunk_id),
    )
    return SampleRecord(meta, None)


def end_of_data(lane_id: LaneId) -> SampleRecord:
    """Marks the end of a lane's stream: every accumulator flushes that lane here."""
    meta = SampleMeta((-1, -1, -1), lane_id, -1, -1, (), -1, {}, {}, EndOfData())
    return SampleRecord(meta, None)


def snapshot_marker(lane_id: LaneId, chunk_id: ChunkId, offset: ChunkOffset) -> SampleRecord:
    """A cut of ``lane_id`` before record ``offset`` of chunk ``chunk_id``: every stateful
    accumulator saves its lane state as the marker passes, so a restore can start there."""
    meta = SampleMeta(
        (-1, -1, -1), lane_id, chunk_id, offset, (), -1, {}, {}, SnapshotMarker((chunk_id, offset))
    )
    return SampleRecord(meta, None)


def is_control(item: StreamItem) -> bool:
    """Tombstones, sentinels and markers: elements that bypass operators and never reach the
    consumer."""
    return item.meta.control is not None


def control_as_tags(control: Control) -> dict[str, Any]:
    """``control`` in the tag form older code and checkpoints use (``TAG_TOMBSTONE``, ...):
    a checkpoint writes a held control record's meta this way, so its format is unchanged."""
    match control:
        case Tombstone(reason, dropped, cut, skipped):
            tags: dict[str, Any] = {TAG_TOMBSTONE: True}
            if reason is not None:
                tags[TAG_ERROR] = reason
            if dropped:
                tags[TAG_DROPPED_TOKENS] = dropped
            if cut is not None:
                tags[TAG_CUT_TOKENS] = cut
            if skipped is not None:
                tags[TAG_SKIPPED] = skipped
            return tags
        case FlushSentinel(boundary):
            return {TAG_FLUSH_SENTINEL: True, TAG_BOUNDARY_CID: boundary}
        case EndOfData():
            return {TAG_END_OF_DATA: True}
        case SnapshotMarker(position, replay):
            tags = {TAG_SNAPSHOT: position}
            if replay is not None:
                tags[TAG_SNAPSHOT_REPLAY] = replay
            return tags


def control_from_tags(tags: Mapping[str, Any]) -> tuple[Mapping[str, Any], Control | None]:
    """The inverse of :func:`control_as_tags`: ``tags`` without the control tags, and the
    control record they describe (None, and ``tags`` itself, when they name no kind)."""
    kind: Control | None
    if TAG_TOMBSTONE in tags:
        reason = tags.get(TAG_ERROR)
        cut = tags.get(TAG_CUT_TOKENS)
        kind = Tombstone(
            None if reason is None else str(reason),
            int(tags.get(TAG_DROPPED_TOKENS) or 0),
            None if cut is None else int(cut),
            tags.get(TAG_SKIPPED),
        )
    elif TAG_FLUSH_SENTINEL in tags:
        kind = FlushSentinel(int(tags[TAG_BOUNDARY_CID]))
    elif TAG_END_OF_DATA in tags:
        kind = EndOfData()
    elif TAG_SNAPSHOT in tags:
        chunk, offset = tags[TAG_SNAPSHOT]
        kind = SnapshotMarker((int(chunk), int(offset)), tags.get(TAG_SNAPSHOT_REPLAY))
    else:
        return tags, None
    return {k: v for k, v in tags.items() if k not in _CONTROL_TAGS}, kind


def records_of(items: Sequence[StreamItem]) -> Iterator[SampleRecord]:
    for item in items:
        if isinstance(item, SampleBatch):
            yield from item.records
        else:
            yield item

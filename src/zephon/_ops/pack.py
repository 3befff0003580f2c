"""pack_sequences and pack_flat: pack tokenized records into bins of ``max_length`` tokens.

The accumulator (serial, per lane) decides which record goes into which bin and builds the
packed record's meta; the workers (``process_many``) assemble the payload with numpy. Samples
of different lanes never share a bin, so a lane's bins depend on that lane's stream alone.

Output meta: the cursor is the first segment's cursor with the segment start appended to the
lineage; ``TAG_CONTRIBUTORS`` lists every segment's refs, closing (``is_last_child``) only on a
record's last segment; ``TAG_PACKING`` holds ``num_sequences``, ``total_length``,
``padding_length``, ``packing_efficiency``, ``component_tokens``, ``segments`` (source
cursor, start, stop per segment), from which split records can be put back together, and
``source_lengths`` (each segment's whole record length, so provenance can tell a piece of a
split record from a whole one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from zephon._image_fields import GRID_FIELDS
from zephon._ops._bookkeeping import TAG_TARGET_MIXTURE, CloserTracker
from zephon._ops._pack_groups import (
    Groups,
    Homogeneity,
    ShuffleStrategy,
    check_grouping,
    group_key,
)
from zephon._ops._pack_images import (
    image_token_counts,
    inline_image_offsets,
    marked_offsets,
    row_layout,
)
from zephon._ops._packing_algos import (
    ALGORITHMS,
    Bin,
    FlushStrategy,
    LanePacker,
    Limits,
    PackingAlgorithm,
    make_packer,
)
from zephon.errors import ConfigError, DataError, MissingFieldError, did_you_mean
from zephon.ops import Accumulator, BaseOp, OpContext, OpTraits, Rebuild
from zephon.ops.accumulators import MicroBatch
from zephon.types import (
    TAG_CONTRIBUTORS,
    TAG_PACKING,
    TOKEN_FIELDS,
    ContributorRef,
    LaneId,
    SampleMeta,
    SampleRecord,
    StreamItem,
    tombstone_meta,
)

log = logging.getLogger("zephon")

TOKEN_FIELD_CANDIDATES = TOKEN_FIELDS
MAX_OVERSIZE_WARNINGS = 3


def resolve_tokens_field(payload: Any, tokens_field: str, sample: Any) -> str:
    """The token field of ``payload``: ``tokens_field``, or the first known name for "auto"."""
    if tokens_field != "auto":
        return tokens_field
    if type(payload) is dict or isinstance(payload, Mapping):  # dict: skips the ABC check
        for name in TOKEN_FIELD_CANDIDATES:
            if name in payload:
                return name
    fields = sorted(payload) if isinstance(payload, Mapping) else type(payload).__name__
    raise MissingFieldError(
        f"pack: record {sample} has none of the token fields {list(TOKEN_FIELD_CANDIDATES)} "
        f"(fields: {fields}); pass tokens_field=... or tokenize first"
    )


def _tokens(payload: Any, name: str, sample: Any) -> Any:
    try:
        return payload[name]
    except (KeyError, TypeError, IndexError):
        fields = sorted(payload) if isinstance(payload, Mapping) else type(payload).__name__
        raise MissingFieldError(
            f"pack: record {sample} has no field {name!r} (fields: {fields}); set "
            "tokens_field= to the field holding the token ids"
        ) from None


class DeferredBin:
    """A bin as the accumulator leaves it: segments to assemble on a worker.

    ``segments`` holds ``(fields, start, stop, full_length)``: for pack_flat ``fields`` is a
    dict of the token field and the aligned fields of the source record; for pack_sequences it
    is the source payload itself.
    """

    __slots__ = ("segments",)

    def __init__(self, segments: list[tuple[Any, int, int, int]]) -> None:
        self.segments = segments

    def __getstate__(self) -> list[tuple[Any, int, int, int]]:
        return self.segments

    def __setstate__(self, state: list[tuple[Any, int, int, int]]) -> None:
        self.segments = state


class _Lane:
    """One lane's packers (one per homogeneity key, in order of first use), the window of the
    length pre-order and the closer tracking."""

    __slots__ = ("make", "packers", "tracker", "window")

    def __init__(self, make: Callable[[], LanePacker]) -> None:
        self.make = make
        self.packers: dict[Any, LanePacker] = {}
        self.window: list[tuple[SampleRecord, int, Any]] = []
        self.tracker = CloserTracker()

    def packer(self, key: Any) -> LanePacker:
        packer = self.packers.get(key)
        if packer is None:
            packer = self.packers[key] = self.make()
        return packer

    def pending(self) -> bool:
        return bool(self.window) or any(p.pending() for p in self.packers.values())

    def state(self) -> dict[str, Any]:
        return {
            "packers": [[key, p.state()] for key, p in self.packers.items()],
            "window": [list(entry) for entry in self.window],
            "tracker": self.tracker.state(),
        }

    def load(self, saved: dict[str, Any]) -> None:
        if "packer" in saved:  # a checkpoint from before homogeneity: one packer
            saved = {**saved, "packers": [[None, saved["packer"]]]}
        for key, packer_state in saved["packers"]:
            self.packer(key).load(packer_state)
        self.window = [(r, int(n), key) for r, n, key in saved.get("window", ())]
        self.tracker = CloserTracker.from_state(saved["tracker"])


class PackAccumulator(Accumulator):
    """Per-lane bins; emits a packed record (with a deferred payload) when a bin closes."""

    reads_payload = True
    state_holds_records = True  # open bins' records are saved by meta and rebuilt

    def state_dict(self, lane_id: LaneId) -> dict[str, Any]:
        """The lane's open bins (their records and segment offsets) and closer tracking."""
        state = self._lanes.get(lane_id)
        if state is None:
            return {}
        return state.state()

    def load_state_dict(self, lane_id: LaneId, saved: dict[str, Any]) -> None:
        self._lanes.pop(lane_id, None)
        if not saved:
            return
        self._lane(lane_id).load(saved)

    def __init__(self, op: PackOpBase) -> None:
        self.op = op
        self.limits = Limits(
            op.max_length,
            op.num_bins,
            op.min_sequence_length,
            op.max_sequences_per_bin,
            op.flush_strategy,
            op.max_images_per_row,
            op.images_of,
            op.max_vision_tokens_per_row,
            op.vision_of,
        )
        self._lanes: dict[LaneId, _Lane] = {}
        self._warned = 0

    def _lane(self, lane_id: LaneId) -> _Lane:
        state = self._lanes.get(lane_id)
        if state is None:
            op = self.op
            limits = self.limits

            def make() -> LanePacker:
                return make_packer(
                    op.algorithm, limits, op.candidate_pool_size, op.max_candidate_age
                )

            state = self._lanes[lane_id] = _Lane(make)
        return state

    def _drop(
        self, state: _Lane, record: SampleRecord, reason: str, tokens: int = 0
    ) -> SampleRecord:
        meta = record.meta
        state.tracker.add(meta)
        refs = state.tracker.settle(meta)
        tomb = tombstone_meta(meta, reason=reason, tokens=tokens)
        if refs != meta.contributors:
            tomb = tomb.with_tags(**{TAG_CONTRIBUTORS: refs})
        return SampleRecord(tomb, None)

    def push_many(self, elems: Sequence[StreamItem]) -> list[MicroBatch]:
        out: MicroBatch = []
        op = self.op
        max_length = op.max_length
        wraps = op.algorithm in ("wrap", "best_fit_wrap")
        length_of = op.length_of
        key_of = op.group_key
        window = op.presort_window
        lanes = self._lanes
        for elem in elems:
            if not isinstance(elem, SampleRecord):
                raise ConfigError(f"{op.name}: cannot pack SampleBatch elements; pack before batch")
            lane_id = elem.meta.lane_id
            state = lanes.get(lane_id) or self._lane(lane_id)
            length = length_of(elem)
            if length <= 0:
                out.append(self._drop(state, elem, "pack: empty sequence"))
                continue
            if length > max_length and not wraps:
                out.append(self._oversized(state, elem, length))
                continue
            state.tracker.add(elem.meta)
            key = key_of(elem)
            if window:
                state.window.append((elem, length, key))
                if len(state.window) >= window:
                    self._release_window(state, out)
                continue
            for b in state.packer(key).add(elem, length):
                out.append(self._emit(state, b))
        return [out] if out else []

    def _release_window(self, state: _Lane, out: MicroBatch) -> None:
        """Feed the window to the packers longest first (ties in arrival order)."""
        entries = sorted(state.window, key=lambda e: -e[1])
        state.window = []
        for record, length, key in entries:
            for b in state.packer(key).add(record, length):
                out.append(self._emit(state, b))

    def _oversized(self, state: _Lane, record: SampleRecord, length: int) -> SampleRecord:
        op = self.op
        if not op.drop_oversized:
            raise DataError(
                f"{op.name}: record {record.meta.sample_id} has {length} tokens, more than "
                f"max_length={op.max_length}; truncate it in tokenize(max_length=...), use "
                "algorithm='wrap' or 'best_fit_wrap' (which split records), or pass "
                "drop_oversized=True to drop it"
            )
        reason = f"pack: {length} tokens exceed max_length={op.max_length}"
        if self._warned < MAX_OVERSIZE_WARNINGS:
            self._warned += 1
            more = (
                " (further drops are counted as tombstones only)"
                if self._warned == MAX_OVERSIZE_WARNINGS
                else ""
            )
            log.warning(
                "zephon: %s dropped record %s: %d tokens > max_length=%d%s",
                op.name,
                record.meta.sample_id,
                length,
                op.max_length,
                more,
            )
        return self._drop(state, record, reason, length)

    def _emit(self, state: _Lane, b: Bin) -> SampleRecord:
        op = self.op
        segments = b.segments
        first, first_start = segments[0][0], segments[0][1]
        fm = first.meta
        tracker = state.tracker
        refs: list[ContributorRef] = []
        counts: dict[int, int] = {}
        comp_tokens: dict[int, int] = {}
        seg_info: list[tuple[Any, int, int]] = []
        parts: list[tuple[Any, int, int, int]] = []
        lengths: list[int] = []
        extract = op.extract
        target = None
        new_tuple = tuple.__new__
        for record, start, stop, last in segments:
            meta = record.meta
            own = meta.tags
            cursor = meta.cursor
            if own and TAG_TARGET_MIXTURE in own:
                target = own[TAG_TARGET_MIXTURE]
            plain = not own or TAG_CONTRIBUTORS not in own  # a 1:1 record: its own cursor
            if last:
                if plain:  # tuple.__new__: ContributorRef(cursor, True) at half the cost
                    refs.append(new_tuple(ContributorRef, (cursor, True)))
                else:
                    refs.extend(tracker.settle(meta))
                if meta.component_counts is None:
                    counts[meta.component_id] = counts.get(meta.component_id, 0) + 1
                else:
                    for comp, n in meta.component_counts.items():
                        counts[comp] = counts.get(comp, 0) + n
            elif plain:
                refs.append(ContributorRef(cursor, False))
            else:
                refs.extend(ContributorRef(r.cursor, False) for r in meta.contributors)
            comp = meta.component_id
            comp_tokens[comp] = comp_tokens.get(comp, 0) + (stop - start)
            seg_info.append((cursor, start, stop))
            fields, full = extract(record)
            parts.append((fields, start, stop, full))
            lengths.append(full)
        used = b.used
        padding = op.max_length - used if op.pads else 0
        packing = {
            "num_sequences": len(segments),
            "total_length": used,
            "padding_length": padding,
            "packing_efficiency": used / op.max_length,
            "component_tokens": comp_tokens,
            "segments": tuple(seg_info),
            "source_lengths": tuple(lengths),
        }
        tags: dict[str, Any] = {TAG_CONTRIBUTORS: tuple(refs), TAG_PACKING: packing}
        if target is not None:
            tags[TAG_TARGET_MIXTURE] = target
        meta = SampleMeta(
            fm.sample_id,
            fm.lane_id,
            fm.chunk_id,
            fm.chunk_offset,
            (*fm.lineage, first_start),
            fm.component_id,
            counts,
            tags,
        )
        return SampleRecord(meta, DeferredBin(parts))

    def flush(self, *, reset: bool = False, lane_id: LaneId | None = None) -> list[MicroBatch]:
        lanes = sorted(self._lanes) if lane_id is None else [lane_id]
        out: MicroBatch = []
        for lane in lanes:
            state = self._lanes.pop(lane, None)
            if state is None:
                continue
            self._release_window(state, out)
            for packer in state.packers.values():
                for b in packer.drain():
                    out.append(self._emit(state, b))
        return [out] if out else []

    def has_pending_data(self, lane_id: LaneId | None = None) -> bool:
        if lane_id is None:
            return any(s.pending() for s in self._lanes.values())
        state = self._lanes.get(lane_id)
        return state is not None and state.pending()


class PackOpBase(BaseOp):
    """Shared configuration and bin logic of pack_sequences and pack_flat."""

    pads = False
    #: images per bin, counted by ``images_of`` (only pack_sequences packs images)
    max_images_per_row: int | None = None

    def images_of(self, record: SampleRecord) -> int:
        """How many images ``record`` holds (0 when the operator packs no images)."""
        return 0

    #: vision tokens per bin, counted by ``vision_of``
    max_vision_tokens_per_row: int | None = None

    def vision_of(self, record: SampleRecord) -> int:
        """How many vision tokens ``record`` holds (0 when the operator packs no images)."""
        return 0

    def __init__(
        self,
        max_length: int,
        *,
        algorithm: PackingAlgorithm = "best_fit",
        num_bins: int = 16,
        min_sequence_length: int = 1,
        max_sequences_per_bin: int | None = None,
        drop_oversized: bool = True,
        flush_strategy: FlushStrategy = "fullest",
        tokens_field: str = "auto",
        candidate_pool_size: int = 256,
        max_candidate_age: int | None = None,
        homogeneity: Homogeneity = "none",
        groups: Groups = None,
        shuffle_strategy: ShuffleStrategy = "none",
        component_names: Sequence[str] = (),
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        label = self.name
        if not isinstance(max_length, int) or max_length < 1:
            raise ConfigError(f"{label}: max_length must be a positive int, got {max_length!r}")
        if algorithm not in ALGORITHMS:
            raise ConfigError(
                f"{label}: algorithm must be one of {list(ALGORITHMS)}, got {algorithm!r}"
                + did_you_mean(algorithm, ALGORITHMS)
            )
        if num_bins < 1:
            raise ConfigError(f"{label}: num_bins must be >= 1, got {num_bins}")
        if not 1 <= min_sequence_length <= max_length:
            raise ConfigError(
                f"{label}: min_sequence_length must be in [1, max_length={max_length}], "
                f"got {min_sequence_length}"
            )
        if max_sequences_per_bin is not None and max_sequences_per_bin < 1:
            raise ConfigError(
                f"{label}: max_sequences_per_bin must be >= 1 or None, got {max_sequences_per_bin}"
            )
        if flush_strategy not in ("fifo", "fullest"):
            raise ConfigError(
                f"{label}: flush_strategy must be 'fifo' or 'fullest', got {flush_strategy!r}"
                + did_you_mean(flush_strategy, ("fifo", "fullest"))
            )
        if candidate_pool_size < 1:
            raise ConfigError(
                f"{label}: candidate_pool_size must be >= 1, got {candidate_pool_size}"
            )
        self.max_length = max_length
        self.algorithm: PackingAlgorithm = algorithm
        self.num_bins = num_bins
        self.min_sequence_length = min_sequence_length
        self.max_sequences_per_bin = max_sequences_per_bin
        self.drop_oversized = drop_oversized
        self.flush_strategy: FlushStrategy = flush_strategy
        self.tokens_field = tokens_field
        self.candidate_pool_size = candidate_pool_size
        self.max_candidate_age = (
            8 * candidate_pool_size if max_candidate_age is None else max_candidate_age
        )
        check_grouping(self.name, homogeneity, groups, shuffle_strategy, component_names)
        self.homogeneity: Homogeneity = homogeneity
        self.groups = dict(groups) if isinstance(groups, Mapping) else groups
        self.shuffle_strategy: ShuffleStrategy = shuffle_strategy
        self.component_names = tuple(component_names)
        self.presort_window = candidate_pool_size if shuffle_strategy == "length" else 0

    def group_key(self, record: SampleRecord) -> Any:
        """Which packer a record goes to: records of different keys never share a bin."""
        return group_key(self, record)

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return PackAccumulator(self)

    def traits(self) -> OpTraits:
        """Bins are assembled on the driver thread: shipping a bin's segments to a worker
        process and its packed row back costs the engine about three times what assembling
        the row does (docs/architecture.md), and threads gain nothing on numpy calls this
        small."""
        return OpTraits(
            preserves_cursor_order=False,
            parallelism=1,
            runs_in_driver=True,
            rebuild=Rebuild.REASSEMBLE,
        )

    def config(self) -> Mapping[str, Any]:
        return {
            "max_length": self.max_length,
            "algorithm": self.algorithm,
            "num_bins": self.num_bins,
            "min_sequence_length": self.min_sequence_length,
            "max_sequences_per_bin": self.max_sequences_per_bin,
            "drop_oversized": self.drop_oversized,
            "flush_strategy": self.flush_strategy,
            "tokens_field": self.tokens_field,
            "candidate_pool_size": self.candidate_pool_size,
            "max_candidate_age": self.max_candidate_age,
            "homogeneity": self.homogeneity,
            "groups": self.groups,
            "shuffle_strategy": self.shuffle_strategy,
        }

    def length_of(self, record: SampleRecord) -> int:
        payload = record.payload
        name = resolve_tokens_field(payload, self.tokens_field, record.meta.sample_id)
        return len(_tokens(payload, name, record.meta.sample_id))

    def extract(self, record: SampleRecord) -> tuple[Any, int]:
        """What a worker needs of ``record`` to assemble its segment, and its full length."""
        raise NotImplementedError

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        out: list[StreamItem] = []
        for elem in elems:
            payload = elem.payload
            if isinstance(payload, DeferredBin):
                out.append(SampleRecord(elem.meta, self.assemble(elem.meta, payload)))
            else:
                out.append(elem)
        return out

    def assemble(self, meta: SampleMeta, deferred: DeferredBin) -> Any:
        raise NotImplementedError

    def reassemble(
        self, meta: SampleMeta, segments: Sequence[tuple[SampleRecord, int, int]]
    ) -> Any:
        """The payload of the packed record ``meta`` from its source records (``Reassembles``)."""
        parts = []
        for record, start, stop in segments:
            fields, full = self.extract(record)
            parts.append((fields, start, stop, full))
        return self.assemble(meta, DeferredBin(parts))


@dataclass(frozen=True)
class FieldsRead:
    """The projection of a payload onto the fields pack_flat reads: a plain value, so a worker
    stage's pickled identity (Ray reuses actors by it) does not change with the operator's
    state between iterations."""

    tokens_field: str
    groups: str | None
    aligned_fields: tuple[str, ...] | None

    def __call__(self, payload: Any) -> Any:
        """The fields of ``payload`` that ``extract`` and ``group_key`` read, in payload
        order (so ``extract`` gives the same result); ``payload`` itself when one is missing
        or nothing is left out."""
        if type(payload) is not dict:
            return payload
        name: str | None = self.tokens_field
        if name == "auto":
            name = next((n for n in TOKEN_FIELD_CANDIDATES if n in payload), None)
        tokens = payload.get(name) if name is not None else None
        if not isinstance(tokens, (np.ndarray, list)):
            return payload
        keep = {name, *(f for f in GRID_FIELDS if f in payload)}  # so extract can refuse them
        if self.groups is not None:
            keep.add(self.groups)
        if self.aligned_fields is not None:
            keep.update(self.aligned_fields)
        if not keep.issubset(payload):
            return payload
        length = len(tokens)
        auto = self.aligned_fields is None
        out = {k: v for k, v in payload.items() if k in keep or (auto and _aligned(v, length))}
        return payload if len(out) == len(payload) else out


def _aligned(value: Any, length: int) -> bool:
    if isinstance(value, np.ndarray):
        return value.ndim == 1 and value.shape[0] == length
    return isinstance(value, list) and len(value) == length


class PackSequencesOp(PackOpBase):
    """Packs records into ``{"packed_samples": [payload, ...]}`` envelopes (no padding).

    Whole records keep their payload object; a piece of a split record (``wrap`` algorithms)
    gets a copy of the payload whose length-aligned fields are sliced to the piece.
    """

    name = "pack_sequences"
    config_when_set = (
        "image_grids",
        "merge_size",
        "max_images_per_row",
        "image_token_id",
        "max_vision_tokens_per_row",
        "image_markers",
        "video_grids",
        "video_token_id",
    )

    def __init__(
        self,
        max_length: int,
        *,
        length_fn: Callable[[Any], int] | None = None,
        image_grids: str | None = None,
        merge_size: int = 2,
        max_images_per_row: int | None = None,
        image_token_id: int | None = None,
        max_vision_tokens_per_row: int | None = None,
        image_markers: tuple[int, int] | None = None,
        video_grids: str | None = None,
        video_token_id: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_length, **kwargs)
        splits = self.algorithm in ("wrap", "best_fit_wrap")
        if length_fn is not None and splits:
            raise ConfigError(
                f"{self.name}: length_fn cannot be combined with algorithm={self.algorithm!r}: "
                "splitting needs token fields to slice; use first_fit or best_fit"
            )
        self.length_fn = length_fn
        self._check_images(image_grids, merge_size, max_images_per_row, splits)
        self.image_grids = image_grids
        self.merge_size = merge_size
        self.max_images_per_row = max_images_per_row
        if image_token_id is not None and image_grids is None:
            raise ConfigError(
                f"{self.name}: image_token_id needs image_grids= (the field with each record's "
                "patch grids, e.g. 'image_grid_thw')"
            )
        #: the vision tokens are already in the token field, as runs of this id
        self.image_token_id = image_token_id
        self._check_vision_cap(max_vision_tokens_per_row)
        self.max_vision_tokens_per_row = max_vision_tokens_per_row
        #: (start, end) token ids around each image's vision tokens (Qwen2-VL's
        #: <|vision_start|>, <|vision_end|>), counted in the row and laid out by to_training
        self.image_markers = self._check_markers(image_markers)
        #: the field with each record's video patch grids: its videos follow its images (a
        #: record may lack one of the two fields, not both)
        self.video_grids = self._check_videos(video_grids, video_token_id)
        #: with image_token_id: the video tokens are in the token field too, as runs of this id
        self.video_token_id = video_token_id

    def _check_videos(self, video_grids: str | None, video_token: int | None) -> str | None:
        if video_grids is not None and self.image_grids is None:
            raise ConfigError(
                f"{self.name}: video_grids needs image_grids= (a record's videos follow its "
                "images in the image map)"
            )
        inline = self.image_token_id is not None
        if video_grids is not None and inline != (video_token is not None):
            raise ConfigError(
                f"{self.name}: with image_token_id, video_grids needs video_token_id (the video "
                "placeholder tokenize_chat expanded), and without it none"
            )
        if video_token is not None and video_grids is None:
            raise ConfigError(f"{self.name}: video_token_id needs video_grids=")
        return video_grids

    def _check_markers(self, markers: Any) -> tuple[int, int] | None:
        if markers is None:
            return None
        if self.image_grids is None or self.image_token_id is not None:
            raise ConfigError(
                f"{self.name}: image_markers needs image_grids= and no image_token_id (with "
                "image_token_id the markers are the chat template's, already in the text)"
            )
        if not isinstance(markers, Sequence) or len(markers) != 2:
            raise ConfigError(
                f"{self.name}: image_markers must be two token ids (vision start, vision end), "
                f"got {markers!r}"
            )
        start, end = (int(m) for m in markers)
        return start, end

    def _check_vision_cap(self, cap: int | None) -> None:
        if cap is None:
            return
        if self.image_grids is None:
            raise ConfigError(
                f"{self.name}: max_vision_tokens_per_row needs image_grids= (the field with "
                "each record's patch grids, e.g. 'image_grid_thw')"
            )
        if cap < 1:
            raise ConfigError(f"{self.name}: max_vision_tokens_per_row must be >= 1, got {cap}")

    def _check_images(
        self, image_grids: str | None, merge_size: int, max_images: int | None, splits: bool
    ) -> None:
        if image_grids is None:
            if max_images is not None:
                raise ConfigError(
                    f"{self.name}: max_images_per_row needs image_grids= (the field with each "
                    "record's patch grids, e.g. 'image_grid_thw')"
                )
            return
        if splits:
            raise ConfigError(
                f"{self.name}: image_grids cannot be combined with algorithm={self.algorithm!r}: "
                "an image cannot be split across rows; use first_fit or best_fit"
            )
        if merge_size < 1:
            raise ConfigError(f"{self.name}: merge_size must be >= 1, got {merge_size}")
        if max_images is not None and max_images < 1:
            raise ConfigError(f"{self.name}: max_images_per_row must be >= 1, got {max_images}")

    def config(self) -> Mapping[str, Any]:
        fn = self.length_fn
        config = {**super().config(), "length_fn": getattr(fn, "__qualname__", None)}
        if self.image_grids is not None:  # see config_when_set
            config["image_grids"] = self.image_grids
            config["merge_size"] = self.merge_size
            config["max_images_per_row"] = self.max_images_per_row
        if self.image_token_id is not None:
            config["image_token_id"] = self.image_token_id
        if self.max_vision_tokens_per_row is not None:
            config["max_vision_tokens_per_row"] = self.max_vision_tokens_per_row
        if self.image_markers is not None:
            config["image_markers"] = list(self.image_markers)
        if self.video_grids is not None:
            config["video_grids"] = self.video_grids
        if self.video_token_id is not None:
            config["video_token_id"] = self.video_token_id
        return config

    def length_of(self, record: SampleRecord) -> int:
        if self.length_fn is not None:
            length = int(self.length_fn(record.payload))
        else:
            length = super().length_of(record)
        if self.image_grids is not None and self.image_token_id is None:
            counts = self._image_tokens(record.payload, record.meta.sample_id)
            length += sum(counts) + (2 * len(counts) if self.image_markers else 0)
        return length

    def images_of(self, record: SampleRecord) -> int:
        if self.image_grids is None:
            return 0
        return len(self._image_tokens(record.payload, record.meta.sample_id))

    def vision_of(self, record: SampleRecord) -> int:
        if self.image_grids is None:
            return 0
        return sum(self._image_tokens(record.payload, record.meta.sample_id))

    def _image_tokens(self, payload: Any, sample: Any) -> list[int]:
        """Vision tokens of each image of ``payload``, then of each of its videos."""
        return [n for counts in self._media_tokens(payload, sample).values() for n in counts]

    def _media_tokens(self, payload: Any, sample: Any) -> dict[str, list[int]]:
        """Vision tokens of each image (each video) of ``payload``, by grid field."""
        assert self.image_grids is not None
        fields = [self.image_grids]
        if self.video_grids is not None and isinstance(payload, Mapping):  # either may be absent
            fields = [f for f in (self.image_grids, self.video_grids) if f in payload] or fields
        return {f: image_token_counts(payload, f, self.merge_size, sample) for f in fields}

    def extract(self, record: SampleRecord) -> tuple[Any, int]:
        return record.payload, self.length_of(record)

    def _inline(self, samples: Sequence[Any], meta: SampleMeta) -> list[list[int]]:
        """Where each sample's images, then its videos, are in its tokens (runs of
        ``image_token_id``, of ``video_token_id``)."""
        assert self.image_token_id is not None
        placeholder = {self.image_grids: self.image_token_id, self.video_grids: self.video_token_id}
        offsets = []
        for i, payload in enumerate(samples):
            where = f"{i} of row {meta.sample_id}"
            tokens = _tokens(
                payload, resolve_tokens_field(payload, self.tokens_field, where), where
            )
            found: list[int] = []
            for field, counts in self._media_tokens(payload, where).items():
                token = placeholder[field]
                assert token is not None
                found += inline_image_offsets(tokens, counts, token, where)
            offsets.append(found)
        return offsets

    def assemble(self, meta: SampleMeta, deferred: DeferredBin) -> Any:
        samples: list[Any] = []
        for payload, start, stop, full in deferred.segments:
            if start == 0 and stop == full:
                samples.append(payload)
                continue
            samples.append(
                {k: (v[start:stop] if _aligned(v, full) else v) for k, v in payload.items()}
            )
        if self.image_grids is None:
            return {"packed_samples": samples}
        lengths = [stop - start for _, start, stop, _ in deferred.segments]
        images = [self._image_tokens(p, meta.sample_id) for p in samples]
        offsets = None if self.image_token_id is None else self._inline(samples, meta)
        if self.image_markers is not None:
            offsets = [marked_offsets(counts) for counts in images]
        cu_seqlens, image_map = row_layout(lengths, images, offsets)
        row = {"packed_samples": samples, "cu_seqlens": cu_seqlens, "image_map": image_map}
        if self.image_markers is not None:
            row["image_markers"] = np.array(self.image_markers, dtype=np.int64)
        return row


class PackFlatOp(PackOpBase):
    """Packs records into one flat, padded token array per bin.

    Payload: the token field (padded with ``pad_token_id`` to ``max_length``), ``positions``
    (restarting at 0 for every segment; the padding tail counts as its own segment),
    ``document_ids`` (segment index per token, -1 on padding) and every aligned field
    (``aligned_fields``; "auto": each 1-D array or list as long as the tokens), padded with 0.
    Other fields are dropped. ``TAG_PACKING["padding_length"]`` gives the padding.
    """

    name = "pack_flat"
    pads = True

    def __init__(
        self,
        max_length: int,
        pad_token_id: int,
        *,
        aligned_fields: Sequence[str] | Literal["auto"] = "auto",
        emit_positions: bool = True,
        emit_document_ids: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_length, **kwargs)
        if not isinstance(pad_token_id, (int, np.integer)) or isinstance(pad_token_id, bool):
            raise ConfigError(
                f"{self.name}: pad_token_id must be an int (e.g. the tokenizer's pad or EOS "
                f"id), got {pad_token_id!r}"
            )
        if isinstance(aligned_fields, str) and aligned_fields != "auto":
            aligned_fields = (aligned_fields,)
        self.pad_token_id = int(pad_token_id)
        self.aligned_fields: tuple[str, ...] | None = (
            None if aligned_fields == "auto" else tuple(aligned_fields)
        )
        self.emit_positions = emit_positions
        self.emit_document_ids = emit_document_ids
        self._ramp_array: np.ndarray | None = None  # built by the first assemble

    def config(self) -> Mapping[str, Any]:
        return {
            **super().config(),
            "pad_token_id": self.pad_token_id,
            "aligned_fields": self.aligned_fields or "auto",
            "emit_positions": self.emit_positions,
            "emit_document_ids": self.emit_document_ids,
        }

    def input_projection(self) -> Callable[[Any], Any]:
        groups = self.groups if isinstance(self.groups, str) else None
        aligned = tuple(self.aligned_fields) if self.aligned_fields is not None else None
        return FieldsRead(self.tokens_field, groups, aligned)

    def extract(self, record: SampleRecord) -> tuple[Any, int]:
        payload = record.payload
        if type(payload) is dict and len(payload) == 1 and self.aligned_fields is None:
            # the token field alone (what input_projection leaves): nothing else to check
            ((name, tokens),) = payload.items()
            if name == self.tokens_field or (
                self.tokens_field == "auto" and name in TOKEN_FIELD_CANDIDATES
            ):
                return {name: tokens}, len(tokens)
        sample = record.meta.sample_id
        for grids in GRID_FIELDS:
            held = payload.get(grids) if isinstance(payload, Mapping) else None
            if held is not None and len(held):
                raise ConfigError(
                    f"{self.name}: record {sample} holds images or videos (field {grids!r}); "
                    "pack_flat drops their pixels and may cut a row through their tokens: pack "
                    "them with pack_sequences(image_grids=...) and to_training"
                )
        name = resolve_tokens_field(payload, self.tokens_field, sample)
        tokens = _tokens(payload, name, sample)
        length = len(tokens)
        fields: dict[str, Any] = {name: tokens}
        if self.aligned_fields is None:
            for key, value in payload.items():
                if key != name and _aligned(value, length):
                    fields[key] = value
        else:
            for key in self.aligned_fields:
                if key not in payload:
                    raise MissingFieldError(
                        f"{self.name}: record {sample} has no aligned field {key!r} (fields: "
                        f"{sorted(payload)}); remove it from aligned_fields or add it upstream"
                    )
                value = payload[key]
                if not _aligned(value, length):
                    raise DataError(
                        f"{self.name}: field {key!r} of record {sample} has "
                        f"{len(value)} entries but the record has {length} tokens; aligned "
                        "fields must have one entry per token"
                    )
                fields[key] = value
        return fields, length

    def assemble(self, meta: SampleMeta, deferred: DeferredBin) -> Any:
        segments = deferred.segments
        names = list(segments[0][0])
        tokens_name = names[0]
        for fields, _, _, _ in segments[1:]:
            if list(fields) != names:
                raise DataError(
                    f"{self.name}: records packed together disagree on their aligned fields "
                    f"({names[1:]} vs {list(fields)[1:]}, packed record {meta.sample_id}); "
                    "pass aligned_fields=[...] to choose the fields explicitly"
                )
        lengths = [stop - start for _, start, stop, _ in segments]
        pad = self.max_length - sum(lengths)
        out: dict[str, Any] = {}
        for name in names:
            pieces = [np.asarray(f[name][start:stop]) for f, start, stop, _ in segments]
            dtype = pieces[0].dtype
            fill = self.pad_token_id if name == tokens_name else 0
            if pad:
                pieces.append(np.full(pad, fill, dtype=dtype))
            out[name] = np.concatenate(pieces) if len(pieces) > 1 else pieces[0].copy()
        runs = [*lengths, pad] if pad else lengths  # the padding tail is a run of its own
        if self.emit_positions:
            ramp = self._ramp()
            out["positions"] = np.concatenate([ramp[:n] for n in runs])
        if self.emit_document_ids:
            ids = np.arange(len(runs), dtype=np.int32)
            if pad:
                ids[-1] = -1
            out["document_ids"] = np.repeat(ids, runs)
        return out

    def _ramp(self) -> np.ndarray:
        """``0, 1, ..., max_length - 1`` (int32, read-only): each run's positions are a prefix."""
        ramp = self._ramp_array
        if ramp is None:
            ramp = self._ramp_array = np.arange(self.max_length, dtype=np.int32)
            ramp.flags.writeable = False
        return ramp

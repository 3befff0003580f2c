"""Segments of delivered records, read from the metadata that already flows with them.

A packed record's ``TAG_PACKING`` lists its segments (source cursor, token span in the source,
whole source length); any other record is one segment covering its tokens. Nothing is read
from disk here: names, files and lines come from an :class:`Origin` only when asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import msgspec
import numpy as np
import xxhash

from zephon.provenance._model import BatchProvenance, ImageSource, Segment
from zephon.provenance._origin import Origin
from zephon.types import TAG_PACKING, SampleBatch, SampleRecord, StreamItem

__all__ = [
    "RawSegment",
    "batch_provenance",
    "content_fingerprint",
    "raw_segments",
    "records_of_item",
]

TOKEN_FIELDS = ("input_ids", "tokens", "token_ids", "ids")

RawSegment = tuple[Any, int, int, int, int, "int | None"]
"""``(source cursor, row start, row end, source start, source end, source length)``."""


def records_of_item(item: StreamItem) -> list[SampleRecord]:
    return item.records if isinstance(item, SampleBatch) else [item]


def _token_count(payload: Any) -> int:
    if isinstance(payload, Mapping):
        for name in TOKEN_FIELDS:
            if name in payload:
                return len(payload[name])
        packed = payload.get("packed_samples")
        if isinstance(packed, Sequence):
            return sum(_token_count(p) for p in packed)
    return 0


def raw_segments(record: SampleRecord) -> list[RawSegment]:
    """The record's segments, in row order, from its metadata."""
    meta = record.meta
    tags = meta.tags
    packing = tags.get(TAG_PACKING) if tags else None
    if packing is None or "segments" not in packing:
        n = _token_count(record.payload)
        return [(meta.cursor, 0, n, 0, n, n)]
    lengths = packing.get("source_lengths")
    out: list[RawSegment] = []
    pos = 0
    for i, (cursor, start, stop) in enumerate(packing["segments"]):
        full = int(lengths[i]) if lengths is not None else None
        out.append((cursor, pos, pos + stop - start, start, stop, full))
        pos += stop - start
    return out


def _place(origin: Origin, ds: int, shard: int, row: int) -> tuple[str, str, int, int | None]:
    """Dataset, file, row and line of a sample: the original document's for a converted
    corpus, else the shard's own."""
    original = origin.source_of(ds, shard, row)
    if original is not None:
        return original
    return origin.name(ds), origin.location(ds, shard), row, origin.line(ds, shard, row)


def batch_provenance(batch: SampleBatch, origin: Any = None) -> BatchProvenance:
    """:meth:`SampleBatch.provenance`: resolve every segment against the batch's origin."""
    resolved = Origin.of(origin) if origin is not None else batch._origin
    if resolved is None:
        resolved = Origin([])
    lane = batch.records[0].meta.lane_id if batch.records else -1
    raw = [raw_segments(record) for record in batch.records]
    whole = _whole_lengths(resolved, int(lane), raw)
    rows: list[tuple[Segment, ...]] = []
    for record, record_segments in zip(batch.records, raw, strict=True):
        segs = []
        images = _images(record.payload, resolved.image_fields)
        for k, (cursor, start, end, src_start, src_end, full) in enumerate(record_segments):
            ds, shard, index = (int(x) for x in cursor[3])
            length = whole.get(cursor, full) if full is not None else None
            name, source, row, line = _place(resolved, ds, shard, index)
            segs.append(
                Segment(
                    dataset=name,
                    source=source,
                    source_row=row,
                    line=line,
                    sample_id=(ds, shard, index),
                    lineage=tuple(int(x) for x in cursor[2]),
                    start=start,
                    end=end,
                    source_start=int(src_start),
                    source_end=int(src_end),
                    source_length=length,
                    extra=resolved.extra(ds, shard, index),
                    cut_tokens=0 if length is None or full is None else length - full,
                    images=images.get(k, ()),
                )
            )
        rows.append(tuple(segs))
    return BatchProvenance(tuple(rows), int(lane))


def _images(payload: Any, fields: Sequence[str]) -> dict[int, tuple[ImageSource, ...]]:
    """Per packed sample (segment) of a row packed with images, its images: where their
    vision tokens are (the row's ``image_map``) and the field and tar member each came from
    (the k-th image is the sample's k-th image field present, as ``decode_image`` reads them)."""
    if not isinstance(payload, Mapping) or "image_map" not in payload:
        return {}
    samples = payload.get("packed_samples") or []
    out: dict[int, list[ImageSource]] = {}
    for sample, k, offset, tokens in np.asarray(payload["image_map"]).tolist():
        fields_of = samples[sample] if sample < len(samples) else {}
        if not isinstance(fields_of, Mapping):
            fields_of = {}
        present = [f for f in fields if f in fields_of]
        field = present[k] if k < len(present) else None
        key = fields_of.get("__key__")
        member = f"{key}.{field}" if isinstance(key, str) and field is not None else None
        image = ImageSource(index=k, start=offset, end=offset + tokens, field=field, member=member)
        out.setdefault(sample, []).append(image)
    return {sample: tuple(images) for sample, images in out.items()}


def _whole_lengths(origin: Origin, lane: int, raw: list[list[RawSegment]]) -> dict[Any, int | None]:
    """``cursor -> whole token count`` of the segments truncation may have cut: those of
    records exactly ``max_length`` long (empty when the pipeline does not truncate)."""
    cuts = origin.cut_lengths()
    if cuts is None:
        return {}
    wanted = [seg[0] for segs in raw for seg in segs if seg[5] == cuts.limit]
    return cuts.whole(lane, wanted) if wanted else {}


def _feed(h: Any, value: Any) -> None:
    """Hash ``value`` with its type and shape, so different contents never feed equal bytes."""
    if isinstance(value, np.ndarray):
        h.update(b"A" + value.dtype.str.encode() + repr(value.shape).encode())
        h.update(np.ascontiguousarray(value).data)
    elif isinstance(value, Mapping):
        h.update(b"M%d" % len(value))
        for key in sorted(value, key=str):
            h.update(str(key).encode() + b"\0")
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)) and not all(
        isinstance(v, (int, float, str, bool)) or v is None for v in value
    ):
        h.update(b"L%d" % len(value))
        for v in value:
            _feed(h, v)
    else:
        try:
            h.update(b"J" + msgspec.json.encode(value))
        except (TypeError, msgspec.EncodeError):
            h.update(b"R" + repr(value).encode())


def content_fingerprint(item: StreamItem) -> str:
    """A stable 128-bit digest (hex) of the training content of a batch or record."""
    h = xxhash.xxh3_128()
    for record in records_of_item(item):
        h.update(b"\x1erow")
        _feed(h, record.payload)
    return h.hexdigest()


def iter_raw(item: StreamItem) -> Iterator[tuple[int, int, RawSegment]]:
    """``(row, segment index, raw segment)`` of every segment of an item."""
    for r, record in enumerate(records_of_item(item)):
        for s, seg in enumerate(raw_segments(record)):
            yield r, s, seg

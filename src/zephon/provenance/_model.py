"""What provenance reports: segments of rows, with the place each came from."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = ["BatchProvenance", "ImageSource", "Segment"]


class ImageSource(msgspec.Struct, frozen=True, kw_only=True):
    """One image of a segment's sample: its vision tokens in the row and where it was stored.

    ``index``: the image's place among its sample's images (its grid in ``image_grid_thw``);
    ``start``/``end``: its vision tokens in the row; ``field``: the field (Parquet column,
    WebDataset extension) it was read from, ``None`` when the pipeline does not say;
    ``member``: the WebDataset tar member holding it (``<key>.<field>``), else ``None``.
    """

    index: int
    start: int
    end: int
    field: str | None
    member: str | None


class Segment(msgspec.Struct, frozen=True, kw_only=True):
    """One contiguous run of a row's tokens and the document it was cut from.

    ``start``/``end``: the token span in the row; ``source_start``/``source_end``: the same
    tokens in the source document as the pipeline tokenized it (``source_length`` tokens in
    all, ``None`` when unknown). ``cut_tokens``: how many of those truncation
    (``tokenize(max_length=...)``) cut from the document's end, so only the first
    ``source_length - cut_tokens`` reached any row. ``source_row`` is the 0-based row of the
    source file, ``line`` its 1-based line for JSON Lines. ``lineage`` holds child indices of
    fan-outs (``expand_chat``). ``extra`` is what a source adds (a capture rollout's
    ``rollout_id`` and ``call_ids``). ``images``: the sample's images in a row packed with
    images (``pack_sequences(image_grids=...)``), each read from this segment's file and row.
    """

    dataset: str
    source: str
    source_row: int
    line: int | None
    sample_id: tuple[int, int, int]
    lineage: tuple[int, ...]
    start: int
    end: int
    source_start: int
    source_end: int
    source_length: int | None
    extra: Mapping[str, Any] | None = None
    cut_tokens: int = 0
    images: tuple[ImageSource, ...] = ()

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def is_piece(self) -> bool:
        """True for a piece of a document split across rows (packing with wrap); a document
        truncation cut is whole when its kept tokens are."""
        if self.source_length is None:
            return self.source_start > 0
        return self.source_start > 0 or self.source_end < self.source_length - self.cut_tokens

    @property
    def span(self) -> str:
        """``START-END/LENGTH`` in the source, with what truncation cut:
        ``0-2048/5000 (cut 2952)``."""
        length = "" if self.source_length is None else f"/{self.source_length}"
        cut = f" (cut {self.cut_tokens})" if self.cut_tokens else ""
        return f"{self.source_start}-{self.source_end}{length}{cut}"

    @property
    def where(self) -> str:
        """``FILE:LINE`` for JSON Lines, ``FILE#ROW`` (0-based) otherwise."""
        if self.line is not None:
            return f"{self.source}:{self.line}"
        return f"{self.source}#{self.source_row}"

    def image_where(self, image: ImageSource) -> str:
        """Where one of the segment's images is stored: ``FILE:MEMBER`` in a tar shard,
        ``FILE#ROW:FIELD`` otherwise."""
        if image.member is not None:
            return f"{self.source}:{image.member}"
        return f"{self.where}:{image.field}" if image.field is not None else self.where

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        out["is_piece"] = self.is_piece
        for image, entry in zip(self.images, out["images"], strict=True):
            entry["where"] = self.image_where(image)
        return out


@dataclass(frozen=True)
class BatchProvenance:
    """Per row of a batch, its segments in row order; ``lane`` is the batch's lane."""

    rows: tuple[tuple[Segment, ...], ...]
    lane: int

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[tuple[Segment, ...]]:
        return iter(self.rows)

    def __getitem__(self, row: int) -> tuple[Segment, ...]:
        return self.rows[row]

    def segments(self) -> Iterator[tuple[int, int, Segment]]:
        """``(row, segment index, segment)`` for every segment, in order."""
        for r, row in enumerate(self.rows):
            for s, seg in enumerate(row):
                yield r, s, seg

    def to_dicts(self) -> list[dict[str, Any]]:
        """One JSON-safe dict per segment, with its ``row`` and ``segment`` index."""
        return [{"row": r, "segment": s, **seg.to_dict()} for r, s, seg in self.segments()]

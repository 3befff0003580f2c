"""Packed rows with images as flat token rows: ``to_training`` over ``pack_sequences`` rows
packed with ``image_grids=``.

Why apart from ``training``: such a row is an envelope of whole samples (their text tokens,
patch grids and decoded pixels) plus its layout (``cu_seqlens``, the image map); the model
wants one token row in that layout (each sample's images as runs of the image placeholder
token, then its text), positions restarting per sample, the 3-D mRoPE positions and the
images' pixels in the same order. A sample's videos (``pack_sequences(video_grids=...)``)
follow its images as runs of the video placeholder token, with their own pixels and grids.
This module makes the flat rows; ``training`` then treats them like any other rows (labels,
masks, varlen keys).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon._mrope import row_mrope
from zephon._pixel_values import pixel_values
from zephon.errors import ConfigError, DataError, MissingFieldError
from zephon.types import SampleRecord

#: The flat rows' fields (``training`` reads them like a token view's).
FLAT_TOKENS, FLAT_LOSS_MASK = "input_ids", "loss_mask"


def is_packed_image_row(payload: Any) -> bool:
    """A ``pack_sequences(image_grids=...)`` row: its samples, ``cu_seqlens`` and image map."""
    return isinstance(payload, Mapping) and "packed_samples" in payload and "image_map" in payload


@dataclass(frozen=True)
class PackedImageRows:
    """The flat rows of a batch of packed image rows, and what the image keys need."""

    records: list[SampleRecord]  # one flat payload per row, all of one width
    samples: list[Any]  # every row's samples, in row order: where the pixels are
    grids: list[tuple[int, int, int]]  # every image's patch grid, in token order
    video_grids: list[tuple[int, int, int]]  # every video's patch grid, in token order
    mrope: np.ndarray  # (3, rows, width) int64
    mm_token_type_ids: np.ndarray  # (rows, width) int32: 1 on image, 2 on video tokens

    def add_to(
        self,
        out: dict[str, Any],
        positions: np.ndarray,
        convention: str,
        fields: Sequence[str],
        video_fields: Sequence[str] = (),
    ) -> None:
        """The mRoPE positions (``hf``: ``position_ids`` of 4 rows, the text positions that
        mark the documents first, as Qwen2-VL's forward takes them for packed rows; else
        ``mrope_positions``), ``mm_token_type_ids`` and, with ``fields`` (``video_fields``),
        the images' (videos') pixels."""
        if convention == "hf":
            out["position_ids"] = np.concatenate([positions[None], self.mrope])
        else:
            out["mrope_positions"] = self.mrope
        out["mm_token_type_ids"] = self.mm_token_type_ids
        for names, video, planned in (
            (fields, False, self.grids),
            (video_fields, True, self.video_grids),
        ):
            if names:
                out.update(self._pixels(names, video, planned))

    def _pixels(
        self, fields: Sequence[str], video: bool, planned: list[tuple[int, int, int]]
    ) -> dict[str, np.ndarray]:
        media, keys = ("video", "video_fields") if video else ("image", "image_fields")
        arrays = pixel_values(self.samples, fields, video=video)
        decoded = [_grid(g) for g in arrays[f"{media}_grid_thw"]]
        if decoded != planned:
            raise DataError(
                f"to_training: the decoded {media}s of fields {list(fields)} have grids "
                f"{decoded}, the packed rows' image maps {planned}; decode_{media} every "
                f"{media} field before pack_sequences and pass those fields as {keys}"
            )
        return arrays


@dataclass(frozen=True)
class _Row:
    ids: np.ndarray
    loss_mask: np.ndarray
    kinds: np.ndarray  # 1 on image, 2 on video tokens
    cu: np.ndarray
    mrope: np.ndarray
    grids: list[tuple[int, int, int]]
    video_grids: list[tuple[int, int, int]]


@dataclass(frozen=True)
class VisionTokens:
    """The model's placeholder tokens and the samples' grid fields, images then videos."""

    image_token_id: int
    grid_field: str
    video_token_id: int | None = None
    video_grid_field: str = "video_grid_thw"

    def media(
        self, sample: Any, lines: np.ndarray, where: str
    ) -> tuple[list[tuple[int, int, int]], np.ndarray]:
        """The patch grid and the placeholder token of each image map line of ``sample``:
        its images first, then its videos (as ``pack_sequences(video_grids=...)`` counts)."""
        if not len(lines):
            return [], np.zeros(0, dtype=np.int64)
        fields = (self.grid_field, self.video_grid_field)
        if not any(f in sample for f in fields[: 1 + (self.video_token_id is not None)]):
            raise MissingFieldError(
                f"to_training: {where} has no field {self.grid_field!r}; pass image_grids= the "
                "field pack_sequences counted"
            )
        grids = [_grid(g) for g in sample.get(self.grid_field, ())]
        images = len(grids)
        if int(lines[:, 1].max()) >= images:
            if self.video_token_id is None or self.video_grid_field not in sample:
                raise ConfigError(
                    f"to_training: {where} has videos; pass video_token_id=... (the model's "
                    "video placeholder: config.video_token_id, 151656 for Qwen2-VL) and "
                    "video_grids= the field pack_sequences counted"
                )
            grids += [_grid(g) for g in sample[self.video_grid_field]]
        chosen = [grids[int(j)] for j in lines[:, 1]]
        tokens = np.where(lines[:, 1] < images, self.image_token_id, self.video_token_id or 0)
        return chosen, tokens.astype(np.int64)


def _flat_row(
    record: SampleRecord,
    token_name: Callable[[Any], str],
    vision_tokens: VisionTokens,
    loss_field: str | None,
    merge_size: int,
) -> _Row:
    """One packed row as a token row: each sample's image tokens (each image between the
    row's ``image_markers`` when it has them), then its text."""
    payload = record.payload
    cu = np.asarray(payload["cu_seqlens"], dtype=np.int64)
    image_map = np.asarray(payload["image_map"], dtype=np.int64).reshape(-1, 4)
    markers = payload.get("image_markers")
    ids: list[np.ndarray] = []
    loss: list[np.ndarray] = []
    grids: list[tuple[int, int, int]] = []
    placeholders: list[np.ndarray] = []
    for i, sample in enumerate(payload["packed_samples"]):
        where = f"sample {i} of packed row {record.meta.sample_id}"
        text = np.asarray(sample[token_name(sample)]).reshape(-1)
        lines = image_map[image_map[:, 0] == i]
        vision = int(lines[:, 3].sum()) + (2 * len(lines) if markers is not None else 0)
        length = int(cu[i + 1] - cu[i])
        if length == len(text) and vision:  # the vision tokens are in the text already
            vision = 0
        elif vision + len(text) != length:
            raise DataError(
                f"to_training: {where} has {len(text)} text and {vision} vision tokens, its "
                f"cu_seqlens {length}; pass the rows of pack_sequences(image_grids=...) unchanged"
            )
        chosen, tokens = vision_tokens.media(sample, lines, where)
        grids += chosen
        placeholders.append(tokens)
        ids += [_vision_ids(tokens, lines[:, 3], markers) if vision else tokens[:0], text]
        mask = np.ones(len(text), dtype=np.float32)
        if loss_field and loss_field in sample:
            mask = np.asarray(sample[loss_field], dtype=np.float32).reshape(-1)
        loss += [np.zeros(vision, dtype=np.float32), mask]
    flat = np.concatenate(ids, dtype=np.int64)
    kinds = np.zeros(len(flat), dtype=np.int32)
    tokens = np.concatenate(placeholders) if placeholders else np.zeros(0, np.int64)
    for (_, _, offset, n), token in zip(image_map, tokens, strict=True):  # wherever they are
        kinds[offset : offset + n] = 1 if token == vision_tokens.image_token_id else 2
    loss_mask = np.concatenate(loss)
    loss_mask[kinds > 0] = 0
    return _Row(
        ids=flat,
        loss_mask=loss_mask,
        kinds=kinds,
        cu=cu,
        mrope=row_mrope(cu, image_map, grids, merge_size),
        grids=[g for g, k in zip(grids, tokens, strict=True) if k == vision_tokens.image_token_id],
        video_grids=[
            g for g, k in zip(grids, tokens, strict=True) if k != vision_tokens.image_token_id
        ],
    )


def _vision_ids(tokens: np.ndarray, counts: np.ndarray, markers: Any) -> np.ndarray:
    """A sample's vision tokens laid out before its text: each image (video) as a run of its
    placeholder token, between its start and end marker when the row has markers."""
    runs = np.repeat(tokens, counts)
    if markers is None:
        return runs
    out = np.empty(len(runs) + 2 * len(counts), dtype=np.int64)
    ends = np.cumsum(counts + 2)
    out[ends - counts - 2], out[ends - 1] = markers[0], markers[1]
    inside = np.ones(len(out), dtype=bool)
    inside[ends - counts - 2] = inside[ends - 1] = False
    out[inside] = runs
    return out


def _grid(grid: Sequence[Any]) -> tuple[int, int, int]:
    t, h, w = (int(n) for n in grid)
    return t, h, w


def packed_image_rows(
    records: Sequence[SampleRecord],
    *,
    token_name: Callable[[Any], str],
    image_token_id: int | None,
    pad_token_id: int | None,
    grid_field: str,
    loss_field: str | None,
    merge_size: int,
    video_token_id: int | None = None,
    video_grid_field: str = "video_grid_thw",
) -> PackedImageRows:
    """Flat rows of ``records`` (packed image rows), right-padded to the longest: padding is
    ``pad_token_id``, positions from 0 (a segment of its own), no loss, no image."""
    if image_token_id is None:
        raise ConfigError(
            "to_training: packed rows with images need image_token_id=... (the model's image "
            "placeholder token: config.image_token_id, 151655 for Qwen2-VL)"
        )
    vision = VisionTokens(image_token_id, grid_field, video_token_id, video_grid_field)
    rows = [_flat_row(r, token_name, vision, loss_field, merge_size) for r in records]
    width = max(len(row.ids) for row in rows)
    if pad_token_id is None and any(len(row.ids) != width for row in rows):
        raise ConfigError(
            "to_training: packed rows have different lengths (pack_sequences does not pad); "
            "pass pad_token_id=... to right-pad them"
        )
    flat, mrope, types = [], np.zeros((3, len(rows), width), np.int64), []
    for b, (record, row) in enumerate(zip(records, rows, strict=True)):
        real, pad = len(row.ids), width - len(row.ids)
        documents = np.repeat(np.arange(len(row.cu) - 1), np.diff(row.cu))
        positions = np.concatenate([np.arange(real) - row.cu[documents], np.arange(pad)])
        mrope[:, b] = np.concatenate([row.mrope, np.broadcast_to(np.arange(pad), (3, pad))], 1)
        types.append(np.concatenate([row.kinds, np.zeros(pad, np.int32)]))
        payload = {
            FLAT_TOKENS: np.concatenate([row.ids, np.full(pad, pad_token_id or 0, np.int64)]),
            "positions": positions,
            "document_ids": np.concatenate([documents, np.full(pad, -1)]),
            FLAT_LOSS_MASK: np.concatenate([row.loss_mask, np.zeros(pad, np.float32)]),
            "num_tokens": np.array([real]),
        }
        flat.append(SampleRecord(record.meta, payload))
    samples = [s for r in records for s in r.payload["packed_samples"]]
    grids = [g for row in rows for g in row.grids]
    videos = [g for row in rows for g in row.video_grids]
    return PackedImageRows(flat, samples, grids, videos, mrope, np.stack(types))

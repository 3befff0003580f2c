"""Packed rows with images as flat token rows: ``to_training`` over ``pack_sequences`` rows
packed with ``image_grids=``.

Why apart from ``training``: such a row is an envelope of whole samples (their text tokens,
patch grids and decoded pixels) plus its layout (``cu_seqlens``, the image map); the model
wants one token row in that layout (each sample's images as runs of the image placeholder
token, then its text), positions restarting per sample, the 3-D mRoPE positions and the
images' pixels in the same order. This module makes the flat rows; ``training`` then treats
them like any other rows (labels, masks, varlen keys).
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
    mrope: np.ndarray  # (3, rows, width) int64
    mm_token_type_ids: np.ndarray  # (rows, width) int32: 1 on image tokens

    def add_to(
        self, out: dict[str, Any], positions: np.ndarray, convention: str, fields: Sequence[str]
    ) -> None:
        """The mRoPE positions (``hf``: ``position_ids`` of 4 rows, the text positions that
        mark the documents first, as Qwen2-VL's forward takes them for packed rows; else
        ``mrope_positions``), ``mm_token_type_ids`` and, with ``fields``, the pixels."""
        if convention == "hf":
            out["position_ids"] = np.concatenate([positions[None], self.mrope])
        else:
            out["mrope_positions"] = self.mrope
        out["mm_token_type_ids"] = self.mm_token_type_ids
        if not fields:
            return
        images = pixel_values(self.samples, fields)
        decoded = [tuple(int(n) for n in g) for g in images["image_grid_thw"]]
        if decoded != self.grids:
            raise DataError(
                f"to_training: the decoded images of fields {list(fields)} have grids "
                f"{decoded}, the packed rows' image maps {self.grids}; decode_image every image "
                "field before pack_sequences and pass those fields as image_fields"
            )
        out.update(images)


@dataclass(frozen=True)
class _Row:
    ids: np.ndarray
    loss_mask: np.ndarray
    is_image: np.ndarray
    cu: np.ndarray
    mrope: np.ndarray
    grids: list[tuple[int, int, int]]


def _flat_row(
    record: SampleRecord,
    token_name: Callable[[Any], str],
    image_token_id: int,
    grid_field: str,
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
    for i, sample in enumerate(payload["packed_samples"]):
        text = np.asarray(sample[token_name(sample)]).reshape(-1)
        lines = image_map[image_map[:, 0] == i]
        vision = int(lines[:, 3].sum()) + (2 * len(lines) if markers is not None else 0)
        length = int(cu[i + 1] - cu[i])
        if length == len(text) and vision:  # the vision tokens are in the text already
            vision = 0
        elif vision + len(text) != length:
            raise DataError(
                f"to_training: sample {i} of packed row {record.meta.sample_id} has {len(text)} "
                f"text and {vision} vision tokens, its cu_seqlens {length}; pass the rows of "
                "pack_sequences(image_grids=...) unchanged"
            )
        if len(lines) and grid_field not in sample:
            raise MissingFieldError(
                f"to_training: sample {i} of packed row {record.meta.sample_id} has no field "
                f"{grid_field!r}; pass image_grids= the field pack_sequences counted"
            )
        grids += [_grid(sample[grid_field][j]) for j in lines[:, 1]]
        vision_ids = np.full(vision, image_token_id, dtype=np.int64)
        if markers is not None and vision:  # each image between its start and end marker
            ends = np.cumsum(lines[:, 3] + 2)
            vision_ids[ends - lines[:, 3] - 2] = markers[0]
            vision_ids[ends - 1] = markers[1]
        ids += [vision_ids, text.astype(np.int64)]
        mask = np.ones(len(text), dtype=np.float32)
        if loss_field and loss_field in sample:
            mask = np.asarray(sample[loss_field], dtype=np.float32).reshape(-1)
        loss += [np.zeros(vision, dtype=np.float32), mask]
    flat = np.concatenate(ids)
    is_image = np.zeros(len(flat), dtype=bool)
    for _, _, offset, tokens in image_map:  # the image tokens, wherever they are
        is_image[offset : offset + tokens] = True
    loss_mask = np.concatenate(loss)
    loss_mask[is_image] = 0
    return _Row(
        ids=flat,
        loss_mask=loss_mask,
        is_image=is_image,
        cu=cu,
        mrope=row_mrope(cu, image_map, grids, merge_size),
        grids=grids,
    )


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
) -> PackedImageRows:
    """Flat rows of ``records`` (packed image rows), right-padded to the longest: padding is
    ``pad_token_id``, positions from 0 (a segment of its own), no loss, no image."""
    if image_token_id is None:
        raise ConfigError(
            "to_training: packed rows with images need image_token_id=... (the model's image "
            "placeholder token: config.image_token_id, 151655 for Qwen2-VL)"
        )
    rows = [
        _flat_row(r, token_name, image_token_id, grid_field, loss_field, merge_size)
        for r in records
    ]
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
        types.append(np.concatenate([row.is_image, np.zeros(pad, bool)]).astype(np.int32))
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
    return PackedImageRows(flat, samples, grids, mrope, np.stack(types))

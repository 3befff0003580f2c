"""Images in packed rows: each record's vision tokens, and where they land in the row.

Why apart from the packers: a record's length for packing is its text tokens plus its vision
tokens, known from the patch grids (``image_tokens`` reads them from headers, ``decode_image``
from pixels) before any pixel is decoded; the row layout (``cu_seqlens`` and the image map) is
derived from the same grids when the row is assembled, so it needs no state of its own.

Row layout: each sample is its images' tokens, in the order of its grids, then its text
(with ``image_markers``, each image between a start and an end marker token); or, when the
vision tokens are already in the text (``tokenize_chat`` expanded the image placeholders),
the sample's tokens as they are, each image where its run of image tokens is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from zephon.errors import DataError, MissingFieldError

#: Columns of the image map: sample index in the row, image index in the sample, offset of
#: the image's first token in the row, its vision tokens.
IMAGE_MAP_COLUMNS = ("sample", "image", "offset", "tokens")


def image_token_counts(
    payload: Any, field: str, merge_size: int, sample: Any, op: str = "pack_sequences"
) -> list[int]:
    """Vision tokens of each image of ``payload``: ``t * h * w / merge_size**2`` per grid
    (errors name the operator ``op``)."""
    try:
        grids = payload[field]
    except (KeyError, TypeError, IndexError):
        fields = sorted(payload) if isinstance(payload, Mapping) else type(payload).__name__
        raise MissingFieldError(
            f"{op}: record {sample} has no field {field!r} (fields: {fields}); run "
            f"image_tokens or decode_image before {op}, or set image_grids= to the field "
            "holding the (t, h, w) patch grids"
        ) from None
    counts: list[int] = []
    for grid in grids if isinstance(grids, Sequence | np.ndarray) else [grids]:
        if not isinstance(grid, Sequence | np.ndarray) or len(grid) != 3 or min(grid) < 1:
            raise DataError(
                f"{op}: field {field!r} of record {sample} holds {grid!r}; each entry must be "
                "an image's (t, h, w) patch grid of positive sizes"
            )
        t, h, w = (int(n) for n in grid)
        counts.append(t * h * w // (merge_size * merge_size))
    return counts


def inline_image_offsets(tokens: Any, counts: Sequence[int], token: int, sample: Any) -> list[int]:
    """Where each image's run of ``token`` starts in ``tokens``: image ``k`` is the next
    ``counts[k]`` image tokens, which must be consecutive."""
    ids = np.asarray(tokens).reshape(-1)
    at = np.flatnonzero(ids == token)
    offsets: list[int] = []
    used = 0
    for n in counts:
        start = int(at[used]) if used < len(at) else len(ids)
        if used + n > len(at) or int(at[used + n - 1]) != start + n - 1:
            break
        offsets.append(start)
        used += n
    if len(offsets) != len(counts) or used != len(at):
        raise DataError(
            f"pack_sequences: record {sample} has {len(at)} image tokens ({token}), not runs of "
            f"{list(counts)} for its images; expand the image placeholders with "
            "tokenize_chat(image_grids=...) from the same grids"
        )
    return offsets


def marked_offsets(counts: Sequence[int]) -> list[int]:
    """Where each image's vision tokens start in a sample laid out with markers: each image
    as its start marker, its ``counts[k]`` vision tokens and its end marker, one after the
    other from the sample's start."""
    return [int(sum(counts[:k])) + 2 * k + 1 for k in range(len(counts))]


def row_layout(
    lengths: Sequence[int],
    images: Sequence[Sequence[int]],
    offsets: Sequence[Sequence[int]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``cu_seqlens`` (int32, samples + 1 entries) and the image map (int32, one row per image,
    :data:`IMAGE_MAP_COLUMNS`) of a row of samples ``lengths`` long (text and vision tokens)
    whose images have ``images[i]`` vision tokens each, at ``offsets[i]`` from the sample's
    start (default: one after the other from its start)."""
    cu = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    entries: list[tuple[int, int, int, int]] = []
    for i, counts in enumerate(images):
        starts = np.cumsum([0, *counts])[:-1] if offsets is None else offsets[i]
        for j, (n, at) in enumerate(zip(counts, starts, strict=True)):
            entries.append((i, j, int(cu[i]) + int(at), n))
    image_map = np.array(entries, dtype=np.int32).reshape(len(entries), len(IMAGE_MAP_COLUMNS))
    return cu, image_map

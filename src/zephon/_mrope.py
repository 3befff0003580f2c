"""3-D (temporal, height, width) rotary position ids of packed rows with images: mRoPE.

Why: Qwen2-VL-style models rotate each token by three positions. A text token has the same
value in all three, one more than the token before; an image's vision tokens share a start
and spread over its merged patch grid (temporal index, row, column); the text after an image
resumes one past the image's largest position. In a packed row every document starts again
at 0, so rows are computed per document from the row's ``cu_seqlens`` and image map, without
the model's own rope-index pass (which sees a packed row as one sequence).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zephon.errors import DataError


def document_mrope(
    length: int, images: Sequence[tuple[int, Sequence[int]]], merge_size: int
) -> np.ndarray:
    """``(3, length)`` int64 positions of one document whose images start at the given offsets
    (from the document's start, ascending) with the given ``(t, h, w)`` patch grids."""
    out = np.empty((3, length), dtype=np.int64)
    at = current = 0
    for offset, grid in images:
        t, h, w = (int(n) for n in grid)
        gh, gw = h // merge_size, w // merge_size
        out[:, at:offset] = current + np.arange(offset - at)
        current += offset - at
        stop = offset + t * gh * gw
        out[:, offset:stop] = np.indices((t, gh, gw)).reshape(3, -1) + current
        current += max(gh, gw)
        at = stop
    out[:, at:] = current + np.arange(length - at)
    return out


def row_mrope(
    cu_seqlens: np.ndarray,
    image_map: np.ndarray,
    grids: Sequence[Sequence[int]],
    merge_size: int,
) -> np.ndarray:
    """``(3, cu_seqlens[-1])`` positions of a packed row: each document from 0, its images
    where the image map puts them. ``grids[k]`` is the patch grid of image map line ``k``."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    lines = np.asarray(image_map, dtype=np.int64).reshape(-1, 4)
    if len(grids) != len(lines):
        raise DataError(f"mRoPE: {len(lines)} images in the image map but {len(grids)} grids")
    parts = []
    for doc in range(len(cu) - 1):
        start, stop = int(cu[doc]), int(cu[doc + 1])
        images = []
        for k in np.flatnonzero(lines[:, 0] == doc):
            t, h, w = (int(n) for n in grids[int(k)])
            if t * (h // merge_size) * (w // merge_size) != lines[k, 3]:
                raise DataError(
                    f"mRoPE: image {int(lines[k, 1])} of sample {doc} has grid {(t, h, w)}, "
                    f"not the {int(lines[k, 3])} vision tokens the row gives it (merge_size "
                    f"{merge_size}); pack and decode with the same grids and merge_size"
                )
            images.append((int(lines[k, 2]) - start, (t, h, w)))
        images.sort()  # a video may come before an image in the text
        parts.append(document_mrope(stop - start, images, merge_size))
    return np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), dtype=np.int64)

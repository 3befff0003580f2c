"""``pixel_values`` and ``image_grid_thw`` (and the videos' ``pixel_values_videos`` and
``video_grid_thw``) of a batch, in the layout Qwen2-VL's forward takes.

Why here: ``decode_image`` leaves uint8 pixels resized to whole patches; the model wants them
rescaled, normalised with CLIP's mean and std and cut into flattened patches, every image of
the batch one after the other: ``(patches, channels * temporal_patch_size * patch**2)`` float32
next to an ``(images, 3)`` grid. The patch order is the processor's: merge-size blocks of
patches, row by row, each patch channel-major with its temporal copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon.errors import DataError

#: The Qwen2-VL image processor's normalisation (OpenAI CLIP's).
IMAGE_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
IMAGE_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)
PATCH_SIZE, MERGE_SIZE, TEMPORAL_PATCH_SIZE = 14, 2, 2
PIXEL_KEYS = ("pixel_values", "image_grid_thw")


def flattened_patches(pixels: np.ndarray, where: str) -> np.ndarray:
    """One ``(height, width, 3)`` uint8 image as ``(h * w patches, 3 * 2 * 14 * 14)`` float32:
    a video of the image twice, as the image processor pads a single frame in time."""
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise DataError(f"to_training: {where} is {pixels.shape}, expected (height, width, 3)")
    frames = np.broadcast_to(pixels[None], (TEMPORAL_PATCH_SIZE, *pixels.shape))
    return video_patches(frames, where)


def video_patches(frames: np.ndarray, where: str) -> np.ndarray:
    """``(frames, height, width, 3)`` uint8 frames as ``(t * h * w patches, 3 * 2 * 14 * 14)``
    float32, ``t`` = frames / 2: each patch holds the same square of two consecutive frames."""
    if frames.ndim != 4 or frames.shape[3] != 3 or frames.shape[0] % TEMPORAL_PATCH_SIZE:
        raise DataError(
            f"to_training: {where} is {frames.shape}, expected (frames, height, width, 3) with "
            f"frames a multiple of {TEMPORAL_PATCH_SIZE}; decode it with decode_video"
        )
    count, height, width, channels = frames.shape
    side = PATCH_SIZE * MERGE_SIZE
    if height % side or width % side:
        raise DataError(
            f"to_training: {where} is {width}x{height} pixels, not whole {side}-pixel blocks; "
            "decode it with resize=True"
        )
    scaled = (frames.astype(np.float32) * np.float32(1 / 255) - IMAGE_MEAN) / IMAGE_STD
    gt, tp = count // TEMPORAL_PATCH_SIZE, TEMPORAL_PATCH_SIZE
    gh, gw, m, p = height // PATCH_SIZE, width // PATCH_SIZE, MERGE_SIZE, PATCH_SIZE
    blocks = scaled.transpose(0, 3, 1, 2).reshape(gt, tp, channels, gh // m, m, p, gw // m, m, p)
    blocks = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (gt, gh, gw, mh, mw, C, tp, ph, pw)
    return blocks.reshape(gt * gh * gw, channels * tp * p * p)


def pixel_values(
    payloads: Sequence[Any], fields: Sequence[str], *, video: bool = False
) -> dict[str, np.ndarray]:
    """Every image (with ``video``, every video) of ``payloads``: each payload's ``fields`` it
    has, in that order."""
    patches: list[np.ndarray] = []
    grids: list[tuple[int, int, int]] = []
    for i, payload in enumerate(payloads):
        for name in fields:
            if name not in payload:
                continue
            pixels = payload[name]
            if not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8:
                raise DataError(
                    f"to_training: field {name!r} of row {i} is {type(pixels).__name__}, not "
                    f"decoded pixels; run decode_{'video' if video else 'image'} before batching"
                )
            where = f"field {name!r} of row {i}"
            cut = video_patches(pixels, where) if video else flattened_patches(pixels, where)
            patches.append(cut)
            height, width = pixels.shape[-3:-1]
            t = len(pixels) // TEMPORAL_PATCH_SIZE if video else 1
            grids.append((t, height // PATCH_SIZE, width // PATCH_SIZE))
    width = 3 * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE
    names = ("pixel_values_videos", "video_grid_thw") if video else PIXEL_KEYS
    return {
        names[0]: np.concatenate(patches) if patches else np.zeros((0, width), np.float32),
        names[1]: np.array(grids, dtype=np.int64).reshape(len(grids), 3),
    }

"""``pixel_values`` and ``image_grid_thw`` of a batch, in the layout Qwen2-VL's forward takes.

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


def flattened_patches(pixels: np.ndarray, where: str) -> np.ndarray:
    """One ``(height, width, 3)`` uint8 image as ``(h * w patches, 3 * 2 * 14 * 14)`` float32."""
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise DataError(f"to_training: {where} is {pixels.shape}, expected (height, width, 3)")
    height, width, channels = pixels.shape
    side = PATCH_SIZE * MERGE_SIZE
    if height % side or width % side:
        raise DataError(
            f"to_training: {where} is {width}x{height} pixels, not whole {side}-pixel blocks; "
            "decode it with decode_image(resize=True)"
        )
    image = (pixels.astype(np.float32) * np.float32(1 / 255) - IMAGE_MEAN) / IMAGE_STD
    gh, gw, m, p = height // PATCH_SIZE, width // PATCH_SIZE, MERGE_SIZE, PATCH_SIZE
    blocks = image.transpose(2, 0, 1).reshape(channels, gh // m, m, p, gw // m, m, p)
    blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh, gw, mh, mw, C, ph, pw)
    doubled = np.broadcast_to(
        blocks[:, :, :, :, :, None], (*blocks.shape[:5], TEMPORAL_PATCH_SIZE, p, p)
    )
    return doubled.reshape(gh * gw, channels * TEMPORAL_PATCH_SIZE * p * p)


def pixel_values(payloads: Sequence[Any], fields: Sequence[str]) -> dict[str, np.ndarray]:
    """Every image of ``payloads`` (each payload's ``fields`` it has, in that order)."""
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
                    "decoded pixels; run decode_image before batching"
                )
            patches.append(flattened_patches(pixels, f"field {name!r} of row {i}"))
            grids.append((1, pixels.shape[0] // PATCH_SIZE, pixels.shape[1] // PATCH_SIZE))
    width = 3 * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE
    return {
        "pixel_values": np.concatenate(patches) if patches else np.zeros((0, width), np.float32),
        "image_grid_thw": np.array(grids, dtype=np.int64).reshape(len(grids), 3),
    }

"""The shared test corpus: the same documents written in every format by its owning library."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import numpy as np

WORDS = ["data", "token", "lane", "chunk", "batch", "shard", "model", "seed", "rank", "é"]


def corpus_docs(n: int = 20_000, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` small documents ``{"id", "text", "lang"}``; stable across Python versions."""
    rng = random.Random(seed)
    return [
        {
            "id": i,
            "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))),
            "lang": "en" if i % 3 else "fr",
        }
        for i in range(n)
    ]


# One column per MDS encoding zephon decodes (the fixture ``mds-types`` holds 300 such rows).
MDS_TYPES = {
    "s": "str", "i": "int", "b": "bytes", "j": "json", "f32": "float32", "u16": "uint16",
    "si": "str_int", "sf": "str_float", "sd": "str_decimal",
}  # fmt: skip


# Arrays, images and pickles (the fixture ``mds-media`` holds 40 such rows).
MDS_MEDIA = {
    "id": "int", "arr": "ndarray", "grid": "ndarray:int16:2,3", "png": "png", "jpeg": "jpeg",
    "pil": "pil", "obj": "pkl",
}  # fmt: skip


def pixels(i: int) -> np.ndarray:
    """A small RGB image, different for each row."""
    base = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    return (base * (i + 1)).astype(np.uint8)


def media_rows(n: int) -> list[dict[str, Any]]:
    """Rows of ``MDS_MEDIA``; images are built by the caller from :func:`pixels`."""
    return [
        {
            "id": i,
            "arr": np.arange(i + 1, dtype=np.float32 if i % 2 else np.int64) * 3,
            "grid": np.full((2, 3), i - 7, dtype=np.int16),
            "obj": {"k": i, "pair": (i, "x" * (i % 4)), "set": frozenset({i})},
        }
        for i in range(n)
    ]


def types_rows(n: int) -> list[dict[str, Any]]:
    return [
        {
            "s": f"row {i} " + "x" * (i % 7),
            "i": i * 1_000_003 - 5,
            "b": bytes([i % 256]) * (i % 5),
            "j": {"k": i, "tags": ["a"] * (i % 3)},
            "f32": np.float32(i / 4),
            "u16": np.uint16(i),
            "si": i,
            "sf": i / 8,
            "sd": Decimal(i) / 4,
        }
        for i in range(n)
    ]

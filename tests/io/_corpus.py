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

"""Small generated documents shared by the engine, runner and mixture tests."""

from __future__ import annotations

import random

WORDS = [
    "data",
    "token",
    "lane",
    "chunk",
    "batch",
    "shard",
    "model",
    "train",
    "seed",
    "pack",
    "mixture",
    "replay",
    "cursor",
    "engine",
    "worker",
    "queue",
    "order",
    "epoch",
    "rank",
    "é",
]


def make_docs(n: int, seed: int = 0) -> list[dict[str, object]]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 60))]
        docs.append({"id": i, "text": " ".join(words) + ("\r\n" if i % 5 == 0 else "")})
    return docs

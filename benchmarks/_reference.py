"""The reference pipeline of the benchmarks (tokenize, shuffle, pack_flat, batch; 4 lanes):
what a training loop reads, and checkpoints every step (trainer.py, checkpoint.py)."""

from __future__ import annotations

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource

REFERENCE_ROWS = [
    {"text": f"doc {i}: " + "lorem ipsum dolor " * (1 + i % 23)} for i in range(20000)
]


def reference_pipeline() -> Pipeline:
    """A fresh reference pipeline (inline runner; callers change options as they need)."""
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("docs", REFERENCE_ROWS, shard_size=2000)],
        mixture=MixtureSpec({"docs": 1.0}),
        chunk_size=64,
        seed=1,
    )
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes", max_length=256)
        .shuffle(256, seed=2)
        .pack_flat(256, pad_token_id=0)
        .batch(4)
        .options(runner="inline", canonical_replicas=4)
    )

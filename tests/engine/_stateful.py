"""The stateful reference pipeline (shuffle, packing, mixture, batch) shared by the resume,
gather and rank tests."""

from __future__ import annotations

from typing import Any

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.types import SampleBatch

A = [{"id": i, "text": "alpha " * (1 + i % 6)} for i in range(160)]
B = [{"id": i, "text": "beta gamma " * (1 + i % 4)} for i in range(90)]


def build(cfg: dict[str, Any], **options: Any) -> Pipeline:
    source = StaticMixtureWorkSource(
        datasets=[
            Dataset.from_records("a", A[: cfg["rows_a"]], shard_size=37),
            Dataset.from_records("b", B[: cfg["rows_b"]], shard_size=23),
        ],
        mixture=MixtureSpec({"a": 0.6, "b": 0.4}),
        chunk_size=cfg["chunk"],
        seed=cfg["seed"],
    )
    pipe = Pipeline(source).decode_text().tokenize("bytes", max_length=24)
    if cfg["shuffle"]:
        pipe = pipe.shuffle(cfg["shuffle_buffer"], seed=3, algorithm=cfg["shuffle"])
    if cfg["pack"]:
        pipe = pipe.pack_flat(32, pad_token_id=0, algorithm=cfg["pack"], num_bins=4)
    if cfg["mixture"]:
        pipe = pipe.ensure_mixture(max_buffer_size=cfg["mixture"])
    pipe = pipe.batch(cfg["batch"], drop_last=cfg["drop_last"])
    opts = {
        "canonical_replicas": cfg["replicas"],
        "flush_every_k_chunks": cfg["k"],
        "snapshot_every_chunks": cfg.get("snap_chunks", 1),
        "snapshot_every_records": cfg.get("snap_records", 512),
        **options,
    }
    return pipe.options(**opts)


def key(batch: Any) -> Any:
    assert isinstance(batch, SampleBatch)
    return (
        batch.lane_id,
        tuple((r.meta.cursor, r.payload["input_ids"].tobytes()) for r in batch.records),
    )


REFERENCE_CFG = {
    "rows_a": 160,
    "rows_b": 90,
    "chunk": 11,
    "seed": 1,
    "shuffle": "streaming",
    "shuffle_buffer": 9,
    "pack": "best_fit",
    "mixture": 20,
    "batch": 2,
    "drop_last": True,
    "replicas": 4,
    "k": 2,
}


def lane_streams(items: list[Any]) -> dict[int, list[Any]]:
    streams: dict[int, list[Any]] = {}
    for lane, rows in items:
        streams.setdefault(lane, []).append(rows)
    return streams

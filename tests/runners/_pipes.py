"""The reference pipelines and a byte-level digest of their output."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tests.engine import _resume as resume
from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
from zephon.types import TAG_CONTRIBUTORS, TAG_PACKING, SampleBatch


def reference(
    docs: list[dict[str, Any]], tok: Path, runner: str, workers: int | Literal["auto"], **opts: Any
):
    """decode -> tokenize -> batch, three lanes."""
    ds = Dataset.from_records("docs", docs, shard_size=50)
    return (
        Pipeline(RangeSource([ds], chunk_size=40))
        .fetch(parallelism=workers)
        .decode_text(parallelism=workers)
        .tokenize(tok, max_length=48, parallelism=workers)
        .batch(8)
        .options(runner=runner, canonical_replicas=3, **opts)
    )


def stateful(docs: list[dict[str, Any]], tok: Path, runner: str, workers: int, **opts: Any):
    """decode -> tokenize -> shuffle -> pack_flat -> batch, two lanes, flush sentinels."""
    ds = Dataset.from_records("docs", docs, shard_size=50)
    return (
        Pipeline(RangeSource([ds], chunk_size=30))
        .fetch(parallelism=workers)
        .decode_text(parallelism=workers)
        .tokenize(tok, max_length=64, parallelism=workers)
        .shuffle(48, seed=3, algorithm="block")
        .pack_flat(96, 0, parallelism=workers)
        .batch(4)
        .options(runner=runner, canonical_replicas=2, flush_every_k_chunks=3, **opts)
    )


def big_array(payload: dict[str, Any]) -> dict[str, Any]:
    rng = np.random.default_rng(int(payload["id"]))
    return {**payload, "pixels": rng.integers(0, 255, size=(256, 1024), dtype=np.int32)}


def add_stats(payload: dict[str, Any]) -> dict[str, Any]:
    # "pixels" passes through unchanged: it travels on as the same segment, not a copy.
    return {**payload, "total": int(payload["pixels"].sum()), "row0": payload["pixels"][0] * 2}


def heavy(runner: str, rows: int = 48, **opts: Any) -> Pipeline:
    """A payload-heavy pipeline: a 1 MiB int32 array per record."""
    ds = Dataset.from_records("rows", [{"id": i} for i in range(rows)], shard_size=16)
    return (
        Pipeline(RangeSource([ds], chunk_size=8))
        .map_transform(big_array, parallelism=2)
        .map_transform(add_stats, parallelism=2)
        .batch(4)
        .options(runner=runner, canonical_replicas=2, **opts)
    )


def describe(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, hashlib.sha1(value.tobytes()).hexdigest())
    if isinstance(value, dict):
        return sorted((k, describe(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    return value


def key(item: Any) -> Any:
    """Everything about one output item: lane, cursors, bookkeeping tags, payload bytes."""
    records = item.records if isinstance(item, SampleBatch) else [item]
    return (
        type(item).__name__,
        [
            (
                r.meta.lane_id,
                r.meta.cursor,
                describe(list(r.meta.tags.get(TAG_CONTRIBUTORS, ()))),
                describe(dict(r.meta.tags.get(TAG_PACKING, {}))),
                describe(r.payload),
            )
            for r in records
        ],
    )


def digest(pipe: Pipeline) -> list[Any]:
    return [key(item) for item in pipe]


def run_with_stops(make: Any, stops: list[int]) -> list[Any]:
    """Consume; checkpoint through JSON; restore in a fresh pipeline; repeat."""
    return resume.run_with_stops(make, key, stops)

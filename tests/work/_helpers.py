"""Shared builders for work-source tests."""

from __future__ import annotations

from collections import Counter
from typing import Any

from zephon.io import Dataset, InMemoryShard
from zephon.work import StaticMixtureWorkSource, WorkChunk


def dataset(name: str, shard_sizes: list[int]) -> Dataset:
    """Rows are their own pointer, so reads can be checked against pointers."""
    return Dataset(
        name,
        [
            InMemoryShard([{"shard": s, "i": i} for i in range(n)], f"<{name}#{s}>")
            for s, n in enumerate(shard_sizes)
        ],
    )


def drain(src: StaticMixtureWorkSource, limit: int = 100_000) -> list[WorkChunk]:
    out = []
    while (c := src.next_chunk()) is not None:
        out.append(c)
        assert len(out) <= limit, "source did not end"
    return out


def all_samples(datasets: list[Dataset]) -> Counter[tuple[int, int, int]]:
    return Counter(
        (d, s, i)
        for d, ds in enumerate(datasets)
        for s, n in enumerate(ds.counts())
        for i in range(n)
    )


def lane_streams(
    src: StaticMixtureWorkSource, lanes: int, lane_ids: list[int] | None = None
) -> dict[int, list[tuple[int, list[list[int]]]]]:
    """``{lane: [(global_index, pointers), ...]}`` for the given lanes."""
    out: dict[int, list[tuple[int, list[list[int]]]]] = {}
    for lane in lane_ids if lane_ids is not None else range(lanes):
        out[lane] = [
            (c.global_index, c.pointers.tolist()) for c in drain(src.clone_for_lane(lane, lanes))
        ]
    return out


def make_source(datasets: list[Dataset], **kw: Any) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(datasets, **kw)

"""Operators written only against the public API (``tests/ops/_user_ops.py``) are proved by
``check_operator`` like the built-ins, and a plan with them takes snapshots: a restore starts
at the newest delivered snapshot, not at the last flush."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from tests.ops._user_ops import GreedyPackOp, WindowSortOp
from zephon import Dataset, Pipeline, SampleBatch, SampleRecord
from zephon import StaticMixtureWorkSource as Source
from zephon.testing import check_operator, run_with_stops

TEXTS = [{"id": i, "text": "alpha beta " * (1 + i * 7 % 11) + f"doc {i}"} for i in range(240)]


def tokens(*, chunk_size: int = 16) -> Pipeline:
    source = Source(
        [Dataset.from_records("a", TEXTS, shard_size=60)], chunk_size=chunk_size, seed=3
    )
    return Pipeline(source).decode_text().tokenize("bytes", max_length=40)


def sorted_windows() -> Pipeline:
    return tokens().add_op(WindowSortOp(6))


def sorted_packed() -> Pipeline:
    return tokens().add_op(WindowSortOp(6)).add_op(GreedyPackOp(96))


def item_key(item: Any) -> Any:
    assert isinstance(item, SampleRecord)
    return (item.meta.cursor, np.asarray(item.payload["input_ids"]).tobytes())


@pytest.mark.timeout(360)  # may start the session's Ray (every runner is tried)
@pytest.mark.parametrize("build", [sorted_windows, sorted_packed], ids=["sort", "sort+pack"])
def test_a_user_operator_passes_check_operator(build: Any, ray_session: Any) -> None:
    report = check_operator(build, key=item_key)
    assert report.passed


def test_the_window_sorter_sorts_each_window_by_length() -> None:
    one_lane = {"runner": "inline", "canonical_replicas": 1, "flush_every_k_chunks": 64}
    out = list(sorted_windows().options(**one_lane))
    lengths = [len(r.payload["input_ids"]) for r in out]
    windows = [lengths[i : i + 6] for i in range(0, len(lengths) - len(lengths) % 6, 6)]
    assert all(w == sorted(w) for w in windows) and any(w != lengths[:6] for w in windows)
    assert sorted(r.meta.sample_id for r in out) == sorted(r.meta.sample_id for r in tokens())


def test_the_packer_fills_bins_and_keeps_every_token() -> None:
    bins = list(sorted_packed().options(runner="inline"))
    assert all(len(b.payload["input_ids"]) <= 96 for b in bins)
    assert sum(len(b.payload["input_ids"]) for b in bins) == sum(
        len(r.payload["input_ids"]) for r in tokens()
    )


def snapshotting(records: int | None = 5) -> Pipeline:
    return (
        sorted_packed()
        .shuffle(8, seed=1)  # holds packed bins: a restore reassembles them
        .batch(2)
        .options(
            runner="inline",
            canonical_replicas=2,
            flush_every_k_chunks=4,
            snapshot_every_records=records,
        )
    )


def batch_key(batch: Any) -> Any:
    assert isinstance(batch, SampleBatch)
    return [item_key(r) for r in batch.records]


def test_a_plan_with_user_operators_takes_snapshots() -> None:
    assert "snapshots every 1 chunk" in str(snapshotting().explain())
    reference = [batch_key(b) for b in snapshotting(None)]
    pipe = snapshotting()
    it = iter(pipe)
    for _ in range(17):
        next(it)
    state = json.loads(json.dumps(pipe.checkpoint()))
    it.close()  # type: ignore[attr-defined]
    lane = state["lanes"]["0"]
    k = state["config"]["flush_every_k_chunks"]
    start = (lane["start_chunk_id"], lane.get("start_offset", 0))
    assert start > (lane["start_chunk_id"] // k * k, 0), "restored from the flush, not a snapshot"
    assert "input_ids" not in json.dumps(lane["operator_state"])  # held records by cursor
    assert [batch_key(b) for b in snapshotting().restore(state)] == reference[17:]
    assert run_with_stops(snapshotting, batch_key, [3, 11, 26]) == reference

"""The golden resume property on stateful pipelines: shuffle, packing, mixture, batch."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine import _resume as resume
from tests.engine._stateful import REFERENCE_CFG, build, key, lane_streams
from zephon import merge_checkpoints


def run_with_stops(cfg: dict[str, Any], stops: list[int], **options: Any) -> list[Any]:
    """Consume, checkpoint through JSON, restore in a fresh pipeline, repeat."""
    return resume.run_with_stops(lambda: build(cfg, **options), key, stops)


CONFIGS = st.fixed_dictionaries(
    {
        "rows_a": st.integers(min_value=5, max_value=160),
        "rows_b": st.integers(min_value=5, max_value=90),
        "chunk": st.integers(min_value=3, max_value=30),
        "seed": st.integers(min_value=0, max_value=3),
        "shuffle": st.sampled_from([None, "streaming", "block", "block_warmup"]),
        "shuffle_buffer": st.integers(min_value=2, max_value=20),
        "pack": st.sampled_from([None, "first_fit", "best_fit", "wrap", "best_fit_wrap"]),
        "mixture": st.sampled_from([None, 8, 50]),
        "batch": st.sampled_from([1, 2, 3]),
        "drop_last": st.booleans(),
        "replicas": st.sampled_from([1, 2, 4]),
        "k": st.sampled_from([None, 1, 2, 3]),
        "snap_chunks": st.sampled_from([0, 1, 2]),
        "snap_records": st.sampled_from([None, 1, 2, 5, 2048]),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONFIGS, st.lists(st.integers(min_value=0, max_value=80), min_size=1, max_size=3))
def test_uninterrupted_equals_stop_and_restore_on_stateful_pipelines(cfg, stops):
    reference = [key(x) for x in build(cfg, runner="inline")]
    stops = sorted(min(s, len(reference)) for s in stops)
    assert run_with_stops(cfg, stops, runner="inline") == reference


def sentinel_stops(cfg: dict[str, Any]) -> list[int]:
    """Stop points right after each lane's epoch boundary is delivered, found by stats."""
    pipe = build(cfg, runner="inline")
    stops = []
    seen_boundaries = 0
    for n, _ in enumerate(pipe, 1):
        stats = pipe.stats()
        assert stats is not None
        boundaries = sum(lp.next_chunk_id - lp.inflight_chunks for lp in stats.lanes.values())
        if boundaries != seen_boundaries:
            seen_boundaries = boundaries
            stops.append(n)
    return stops[:3]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("runner", "parallelism"), [("threads", 1), ("threads", 4)])
def test_reference_pipeline_restores_at_epoch_edges_and_again(runner, parallelism):
    reference = [key(x) for x in build(REFERENCE_CFG, runner="inline")]
    stops = sorted({1, *sentinel_stops(REFERENCE_CFG), len(reference) // 2, len(reference)})
    got = run_with_stops(REFERENCE_CFG, stops, runner=runner, max_inflight=parallelism)
    assert got == reference


@pytest.mark.timeout(180)
def test_reference_pipeline_restores_with_process_runner():
    reference = [key(x) for x in build(REFERENCE_CFG, runner="inline")]
    stops = [len(reference) // 3, 2 * len(reference) // 3]
    assert run_with_stops(REFERENCE_CFG, stops, runner="process") == reference


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("old_world", "new_world"), [(1, 2), (2, 4), (4, 1), (2, 1), (4, 2)])
def test_elastic_resume_on_stateful_pipeline(old_world, new_world):
    reference = [key(b) for b in build(REFERENCE_CFG, runner="inline")]
    ref_lanes = lane_streams(reference)
    states, before = [], []
    for rank in range(old_world):
        pipe = build(REFERENCE_CFG, runner="inline", dp_rank=rank, dp_world_size=old_world)
        it = iter(pipe)
        for _ in range(3 * (4 // old_world)):  # a window boundary: 3 batches per lane
            before.append(key(next(it)))
        states.append(pipe.checkpoint())
        it.close()  # type: ignore[attr-defined]
    merged = json.loads(json.dumps(merge_checkpoints(states)))
    after = []
    for rank in range(new_world):
        pipe = build(REFERENCE_CFG, runner="threads", dp_rank=rank, dp_world_size=new_world)
        after.extend(key(b) for b in pipe.restore(merged))
    assert lane_streams(before + after) == ref_lanes
    # The global batches per step at a window boundary equal the uninterrupted run's.
    per_step = len(reference) // 4
    assert sorted(before) == sorted(reference[: len(before)])
    assert per_step > 3

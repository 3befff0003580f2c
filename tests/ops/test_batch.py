"""``batch`` saves its partial batch, so a snapshot marker passes it at once: a restore starts
at the newest cut a lane delivered, not at the one before its last batch, and re-delivers
nothing when the lane delivered nothing since. Whatever the stop point, runner, or a flush
sentinel that ``batch(drop_last=True)`` holds back, the restored run continues exactly."""

from __future__ import annotations

import json
from typing import Any

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon._ops.batch import BatchAccumulator
from zephon._snapshot_codec import unpack_state
from zephon.testing import run_with_stops
from zephon.types import SampleBatch, SampleMeta, SampleRecord

ROWS = [{"id": i, "text": "word " * (1 + i % 11) + f"doc {i}"} for i in range(360)]
BATCH_STATE = "4"  # fetch, decode_text, tokenize, pack_flat, batch


def build(runner: str = "inline", **options: Any) -> Pipeline:
    source = StaticMixtureWorkSource(
        [Dataset.from_records("a", ROWS, shard_size=60)], chunk_size=40, seed=3
    )
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes", max_length=40)
        .pack_flat(48, 0)
        .batch(3, drop_last=True)
        .options(
            runner=runner,
            canonical_replicas=2,
            flush_every_k_chunks=2,
            snapshot_every_records=6,
            **options,
        )
    )


def key(batch: Any) -> Any:
    assert isinstance(batch, SampleBatch)
    return [(r.meta.cursor, r.payload["input_ids"].tobytes()) for r in batch.records]


@pytest.fixture(scope="module")
def reference() -> list[Any]:
    return [key(b) for b in build(snapshot_every_chunks=0)]


def checkpoint_after(stop: int) -> dict[str, Any]:
    pipe = build()
    it = iter(pipe)
    for _ in range(stop):
        next(it)
    state = json.loads(json.dumps(pipe.checkpoint()))
    it.close()  # type: ignore[attr-defined]
    return state


def held_by_batch(lane: dict[str, Any]) -> int:
    saved = (lane.get("operator_state") or {}).get(BATCH_STATE)
    return 0 if saved is None else len(unpack_state(saved)["held"])


def test_the_accumulator_saves_and_loads_its_partial_batch() -> None:
    acc = BatchAccumulator(3, None, drop_last=True)
    records = [SampleRecord(SampleMeta((0, 0, i), 1, 0, i), {"i": i}) for i in range(5)]
    assert [len(mb) for mb in acc.push_many(records)] == [3]
    state = acc.state_dict(1)
    assert [r.payload["i"] for r in state["held"]] == [3, 4] and acc.state_dict(0) == {"held": []}
    fresh = BatchAccumulator(3, None, drop_last=True)
    fresh.load_state_dict(1, state)
    out = fresh.push_many([SampleRecord(SampleMeta((0, 0, 5), 1, 0, 5), {"i": 5})])
    assert [[r.payload["i"] for r in mb] for mb in out] == [[3, 4, 5]]
    fresh.load_state_dict(1, {"held": []})
    assert not fresh.has_pending_data(1)


def test_every_stop_point_restores_exactly_on_every_runner(reference) -> None:
    stops = list(range(1, len(reference)))
    assert run_with_stops(build, key, stops) == reference
    for runner in ("threads", "process"):
        assert run_with_stops(lambda r=runner: build(r), key, stops[::5]) == reference, runner


def test_a_checkpoint_names_the_partial_batch_only_while_the_lane_holds_it(reference) -> None:
    named = drained = 0
    for stop in range(1, len(reference) - 1):
        state = checkpoint_after(stop)
        for lane in state["lanes"].values():
            if held_by_batch(lane):
                named += 1
                # the lane delivered nothing after its restart point: the partial batch is
                # still to come, so a restore re-delivers nothing
                assert lane["replay_cursor"] is None, stop
            elif lane["replay_cursor"] is not None:
                drained += 1  # a batch left after the cut: it took the partial batch along
        assert [key(b) for b in build().restore(state)] == reference[stop:], stop
    assert named > 0 and drained > 0


def test_a_restore_at_a_cut_with_a_partial_batch_re_delivers_nothing(reference) -> None:
    for stop in range(1, len(reference) - 1):
        state = checkpoint_after(stop)
        lanes = state["lanes"].values()
        if any(held_by_batch(lane) and lane["replay_cursor"] is None for lane in lanes):
            break
    else:
        pytest.fail("no checkpoint named a partial batch at a cut its lane delivered last")
    pipe = build().restore(state)
    it = iter(pipe)
    first = [key(next(it)) for _ in range(len(state["lanes"]))]
    stats = pipe.stats()
    it.close()  # type: ignore[attr-defined]
    assert first == reference[stop : stop + len(first)]
    assert stats is not None and stats.tombstones == 0  # no batch regenerated and dropped

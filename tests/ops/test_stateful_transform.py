"""stateful_transform, map_batch and materialize: functional operators that restore exactly."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine import _resume as resume
from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline, SampleBatch, SampleRecord
from zephon.errors import ConfigError, ContractError

ROWS = [{"id": i, "text": f"text {(i * 7) % 53}"} for i in range(400)]


def first_sight(seen: list[str], payload: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """A dedupe in a few lines: the state is the sorted list of texts seen."""
    if payload["text"] in seen:
        return seen, []
    return sorted([*seen, payload["text"]]), [payload]


def running_mean(state: dict[str, float], payload: dict[str, Any]) -> tuple[dict, list[Any]]:
    n, total = state["n"] + 1, state["total"] + payload["id"]
    return {"n": n, "total": total}, [{**payload, "mean_so_far": total / n}]


def source() -> RangeSource:
    return RangeSource([Dataset.from_records("docs", ROWS, shard_size=100)], chunk_size=16)


def dedupe(runner: str = "inline") -> Pipeline:
    return (
        Pipeline(source())
        .stateful_transform("dedupe", init_state=[], push=first_sight)
        .stateful_transform("mean", init_state={"n": 0, "total": 0}, push=running_mean)
        .options(runner=runner)
    )


def key(record: Any) -> Any:
    return (record.meta.sample_id, record.payload["text"], record.payload["mean_so_far"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_dedupe_and_running_mean_restore_exactly(runner):
    expected = [key(r) for r in dedupe("inline")]
    assert len(expected) == 53
    stops = list(range(0, 54, 6)) if runner == "inline" else [0, 5, 30, 53]
    assert resume.run_with_stops(lambda: dedupe(runner), key, stops) == expected


def test_several_outputs_fan_out_and_none_drops():
    def split(state: int, payload: dict[str, Any]) -> tuple[int, list[Any]]:
        parts = [] if payload["id"] % 3 == 0 else [{"part": j} for j in range(payload["id"] % 3)]
        return state + 1, parts

    pipe = Pipeline(source()).stateful_transform("split", init_state=0, push=split)
    out = list(pipe.options(runner="inline"))
    expected = sum(i % 3 for i in range(400))
    assert len(out) == expected
    assert pipe.stats().tombstones >= 134


def test_a_state_that_is_not_json_is_refused_naming_the_operator():
    with pytest.raises(ConfigError, match=r"stateful_transform 'bad'.*JSON-safe"):
        Pipeline(source()).stateful_transform("bad", init_state={1, 2}, push=first_sight)
    pipe = Pipeline(source()).stateful_transform(
        "sets", init_state=[], push=lambda s, p: ({"x": {1}}, [p])
    )
    with pytest.raises(ContractError, match=r"operator 'sets'.*JSON-safe"):
        list(pipe.options(runner="inline"))


def double_ids(batch: SampleBatch) -> SampleBatch:
    return SampleBatch([SampleRecord(r.meta, {"id2": r.payload["id"] * 2}) for r in batch.records])


def test_map_batch_follows_batch_and_keeps_restores_exact():
    def build(runner: str = "inline") -> Pipeline:
        return Pipeline(source()).batch(8).map_batch(double_ids).options(runner=runner)

    expected = [[r.payload["id2"] for r in b.records] for b in build()]
    assert expected[0] == [0, 2, 4, 6, 8, 10, 12, 14]
    got = resume.run_with_stops(
        lambda: build("threads"), lambda b: [r.payload["id2"] for r in b.records], [3, 20]
    )
    assert got == expected
    with pytest.raises(ConfigError, match="needs a batch"):
        Pipeline(source()).map_batch(double_ids)


def test_map_batch_must_return_the_same_records():
    pipe = Pipeline(source()).batch(4).map_batch(lambda b: SampleBatch(b.records[:2]))
    with pytest.raises(ContractError, match="same records"):
        list(pipe.options(runner="inline"))


def test_materialize_passes_everything_through():
    plain = [r.payload for r in Pipeline(source()).options(runner="inline")]
    pipe = Pipeline(source()).materialize().options(runner="threads")
    assert [r.payload for r in pipe] == plain
    assert "materialize" in str(pipe.explain())

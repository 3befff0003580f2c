"""Failures surface at the consumer with context; early exits shut everything down."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
from zephon.errors import ConfigError, ContractError, MissingFieldError
from zephon.ops import BaseOp, CountingAccumulator, OpTraits


def explode_on_17(payload: dict[str, Any]) -> dict[str, Any]:
    if payload["id"] == 17:
        raise ValueError("boom on record 17")
    return payload


def make_source(n: int = 100, chunk: int = 10) -> RangeSource:
    rows = [{"id": i, "text": f"document number {i}"} for i in range(n)]
    return RangeSource([Dataset.from_records("docs", rows, shard_size=25)], chunk)


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("zephon-engine-")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_worker_exception_reaches_consumer_with_operator_and_traceback(runner):
    pipe = Pipeline(make_source()).map_transform(explode_on_17, parallelism=2)
    with pytest.raises(ValueError, match="boom on record 17") as info:
        list(pipe.options(runner=runner))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "operator 'map_transform'" in notes
    assert "explode_on_17" in notes  # the worker-side traceback names the failing function
    assert engine_threads() == []
    assert multiprocessing.active_children() == []


def explode_on_300(payload: dict[str, Any]) -> dict[str, Any]:
    if payload["id"] == 300:
        raise ValueError("boom on record 300")
    return payload


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_everything_before_the_failing_micro_batch_is_delivered_first(runner):
    """Record 300 fails in the micro-batch of records 256-319: the 25 batches of 0-249 were
    complete before it, and must reach the consumer ahead of the error, whatever the runner
    held back to send in one message."""
    pipe = Pipeline(make_source(600, chunk=600)).map_transform(explode_on_300).batch(10)
    got: list[int] = []
    with pytest.raises(ValueError, match="boom on record 300"):
        for batch in pipe.options(runner=runner):
            got.extend(p["id"] for p in batch.payloads)
    assert got == list(range(250))


class ReturnsDicts(BaseOp):
    name = "returns_dicts"

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        return [e.payload for e in elems]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_returning_a_dict_is_a_type_error_naming_the_operator(runner):
    pipe = Pipeline(make_source()).add_op(ReturnsDicts()).options(runner=runner)
    with pytest.raises(TypeError, match=r"Unsupported element type 'dict'.*'returns_dicts'"):
        list(pipe)


class LeakyResetAccumulator(CountingAccumulator):
    def flush(self, *, reset=False, lane_id=None):
        if reset:
            return []  # keeps the lane's buffer: breaks the sentinel contract
        return super().flush(reset=reset, lane_id=lane_id)


class LeakyOp(BaseOp):
    name = "leaky"

    def accumulator(self, *, deterministic, ctx):
        return LeakyResetAccumulator(7)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        return elems


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_accumulator_that_keeps_data_across_a_sentinel_is_refused(runner):
    pipe = Pipeline(make_source()).add_op(LeakyOp()).options(runner=runner, flush_every_k_chunks=1)
    with pytest.raises(ContractError, match="'leaky' still has pending data for lane 0"):
        list(pipe)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_accumulator_that_keeps_data_at_the_end_of_a_lane_is_refused(runner):
    # K far above the chunk count: the only lane flush is the one at the end of data, where
    # records kept back would otherwise never be delivered.
    pipe = (
        Pipeline(make_source(200))
        .add_op(LeakyOp())
        .options(  # 200 % 7 records kept
            runner=runner, flush_every_k_chunks=1000
        )
    )
    with pytest.raises(ContractError) as info:
        list(pipe)
    message = str(info.value)
    assert "'leaky' still has pending data for lane 0" in message
    assert "at the end of data" in message


def test_missing_field_names_field_and_sample_id():
    pipe = Pipeline(make_source()).tokenize("bytes", field="body").options(runner="inline")
    with pytest.raises(MissingFieldError, match=r"record \(0, 0, 0\) has no field 'body'"):
        list(pipe)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["threads", "process"])
def test_early_break_shuts_down_threads_and_processes(runner):
    pipe = Pipeline(make_source(2000)).decode_text(parallelism=2).batch(4).options(runner=runner)
    for i, _ in enumerate(pipe):
        if i == 2:
            break
    assert engine_threads() == []
    assert multiprocessing.active_children() == []
    # The pipeline can be iterated again from the start after an early exit.
    assert sum(len(b) for b in pipe) == 2000


@pytest.mark.timeout(60)
def test_backpressure_bounds_what_the_source_reads_ahead():
    source = make_source(50_000, chunk=10)
    pipe = Pipeline(source).decode_text().options(runner="threads", queue_size=2)
    it = iter(pipe)
    next(it)
    engine = pipe._engine
    assert engine is not None
    feeder = engine.feeder
    # Give the producer every chance to run ahead; it must stay bounded by the queues.
    limit = 6 * 2 * 128 + 4 * 128
    for _ in range(20):
        time.sleep(0.01)
        assert feeder.samples_emitted <= limit
    it.close()  # type: ignore[attr-defined]
    assert engine_threads() == []


def test_concurrent_second_iteration_is_refused():
    pipe = Pipeline(make_source()).options(runner="threads")
    it = iter(pipe)
    next(it)
    with pytest.raises(RuntimeError, match="already being iterated"):
        next(iter(pipe))
    it.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"runner": "gpu"}, "runner must be one of"),
        ({"queue_size": 0}, "queue_size must be >= 1"),
        ({"colour": "red"}, r"unknown pipeline option\(s\) \['colour'\]"),
        ({"canonical_replicas": 3, "dp_world_size": 2}, "not divisible by dp_world_size=2"),
        (
            {"dp_rank": 2, "dp_world_size": 2, "canonical_replicas": 2},
            r"dp_rank must be in \[0, 2\)",
        ),
    ],
)
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        Pipeline(make_source()).options(**options).explain()


def test_builder_rejects_ops_after_batch_and_double_batch():
    pipe = Pipeline(make_source()).batch(4)
    with pytest.raises(ConfigError, match="cannot follow batch"):
        pipe.decode_text()
    with pytest.raises(ConfigError, match="only once"):
        pipe.batch(2)


def test_explain_returns_plan_as_data_and_text():
    pipe = (
        Pipeline(make_source())
        .decode_text(parallelism=3)
        .tokenize("bytes", parallelism=2)
        .batch(16)
        .options(runner="threads", canonical_replicas=4, dp_rank=1, dp_world_size=2)
    )
    plan = pipe.explain()
    data = plan.to_dict()
    names = [s["op_name"] for s in data["stages"]]
    assert names == ["fetch", "decode_text", "tokenize", "replay_filter", "batch"]
    assert [s["parallelism"] for s in data["stages"]][1:] == [3, 2, 1, 1]
    assert data["stages"][4]["runner"] == "driver" and data["stages"][4]["micro_batch"] == 16
    assert data["lanes"] == [1, 3]  # rank 1 of 2 over 4 lanes, interleaved (the default)
    text = str(plan)
    assert "tokenize" in text and "stalls sentinels" in text


class FlushesEveryLaneAccumulator(CountingAccumulator):
    def flush(self, *, reset=False, lane_id=None):
        return super().flush(reset=reset, lane_id=None)  # ignores lane_id: flushes all lanes


class EveryLaneOp(LeakyOp):
    name = "every_lane"

    def accumulator(self, *, deterministic, ctx):
        return FlushesEveryLaneAccumulator(7)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_accumulator_that_flushes_other_lanes_at_a_sentinel_is_refused(runner):
    pipe = (
        Pipeline(make_source(400, chunk=100))  # lanes interleave mid-chunk
        .add_op(EveryLaneOp())
        .options(runner=runner, flush_every_k_chunks=1, canonical_replicas=2)
    )
    with pytest.raises(
        ContractError, match="emitted a lane 1 element at a flush sentinel of lane 0"
    ):
        list(pipe)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("runner", ["threads", "process", "engine_process"])
def test_an_iterator_left_open_at_exit_prints_nothing(runner):
    """The interpreter exits with the engine busy behind an unfinished iterator: the engine
    is closed quietly, without an ignored exception or a wait on frozen threads."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), str(repo)])}
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-m", "tests.engine._open_at_exit", runner],
            cwd=repo, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert (done.returncode, done.stderr) == (0, "")

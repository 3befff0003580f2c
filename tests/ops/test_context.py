"""What an operator is handed: process_one for single elements, a real OpContext."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine._sources import RangeSource
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.ops import BaseOp, CountingAccumulator, OpContext, OpTraits
from zephon.types import SampleRecord


class ScalarPath(BaseOp):
    """Marks which path handled each record."""

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> CountingAccumulator:
        return CountingAccumulator(3)

    def process_many(self, elems: list[Any]) -> list[Any]:
        return [SampleRecord(e.meta, {**e.payload, "path": "many"}) for e in elems]

    def process_one(self, elem: Any) -> list[Any]:
        return [SampleRecord(elem.meta, {**elem.payload, "path": "one"})]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_every_runner_calls_process_one_for_a_single_element(runner):
    ds = Dataset.from_records("d", [{"id": i} for i in range(10)], shard_size=10)
    pipe = Pipeline(RangeSource([ds], chunk_size=10)).add_op(ScalarPath()).options(runner=runner)
    paths = [r.payload["path"] for r in pipe]
    assert paths == ["many"] * 9 + ["one"]  # 10 = 3 + 3 + 3 + the last one alone


class Recorder(BaseOp):
    seen: list[tuple[str, OpContext]] = []  # the inline runner: all in this process

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> CountingAccumulator:
        Recorder.seen.append(("accumulator", ctx))
        return CountingAccumulator(8)

    def setup(self, ctx: OpContext) -> None:
        Recorder.seen.append(("setup", ctx))

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems: list[Any]) -> list[Any]:
        return elems


def contexts(seed: int) -> tuple[OpContext, OpContext]:
    """The context of the running accumulator and the one ``setup`` got."""
    Recorder.seen = []
    rows = [{"text": str(i)} for i in range(40)]
    source = StaticMixtureWorkSource(
        [Dataset.from_records("d", rows)], mixture=MixtureSpec({"d": 1.0}), chunk_size=8, seed=seed
    )
    pipe = Pipeline(source).add_op(Recorder()).options(runner="inline", canonical_replicas=2)
    list(pipe)
    running = [c for kind, c in Recorder.seen if kind == "accumulator" and "stats" in c.services]
    setups = [c for kind, c in Recorder.seen if kind == "setup"]
    assert len(running) == 1 and len(setups) == 1
    return running[0], setups[0]


def test_the_context_has_a_derived_seed_the_lanes_a_logger_and_the_stats():
    acc_ctx, setup_ctx = contexts(seed=1)
    assert acc_ctx.op_index == 1 and acc_ctx.lanes == (0, 1)
    assert acc_ctx.seed == setup_ctx.seed != 0
    assert contexts(seed=1)[0].seed == acc_ctx.seed  # deterministic
    assert contexts(seed=2)[0].seed != acc_ctx.seed  # follows the source's seed
    assert acc_ctx.logger.name == "zephon.op.recorder"
    stats = acc_ctx.services["stats"]
    assert stats.name == "recorder" and stats.elements_in == 40  # live counters, updated
    assert "stats" not in setup_ctx.services  # workers get no driver-side counters

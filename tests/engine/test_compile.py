"""A compiled run builds each operator's accumulator once: the engine runs the very ones the
plan was decided with, and a restore's validation builds none."""

from __future__ import annotations

import json
from typing import Any

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.ops import Accumulator, BaseOp, OpContext, OpTraits, PassthroughAccumulator
from zephon.types import StreamItem

ROWS = [{"text": f"line {i}"} for i in range(120)]


class Counted(BaseOp):
    """A user operator that counts how often the engine asks it for an accumulator."""

    name = "counted"

    def __init__(self) -> None:
        super().__init__()
        self.built = 0

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        self.built += 1
        return PassthroughAccumulator()

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, elementwise=True)

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return elems


def pipeline(op: Counted, **options: Any) -> Pipeline:
    source = StaticMixtureWorkSource([Dataset.from_records("d", ROWS)], chunk_size=16)
    return (
        Pipeline(source)
        .decode_text()
        .add_op(op)
        .shuffle(8, seed=1)
        .batch(4)
        .options(runner="inline", canonical_replicas=2, **options)
    )


@pytest.mark.parametrize("track_stats", [True, False])
def test_an_iteration_builds_each_accumulator_once(track_stats: bool) -> None:
    op = Counted()
    pipe = pipeline(op, track_stats=track_stats)
    assert len(list(pipe)) == 30
    assert op.built == 1
    stats = pipe.stats()
    if track_stats:  # the counters are the ones the accumulator was built with
        assert stats is not None
        counted = next(o for o in stats.operators if o.name == "counted")
        assert counted.elements_in == len(ROWS)


def test_explain_builds_each_accumulator_once() -> None:
    op = Counted()
    pipeline(op).explain()
    assert op.built == 1


def test_restore_then_iterate_builds_each_accumulator_once() -> None:
    first = pipeline(Counted())
    it = iter(first)
    seen = [next(it) for _ in range(7)]
    state = json.loads(json.dumps(first.checkpoint()))
    it.close()  # type: ignore[attr-defined]
    op = Counted()
    restored = pipeline(op).restore(state)
    assert op.built == 0  # validating the checkpoint decides no plan
    rest = list(restored)
    assert op.built == 1
    assert len(seen) + len(rest) == 30


def test_a_checkpoint_before_iterating_and_each_new_iteration_build_fresh_ones() -> None:
    op = Counted()
    pipe = pipeline(op)
    pipe.checkpoint()
    assert op.built == 1
    pipe.set_epoch(0)
    assert len(list(pipe)) == 30
    pipe.set_epoch(1)
    assert len(list(pipe)) == 30
    assert op.built == 3

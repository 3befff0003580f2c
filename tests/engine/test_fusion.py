"""Fusion of adjacent element-wise operators: same output, same counters, only fewer hops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tests.engine._resume import run_with_stops
from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext, OpTraits
from zephon.types import LaneId, SampleBatch, SampleRecord, StreamItem

ROWS = [{"id": i, "text": f"Row {i} " * (1 + i % 4)} for i in range(600)]


def shout(payload: dict[str, Any]) -> dict[str, Any] | None:
    if payload["id"] % 11 == 0:
        return None  # dropped: a tombstone that must skip the rest of the chain
    return {**payload, "text": payload["text"].upper()}


def not_seven(payload: dict[str, Any]) -> bool:
    return "7" not in str(payload["id"])


def build(runner: str = "threads", *, tokenize: bool = True, **options: Any) -> Pipeline:
    ds = Dataset.from_records("rows", ROWS, shard_size=70)
    pipe = Pipeline(RangeSource([ds], chunk_size=24)).decode_text().map_transform(shout)
    pipe = pipe.filter(not_seven)
    if tokenize:
        pipe = pipe.tokenize("bytes", parallelism=2)
    return pipe.batch(5).options(runner=runner, canonical_replicas=3, **options)


def key(batch: SampleBatch) -> tuple[Any, ...]:
    return tuple(
        (r.meta.cursor, r.payload["text"], r.payload["input_ids"].tobytes()) for r in batch
    )


def counters(pipe: Pipeline) -> dict[str, tuple[int, int, bool, bool]]:
    """Per-operator counters of a full run: what fused and unfused runs must agree on."""
    list(pipe)
    stats = pipe.stats()
    assert stats is not None
    return {
        op.name: (op.elements_in, op.elements_out, op.micro_batches > 0, op.worker_ns > 0)
        for op in stats.operators
    }


@pytest.fixture(scope="module")
def reference() -> list[tuple[Any, ...]]:
    return [key(b) for b in build("inline")]


@pytest.mark.parametrize("runner", ["threads", "process"])
@pytest.mark.parametrize("fuse", [True, False])
def test_fused_and_unfused_runs_equal_the_inline_reference(runner, fuse, reference):
    assert [key(b) for b in build(runner, fuse=fuse)] == reference


@pytest.mark.parametrize("fuse", [True, False])
def test_stop_and_restore_across_fusion_settings(fuse, reference):
    """A checkpoint taken fused restores unfused and back: fusion is not in the fingerprint."""
    settings = iter([fuse, not fuse, fuse, not fuse])
    out = run_with_stops(lambda: build("threads", fuse=next(settings)), key, [7, 19, 40])
    assert out == reference


@pytest.mark.parametrize("held_records", [False, True])
def test_a_restored_shuffle_feeding_a_fused_chain_rebuilds_the_records_it_held(held_records):
    """Records a shuffle holds at a checkpoint are rebuilt as they enter the operator that
    reads them first, which here heads a fused chain (it once got them unbuilt)."""

    def shuffled(runner: str) -> Pipeline:
        ds = Dataset.from_records("rows", ROWS, shard_size=70)
        pipe = Pipeline(RangeSource([ds], chunk_size=24)).decode_text().shuffle(64, seed=5)
        pipe = pipe.filter(not_seven).map_transform(shout).tokenize("bytes", parallelism=2)
        return pipe.batch(5).options(runner=runner, canonical_replicas=3)

    assert [3, 4, 5] in shuffled("threads").explain().fused
    expected = [key(b) for b in shuffled("inline")]
    stops = [3, 11, 30]
    out = run_with_stops(lambda: shuffled("threads"), key, stops, held_records=held_records)
    assert out == expected


@pytest.mark.parametrize("runner", ["threads", "process"])
def test_explain_names_fused_and_chained_operators_and_fuse_false_keeps_them_apart(runner):
    fused = build(runner).explain()
    assert fused.fused == [[0, 1, 2, 3, 4]]
    assert "fused: 0 fetch + 1 decode_text + 2 map_transform + 3 filter + 4 tokenize" in str(fused)
    assert fused.chained == [[5, 6]]  # the replay filter and batch ride on the fused driver
    assert "chained: 5 replay_filter + 6 batch (on the driver thread of 4 tokenize)" in str(fused)
    apart = build(runner, fuse=False).explain()
    assert apart.fused == [] and "fused:" not in str(apart)
    assert apart.chained == [] and "chained:" not in str(apart)
    assert build("inline").explain().fused == []


@pytest.mark.parametrize("runner", ["threads", "process"])
def test_fused_stats_count_every_operator_as_unfused(runner):
    """Process workers send a fused chain's per-operator counts back with each reply."""
    assert counters(build(runner, fuse=True)) == counters(build(runner, fuse=False))


@pytest.mark.parametrize("runner", ["threads", "process"])
def test_an_error_in_a_fused_operator_names_that_operator(runner):
    def boom(payload: dict[str, Any]) -> dict[str, Any]:
        if payload["id"] == 321:
            raise ValueError("bad row")
        return payload

    ds = Dataset.from_records("rows", ROWS, shard_size=70)
    pipe = Pipeline(RangeSource([ds], chunk_size=24)).decode_text().map_transform(boom, name="b")
    pipe.options(runner=runner)
    assert pipe.explain().fused == [[0, 1, 2]]
    with pytest.raises(ValueError, match="bad row") as info:
        list(pipe)
    assert getattr(info.value, "zephon_op_name", None) == "b"


class _Elementwise(BaseOp):
    """An element-wise operator whose accumulator is chosen by the test."""

    def __init__(self, acc: type[Accumulator]) -> None:
        super().__init__(name="custom")
        self.acc = acc

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return self.acc(4) if issubclass(self.acc, CountingAccumulator) else self.acc()

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, elementwise=True)

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return elems


class _Remembering(CountingAccumulator):
    """Per-lane state saved in checkpoints: the operator must keep its own stage."""

    def state_dict(self, lane_id: LaneId) -> Any:
        return {}

    def load_state_dict(self, lane_id: LaneId, state: Any) -> None:
        pass


class _Grouping(Accumulator):
    """Not a plain count: its micro-batch boundaries may carry meaning."""

    def __init__(self) -> None:
        self._held: list[StreamItem] = []

    def push_many(self, elems: Sequence[StreamItem]) -> list[list[StreamItem]]:
        return [list(elems)] if elems else []

    def flush(self, *, reset: bool = False, lane_id: LaneId | None = None) -> list[list[Any]]:
        return []

    def has_pending_data(self, lane_id: LaneId | None = None) -> bool:
        return False


def _plain() -> Pipeline:
    ds = Dataset.from_records("rows", ROWS[:50])
    return Pipeline(RangeSource([ds], chunk_size=10)).decode_text()


@pytest.mark.parametrize("acc", [CountingAccumulator, _Remembering, _Grouping])
def test_only_plain_accumulators_fuse(acc):
    plan = _plain().add_op(_Elementwise(acc)).explain()
    assert plan.fused == ([[0, 1, 2]] if acc is CountingAccumulator else [[0, 1]])


def test_stateful_and_order_changing_operators_are_never_fused():
    stateful = (
        _plain()
        .stateful_transform("count", init_state=0, push=lambda s, p: (s + 1, [p]))
        .map_transform(shout)
    )
    assert stateful.explain().fused == [[0, 1]]
    shuffled = _plain().shuffle(8, algorithm="block").map_transform(shout)
    assert shuffled.explain().fused == [[0, 1]]


def test_a_fused_chain_passes_records_it_does_not_touch_unchanged():
    """The fused task hands later operators only data records, never tombstones."""
    seen: list[Any] = []

    def record(payload: dict[str, Any]) -> dict[str, Any]:
        seen.append(payload["id"])
        return payload

    ds = Dataset.from_records("rows", ROWS[:100])
    pipe = (
        Pipeline(RangeSource([ds], chunk_size=10))
        .filter(not_seven)
        .map_transform(record)
        .options(runner="threads")
    )
    out = [r for r in pipe if isinstance(r, SampleRecord)]
    kept = [r["id"] for r in ROWS[:100] if not_seven(r)]
    assert [r.payload["id"] for r in out] == kept and sorted(seen) == kept


def width_one(runner: str = "threads", **options: Any) -> Pipeline:
    """The chain of ``build`` without the two-worker tokenizer: one unit of width one."""
    return build(runner, tokenize=False, **options)


def plain_key(batch: SampleBatch) -> tuple[Any, ...]:
    return tuple((r.meta.cursor, r.payload["text"]) for r in batch)


def test_a_width_one_unit_runs_on_its_driver_thread_with_the_same_output():
    """In-memory rows make fetch one reader wide, so the whole fused chain has width one."""
    plan = width_one().explain()
    assert plan.on_driver == [[0, 1, 2, 3]]
    assert "on driver: 0 fetch + 1 decode_text + 2 map_transform + 3 filter" in str(plan)
    assert build().explain().on_driver == []  # the tokenizer's two workers need a pool
    assert width_one(fuse=False).explain().on_driver == []
    assert width_one("process").explain().on_driver == []  # processes isolate the GIL
    reference = [plain_key(b) for b in width_one("inline")]
    assert [plain_key(b) for b in width_one()] == reference
    assert [plain_key(b) for b in width_one(fuse=False)] == reference
    pooled = width_one().fetch(parallelism=2)  # the same chain on a two-thread pool
    assert pooled.explain().on_driver == []
    assert [plain_key(b) for b in pooled] == reference


def test_width_one_units_count_their_work_as_pooled_ones():
    assert counters(width_one(fuse=True)) == counters(width_one(fuse=False))

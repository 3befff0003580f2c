"""``zephon.testing.check_operator`` passes a correct operator and names each broken property."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine._dedupe import DedupeOp
from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpTraits
from zephon.testing import OperatorCheckError, check_operator

ROWS = [{"id": i, "text": f"text {(i * 7) % 53}"} for i in range(240)]
FAST: dict[str, Any] = {"runners": ("inline", "threads"), "workers": (1, 2)}


def ending_in(op: BaseOp) -> Pipeline:
    ds = Dataset.from_records("docs", ROWS, shard_size=60)
    return Pipeline(RangeSource([ds], chunk_size=16)).add_op(op).options(canonical_replicas=2)


def first_sight(seen: list[str], payload: dict[str, Any]) -> tuple[list[str], list[Any]]:
    if payload["text"] in seen:
        return seen, []
    return sorted([*seen, payload["text"]]), [payload]


@pytest.mark.timeout(300)
def test_a_dedupe_with_saved_state_passes_every_check_on_every_runner():
    report = check_operator(lambda: ending_in(DedupeOp()), runners=("inline", "threads", "process"))
    assert report.operator == "dedupe" and report.items == 106  # 53 texts on each of 2 lanes
    assert "process x2 equals inline" in report.passed
    assert "elastic resume 2 -> 1 and 2 -> 4 ranks" in report.passed


def test_the_functional_dedupe_passes():
    def build() -> Pipeline:
        ds = Dataset.from_records("docs", ROWS, shard_size=60)
        return (
            Pipeline(RangeSource([ds], chunk_size=16))
            .stateful_transform("dedupe", init_state=[], push=first_sight)
            .options(canonical_replicas=2)
        )

    assert check_operator(build, **FAST).items == 106


def test_hidden_accumulator_state_is_caught_at_restore():
    with pytest.raises(OperatorCheckError) as info:
        check_operator(lambda: ending_in(DedupeOp(remember=False)), **FAST)
    assert info.value.property == "stop and restore"
    assert "state_dict/load_state_dict" in str(info.value)


class Keeps(CountingAccumulator):
    def flush(self, *, reset=False, lane_id=None):
        return [] if reset else super().flush(reset=reset, lane_id=lane_id)


class FlushesAll(CountingAccumulator):
    def flush(self, *, reset=False, lane_id=None):
        return super().flush(reset=reset, lane_id=None)


class Buffering(BaseOp):
    def __init__(self, kind: str) -> None:
        super().__init__(name=f"buffering_{kind}")
        self.kind = kind

    def accumulator(self, *, deterministic, ctx) -> Accumulator:
        return {"keeps": Keeps, "flushes_all": FlushesAll}[self.kind](5)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=False)

    def process_many(self, elems):
        return elems


@pytest.mark.parametrize(
    ("kind", "words"),
    [("keeps", "still has pending data"), ("flushes_all", "lane")],
)
def test_a_broken_reset_flush_is_caught(kind, words):
    with pytest.raises(OperatorCheckError) as info:
        check_operator(lambda: ending_in(Buffering(kind)), **FAST)
    assert info.value.property in ("reset contract", "contract")
    assert words in str(info.value)


class Counting(BaseOp):
    """process_many numbers records with a counter on self: a hidden cross-call state."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def accumulator(self, *, deterministic, ctx) -> Accumulator:
        return CountingAccumulator(8)

    def process_many(self, elems):
        out = []
        for elem in elems:
            self.seen += 1
            out.append(type(elem)(elem.meta, {**elem.payload, "n": self.seen}))
        return out

    def config(self) -> dict[str, Any]:
        return {}


def test_state_kept_across_process_many_calls_is_caught():
    with pytest.raises(OperatorCheckError) as info:
        check_operator(lambda: ending_in(Counting()), **FAST)
    assert info.value.property == "stateless process_many"
    assert "move that state into the accumulator" in str(info.value)


class Hurried(BaseOp):
    def accumulator(self, *, deterministic, ctx) -> Accumulator:
        return CountingAccumulator(8, max_latency_ms=5.0)  # ignores `deterministic`

    def process_many(self, elems):
        return elems


def test_a_latency_bound_in_deterministic_mode_is_caught():
    with pytest.raises(OperatorCheckError) as info:
        check_operator(lambda: ending_in(Hurried()), **FAST)
    assert info.value.property == "deterministic flag"


class Threshold(BaseOp):
    def __init__(self, threshold: int, *, label: str = "x") -> None:
        super().__init__()
        self.threshold = threshold
        self.label = label

    def process_many(self, elems):
        return [e for e in elems if e.payload["id"] >= 0]

    def config(self) -> dict[str, Any]:
        return {"threshold": self.threshold}  # forgets `label`


def test_a_constructor_argument_missing_from_the_fingerprint_is_caught():
    with pytest.raises(OperatorCheckError) as info:
        check_operator(lambda: ending_in(Threshold(3)), **FAST)
    assert info.value.property == "fingerprint"
    assert "'label' of Threshold is not in config()" in str(info.value)

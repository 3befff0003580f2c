"""planned_samples: the samples a source's lanes emit over the whole run, known before it runs
(the total of ``zephon run``'s progress bar), equal to what draining the lanes emits."""

from __future__ import annotations

from typing import Any

import pytest

from tests.work._helpers import dataset, drain
from zephon.io import Dataset
from zephon.work import (
    MixtureSchedule,
    MixtureSpec,
    StaticMixtureWorkSource,
    WorkChunk,
    WorkSource,
)

A, B, C = dataset("a", [60, 40]), dataset("b", [300, 200, 250]), dataset("c", [7])


def _emitted(src: StaticMixtureWorkSource, lanes: list[int], replicas: int) -> int:
    return sum(len(c) for lane in lanes for c in drain(src.clone_for_lane(lane, replicas)))


CASES: dict[str, tuple[list[Dataset], dict[str, Any]]] = {
    # the faster dataset repeats until the slower one finished its pass
    "70/30 samples, one pass": ([A, B], {"mixture": {"a": 0.7, "b": 0.3}, "chunk_size": 32}),
    "70/30 tokens, shuffled": (
        [A, B],
        {
            "mixture": MixtureSpec(
                {"a": 0.7, "b": 0.3}, unit="tokens", tokens_per_sample={"a": 90.0, "b": 400.0}
            ),
            "chunk_size": 16,
            "shuffle_within_shard": True,
            "shuffle_block_size": 64,
        },
    ),
    "two passes": ([A, B, C], {"chunk_size": 8, "stop_after_passes": 2}),
    "max_repeats": (
        [A, B],
        {"mixture": {"a": 1, "b": 1}, "chunk_size": 8, "max_repeats": {"a": 2, "b": 0}},
    ),
    "stop": ([A, B], {"mixture": {"a": 1, "b": 3}, "chunk_size": 8, "exhausted_policy": "stop"}),
    "redistribute": (
        [A, B, C],
        {"mixture": {"a": 2, "b": 1, "c": 1}, "chunk_size": 5, "exhausted_policy": "redistribute"},
    ),
    "a tiny weight (no batched skips)": (
        [A, B],
        {"mixture": {"a": 1, "b": 400}, "chunk_size": 8, "exhausted_policy": "stop"},
    ),
    "schedule": (
        [A, B],
        {
            "mixture": MixtureSchedule([(0, {"a": 0.9, "b": 0.1}), (300, {"a": 0.2, "b": 0.8})]),
            "chunk_size": 16,
        },
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(
    ("replicas", "owned"), [(1, [0]), (4, [0, 1, 2, 3]), (4, [1, 3]), (3, [2])]
)
def test_the_plan_is_what_the_lanes_emit(case: str, replicas: int, owned: list[int]) -> None:
    datasets, kw = CASES[case]
    src = StaticMixtureWorkSource(datasets, **kw)
    assert src.planned_samples(owned, replicas) == _emitted(src, owned, replicas)


def test_the_plan_of_another_epoch_deals_its_chunks_in_that_epochs_order() -> None:
    src = StaticMixtureWorkSource([A, B, C], {"a": 1, "b": 5, "c": 1}, 7).with_epoch(3)
    assert src.planned_samples([1], 3) == _emitted(src, [1], 3)


def test_the_plan_does_not_move_the_source() -> None:
    src = StaticMixtureWorkSource([A, B], {"a": 1, "b": 1}, 8)
    first = src.next_chunk()
    fresh = StaticMixtureWorkSource([A, B], {"a": 1, "b": 1}, 8)
    assert src.planned_samples([0], 1) == _emitted(fresh, [0], 1) > 2 * 750 - 8  # a repeats
    assert first is not None and src.state_dict()["global_index"] == 1


def test_an_endless_source_has_no_plan() -> None:
    endless = StaticMixtureWorkSource([A, B], {"a": 1, "b": 1}, 8, exhausted_policy="repeat")
    assert endless.planned_samples([0], 1) is None
    # retired or stopped datasets end a source even when another one repeats without limit
    stops = StaticMixtureWorkSource(
        [A, B], {"a": 1, "b": 1}, 8, exhausted_policy={"a": "stop", "b": "repeat"}
    )
    assert stops.planned_samples([0], 1) == _emitted(stops, [0], 1)
    retires = StaticMixtureWorkSource(
        [A, B], {"a": 1, "b": 1}, 8, exhausted_policy={"a": "redistribute", "b": "repeat"}
    )
    assert retires.planned_samples([0], 1) is None


class _Custom(WorkSource):
    @property
    def datasets(self) -> list[Dataset]:
        return [A]

    def next_chunk(self) -> WorkChunk | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Any) -> None:
        pass

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> WorkSource:
        return self


def test_a_source_that_does_not_know_its_plan_says_so() -> None:
    assert _Custom().planned_samples([0], 1) is None

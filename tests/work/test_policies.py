"""End-of-data policies, lane edge cases and configuration errors of StaticMixtureWorkSource."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from tests.work._helpers import dataset, drain
from zephon.errors import CheckpointError, ConfigError
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource, lanes_for_rank


def per_dataset(chunks: list[Any]) -> Counter[int]:
    return Counter(p[0] for c in chunks for p in c.pointers.tolist())


def sample_counts(chunks: list[Any], d: int) -> Counter[tuple[int, int]]:
    return Counter((p[1], p[2]) for c in chunks for p in c.pointers.tolist() if p[0] == d)


A, B = dataset("a", [6, 4]), dataset("b", [50, 50])


def test_stop_ends_in_the_chunk_where_a_dataset_runs_out() -> None:
    chunks = drain(StaticMixtureWorkSource([A, B], {"a": 1, "b": 1}, 4, exhausted_policy="stop"))
    assert per_dataset(chunks)[0] == 10
    assert set(sample_counts(chunks, 0).values()) == {1}
    assert per_dataset(chunks)[1] == 10  # b got its share up to that point
    assert chunks[-1].source_exhausted == ("a", "b")
    assert all(not c.source_exhausted for c in chunks[:-1])


def test_repeat_with_max_repeats_then_stop() -> None:
    src = StaticMixtureWorkSource(
        [A, B], {"a": 1, "b": 1}, 4, exhausted_policy="repeat", max_repeats={"a": 2}
    )
    chunks = drain(src)
    assert set(sample_counts(chunks, 0).values()) == {3}  # 1 + 2 repeats of every a sample
    assert per_dataset(chunks)[0] == 30


def test_repeated_passes_are_reshuffled() -> None:
    src = StaticMixtureWorkSource(
        [dataset("a", [40])], chunk_size=40, shuffle_within_shard=True, stop_after_passes=3
    )
    passes = [c.pointers[:, 2].tolist() for c in drain(src)]
    assert len(passes) == 3 and all(sorted(p) == list(range(40)) for p in passes)
    assert len({tuple(p) for p in passes}) == 3
    same = StaticMixtureWorkSource(
        [dataset("a", [40])],
        chunk_size=40,
        shuffle_within_shard=True,
        stop_after_passes=3,
        reshuffle_on_repeat=False,
    )
    assert len({tuple(c.pointers[:, 2].tolist()) for c in drain(same)}) == 1


def test_redistribute_renormalises_the_rest() -> None:
    src = StaticMixtureWorkSource(
        [A, B, dataset("c", [30])], {"a": 1, "b": 1, "c": 2}, 8, exhausted_policy="redistribute"
    )
    chunks = drain(src)
    for d in range(3):
        assert set(sample_counts(chunks, d).values()) == {1}
    assert per_dataset(chunks) == Counter({0: 10, 1: 100, 2: 30})
    first_a_out = next(i for i, c in enumerate(chunks) if "a" in c.source_exhausted)
    assert chunks[0].target_mixture == {"a": 0.25, "b": 0.25, "c": 0.5}
    after = chunks[first_a_out + 1].target_mixture
    assert after is not None and after == pytest.approx({"b": 1 / 3, "c": 2 / 3})
    assert len(chunks[-1]) <= 8 and chunks[-1].source_exhausted == ("b",)


def test_mixed_policies_per_dataset() -> None:
    src = StaticMixtureWorkSource(
        [A, B], {"a": 1, "b": 1}, 4, exhausted_policy={"a": "redistribute", "b": "stop"}
    )
    chunks = drain(src)
    assert set(sample_counts(chunks, 0).values()) == {1}
    assert set(sample_counts(chunks, 1).values()) == {1}
    assert per_dataset(chunks) == Counter({0: 10, 1: 100})


def test_stop_after_passes_waits_for_the_slowest() -> None:
    src = StaticMixtureWorkSource([A, B], {"a": 1, "b": 1}, 4, stop_after_passes=2)
    chunks = drain(src)
    assert set(sample_counts(chunks, 1).values()) == {2}  # b, the slowest, makes 2 passes
    assert per_dataset(chunks)[0] == 200  # a keeps its share and repeats meanwhile
    assert chunks[-1].source_exhausted == ("a", "b")


def test_default_is_one_pass_of_the_slowest() -> None:
    chunks = drain(StaticMixtureWorkSource([A, B], {"a": 1, "b": 1}, 4))
    assert set(sample_counts(chunks, 1).values()) == {1}
    assert per_dataset(chunks) == Counter({0: 100, 1: 100})


def test_repeat_without_limit_is_endless() -> None:
    src = StaticMixtureWorkSource([A], chunk_size=3, exhausted_policy="repeat")
    assert all(src.next_chunk() is not None for _ in range(500))


def test_default_mixture_is_size_weighted() -> None:
    chunks = drain(StaticMixtureWorkSource([A, B], chunk_size=11, exhausted_policy="stop"))
    assert per_dataset(chunks) == Counter({0: 10, 1: 100})
    assert chunks[0].target_mixture == {"a": 10 / 110, "b": 100 / 110}


def test_lanes_that_never_get_a_chunk_round_trip_through_json() -> None:
    src = StaticMixtureWorkSource([dataset("a", [5])], chunk_size=2)  # 3 chunks
    for lane in range(16):
        clone = src.clone_for_lane(lane, 16)
        state = json.loads(json.dumps(clone.state_dict()))
        assert state["lane_chunks"] == 0
        fresh = src.clone_for_lane(lane, 16)
        fresh.load_state_dict(state)
        assert len(drain(fresh)) == len(drain(clone))
    got = [len(drain(src.clone_for_lane(lane, 16))) for lane in range(16)]
    assert sum(got) == 3 and set(got) == {0, 1}


def test_lane_state_is_refused_by_another_lane() -> None:
    src = StaticMixtureWorkSource([A], chunk_size=2)
    state = src.clone_for_lane(1, 4).state_dict()
    with pytest.raises(CheckpointError, match=r"lane_id=1 but this source has lane_id=3"):
        src.clone_for_lane(3, 4).load_state_dict(state)
    with pytest.raises(CheckpointError, match=r"canonical_replicas=4 .* canonical_replicas=8"):
        src.clone_for_lane(1, 8).load_state_dict(state)


def test_state_from_other_configuration_names_the_difference() -> None:
    state = StaticMixtureWorkSource([A, B], {"a": 1, "b": 2}, 4, seed=1).state_dict()
    other = StaticMixtureWorkSource([A, B], {"a": 1, "b": 3}, 4, seed=2)
    with pytest.raises(CheckpointError, match=r"seed: saved 1, now 2; weights: saved \[1, 2\]"):
        other.load_state_dict(state)
    bigger = StaticMixtureWorkSource([A, dataset("b", [50, 51])], {"a": 1, "b": 2}, 4, seed=1)
    with pytest.raises(CheckpointError, match=r"datasets: saved"):
        bigger.load_state_dict(state)
    with pytest.raises(CheckpointError, match=r"version"):
        bigger.load_state_dict({**state, "version": 99})


def test_state_is_small_and_json_safe() -> None:
    src = StaticMixtureWorkSource(
        [dataset("a", [1000] * 50), dataset("b", [10])], {"a": 0.3, "b": 0.7}, 64
    ).clone_for_lane(5, 8)
    for _ in range(20):
        src.next_chunk()
    text = json.dumps(src.state_dict())
    assert len(text) < 2000


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mixture": {"a": 1, "zz": 1}}, r"mixture names unknown dataset\(s\) \['zz'\]"),
        ({"mixture": {"a": 1}}, r"dataset\(s\) \['b'\] have no weight"),
        ({"mixture": {"a": 0, "b": 1}}, r"weight for 'a' must be positive"),
        ({"mixture": {"a": -2, "b": 1}}, r"weight for 'a' must be positive"),
        ({"mixture": {"a": float("nan"), "b": 1}}, r"weight for 'a' must be positive and finite"),
        ({"chunk_size": 0}, r"chunk_size must be a positive integer"),
        ({"exhausted_policy": "drop"}, r"exhausted_policy for 'a' must be one of"),
        ({"exhausted_policy": {"q": "stop"}}, r"exhausted_policy names unknown dataset"),
        ({"max_repeats": -1}, r"max_repeats for 'a' must be an integer >= 0"),
        ({"exhausted_policy": "stop", "stop_after_passes": 2}, r"cannot be combined"),
        ({"shuffle_block_size": "huge"}, r"shuffle_block_size must be"),
        ({"lane_assignment": "random"}, r"lane_assignment must be"),
    ],
)
def test_bad_configuration(kwargs: dict[str, Any], match: str) -> None:
    kw: dict[str, Any] = {"mixture": {"a": 1, "b": 1}, **kwargs}
    mixture = kw.pop("mixture")
    with pytest.raises(ConfigError, match=match):
        StaticMixtureWorkSource([A, B], MixtureSpec(mixture), **kw)


def test_bad_datasets() -> None:
    with pytest.raises(ConfigError, match=r"dataset 'e' has no rows"):
        StaticMixtureWorkSource([Dataset.from_records("e", [])])
    with pytest.raises(ConfigError, match=r"repeated: \['a'\]"):
        StaticMixtureWorkSource([A, dataset("a", [3])])
    with pytest.raises(ConfigError, match=r"lane_id must be in \[0, 4\)"):
        StaticMixtureWorkSource([A]).clone_for_lane(4, 4)


def test_lanes_for_rank_mappings() -> None:
    assert lanes_for_rank(1, 3, 6, "contiguous") == [2, 3]
    assert lanes_for_rank(1, 3, 6, "interleaved") == [1, 4]
    every = sorted(lane for r in range(4) for lane in lanes_for_rank(r, 4, 8, "interleaved"))
    assert every == list(range(8))
    with pytest.raises(ConfigError, match=r"canonical_replicas=6 is not divisible"):
        lanes_for_rank(0, 4, 6)
    with pytest.raises(ConfigError, match=r"dp_rank must be in \[0, 2\)"):
        lanes_for_rank(2, 2, 4)
    with pytest.raises(ConfigError, match=r"mapping must be"):
        lanes_for_rank(0, 2, 4, "zigzag")  # type: ignore[arg-type]

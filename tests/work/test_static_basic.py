"""StaticMixtureWorkSource basics: one dataset, tail chunk, lanes."""

from __future__ import annotations

import json

import pytest

from zephon.errors import CheckpointError, ConfigError
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource, WorkChunk


def drain(src: StaticMixtureWorkSource) -> list[WorkChunk]:
    out = []
    while (c := src.next_chunk()) is not None:
        out.append(c)
    return out


def make(n: int = 25, shard: int = 7, **kw: object) -> StaticMixtureWorkSource:
    ds = Dataset.from_records("a", [{"i": i} for i in range(n)], shard_size=shard)
    return StaticMixtureWorkSource([ds], MixtureSpec({"a": 1.0}), **kw)  # type: ignore[arg-type]


def test_single_dataset_one_pass_with_partial_tail() -> None:
    chunks = drain(make(25, chunk_size=10, seed=3))
    assert [len(c) for c in chunks] == [10, 10, 5]
    ids = [sid for c in chunks for sid in c]
    assert len(ids) == 25 and len(set(ids)) == 25
    assert chunks[-1].source_exhausted == ("a",)
    assert [c.global_index for c in chunks] == [0, 1, 2]


def test_dataset_smaller_than_one_chunk() -> None:
    chunks = drain(make(5, chunk_size=16384))
    assert [len(c) for c in chunks] == [5]


@pytest.mark.parametrize("lanes", [1, 2, 3, 8])
@pytest.mark.parametrize("assignment", ["permute", "modulo"])
def test_lanes_partition_the_global_sequence(lanes: int, assignment: str) -> None:
    src = make(53, chunk_size=4, seed=9, lane_assignment=assignment)
    reference = {c.global_index: c.pointers.tolist() for c in drain(src)}
    seen: dict[int, list[list[int]]] = {}
    for lane in range(lanes):
        for c in drain(src.clone_for_lane(lane, lanes)):
            assert c.global_index not in seen
            seen[c.global_index] = c.pointers.tolist()
    assert seen == reference


def test_state_round_trip_through_json() -> None:
    src = make(40, chunk_size=3, seed=1).clone_for_lane(2, 4)
    first = src.next_chunk()
    assert first is not None
    state = json.loads(json.dumps(src.state_dict()))
    rest = [c.pointers.tolist() for c in drain(src)]
    fresh = make(40, chunk_size=3, seed=1).clone_for_lane(2, 4)
    fresh.load_state_dict(state)
    assert [c.pointers.tolist() for c in drain(fresh)] == rest


def test_state_from_other_config_is_refused() -> None:
    state = make(40, chunk_size=3).state_dict()
    with pytest.raises(CheckpointError, match=r"chunk_size: saved 3, now 4"):
        make(40, chunk_size=4).load_state_dict(state)


def test_lean_state_continues_identically_and_refuses_another_config() -> None:
    src = make(40, chunk_size=3, seed=1).clone_for_lane(1, 4)
    assert src.next_chunk() is not None
    lean = json.loads(json.dumps(src.lean_state_dict()))
    assert "config" not in lean
    assert lean == {k: v for k, v in src.state_dict().items() if k != "config"}
    rest = [c.pointers.tolist() for c in drain(src)]
    fresh = make(40, chunk_size=3, seed=1).clone_for_lane(1, 4)
    fresh.load_state_dict(lean)
    assert [c.pointers.tolist() for c in drain(fresh)] == rest
    with pytest.raises(CheckpointError, match="carries no configuration summary"):
        make(40, chunk_size=3, seed=2).clone_for_lane(1, 4).load_state_dict(lean)


def test_mixture_naming_unknown_dataset() -> None:
    ds = Dataset.from_records("a", [{"i": 1}])
    with pytest.raises(ConfigError, match=r"unknown dataset\(s\) \['b'\]"):
        StaticMixtureWorkSource([ds], MixtureSpec({"a": 1, "b": 1}))

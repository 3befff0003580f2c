"""StaticMixtureWorkSource.with_epoch: every epoch a new order of the same passes."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.work._helpers import all_samples, dataset, drain, lane_streams
from zephon.errors import CheckpointError, ConfigError
from zephon.work import StaticMixtureWorkSource

DATASETS = [dataset("a", [7, 5, 9, 4]), dataset("b", [6, 6])]


def make(**kw: object) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(DATASETS, {"a": 2.0, "b": 1.0}, chunk_size=6, seed=4, **kw)  # type: ignore[arg-type]


def pointers(src: StaticMixtureWorkSource) -> list[tuple[int, int, int]]:
    return [sid for chunk in drain(src) for sid in chunk]


def test_each_epoch_reads_the_same_passes_in_its_own_order():
    src = make(stop_after_passes=2)
    epochs = [pointers(src.with_epoch(e)) for e in range(3)]
    assert epochs[0] == pointers(make(stop_after_passes=2))  # epoch 0: the order it always had
    for got in epochs:
        counts = Counter(got)
        # the slowest dataset ("a") twice exactly; "b" repeats meanwhile, but not beyond
        assert {k: v for k, v in counts.items() if k[0] == 0} == {
            k: 2 for k in all_samples(DATASETS) if k[0] == 0
        }
        assert len(got) == len(epochs[0])
    assert len({tuple(got) for got in epochs}) == 3
    assert pointers(make(stop_after_passes=2).with_epoch(2)) == epochs[2]  # deterministic


def test_an_epoch_deals_chunks_to_lanes_anew_and_each_lane_only_its_own():
    zero = lane_streams(make(shuffle_shards=False), 3)
    one = lane_streams(make(shuffle_shards=False).with_epoch(1), 3)
    assert zero != one  # no shard shuffle: the deal alone differs
    got = Counter(tuple(p) for lane in one.values() for _, ptrs in lane for p in ptrs)
    assert got == Counter(tuple(p) for lane in zero.values() for _, ptrs in lane for p in ptrs)


def test_a_state_from_another_epoch_is_refused_naming_it():
    one = make().with_epoch(1)
    assert one.epoch == 1 and make().epoch == 0 and one.fingerprint != make().fingerprint
    state = one.clone_for_lane(0, 2).state_dict()
    with pytest.raises(CheckpointError, match="epoch: saved 1, now 0"):
        make().clone_for_lane(0, 2).load_state_dict(state)
    with pytest.raises(ConfigError, match="epoch must be an integer >= 0"):
        make().with_epoch(-2)

"""Ranks of uneven lengths: checkpoints taken while ranks are in different passes merge, keep
each lane's pass, and restore exactly on the same and on another number of ranks."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource, merge_checkpoints
from zephon.checkpoints import parse_checkpoint, seal
from zephon.errors import CheckpointError
from zephon.torch_loader import PipelineDataLoader, merge_loader_states

ROWS = [{"text": f"doc {i} " + "w " * (i % 7)} for i in range(170)]
TAKEN = 85  # rank 0 holds 90 batches a pass, rank 1 80: rank 1 is 5 batches into its 2nd pass

Item = tuple[int, int, str]  # (epoch, lane, the batch's sample ids)


def build(rank: int = 0, world: int = 1) -> Pipeline:
    source = StaticMixtureWorkSource(
        [Dataset.from_records("d", ROWS, shard_size=17)], chunk_size=10, seed=3
    )
    return (
        Pipeline(source).decode_text().tokenize("bytes").batch(1)
        .options(canonical_replicas=4, runner="inline", dp_rank=rank, dp_world_size=world)
    )  # fmt: skip


def items(loader: PipelineDataLoader, count: int | None = None, *, until: int = 2) -> list[Item]:
    """``count`` items over as many passes as it takes, or every item up to pass ``until``."""
    out: list[Item] = []
    while count is None or len(out) < count:
        if count is None and loader.epoch_finished and loader.epoch + 1 >= until:
            break
        for batch in loader:
            out.append((loader.epoch, batch.lane_id, str(batch.ids)))
            if len(out) == count:
                break
    return out


def by_lane(delivered: list[Item]) -> dict[tuple[int, int], list[str]]:
    lanes: dict[tuple[int, int], list[str]] = defaultdict(list)
    for epoch, lane, ids in delivered:
        lanes[epoch, lane].append(ids)
    return dict(lanes)


def reference() -> dict[tuple[int, int], list[str]]:
    """Each lane's batches in passes 0 and 1 (a lane's stream does not depend on the ranks)."""
    return by_lane(items(PipelineDataLoader(build(), auto_epoch=True)))


def uneven_state() -> tuple[dict[str, Any], list[list[Item]]]:
    """Two ranks' loaders, ``TAKEN`` batches each, and their merged state (through JSON)."""
    loaders = [PipelineDataLoader(build(rank, 2), auto_epoch=True) for rank in (0, 1)]
    heads = [items(loader, TAKEN) for loader in loaders]
    merged = merge_loader_states([loader.state_dict() for loader in loaders])
    return json.loads(json.dumps(merged)), heads


def test_passes_of_ranks_differ_in_length_and_pass_length_says_so() -> None:
    ranks = [build(rank, 2) for rank in (0, 1)]
    assert [p.pass_length() for p in ranks] == [90, 80]
    assert [len(list(build(rank, 2).set_epoch(1))) for rank in (0, 1)] == [
        p.pass_length(1) for p in ranks
    ]
    assert sum(build(rank, 4).pass_length() for rank in range(4)) == build().pass_length() == 170


def test_a_checkpoint_while_ranks_are_in_different_passes_merges_keeping_each_lanes_pass() -> None:
    merged, heads = uneven_state()
    assert {epoch for epoch, _, _ in heads[0]} == {0} and heads[1][-1][0] == 1
    parsed = parse_checkpoint(merged)
    assert merged["version"] == 6 and parsed.epoch == 0
    assert {lane: parsed.lane_epoch(lane) for lane in range(4)} == {0: 0, 1: 1, 2: 0, 3: 1}
    again = merge_checkpoints([merged])  # a merged checkpoint merges again, lanes unchanged
    assert again["lanes"] == merged["lanes"] and again["config"] == merged["config"]


def test_the_same_ranks_continue_exactly() -> None:
    merged, heads = uneven_state()
    for rank in (0, 1):
        whole = items(PipelineDataLoader(build(rank, 2), auto_epoch=True), 3 * TAKEN)
        assert whole[:TAKEN] == heads[rank]
        resumed = PipelineDataLoader(build(rank, 2), auto_epoch=True)
        resumed.load_state_dict(merged)
        assert items(resumed, 2 * TAKEN) == whole[TAKEN:]


@pytest.mark.parametrize("world", [1, 4])
def test_another_number_of_ranks_continues_every_lane_in_its_pass(world: int) -> None:
    merged, heads = uneven_state()
    rest: list[Item] = []
    for rank in range(world):
        loader = PipelineDataLoader(build(rank, world), auto_epoch=True)
        loader.load_state_dict(merged)
        assert loader.epoch == 0
        rest += items(loader)
    assert by_lane(heads[0] + heads[1] + rest) == reference()


def test_a_pipeline_keeps_lanes_of_a_later_pass_until_that_pass() -> None:
    merged, heads = uneven_state()
    pipe = build().restore(merged)
    it = iter(pipe)
    got = [(0, b.lane_id, str(b.ids)) for b in (next(it), next(it))]
    state = pipe.checkpoint()
    it.close()
    later = {k: v for k, v in state["lanes"].items() if "epoch" in v}
    assert state["version"] == 6 and sorted(later) == ["1", "3"]  # passed on, untouched
    assert later == {k: merged["lanes"][k] for k in later}
    pipe = build().restore(state)
    got += [(0, b.lane_id, str(b.ids)) for b in pipe]
    with pytest.raises(CheckpointError, match=r"lanes \[1, 3\] are in the middle of epoch 1"):
        pipe.set_epoch(2)  # would skip the rest of their pass
    got += [(1, b.lane_id, str(b.ids)) for b in pipe.set_epoch(1)]
    assert by_lane(heads[0] + heads[1] + got) == reference()


def test_a_lane_of_another_configuration_in_its_pass_is_refused() -> None:
    merged, _ = uneven_state()
    merged["lanes"]["1"]["fingerprint"] = "0" * 16
    with pytest.raises(CheckpointError, match="lane 1 was saved in epoch 1 with another conf"):
        build().restore(seal(merged))
    merged["lanes"]["1"]["epoch"] = 0
    with pytest.raises(CheckpointError, match=r"lanes\[1\]\.epoch is 0, not later"):
        parse_checkpoint(seal(merged))

"""Epochs: set_epoch gives every pass its own order, each item once per pass, resumable."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource, merge_checkpoints
from zephon.errors import CheckpointError, ConfigError
from zephon.testing import item_key, run_with_stops
from zephon.types import TAG_PACKING
from zephon.work import WorkChunk, WorkSource

ROWS = [{"text": f"doc {i} " + "word " * (i % 9)} for i in range(240)]


def build(runner: str = "inline", epoch: int | None = None, **source: Any) -> Pipeline:
    options = {"chunk_size": 24, "seed": 5, **source}
    src = StaticMixtureWorkSource([Dataset.from_records("d", ROWS, shard_size=40)], **options)
    pipe = (
        Pipeline(src)
        .decode_text()
        .tokenize("bytes", max_length=64)
        .shuffle(16, seed=2)
        .pack_flat(96, pad_token_id=0)
        .batch(2, drop_last=False)  # so that every document of a pass arrives
        .options(runner=runner, canonical_replicas=2, flush_every_k_chunks=3)
    )
    if runner == "process":
        pipe.options(process_pool="shared")
    return pipe if epoch is None else pipe.set_epoch(epoch)


def documents(batches: list[Any]) -> list[tuple[int, ...]]:
    """The source rows in delivery order (each packed row names its documents)."""
    return [sid for key in batches for row in key for sid in row[-1]]


def key(batch: Any) -> tuple[Any, ...]:
    """Everything of a batch, plus each packed row's documents (a document fits one row)."""
    return tuple(
        (*row, tuple(seg[0].sample_id for seg in record.meta.tags[TAG_PACKING]["segments"]))
        for row, record in zip(item_key(batch), batch.records, strict=True)
    )


def test_each_epoch_is_another_order_of_every_item_once_on_every_runner():
    pipe = build()
    passes = []
    for epoch in range(3):
        pipe.set_epoch(epoch)
        passes.append([key(b) for b in pipe])
    for got in passes:
        docs = documents(got)
        assert len(docs) == len(set(docs)) == len(ROWS)  # every item exactly once
    assert len({tuple(documents(got)) for got in passes}) == 3  # three different orders
    for runner in ("threads", "process"):
        assert [key(b) for b in build(runner, epoch=2)] == passes[2], runner
    # epoch 0 is the order a pipeline had before epochs existed (no set_epoch at all)
    assert [key(b) for b in build()] == passes[0]


@pytest.mark.parametrize("runner", ["inline", "threads", "process", "engine_process"])
def test_a_resume_mid_epoch_two_continues_exactly(runner: str):
    reference = [key(b) for b in build(epoch=2)]
    stops = [3, len(reference) // 2]

    def make() -> Pipeline:
        if runner == "engine_process":  # the engine in a child, checkpoints in the consumer
            return build("threads", epoch=2).options(engine_process=True)
        return build(runner, epoch=2)

    assert run_with_stops(make, key, stops) == reference
    # a new pipeline that never heard of set_epoch takes the epoch from the checkpoint
    pipe = build(epoch=2)
    it = iter(pipe)
    head = [key(next(it)) for _ in range(stops[1])]
    state = json.loads(json.dumps(pipe.checkpoint()))
    it.close()  # type: ignore[attr-defined]
    fresh = build("threads" if runner == "engine_process" else runner).restore(state)
    assert fresh.epoch == 2 and state["config"]["epoch"] == 2
    assert head + [key(b) for b in fresh] == reference


def test_the_epoch_is_part_of_the_fingerprint_and_of_merges():
    zero, two = build().checkpoint(), build(epoch=2).checkpoint()
    assert "epoch" not in zero["config"]  # epoch 0 checkpoints are as they always were
    assert zero["fingerprint"] != two["fingerprint"]
    one_rank = build().options(dp_world_size=2)
    other_rank = build(epoch=2).options(dp_world_size=2, dp_rank=1)
    merged = merge_checkpoints([one_rank.checkpoint(), other_rank.checkpoint()])
    # ranks in different passes merge: the earliest is the checkpoint's, the later one tagged
    assert "epoch" not in merged["config"] and merged["version"] == 6
    assert {k: (v.get("epoch"), v.get("fingerprint")) for k, v in merged["lanes"].items()} == {
        "0": (None, None),
        "1": (2, other_rank.checkpoint()["fingerprint"]),
    }
    other_data = build(epoch=2).options(dp_world_size=2, dp_rank=1, flush_every_k_chunks=2)
    with pytest.raises(CheckpointError, match="flush_every_k_chunks"):
        merge_checkpoints([one_rank.checkpoint(), other_data.checkpoint()])
    pipe = build()
    for _ in pipe:
        pass
    assert all(lane["done"] for lane in pipe.checkpoint()["lanes"].values())
    for epoch in (0, 1):  # after set_epoch a checkpoint describes the start of that pass
        state = pipe.set_epoch(epoch).checkpoint()
        assert state["config"].get("epoch", 0) == epoch
        assert not any(lane["done"] or lane["delivered"] for lane in state["lanes"].values())


def test_set_epoch_after_a_restore_keeps_finishes_or_refuses():
    pipe = build(epoch=1)
    it = iter(pipe)
    next(it)
    middle = pipe.checkpoint()
    it.close()  # type: ignore[attr-defined]
    with pytest.raises(CheckpointError, match=r"middle of epoch 1; call set_epoch\(1\)"):
        build().restore(middle).set_epoch(2)
    assert build().restore(middle).set_epoch(1).epoch == 1  # the same epoch: continues
    done = build(epoch=1)
    for _ in done:
        pass
    finished = done.checkpoint()
    after = build().restore(finished)
    assert [key(b) for b in after] == []  # epoch 1 was complete
    after.set_epoch(2)
    assert [key(b) for b in after] == [key(b) for b in build(epoch=2)]


def test_a_second_pass_without_set_epoch_says_it_repeats(caplog: pytest.LogCaptureFixture):
    pipe = build()
    first = [key(b) for b in pipe]
    with caplog.at_level(logging.WARNING, logger="zephon"):
        again = [key(b) for b in pipe]
    assert again == first
    assert "iterated again at epoch 0 without set_epoch()" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="zephon"):
        pipe.set_epoch(0)
        assert [key(b) for b in pipe] == first
        pipe.set_epoch(1)
        assert [key(b) for b in pipe] != first
    assert "without set_epoch" not in caplog.text


def test_without_any_shuffle_in_the_source_the_shuffle_operator_still_reorders():
    """One lane, no shard shuffle: only the operator's epoch-keyed seed changes the order."""

    def plain(epoch: int) -> list[tuple[int, ...]]:
        src = StaticMixtureWorkSource(
            [Dataset.from_records("d", ROWS)], chunk_size=24, shuffle_shards=False
        )
        pipe = Pipeline(src).decode_text().shuffle(32, seed=2).set_epoch(epoch)
        return [r.meta.sample_id for r in pipe]

    zero, one = plain(0), plain(1)
    assert zero != one and sorted(zero) == sorted(one)


class _Fixed(WorkSource):
    """A custom source that knows nothing of epochs."""

    def __init__(self) -> None:
        self._ds = Dataset.from_records("d", ROWS[:10])
        self._done = False

    @property
    def datasets(self) -> list[Dataset]:
        return [self._ds]

    def next_chunk(self) -> WorkChunk | None:
        import numpy as np

        if self._done:
            return None
        self._done = True
        return WorkChunk(np.array([[0, 0, i] for i in range(10)], dtype=np.int64))

    def state_dict(self) -> dict[str, Any]:
        return {"done": self._done}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._done = bool(state["done"])

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> _Fixed:
        return _Fixed()


def test_bad_epochs_and_sources_without_epochs_are_refused():
    with pytest.raises(ConfigError, match="_Fixed has no epochs"):
        Pipeline(_Fixed()).set_epoch(1)
    assert len(list(Pipeline(_Fixed()).set_epoch(0))) == 10
    with pytest.raises(ConfigError, match="epoch must be an integer >= 0"):
        build().set_epoch(-1)
    pipe = build()
    it = iter(pipe)
    next(it)
    with pytest.raises(RuntimeError, match="between iterations"):
        pipe.set_epoch(1)
    it.close()  # type: ignore[attr-defined]


def block_shuffled(runner: str, **options: Any) -> Pipeline:
    src = StaticMixtureWorkSource([Dataset.from_records("d", ROWS, shard_size=40)], chunk_size=24)
    return (
        Pipeline(src)
        .decode_text()
        .tokenize("bytes", max_length=64)
        .shuffle(16, seed=2, algorithm="block")
        .batch(2, drop_last=False)
        .options(runner=runner, canonical_replicas=2, **options)
    )


def test_block_shuffle_in_reused_workers_takes_each_epochs_seed():
    # the block shuffle seeds itself when a worker sets it up; a worker kept for reuse from
    # epoch 0 must not keep epoch 0's seed
    def two_epochs(pipe: Pipeline) -> list[list[Any]]:
        return [[item_key(b) for b in pipe.set_epoch(epoch)] for epoch in (0, 1)]

    reference = two_epochs(block_shuffled("inline"))
    assert reference[0] != reference[1]
    assert two_epochs(block_shuffled("process", reuse_workers=True)) == reference

"""The torch adapter: plain and stateful DataLoaders, with and without workers."""

from __future__ import annotations

from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError
from zephon.types import SampleBatch

ROWS = [{"id": i, "text": f"row {i} " * (1 + i % 4)} for i in range(240)]


def build() -> Pipeline:
    ds = Dataset.from_records("rows", ROWS, shard_size=50)
    return (
        Pipeline(RangeSource([ds], chunk_size=8))
        .decode_text()
        .tokenize("bytes")
        .batch(4)
        .options(canonical_replicas=4, runner="threads")
    )


def ids(batch: SampleBatch) -> tuple[Any, ...]:
    return (batch.lane_id, tuple(batch.ids))


def identity(x: Any) -> Any:
    return x


def test_dataset_yields_the_pipeline_items_and_transform():
    reference = [ids(b) for b in build()]
    assert [ids(b) for b in build().to_torch_dataset()] == reference
    lens = list(build().to_torch_dataset(transform=len))
    assert lens == [4] * len(reference)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_exactly(workers: int):
    def loader() -> StatefulDataLoader:
        # DataLoader's default start method on Linux (fork): the pipeline builds its threads
        # and tokenizer lazily inside each worker, so nothing crosses the fork half-made.
        kwargs: dict[str, Any] = {}
        return StatefulDataLoader(
            build().to_torch_dataset(transform=ids),
            batch_size=None,
            collate_fn=identity,
            num_workers=workers,
            **kwargs,
        )

    dl = loader()
    it = iter(dl)
    head = [next(it) for _ in range(7)]
    state = dl.state_dict()
    rest = list(it)  # the uninterrupted continuation
    assert sorted(head + rest) == sorted(ids(b) for b in build())  # same batches, any workers
    resumed = loader()
    resumed.load_state_dict(state)
    assert list(resumed) == rest


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_stateful_dataloader_order_does_not_depend_on_workers_until_a_lane_ends():
    reference = [ids(b) for b in build()]
    ends = min(
        max(i for i, (lane, _) in enumerate(reference) if lane == n) for n in range(4)
    )  # the last batch of the first lane to end
    for workers in (2, 4):
        dl = StatefulDataLoader(build().to_torch_dataset(transform=ids), batch_size=None,
                                collate_fn=identity, num_workers=workers)  # fmt: skip
        assert list(dl)[: ends + 1] == reference[: ends + 1], f"num_workers={workers}"


def row_ids(batch: SampleBatch) -> dict[str, Any]:
    """Per row: its sample index, as an array the DataLoader's collator stacks."""
    import numpy as np

    return {
        "index": np.array([sid[2] for sid in batch.ids]),
        "lane": np.full(len(batch), batch.lane_id),
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_rows_batch_by_the_loader_and_resume_inside_a_pipeline_batch(workers: int):
    def loader() -> StatefulDataLoader:
        dataset = build().to_torch_dataset(transform=row_ids, rows=True)
        return StatefulDataLoader(dataset, batch_size=3, num_workers=workers)

    def flat(batches: list[dict[str, Any]]) -> list[tuple[int, int]]:
        return [(int(ln), int(i)) for b in batches for ln, i in zip(b["lane"], b["index"])]

    dl = loader()
    it = iter(dl)
    head = [next(it) for _ in range(5)]  # 15 rows: 3 batches of 4, and 3 of the fourth
    assert all(len(b["index"]) == 3 for b in head)
    state = dl.state_dict()
    rest = list(it)
    every_row = sorted((b.lane_id, sid[2]) for b in build() for sid in b.ids)
    assert sorted(flat(head) + flat(rest)) == every_row  # each row once
    resumed = loader()
    resumed.load_state_dict(state)
    assert flat(list(resumed)) == flat(rest)


def test_rows_without_per_row_arrays_are_refused():
    dataset = build().to_torch_dataset(transform=lambda b: {"n": len(b)}, rows=True)
    with pytest.raises(ConfigError, match="no per-row arrays"):
        next(iter(dataset))


def epoch_build() -> Pipeline:
    ds = Dataset.from_records("rows", ROWS, shard_size=50)
    source = StaticMixtureWorkSource([ds], chunk_size=8, seed=2)
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes")
        .shuffle(16, seed=1)
        .batch(4)
        .options(canonical_replicas=4, runner="threads")
    )


@pytest.mark.timeout(120)
def test_set_epoch_through_a_stateful_dataloader_resumes_inside_the_second_epoch():
    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(
            epoch_build().to_torch_dataset(transform=ids),
            batch_size=None,
            collate_fn=identity,
            num_workers=2,
        )

    dl = loader()
    passes = []
    for epoch in range(2):
        dl.dataset.set_epoch(epoch)
        passes.append(list(dl))

    def samples(batches: list[Any]) -> list[Any]:
        return sorted(sid for _, sids in batches for sid in sids)

    assert passes[0] != passes[1] and samples(passes[0]) == samples(passes[1])
    dl.dataset.set_epoch(1)
    it = iter(dl)
    head = [next(it) for _ in range(9)]
    state = dl.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    resumed.dataset.set_epoch(1)  # the usual loop: load, then set the epoch it was in
    rest = list(resumed)
    assert sorted(head + rest) == sorted(passes[1])  # epoch 1's batches, each once

"""The torch adapter: plain and stateful DataLoaders, with and without workers."""

from __future__ import annotations

from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
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

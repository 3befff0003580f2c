"""What a mixture delivered, in ``pipeline.stats()`` and checkpoints: a 70/30 sample mixture of
short and long documents is 70/30 by samples and about 32/68 by tokens, and the counts say so.

Every expected count is taken from the delivered items themselves (sample ids and token fields,
or a packed row's provenance segments), never from the counters under test.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource, merge_checkpoints
from zephon._engine.state.mixture_counts import MixtureCounts
from zephon.checkpoints import parse_checkpoint
from zephon.errors import CheckpointError
from zephon.types import SampleMeta, SampleRecord

NAMES = ("web", "code")


def rows(n: int, low: int, high: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [{"text": "x" * rng.randint(low, high)} for _ in range(n)]


@pytest.fixture(scope="module")
def datasets() -> list[Dataset]:
    # web: ~20 bytes a document, code: ~100; 70/30 by samples is ~32/68 by tokens
    return [
        Dataset.from_records("web", rows(1400, 10, 30, 1), shard_size=400),
        Dataset.from_records("code", rows(600, 80, 120, 2), shard_size=200),
    ]


def pipeline(datasets: list[Dataset], mixture: Any = None, **options: Any) -> Pipeline:
    source = StaticMixtureWorkSource(
        datasets, mixture or {"web": 0.7, "code": 0.3}, chunk_size=50, seed=3,
        exhausted_policy="stop",
    )  # fmt: skip
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes")
        .shuffle(64, seed=1)
        .batch(8)
        .options(canonical_replicas=2, **{"runner": "threads", **options})
    )


def delivered(items: list[Any]) -> tuple[dict[str, int], dict[str, int]]:
    """Samples and tokens per dataset, read off the delivered records."""
    samples: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    for batch in items:
        for record in batch.records:
            name = NAMES[record.meta.sample_id[0]]
            samples[name] += 1
            tokens[name] += len(record.payload["input_ids"])
    return dict(samples), dict(tokens)


@pytest.mark.parametrize("options", [{}, {"runner": "process"}, {"engine_process": True}])
def test_the_stats_count_samples_and_tokens_per_dataset(datasets, options):
    pipe = pipeline(datasets, **options)
    items = list(pipe)
    samples, tokens = delivered(items)
    mixture = pipe.stats().mixture
    assert mixture is not None
    assert (mixture.unit, dict(mixture.weights)) == ("samples", {"web": 0.7, "code": 0.3})
    assert dict(mixture.samples) == samples and dict(mixture.tokens) == tokens
    assert mixture.sample_shares["web"] == pytest.approx(0.7, abs=0.01)
    assert mixture.token_shares["web"] == pytest.approx(0.32, abs=0.03)  # not 70/30 at all
    data = pipe.stats().to_dict()["mixture"]
    assert data["sample_shares"] == mixture.sample_shares
    assert data["token_shares"] == mixture.token_shares


def test_a_token_mixture_says_its_unit(datasets):
    spec = MixtureSpec({"web": 0.7, "code": 0.3}, unit="tokens")
    pipe = pipeline(datasets, spec)
    list(pipe)
    mixture = pipe.stats().mixture
    assert mixture is not None and mixture.unit == "tokens"
    assert mixture.token_shares["web"] == pytest.approx(0.7, abs=0.03)
    assert mixture.sample_shares["web"] > 0.85  # short documents: many more of them


def test_a_restored_run_counts_on_from_its_checkpoint(datasets):
    whole = pipeline(datasets)
    list(whole)
    first = pipeline(datasets)
    head = [b for _, b in zip(range(30), first, strict=False)]
    state = json.loads(json.dumps(first.checkpoint()))
    counted = parse_checkpoint(state).delivered_mixture()
    assert counted is not None
    samples, tokens = delivered(head)
    assert counted == ([samples["web"], samples["code"]], [tokens["web"], tokens["code"]])
    second = pipeline(datasets).restore(state)
    list(second)
    assert second.stats().mixture == whole.stats().mixture  # cumulative, as if never stopped


def test_merged_rank_checkpoints_keep_every_lanes_counts(datasets):
    ranks = [pipeline(datasets, dp_rank=r, dp_world_size=2) for r in (0, 1)]
    heads = [[b for _, b in zip(range(10), p, strict=False)] for p in ranks]
    merged = parse_checkpoint(merge_checkpoints([p.checkpoint() for p in ranks]))
    samples, tokens = delivered(heads[0] + heads[1])
    assert merged.mixture is not None and merged.mixture["components"] == list(NAMES)
    assert merged.delivered_mixture() == (
        [samples["web"], samples["code"]],
        [tokens["web"], tokens["code"]],
    )


def test_packed_rows_count_each_datasets_tokens(datasets):
    source = StaticMixtureWorkSource(datasets, {"web": 0.7, "code": 0.3}, chunk_size=50)
    pipe = (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes")
        .pack_flat(256, pad_token_id=0)
        .batch(4)
        .options(runner="threads")
    )
    samples: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    for batch in pipe:
        for row in batch.provenance():
            for seg in row:
                tokens[seg.dataset] += seg.length
                samples[seg.dataset] += seg.source_end == seg.source_length
    mixture = pipe.stats().mixture
    assert mixture is not None
    assert dict(mixture.tokens) == dict(tokens) and dict(mixture.samples) == dict(samples)


def test_one_dataset_has_no_mixture_and_its_checkpoints_none():
    source = StaticMixtureWorkSource([Dataset.from_records("only", rows(50, 5, 9, 4))])
    pipe = Pipeline(source).decode_text().options(runner="inline")
    list(pipe)
    state = pipe.checkpoint()
    assert pipe.stats().mixture is None and "mixture" not in state
    assert all("mixture" not in lane for lane in state["lanes"].values())


def test_damaged_counts_are_refused_naming_the_lane(datasets):
    from zephon.checkpoints import seal

    pipe = pipeline(datasets)
    list(zip(range(5), pipe, strict=False))
    state = json.loads(json.dumps(pipe.checkpoint()))
    state["lanes"]["1"]["mixture"]["tokens"] = [1, -5]
    with pytest.raises(CheckpointError, match=r"lanes\[1\]\.mixture is not \{samples"):
        parse_checkpoint(seal(state))


def test_unbatched_records_are_counted_one_by_one(datasets):
    source = StaticMixtureWorkSource(datasets, {"web": 0.7, "code": 0.3}, chunk_size=50)
    pipe = Pipeline(source).decode_text().tokenize("bytes").options(runner="inline")
    samples: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    for record in zip(range(500), pipe, strict=False):
        name = NAMES[record[1].meta.sample_id[0]]
        samples[name] += 1
        tokens[name] += len(record[1].payload["input_ids"])
    mixture = pipe.stats().mixture
    assert mixture is not None
    assert dict(mixture.samples) == samples and dict(mixture.tokens) == tokens


def test_frozen_counts_stay_one_object_until_the_lane_counts_another_item():
    def record(lane: int, component: int, tokens: int) -> SampleRecord:
        meta = SampleMeta((component, 0, 0), lane, 0, 0, (), component)
        return SampleRecord(meta, {"input_ids": [1] * tokens})

    counts = MixtureCounts(2, [0, 1], {1: ([4, 0], [40, 0])})
    first = counts.frozen(0)
    assert first == ((0, 0), (0, 0)) and counts.frozen(0) is first
    assert counts.frozen(1) == ((4, 0), (40, 0))
    counts.add(record(1, 1, 5))  # another lane's item leaves lane 0's counts as they were
    assert counts.frozen(0) is first
    assert counts.frozen(1) == ((4, 1), (40, 5))
    counts.add(record(0, 0, 3))
    assert counts.frozen(0) == ((1, 0), (3, 0))
    assert counts.frozen(0) == tuple(map(tuple, counts.lane(0)))

"""A pipeline with videos, end to end: records with a JPEG and an MP4 decoded, captions
tokenized, packed by text + image + video tokens, batched. Its full output (frames, pixels,
grids, packed rows, image maps) is identical on every runner and decode worker count, across
stops and restores at 20 points, and across resumes on 1 and on 4 ranks of a run on 2."""

from __future__ import annotations

from typing import Any

import pytest

from tests._media import encoded, picture, video
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.testing import check_operator, item_key

SMALL = {"min_pixels": 28 * 28, "max_pixels": 28 * 28 * 4}


def clips() -> list[dict[str, Any]]:
    return [
        {
            "text": "a clip " * (1 + i % 3) + str(i),
            "jpg": encoded(picture(i, (40 + 9 * i, 50))),
            "mp4": video(4 + 2 * (i % 2), seed=i, size=(48, 40)),
        }
        for i in range(24)
    ]


CLIPS = clips()


def pipeline(workers: int | None = None) -> Pipeline:
    source = StaticMixtureWorkSource(
        [Dataset.from_records("clips", CLIPS)], chunk_size=3, seed=5, shuffle_within_shard=True
    )
    return (
        Pipeline(source)
        .decode_image(fields=["jpg"], parallelism=workers, **SMALL)
        .decode_video(fields=["mp4"], fps=10, parallelism=workers, **SMALL)
        .tokenize("bytes")
        .pack_sequences(80, image_grids="image_grid_thw", video_grids="video_grid_thw", num_bins=2)
        .batch(1)
        .options(canonical_replicas=2, flush_every_k_chunks=2)
    )


def test_runners_and_worker_counts_give_identical_batches() -> None:
    expected = [item_key(batch) for batch in pipeline().options(runner="inline")]
    rows = [r for batch in pipeline().options(runner="inline") for r in batch.records]
    assert sum(len(r.payload["packed_samples"]) for r in rows) >= 22
    for runner, workers in (("threads", 2), ("process", 2)):
        got = [item_key(batch) for batch in pipeline(workers).options(runner=runner)]
        assert got == expected, f"runner={runner} with {workers} decode workers"


@pytest.mark.timeout(600)
def test_stops_at_20_points_and_elastic_resumes_are_exact() -> None:
    report = check_operator(pipeline, runners=("inline", "threads"), workers=(2,), stops=range(20))
    assert "stop and restore at 21 points" in report.passed
    assert "elastic resume 2 -> 1 and 2 -> 4 ranks" in report.passed

"""A whole image pipeline, end to end: tar shards and a Parquet file of encoded images, decoded,
captions tokenized, packed by text + vision tokens, batched. Its full output (pixels, grids,
packed rows, image maps) is identical on every runner and worker count, across stops and
restores at 20 points, and across resumes on 1 and on 4 ranks of a run checkpointed on 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._media import write_pairs_parquet, write_shards
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.testing import check_operator, item_key

MAX_PIXELS = 28 * 28 * 4


def corpus(tmp_path: Path) -> list[Dataset]:
    if not (tmp_path / "wds").exists():
        write_shards(tmp_path / "wds", [23, 20, 21])
        (tmp_path / "pq").mkdir()
        write_pairs_parquet(tmp_path / "pq" / "pairs.parquet", 40)
    return [Dataset.from_path("wds", tmp_path / "wds"), Dataset.from_path("pq", tmp_path / "pq")]


def pipeline(tmp_path: Path, workers: int | None = None) -> Pipeline:
    source = StaticMixtureWorkSource(
        corpus(tmp_path), chunk_size=4, seed=3, shuffle_within_shard=True
    )
    return (
        Pipeline(source)
        .decode_image(
            fields=("jpg", "png", "webp"),
            min_pixels=28 * 28,
            max_pixels=MAX_PIXELS,
            parallelism=workers,
        )
        .decode_text(fields=["txt"])
        .tokenize("bytes", field="txt")
        .pack_sequences(
            64,
            image_grids="image_grid_thw",
            max_images_per_row=3,
            num_bins=2,
            image_markers=(300, 301),
        )
        .batch(2)
        .options(canonical_replicas=2, flush_every_k_chunks=3)
    )


def outputs(pipe: Pipeline) -> list[object]:
    return [item_key(batch) for batch in pipe]


def test_the_pipeline_decodes_packs_and_batches_every_image(tmp_path: Path) -> None:
    batches = list(pipeline(tmp_path).options(runner="inline"))
    rows = [row for batch in batches for row in batch.records]
    samples = [s for row in rows for s in row.payload["packed_samples"]]
    assert len(samples) >= 100  # 104 samples, less the last rows batch(2) drops
    assert {len(row.payload["image_map"]) for row in rows} <= {1, 2, 3}
    pairs = [s for s in samples if "png" in s and "jpg" in s]
    assert pairs and all(len(s["image_grid_thw"]) == 2 for s in pairs)
    assert all(s["png"].dtype.name == "uint8" and s["png"].ndim == 3 for s in pairs)
    assert len(batches) >= 21  # 20 stops, all inside the run


@pytest.mark.timeout(900)
def test_runners_and_worker_counts_give_identical_batches(tmp_path: Path) -> None:
    expected = outputs(pipeline(tmp_path).options(runner="inline"))
    for runner in ("threads", "process"):
        for workers in (1, 2, 4):
            got = outputs(pipeline(tmp_path, workers).options(runner=runner))
            assert got == expected, f"runner={runner} with {workers} decode workers"


@pytest.mark.timeout(900)
def test_stops_at_20_points_and_elastic_resumes_are_exact(tmp_path: Path) -> None:
    corpus(tmp_path)
    report = check_operator(
        lambda: pipeline(tmp_path), runners=("inline", "threads"), workers=(2,), stops=range(20)
    )
    assert "stop and restore at 21 points" in report.passed
    assert "elastic resume 2 -> 1 and 2 -> 4 ranks" in report.passed

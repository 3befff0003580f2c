"""pack_sequences with images: a record's length is its text plus its vision tokens, rows cap
their images and carry cu_seqlens and an image map; exact across runners, stops and ranks."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._media import write_shards
from zephon import Dataset, Pipeline
from zephon import StaticMixtureWorkSource as Source
from zephon._ops.pack import PackSequencesOp
from zephon.errors import ConfigError, DataError, MissingFieldError
from zephon.testing import check_operator
from zephon.types import TAG_PACKING

RNG = random.Random(11)


def caption(i: int) -> dict[str, Any]:
    grids = [(1, 2 * RNG.randint(1, 8), 2 * RNG.randint(1, 8)) for _ in range(RNG.randint(1, 4))]
    return {"id": i, "input_ids": list(range(RNG.randint(1, 30))), "image_grid_thw": grids}


ROWS = [caption(i) for i in range(200)]


def vision(payload: dict[str, Any]) -> list[int]:
    return [t * h * w // 4 for t, h, w in payload["image_grid_thw"]]


def packed(rows: list[dict[str, Any]] = ROWS, **kwargs: Any) -> list[Any]:
    source = Source([Dataset.from_records("c", rows, shard_size=50)], chunk_size=8)
    pipe = Pipeline(source).pack_sequences(image_grids="image_grid_thw", **kwargs)
    return list(pipe.options(runner="inline"))


@pytest.mark.parametrize("algorithm", ["first_fit", "best_fit"])
def test_rows_count_text_and_vision_tokens_and_map_every_image(algorithm: str) -> None:
    out = packed(max_length=256, algorithm=algorithm)
    seen = []
    for record in out:
        samples = record.payload["packed_samples"]
        lengths = [len(p["input_ids"]) + sum(vision(p)) for p in samples]
        assert record.meta.tags[TAG_PACKING]["total_length"] == sum(lengths) <= 256
        cu = record.payload["cu_seqlens"]
        assert cu.dtype == np.int32 and cu.tolist() == [0, *np.cumsum(lengths).tolist()]
        expected = []
        for i, p in enumerate(samples):
            offset = int(cu[i])  # a sample's images come first, in order, then its text
            for j, n in enumerate(vision(p)):
                expected.append([i, j, offset, n])
                offset += n
        assert record.payload["image_map"].tolist() == expected
        seen += [p["id"] for p in samples]
    assert sorted(seen) == list(range(200))


def test_max_images_per_row_caps_the_images_of_every_row() -> None:
    def images(rows: list[Any]) -> list[int]:
        return [len(r.payload["image_map"]) for r in rows]

    assert max(images(packed(max_length=512))) > 6  # the cap below binds
    capped = packed(max_length=512, max_images_per_row=6)
    assert max(images(capped)) <= 6
    ids = sorted(p["id"] for r in capped for p in r.payload["packed_samples"])
    assert ids == list(range(200))
    # a record with more images than the cap gets a row of its own
    many = [{"id": 0, "input_ids": [1], "image_grid_thw": [(1, 2, 2)] * 5}, ROWS[1]]
    alone = packed(many, max_length=512, max_images_per_row=3)
    assert sorted(len(r.payload["packed_samples"]) for r in alone) == [1, 1]


def test_packing_without_images_keeps_its_envelope() -> None:
    source = Source([Dataset.from_records("c", ROWS[:10])], chunk_size=8)
    (row, *_) = list(Pipeline(source).pack_sequences(4096).options(runner="inline"))
    assert list(row.payload) == ["packed_samples"]


def test_image_settings_are_checked_and_a_missing_grid_field_is_named() -> None:
    with pytest.raises(ConfigError, match="image cannot be split across rows"):
        PackSequencesOp(64, image_grids="image_grid_thw", algorithm="wrap")
    with pytest.raises(ConfigError, match="max_images_per_row needs image_grids="):
        PackSequencesOp(64, max_images_per_row=2)
    with pytest.raises(ConfigError, match="max_images_per_row must be >= 1"):
        PackSequencesOp(64, image_grids="g", max_images_per_row=0)
    rows = [{"input_ids": [1, 2]}]
    with pytest.raises(MissingFieldError, match=r"record \(0, 0, 0\) has no field 'image_grid"):
        packed(rows, max_length=64)


@pytest.mark.timeout(600)
def test_planned_from_headers_packing_passes_check_operator(tmp_path: Path) -> None:
    """Real tar shards: image_tokens counts from headers, tokenize the caption, pack."""
    write_shards(tmp_path / "wds", [21, 20, 19])

    def build() -> Pipeline:
        ds = Dataset.from_path("w", tmp_path / "wds")
        source = Source([ds], chunk_size=4, seed=7, shuffle_within_shard=True)
        return (
            Pipeline(source)
            .image_tokens(min_pixels=28 * 28, max_pixels=28 * 28 * 6)
            .decode_text(fields=["txt"])
            .tokenize("bytes", field="txt")
            .pack_sequences(
                40,
                image_grids="image_grid_thw",
                max_images_per_row=3,
                max_vision_tokens_per_row=2,  # binding: tiny images, 1 vision token each
                num_bins=2,
            )
            .options(canonical_replicas=2, flush_every_k_chunks=2)
        )

    report = check_operator(
        build,
        runners=("inline", "threads", "process"),
        workers=(1, 2, 4),
        stops=range(0, 20),
    )
    assert report.items >= 20  # 20 stops, all inside the run
    rows = list(build())
    assert sum(len(r.payload["packed_samples"]) for r in rows) == 60
    assert all(len(r.payload["image_map"]) <= 3 for r in rows)
    vision = [int(r.payload["image_map"][:, 3].sum()) for r in rows]
    assert max(vision) == 2


def test_text_only_packing_keeps_the_fingerprint_its_checkpoints_were_saved_with() -> None:
    """The image settings are described only once set: a run started before they existed
    still restores, and a run with them set refuses a checkpoint without them."""
    text = PackSequencesOp(256).config()
    assert not {"image_grids", "merge_size", "max_images_per_row"} & set(text)
    with_images = PackSequencesOp(256, image_grids="image_grid_thw", max_images_per_row=4)
    assert dict(with_images.config()) == {
        **text,
        "image_grids": "image_grid_thw",
        "merge_size": 2,
        "max_images_per_row": 4,
    }


IMAGE = 9999


def inline(i: int) -> dict[str, Any]:
    """A record whose tokens hold its images' vision tokens already, among its text (as
    tokenize_chat(image_grids=...) makes them), images sometimes back to back."""
    row = caption(i)
    ids: list[int] = list(range(RNG.randint(0, 5)))
    for n in vision(row):
        ids += [IMAGE] * n + list(range(RNG.choice([0, 0, 3])))
    row["input_ids"] = ids + list(range(RNG.randint(1, 9)))
    return row


def test_vision_tokens_already_in_the_text_count_once_and_map_where_they_are() -> None:
    rows = [inline(i) for i in range(80)]
    out = packed(rows, max_length=256, image_token_id=IMAGE)
    seen = 0
    for record in out:
        samples = record.payload["packed_samples"]
        lengths = [len(p["input_ids"]) for p in samples]
        assert record.meta.tags[TAG_PACKING]["total_length"] == sum(lengths) <= 256
        cu, image_map = record.payload["cu_seqlens"], record.payload["image_map"]
        assert cu.tolist() == np.cumsum([0, *lengths]).tolist()
        for i, sample in enumerate(samples):
            ids = np.asarray(sample["input_ids"])
            lines = image_map[image_map[:, 0] == i]
            assert lines[:, 1].tolist() == list(range(len(vision(sample))))
            assert lines[:, 3].tolist() == vision(sample)
            covered = np.zeros(len(ids), dtype=bool)
            for _, _, offset, tokens in lines:
                covered[offset - cu[i] : offset - cu[i] + tokens] = True
            assert (covered == (ids == IMAGE)).all()
            seen += 1
    assert seen == 80


def test_image_tokens_that_do_not_match_the_grids_are_an_error() -> None:
    row = caption(0)
    row["input_ids"] = [1, 2] + [IMAGE] * (sum(vision(row)) - 1) + [3]
    with pytest.raises(DataError, match=r"has \d+ image tokens \(9999\), not runs of \["):
        packed([row], max_length=256, image_token_id=IMAGE)
    with pytest.raises(ConfigError, match="image_token_id needs image_grids="):
        PackSequencesOp(64, image_token_id=IMAGE)


def test_image_token_id_enters_the_fingerprint_only_once_set() -> None:
    base = PackSequencesOp(256, image_grids="image_grid_thw").config()
    assert "image_token_id" not in base
    inline_op = PackSequencesOp(256, image_grids="image_grid_thw", image_token_id=IMAGE)
    assert dict(inline_op.config()) == {**base, "image_token_id": IMAGE}


def test_max_vision_tokens_per_row_caps_the_vision_tokens_of_every_row() -> None:
    def row_vision(record: Any) -> int:
        return int(record.payload["image_map"][:, 3].sum())

    uncapped = packed(max_length=256)
    assert max(row_vision(r) for r in uncapped) > 60
    out = packed(max_length=256, max_vision_tokens_per_row=60)
    assert sum(len(r.payload["packed_samples"]) for r in out) == len(ROWS)
    for record in out:
        samples = record.payload["packed_samples"]
        assert row_vision(record) <= 60 or len(samples) == 1  # a record over the cap: alone
    assert any(sum(vision(p)) > 60 for p in ROWS)  # such records exist
    with pytest.raises(ConfigError, match="max_vision_tokens_per_row needs image_grids="):
        PackSequencesOp(64, max_vision_tokens_per_row=8)
    with pytest.raises(ConfigError, match="max_vision_tokens_per_row must be >= 1"):
        PackSequencesOp(64, image_grids="g", max_vision_tokens_per_row=0)
    base = PackSequencesOp(256, image_grids="image_grid_thw").config()
    capped = PackSequencesOp(256, image_grids="image_grid_thw", max_vision_tokens_per_row=60)
    assert dict(capped.config()) == {**base, "max_vision_tokens_per_row": 60}


def test_pack_flat_refuses_records_with_images_and_names_pack_sequences() -> None:
    source = Source([Dataset.from_records("c", ROWS)], chunk_size=4)
    pipe = Pipeline(source).pack_flat(64, pad_token_id=0).options(runner="inline")
    with pytest.raises(
        ConfigError,
        match=r"holds images or videos \(field 'image_grid_thw'\).*"
        r"pack_sequences\(image_grids=\.\.\.\)",
    ):
        list(pipe)
    text = [{**row, "image_grid_thw": []} for row in ROWS]  # no image: packs as text
    pipe = Pipeline(Source([Dataset.from_records("t", text)], chunk_size=4))
    rows = list(pipe.pack_flat(64, pad_token_id=0).options(runner="inline"))
    assert sum(int((r.payload["document_ids"] >= 0).sum()) for r in rows) == sum(
        len(row["input_ids"]) for row in ROWS
    )

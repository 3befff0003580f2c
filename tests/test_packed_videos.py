"""to_training over packed rows whose samples hold videos: video tokens after the images,
``pixel_values_videos`` and ``video_grid_thw``, mRoPE positions with the temporal index, and a
tiny Qwen2-VL whose loss on the packed rows is its loss on the samples one by one.

The reference per sample is built as the image tests build theirs: transformers' video
processor needs torchvision (not installed here), so the pixels come from zephon's
``to_training`` on the sample alone (their layout is checked against the image processor in
test_pixel_values) and the positions from the model's own rope index."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests._media import encoded, picture, video
from tests._qwen2_vl import IMAGE_TOKEN, VOCAB, tiny_qwen2_vl
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError
from zephon.types import SampleBatch

VIDEO_TOKEN = VOCAB - 1  # the tiny model's video placeholder
MARKERS = (VOCAB - 2, VOCAB - 3)


def clips(n: int) -> list[dict[str, Any]]:
    """Each sample: a caption, a JPEG and a 4- or 6-frame MP4; every third also a PNG."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        row: dict[str, Any] = {"text": "a clip " * (1 + i % 3) + str(i)}
        row["jpg"] = encoded(picture(i, (40 + 17 * i, 60)))
        if i % 3 == 1:
            row["png"] = encoded(picture(i + 5, (70, 30 + 9 * i)), "PNG")
        row["mp4"] = video(4 + 2 * (i % 2), seed=i, size=(48 + 8 * i, 40))
        out.append(row)
    return out


def packed(n: int = 6, rows: int = 3, length: int = 200, **packing: Any) -> list[SampleBatch]:
    source = StaticMixtureWorkSource([Dataset.from_records("v", clips(n))], chunk_size=4)
    pipe = (
        Pipeline(source)
        .decode_image(fields=["jpg", "png"], min_pixels=28 * 28, max_pixels=28 * 28 * 4)
        .decode_video(fields=["mp4"], fps=10, min_pixels=28 * 28, max_pixels=28 * 28 * 4)
        .tokenize("bytes")
        .pack_sequences(
            length, image_grids="image_grid_thw", video_grids="video_grid_thw", **packing
        )
        .batch(rows, drop_last=False)
        .options(runner="inline")
    )
    return list(pipe)


def inputs(batch: SampleBatch, **options: Any) -> dict[str, Any]:
    return batch.to_training(
        image_fields=["jpg", "png"],
        video_fields=["mp4"],
        image_token_id=IMAGE_TOKEN,
        video_token_id=VIDEO_TOKEN,
        pad_token_id=0,
        **options,
    )


def tokens(grids: Any) -> list[int]:
    return [int(t * h * w) // 4 for t, h, w in grids]


def test_each_sample_is_its_images_then_its_videos_then_its_text() -> None:
    seen = 0
    for batch in packed():
        out = inputs(batch, convention="hf")
        ids, types = out["input_ids"], out["mm_token_type_ids"]
        for b, record in enumerate(batch.records):
            cu = record.payload["cu_seqlens"]
            for i, sample in enumerate(record.payload["packed_samples"]):
                images, videos = tokens(sample["image_grid_thw"]), tokens(sample["video_grid_thw"])
                kinds = [1] * sum(images) + [2] * sum(videos) + [0] * len(sample["input_ids"])
                assert types[b, cu[i] : cu[i + 1]].tolist() == kinds
                expected = [IMAGE_TOKEN] * sum(images) + [VIDEO_TOKEN] * sum(videos)
                assert ids[b, cu[i] : cu[i + 1]].tolist() == expected + list(sample["input_ids"])
                assert (out["labels"][b, cu[i] : cu[i] + len(expected)] == -100).all()
                seen += 1
        samples = [s for r in batch.records for s in r.payload["packed_samples"]]
        grids = [list(g) for s in samples for g in s["video_grid_thw"]]
        assert out["video_grid_thw"].tolist() == grids
        assert len(out["pixel_values_videos"]) == 4 * (ids == VIDEO_TOKEN).sum()
        assert len(out["pixel_values"]) == 4 * (ids == IMAGE_TOKEN).sum()
    assert seen == 6


def test_video_positions_are_the_models_rope_index_per_sample() -> None:
    """The temporal index runs over the video's frames while height and width span its grid;
    the text after it resumes where transformers' Qwen2-VL resumes it."""
    model = tiny_qwen2_vl()
    longer = 0
    for batch in packed(image_markers=MARKERS):
        out = inputs(batch, convention="hf", return_tensors="pt")
        for b, record in enumerate(batch.records):
            cu = record.payload["cu_seqlens"]
            for i, sample in enumerate(record.payload["packed_samples"]):
                ids = out["input_ids"][b : b + 1, cu[i] : cu[i + 1]]
                expected, _ = model.model.get_rope_index(
                    ids,
                    mm_token_type_ids=out["mm_token_type_ids"][b : b + 1, cu[i] : cu[i + 1]],
                    image_grid_thw=torch.tensor(np.asarray(sample["image_grid_thw"])),
                    video_grid_thw=torch.tensor(np.asarray(sample["video_grid_thw"])),
                )
                got = out["position_ids"][1:, b, cu[i] : cu[i + 1]]
                assert got.tolist() == expected[:, 0].tolist()
                longer += sum(t > max(h, w) // 2 for t, h, w in sample["video_grid_thw"])
    assert longer > 0  # a clip with more temporal patches than merged rows or columns


def marked(images: list[int], videos: list[int]) -> tuple[list[int], list[int]]:
    """A sample's vision tokens and their token types, each image and video between the
    vision start and end markers (so the model's rope index sees every one apart)."""
    ids: list[int] = []
    types: list[int] = []
    for token, kind, counts in ((IMAGE_TOKEN, 1, images), (VIDEO_TOKEN, 2, videos)):
        for n in counts:
            ids += [MARKERS[0], *[token] * n, MARKERS[1]]
            types += [0, *[kind] * n, 0]
    return ids, types


def test_packed_loss_equals_the_loss_of_each_sample_alone() -> None:
    model = tiny_qwen2_vl()
    (batch,) = packed(6, rows=4, length=90, image_markers=MARKERS)
    assert len(batch.records) > 1
    out = inputs(batch, convention="hf", return_tensors="pt")
    assert 3 in out["video_grid_thw"][:, 0].tolist()
    with torch.no_grad():
        packed_loss = model(**out).loss.item()
    packed_sum = packed_loss * int((out["labels"][:, 1:] != -100).sum())
    alone_sum, count = 0.0, 0
    for b, record in enumerate(batch.records):
        cu = record.payload["cu_seqlens"]
        for i, sample in enumerate(record.payload["packed_samples"]):
            one = SampleBatch([type(record)(record.meta, sample)]).to_training(
                image_fields=["jpg", "png"], video_fields=["mp4"], return_tensors="pt"
            )
            vision, kinds = marked(tokens(one["image_grid_thw"]), tokens(one["video_grid_thw"]))
            ids = torch.cat([torch.tensor([vision]), one["input_ids"]], 1)
            assert ids[0].tolist() == out["input_ids"][b, cu[i] : cu[i + 1]].tolist()
            types = torch.zeros_like(ids)
            types[0, : len(kinds)] = torch.tensor(kinds)
            labels = ids.clone()
            labels[0, : len(vision)] = -100
            with torch.no_grad():  # the model's own rope index, from the token types
                result = model(
                    input_ids=ids,
                    labels=labels,
                    pixel_values=one["pixel_values"],
                    image_grid_thw=one["image_grid_thw"],
                    pixel_values_videos=one["pixel_values_videos"],
                    video_grid_thw=one["video_grid_thw"],
                    mm_token_type_ids=types.int(),
                )
            n = int((labels[:, 1:] != -100).sum())
            alone_sum += result.loss.item() * n
            count += n
    assert count == int((out["labels"][:, 1:] != -100).sum())
    assert packed_sum == pytest.approx(alone_sum, rel=1e-6)  # the loss is float32


def test_rows_with_videos_need_the_video_token() -> None:
    batch = packed()[0]
    with pytest.raises(ConfigError, match=r"has videos; pass video_token_id=\.\.\."):
        batch.to_training(image_fields=["jpg"], image_token_id=IMAGE_TOKEN, pad_token_id=0)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"image_grids": None}, "video_grids needs image_grids="),
        ({"image_token_id": IMAGE_TOKEN}, "with image_token_id, video_grids needs video_token_id"),
        ({"video_token_id": VIDEO_TOKEN}, "with image_token_id, video_grids needs video_token_id"),
        ({"video_grids": None, "video_token_id": VIDEO_TOKEN}, "video_token_id needs video_grids="),
    ],
)
def test_video_settings_are_checked(bad: dict[str, Any], message: str) -> None:
    source = StaticMixtureWorkSource([Dataset.from_records("v", clips(1))], chunk_size=4)
    with pytest.raises(ConfigError, match=message):
        Pipeline(source).pack_sequences(
            100, **{"image_grids": "image_grid_thw", "video_grids": "video_grid_thw", **bad}
        )


def test_samples_with_only_a_video_pack_without_image_grids() -> None:
    rows = [{"text": f"clip {i}", "mp4": video(4, seed=i)} for i in range(3)]
    source = StaticMixtureWorkSource([Dataset.from_records("v", rows)], chunk_size=4)
    pipe = (
        Pipeline(source)
        .decode_video(fields=["mp4"], min_pixels=28 * 28, max_pixels=28 * 28 * 4)
        .tokenize("bytes")
        .pack_sequences(100, image_grids="image_grid_thw", video_grids="video_grid_thw")
        .batch(4, drop_last=False)
        .options(runner="inline")
    )
    (batch,) = list(pipe)
    out = batch.to_training(
        video_fields=["mp4"], image_token_id=IMAGE_TOKEN, video_token_id=VIDEO_TOKEN, pad_token_id=0
    )
    grids = [
        list(g)
        for r in batch.records
        for s in r.payload["packed_samples"]
        for g in s["video_grid_thw"]
    ]
    assert out["video_grid_thw"].tolist() == grids and len(grids) == 3
    videos = int((out["input_ids"] == VIDEO_TOKEN).sum())
    assert videos == sum(tokens(grids)) == int((out["mm_token_type_ids"] == 2).sum())
    assert (out["mm_token_type_ids"] != 1).all() and "pixel_values" not in out

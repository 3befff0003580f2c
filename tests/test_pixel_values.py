"""to_training(image_fields=...): pixel_values and image_grid_thw as Qwen2-VL's processor makes
them, from records decoded by decode_image."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from tests._media import encoded, picture, video
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import DataError
from zephon.types import SampleBatch, SampleMeta, SampleRecord

FIELDS = ["jpg", "png"]


def rows() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(6):
        jpeg = encoded(picture(i, (60 + 20 * i, 90)))
        row: dict[str, Any] = {"text": f"caption {i}", "jpg": jpeg}
        if i % 2:
            row["png"] = encoded(picture(i + 7, (120, 40 + 9 * i)), "PNG")
        out.append(row)
    return out


def batches(**decode: Any) -> list[SampleBatch]:
    source = StaticMixtureWorkSource([Dataset.from_records("c", rows())], chunk_size=4)
    pipe = (
        Pipeline(source)
        .decode_image(fields=FIELDS, min_pixels=28 * 28, max_pixels=28 * 28 * 20, **decode)
        .tokenize("bytes")
        .batch(3)
        .options(runner="inline")
    )
    return list(pipe)


@pytest.mark.parametrize("convention", ["shifted", "hf"])
def test_pixel_values_equal_the_qwen2_vl_processor(convention: str) -> None:
    processor = Qwen2VLImageProcessorPil()
    found = 0
    for batch in batches():
        out = batch.to_training(image_fields=FIELDS, convention=convention)
        images = [r.payload[f] for r in batch.records for f in FIELDS if f in r.payload]
        expected = processor(images=images, do_resize=False, return_tensors="np")
        assert out["pixel_values"].dtype == np.float32
        assert out["pixel_values"].shape == expected["pixel_values"].shape
        np.testing.assert_allclose(out["pixel_values"], expected["pixel_values"], atol=1e-5)
        assert out["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
        grids = [g for r in batch.records for g in r.payload["image_grid_thw"]]
        assert out["image_grid_thw"].tolist() == [list(g) for g in grids]
        found += len(images)
    assert found == 9


def test_torch_tensors_and_a_batch_without_images() -> None:
    batch = batches()[0]
    out = batch.to_training(image_fields=FIELDS, return_tensors="pt")
    assert out["pixel_values"].dtype == torch.float32 and out["pixel_values"].shape[1] == 1176
    assert out["image_grid_thw"].dtype == torch.int64
    none = batch.to_training(image_fields=["webp"])
    assert none["pixel_values"].shape == (0, 1176) and none["image_grid_thw"].shape == (0, 3)
    assert "pixel_values" not in batch.to_training()


def test_undecoded_or_unresized_images_are_named() -> None:
    record = batches()[0].records[0]
    meta: SampleMeta = record.meta
    encoded_row = SampleRecord(meta, {**record.payload, "jpg": b"\xff\xd8"})
    with pytest.raises(DataError, match=r"field 'jpg' of row 0 is bytes, not decoded pixels"):
        SampleBatch([encoded_row]).to_training(image_fields=FIELDS)
    odd = SampleRecord(meta, {**record.payload, "jpg": np.zeros((30, 56, 3), np.uint8)})
    with pytest.raises(DataError, match=r"56x30 pixels, not whole 28-pixel blocks"):
        SampleBatch([odd]).to_training(image_fields=FIELDS)


def decoded_videos() -> SampleBatch:
    """Three decoded MP4s (4 and 6 frames at 10 fps, sampled at 10 fps: t = 2 and 3)."""
    videos = [{"text": f"clip {i}", "mp4": video(4 + 2 * (i % 2), seed=i)} for i in range(3)]
    source = StaticMixtureWorkSource([Dataset.from_records("v", videos)], chunk_size=4)
    pipe = (
        Pipeline(source)
        .decode_video(fields=["mp4"], fps=10, min_pixels=28 * 28, max_pixels=28 * 28 * 4)
        .tokenize("bytes")
        .batch(3)
        .options(runner="inline")
    )
    (batch,) = list(pipe)
    return batch


def test_video_pixels_are_patches_of_two_consecutive_frames() -> None:
    """The spatial and channel layout is the image processor's (a frame twice is that image);
    the temporal halves of a patch are frames 2t and 2t + 1."""
    batch = decoded_videos()
    out = batch.to_training(video_fields=["mp4"], convention="hf")
    assert "pixel_values" not in out
    grids = [g for r in batch.records for g in r.payload["video_grid_thw"]]
    assert out["video_grid_thw"].tolist() == [list(g) for g in grids]
    assert sorted({g[0] for g in grids}) == [2, 3]
    processor = Qwen2VLImageProcessorPil()
    at = 0
    for record in batch.records:
        frames = record.payload["mp4"]
        for t in range(len(frames) // 2):
            pair = [
                processor(images=[f], do_resize=False, return_tensors="np")
                for f in frames[2 * t : 2 * t + 2]
            ]
            n = len(pair[0]["pixel_values"])
            got = out["pixel_values_videos"][at : at + n].reshape(n, 3, 2, 14 * 14)
            for half in (0, 1):
                want = pair[half]["pixel_values"].reshape(n, 3, 2, 14 * 14)[:, :, half]
                np.testing.assert_allclose(got[:, :, half], want, atol=1e-5)
            assert not np.allclose(got[:, :, 0], got[:, :, 1])  # the frames differ
            at += n
    assert at == len(out["pixel_values_videos"]) == int(out["video_grid_thw"].prod(axis=1).sum())


def test_frames_that_are_not_whole_temporal_patches_are_named() -> None:
    record = decoded_videos().records[0]
    odd = SampleRecord(record.meta, {**record.payload, "mp4": record.payload["mp4"][:3]})
    with pytest.raises(DataError, match=r"field 'mp4' of row 0 is \(3, .*frames a multiple of 2"):
        SampleBatch([odd]).to_training(video_fields=["mp4"])
    with pytest.raises(DataError, match=r"not decoded pixels; run decode_video"):
        SampleBatch([SampleRecord(record.meta, {**record.payload, "mp4": b"x"})]).to_training(
            video_fields=["mp4"]
        )

"""decode_video on real videos (MP4s encoded here with PyAV): frames sampled at fps, resized
to patch multiples, grids and token counts as the Qwen2-VL video processor computes them,
corrupt videos under on_error, YAML, and every runner, worker count, stop and rank count."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from tests._media import video
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.config import load_config
from zephon.errors import ConfigError, DataFormatError
from zephon.testing import check_operator

SMALL = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 12}


def decode(rows: list[dict[str, Any]], **kwargs: Any) -> list[dict[str, Any]]:
    source = StaticMixtureWorkSource([Dataset.from_records("v", rows)], chunk_size=4)
    pipe = Pipeline(source).decode_video(**kwargs).options(runner="inline")
    return [r.payload for r in pipe]


def every_frame(data: bytes) -> list[Image.Image]:
    """Every frame of a video, decoded with PyAV directly."""
    with av.open(io.BytesIO(data)) as container:
        return [frame.to_image() for frame in container.decode(video=0)]


@pytest.mark.parametrize(("frames", "rate", "fps", "kept"), [
    (40, 10, 2.0, [0, 5, 10, 15, 20, 25, 30, 35]),  # 4 s at 2 frames a second
    (40, 10, 0.5, [0, 10, 20, 30]),  # 2 frames in 4 s, raised to min_frames
    (7, 10, 2.0, [0, 1, 3, 5]),  # 0.7 s: min_frames of the 7
    (3, 10, 2.0, [0, 1]),  # fewer than min_frames: a whole temporal patch of them
])  # fmt: skip
def test_frames_are_sampled_at_fps_and_resized(
    frames: int, rate: int, fps: float, kept: list[int]
) -> None:
    data = video(frames, rate=rate)
    (out,) = decode([{"mp4": data}], fps=fps, **SMALL)
    h, w = smart_resize(48, 64, factor=28, **SMALL)
    every = every_frame(data)
    expected = [np.asarray(every[i].resize((w, h), Image.Resampling.BICUBIC)) for i in kept]
    assert out["mp4"].dtype == np.uint8 and out["mp4"].shape == (len(kept), h, w, 3)
    assert np.array_equal(out["mp4"], np.stack(expected))
    assert out["video_grid_thw"] == [(len(kept) // 2, h // 14, w // 14)]
    assert out["video_tokens"] == len(kept) // 2 * (h // 14) * (w // 14) // 4


@pytest.mark.parametrize(("container_format", "codec"), [("matroska", "mpeg4"), ("webm", "libvpx")])
def test_containers_without_a_frame_count_are_counted(container_format: str, codec: str) -> None:
    """Matroska and WebM headers give no frame count: the packets are counted instead."""
    data = video(23, container_format=container_format, codec=codec)
    with av.open(io.BytesIO(data)) as container:
        assert container.streams.video[0].frames == 0
    (out,) = decode([{"mkv": data}], **SMALL)
    h, w = smart_resize(48, 64, factor=28, **SMALL)
    every = every_frame(data)
    kept = [0, 5, 11, 17]  # 2.3 s at 2 frames a second: 4 of 23 frames
    expected = [np.asarray(every[i].resize((w, h), Image.Resampling.BICUBIC)) for i in kept]
    assert np.array_equal(out["mkv"], np.stack(expected))


def test_a_one_frame_video_repeats_its_frame_to_a_temporal_patch() -> None:
    (out,) = decode([{"mp4": video(1)}], resize=False)
    assert out["mp4"].shape == (2, 48, 64, 3) and np.array_equal(out["mp4"][0], out["mp4"][1])
    h, w = smart_resize(48, 64, factor=28, min_pixels=128 * 28 * 28, max_pixels=768 * 28 * 28)
    assert out["video_grid_thw"] == [(1, h // 14, w // 14)]  # the processor's size, unresized


def test_every_video_field_counts_and_max_frames_caps() -> None:
    (out,) = decode([{"mp4": video(30), "video": video(12, seed=5)}], max_frames=4, **SMALL)
    assert [len(out["mp4"]), len(out["video"])] == [4, 4]
    assert out["video_tokens"] == sum(t * h * w // 4 for t, h, w in out["video_grid_thw"])


def test_settings_are_checked() -> None:
    for bad in ({"fps": 0}, {"min_frames": 0}, {"min_frames": 8, "max_frames": 4}):
        with pytest.raises(ConfigError, match="decode_video"):
            Pipeline(StaticMixtureWorkSource([Dataset.from_records("v", [{}])])).decode_video(**bad)


def corrupt(tmp_path: Path) -> list[dict[str, Any]]:
    good = video(6)
    return [
        {"__key__": "clip-0", "mp4": good},
        {"__key__": "clip-1", "mp4": good[: len(good) // 2]},  # truncated
        {"__key__": "clip-2", "mp4": b"not a video"},
        {"__key__": "clip-3", "mp4": good},
    ]


def test_a_corrupt_video_raises_naming_the_record(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError) as info:
        decode(corrupt(tmp_path), **SMALL)
    message = str(info.value)
    assert "\n" not in message and "decode_video: record (0, 0, 1) (key 'clip-1')" in message
    assert "field 'mp4' is not a readable video" in message
    assert "decode_video(on_error='skip')" in message


def test_corrupt_videos_are_skipped_and_quarantined(tmp_path: Path) -> None:
    source = StaticMixtureWorkSource([Dataset.from_records("v", corrupt(tmp_path))])
    quarantine = tmp_path / "skipped.jsonl"
    pipe = Pipeline(source).decode_video(**SMALL)
    pipe.options(on_error="skip", quarantine=quarantine)
    assert [r.payload["__key__"] for r in pipe] == ["clip-0", "clip-3"]
    entries = [json.loads(line) for line in quarantine.read_text().splitlines()]
    assert [e["key"] for e in entries] == ["clip-1", "clip-2"]
    assert all("decode_video" in e["reason"] and e["field"] == "mp4" for e in entries)


def test_yaml_configures_decode_video(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "clips").mkdir()
    clips = [video(10 + 5 * i, seed=i) for i in range(3)]
    pq.write_table(pa.table({"mp4": clips}), tmp_path / "clips" / "c.parquet")
    (tmp_path / "p.yaml").write_text(
        f"datasets: [{{name: c, path: '{tmp_path / 'clips'}'}}]\n"
        "operators: [{op: decode_video, fps: 4, max_pixels: 9408, min_pixels: 3136}]\n"
    )
    rows = list(load_config(tmp_path / "p.yaml").build())
    assert [len(r.payload["mp4"]) for r in rows] == [4, 6, 8]  # 1, 1.5, 2 s at 4 a second


@pytest.mark.timeout(300)
def test_runners_workers_stops_and_ranks_agree() -> None:
    rows = [{"__key__": f"c{i}", "mp4": video(4 + i % 5, seed=i)} for i in range(16)]

    def build() -> Pipeline:
        source = StaticMixtureWorkSource(
            [Dataset.from_records("v", rows, shard_size=5)], chunk_size=2, seed=1
        )
        return Pipeline(source).decode_video(**SMALL).options(canonical_replicas=2)

    report = check_operator(build, runners=("inline", "threads", "process"), workers=(1, 3))
    assert report.items == 16 and "elastic resume 2 -> 1 and 2 -> 4 ranks" in report.passed


def test_packing_counts_video_tokens_from_the_video_grids() -> None:
    rows = [{"mp4": video(6 + 7 * i, seed=i), "text": "clip " * (i + 1)} for i in range(6)]
    source = StaticMixtureWorkSource([Dataset.from_records("v", rows)], chunk_size=3)
    pipe = (
        Pipeline(source)
        .decode_video(**SMALL)
        .tokenize("bytes")
        .pack_sequences(160, image_grids="video_grid_thw")
        .options(runner="inline")
    )
    rows_out = list(pipe)
    assert sum(len(row.payload["packed_samples"]) for row in rows_out) == 6
    for row in rows_out:
        cu, image_map = row.payload["cu_seqlens"], row.payload["image_map"]
        for i, sample in enumerate(row.payload["packed_samples"]):
            assert cu[i + 1] - cu[i] == len(sample["input_ids"]) + sample["video_tokens"]
            assert image_map[image_map[:, 0] == i, 3].sum() == sample["video_tokens"]

"""decode_image on real images (Pillow-made JPEG, PNG, WebP) and real WebDataset shards:
pixels, EXIF orientation, patch-multiple resizing, token counts, corrupt images, runners."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageOps
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
    smart_resize as qwen_smart_resize,
)

from tests._media import encoded, picture, samples, write_shards
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.config import load_config
from zephon.errors import ConfigError, DataFormatError, MissingFieldError
from zephon.testing import check_operator


def decode(records: list[dict[str, Any]], **kwargs: Any) -> list[dict[str, Any]]:
    source = StaticMixtureWorkSource([Dataset.from_records("m", records)], chunk_size=4)
    pipe = Pipeline(source).decode_image(**kwargs).options(runner="inline")
    return [r.payload for r in pipe]


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "JPEG"])
def test_pixels_are_the_decoded_rgb_image(fmt: str) -> None:
    data = encoded(picture(3, (40, 30)), fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    (out,) = decode([{"image": data}], resize=False)
    pixels = out["image"]
    assert pixels.dtype == np.uint8 and pixels.shape == (30, 40, 3)
    assert np.array_equal(pixels, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    if fmt != "JPEG":  # lossless: the very pixels that were saved
        assert np.array_equal(pixels, np.asarray(picture(3, (40, 30))))


def test_exif_orientation_is_applied() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: rotate 90 degrees clockwise to display
    data = encoded(picture(1, (40, 30)), "JPEG", exif=exif.tobytes(), quality=95)
    (out,) = decode([{"jpg": data}], resize=False)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    assert out["jpg"].shape == (40, 30, 3)
    assert np.array_equal(out["jpg"], np.asarray(upright.convert("RGB")))


def test_transparency_is_composited_over_white_and_gray_becomes_rgb() -> None:
    rgba = Image.new("RGBA", (4, 2), (10, 20, 30, 255))
    rgba.putpixel((0, 0), (10, 20, 30, 0))
    gray = Image.new("L", (4, 2), 77)
    out = decode([{"png": encoded(rgba, "PNG")}, {"png": encoded(gray, "PNG")}], resize=False)
    assert out[0]["png"][0, 0].tolist() == [255, 255, 255]
    assert out[0]["png"][1, 3].tolist() == [10, 20, 30]
    assert out[1]["png"].shape == (2, 4, 3) and np.all(out[1]["png"] == 77)


def test_resize_to_patch_multiples_with_grid_and_tokens() -> None:
    data = encoded(picture(2, (500, 300)), "PNG")
    (out,) = decode([{"png": data}])
    h, w = qwen_smart_resize(300, 500, 28, 56 * 56, 14 * 14 * 4 * 1280)
    assert out["png"].shape == (h, w, 3)
    assert out["image_grid_thw"] == [(1, h // 14, w // 14)]
    assert out["vision_tokens"] == (h // 14) * (w // 14) // 4
    # max_pixels and max_patches shrink it; resize=False keeps the pixels, counts the same
    (small,) = decode([{"png": data}], max_patches=100)
    _, gh, gw = small["image_grid_thw"][0]
    assert gh * gw <= 100 and small["png"].shape[:2] == (gh * 14, gw * 14)
    (kept,) = decode([{"png": data}], resize=False, max_pixels=28 * 28 * 40)
    assert kept["png"].shape == (300, 500, 3)
    hh, ww = qwen_smart_resize(300, 500, 28, 56 * 56, 28 * 28 * 40)
    assert kept["vision_tokens"] == (hh // 28) * (ww // 28)


def test_every_image_field_of_a_record_is_decoded_and_counted() -> None:
    record = {"jpg": encoded(picture(0, (56, 56))), "png": encoded(picture(1, (112, 56)), "PNG")}
    (out,) = decode([record], fields=["png", "jpg"], min_pixels=1)
    assert out["image_grid_thw"] == [(1, 4, 8), (1, 4, 4)]  # in the order of fields
    assert out["vision_tokens"] == 8 + 4


def test_a_record_without_an_image_field_is_named() -> None:
    with pytest.raises(MissingFieldError, match=r"record \(0, 0, 0\) has none of the fields"):
        decode([{"txt": b"no picture"}])
    with pytest.raises(ConfigError, match="on_error must be 'raise' or 'skip'"):
        decode([{"jpg": b""}], on_error="ignore")


def corrupt_shards(folder: Path) -> None:
    """Two shards; the sample with key part/00004 holds a JPEG cut in half."""
    import webdataset

    folder.mkdir(parents=True)
    rows = samples(8)
    rows[4] = {"__key__": "part/00004", "jpg": encoded(picture(4, (64, 48)))[:300], "txt": "x"}
    for s, part in enumerate((rows[:5], rows[5:])):
        with webdataset.TarWriter(str(folder / f"shard-{s}.tar")) as sink:
            for sample in part:
                sink.write(sample)


def test_a_corrupt_image_raises_naming_the_record(tmp_path: Path) -> None:
    corrupt_shards(tmp_path / "wds")
    source = StaticMixtureWorkSource([Dataset.from_path("w", tmp_path / "wds")], chunk_size=4)
    with pytest.raises(DataFormatError) as info:
        list(Pipeline(source).decode_image().options(runner="threads"))
    message = str(info.value)
    assert "\n" not in message
    assert "record (0, 0, 4) (key 'part/00004')" in message and "field 'jpg'" in message
    assert "on_error='skip'" in message


@pytest.mark.parametrize("where", ["run", "operator"])
def test_a_corrupt_image_is_skipped_and_quarantined(tmp_path: Path, where: str) -> None:
    corrupt_shards(tmp_path / "wds")
    source = StaticMixtureWorkSource([Dataset.from_path("w", tmp_path / "wds")], chunk_size=4)
    quarantine = tmp_path / "skipped.jsonl"
    if where == "run":
        pipe = Pipeline(source).decode_image().options(on_error="skip", quarantine=quarantine)
    else:
        pipe = Pipeline(source).decode_image(on_error="skip").options(quarantine=quarantine)
    keys = sorted(r.payload["__key__"] for r in pipe)
    assert keys == [f"part/{i:05d}" for i in range(8) if i != 4]
    assert pipe.last_stats is not None and pipe.last_stats.skipped == 1
    (entry,) = [json.loads(line) for line in quarantine.read_text().splitlines()]
    assert entry["sample_id"] == [0, 0, 4] and entry["key"] == "part/00004"
    assert entry["field"] == "jpg" and "not a readable image" in entry["reason"]


def test_yaml_configures_decode_image(tmp_path: Path) -> None:
    write_shards(tmp_path / "wds", [4, 4])
    (tmp_path / "p.yaml").write_text(
        f"datasets: [{{name: w, path: '{tmp_path / 'wds'}'}}]\n"
        "operators: [{op: decode_image, max_patches: 64, min_pixels: 784}]\n"
    )
    rows = list(load_config(tmp_path / "p.yaml").build())
    assert len(rows) == 8
    for r in rows:
        _, h, w = r.payload["image_grid_thw"][0]
        image = next(v for k, v in r.payload.items() if k in ("jpg", "png", "webp"))
        assert h * w <= 64 and image.shape == (h * 14, w * 14, 3)


@pytest.mark.timeout(300)
def test_runners_workers_stops_and_ranks_agree_over_tar_shards(tmp_path: Path) -> None:
    write_shards(tmp_path / "wds", [13, 11, 12])

    def build() -> Pipeline:
        ds = Dataset.from_path("w", tmp_path / "wds")
        source = StaticMixtureWorkSource([ds], chunk_size=4, seed=7, shuffle_within_shard=True)
        pipe = Pipeline(source).decode_image(min_pixels=28 * 28, max_pixels=28 * 28 * 6)
        return pipe.options(canonical_replicas=2)

    report = check_operator(build, runners=("inline", "threads", "process"), workers=(1, 2, 4))
    assert report.items == 36 and len(report.passed) >= 10


def _in_shared_memory(array: np.ndarray) -> bool:
    """Whether ``array``'s memory is a mapping of one of the run's shared-memory segments."""
    from zephon._engine.handoff import shm

    return any(array.base is segment for segment in shm._MAPS.values())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine_process", [False, True])
def test_process_workers_hand_decoded_images_over_in_shared_memory(engine_process: bool) -> None:
    """Pixels decoded in worker processes reach the consumer as uint8 views on shared memory
    (no pickled copy), through packing and batching, equal to the inline run's."""
    rows = [{"jpg": encoded(picture(i, (200 + 3 * i, 180))), "txt": "seen"} for i in range(12)]
    source = StaticMixtureWorkSource([Dataset.from_records("r", rows, shard_size=6)], chunk_size=4)

    def run(**options: Any) -> list[np.ndarray]:
        pipe = (
            Pipeline(source)
            .decode_image(max_pixels=28 * 28 * 64)
            .tokenize("bytes", field="txt")
            .pack_sequences(2048, image_grids="image_grid_thw")
            .batch(1, drop_last=False)
            .options(**options)
        )
        batches = list(pipe)
        return [s["jpg"] for b in batches for r in b.records for s in r.payload["packed_samples"]]

    expected = run(runner="inline")
    got = run(runner="process", engine_process=engine_process)
    assert len(got) == 12 and all(a.nbytes >= 64 * 1024 for a in got)  # over shm_min_bytes
    assert all(a.dtype == np.uint8 and _in_shared_memory(a) for a in got)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    pickled = run(runner="process", engine_process=engine_process, shm_min_bytes=None)
    assert not any(_in_shared_memory(a) for a in pickled)

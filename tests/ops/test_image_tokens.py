"""image_tokens on real encoded images: the grids and counts decode_image gives, from headers."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests._media import FORMATS, encoded, picture, write_shards
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.config import load_config
from zephon.errors import DataFormatError

SIZES = [(40, 30), (500, 300), (3000, 20), (29, 2900), (1000, 1000), (57, 83)]


def run(records: list[dict[str, Any]], op: str, **kwargs: Any) -> list[dict[str, Any]]:
    source = StaticMixtureWorkSource([Dataset.from_records("m", records)], chunk_size=4)
    pipe = getattr(Pipeline(source), op)(**kwargs).options(runner="inline")
    return [r.payload for r in pipe]


@pytest.mark.parametrize("bounds", [{}, {"max_pixels": 28 * 28 * 64}, {"max_patches": 100}])
def test_grids_and_counts_equal_decode_image(bounds: dict[str, int]) -> None:
    records = [
        {"image": encoded(picture(i, size), FORMATS[i % 3]), "n": i} for i, size in enumerate(SIZES)
    ]
    exif = Image.Exif()
    exif[0x0112] = 6  # sideways: the decoded image is 30 wide, 40 high
    records.append({"jpg": encoded(picture(9, (40, 30)), "JPEG", exif=exif.tobytes())})
    records.append({"png": encoded(picture(1, (112, 56)), "PNG"), "jpg": records[0]["image"]})
    counted = run(records, "image_tokens", **bounds)
    decoded = run(records, "decode_image", **bounds)
    for before, after, original in zip(counted, decoded, records, strict=True):
        assert before["image_grid_thw"] == after["image_grid_thw"]
        assert before["vision_tokens"] == after["vision_tokens"] > 0
        assert all(before[k] is original[k] for k in original)  # the bytes are left as stored
    assert counted[-2]["image_grid_thw"] == [(1, 6, 4)]  # stored 40x30, shown 30 wide


def test_the_image_is_not_decoded() -> None:
    """A JPEG whose data is cut after its header still has a size, so a count."""
    data = encoded(picture(0, (640, 480)), "JPEG")
    header_only = data[: len(data) // 3]
    with pytest.raises(OSError):
        Image.open(io.BytesIO(header_only)).load()
    (out,) = run([{"jpg": header_only}], "image_tokens")
    assert out["image_grid_thw"] == [(1, 34, 46)] and out["vision_tokens"] == 17 * 23


def test_bytes_that_are_no_image_raise_naming_the_record() -> None:
    with pytest.raises(DataFormatError, match=r"record \(0, 0, 1\).*field 'jpg'"):
        run([{"jpg": encoded(picture(0))}, {"jpg": b"not an image"}], "image_tokens")


def test_yaml_and_tar_shards(tmp_path: Path) -> None:
    write_shards(tmp_path / "wds", [5, 4])
    (tmp_path / "p.yaml").write_text(
        f"datasets: [{{name: w, path: '{tmp_path / 'wds'}'}}]\n"
        "operators: [{op: image_tokens, min_pixels: 784}]\n"
    )
    rows = list(load_config(tmp_path / "p.yaml").build())
    assert len(rows) == 9 and all(isinstance(r.payload["vision_tokens"], int) for r in rows)
    assert all(r.payload["vision_tokens"] >= 1 for r in rows)

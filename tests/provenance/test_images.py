"""Provenance of rows packed with images: each segment names its sample's images, where their
vision tokens are in the row and where each is stored (the tar member of a WebDataset shard,
the row and column of a Parquet file); ``zephon trace`` shows the same."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests._media import write_pairs_parquet, write_shards
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.cli import main
from zephon.provenance import Segment

YAML = """\
datasets:
  - {name: wds, path: wds, format: webdataset}
  - {name: pq, path: pq}
source: {chunk_size: 4, seed: 5}
operators:
  - {op: decode_image, fields: [png, jpg, webp], min_pixels: 784, max_pixels: 3136}
  - {op: decode_text, fields: [txt]}
  - {op: tokenize, tokenizer: bytes, field: txt}
  - {op: pack_sequences, max_length: 64, image_grids: image_grid_thw, max_images_per_row: 3}
  - {op: batch, microbatch_size: 2}
"""


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    write_shards(tmp_path / "wds", [9, 8])
    (tmp_path / "pq").mkdir()
    write_pairs_parquet(tmp_path / "pq" / "pairs.parquet", 12)
    (tmp_path / "images.yaml").write_text(YAML)
    return tmp_path


def stored(seg: Segment, field: str, member: str | None) -> bytes:
    """The encoded image a segment names, read straight from its file."""
    if member is not None:
        with tarfile.open(seg.source) as tar:
            handle = tar.extractfile(member)
            assert handle is not None
            return handle.read()
    return bytes(pq.read_table(seg.source).column(field)[seg.source_row].as_py())


def decoded(data: bytes) -> np.ndarray:
    source = StaticMixtureWorkSource([Dataset.from_records("one", [{"image": data}])])
    pipe = Pipeline(source).decode_image(min_pixels=784, max_pixels=3136)
    (record,) = pipe.options(runner="inline")
    return record.payload["image"]  # type: ignore[no-any-return]


def test_every_image_of_a_packed_row_is_named_where_it_is_stored(corpus: Path) -> None:
    from zephon.config import load_config

    batches = list(load_config(corpus / "images.yaml").build())
    named = 0
    for batch in batches:
        for row, segments in zip(batch.records, batch.provenance(), strict=True):
            for sample, seg in zip(row.payload["packed_samples"], segments, strict=True):
                assert [i.index for i in seg.images] == list(range(len(sample["image_grid_thw"])))
                for image in seg.images:
                    assert seg.start <= image.start < image.end <= seg.end
                    assert image.field is not None
                    if seg.dataset == "wds":  # a tar member, key and extension
                        assert image.member == f"{sample['__key__']}.{image.field}"
                        assert seg.image_where(image) == f"{seg.source}:{image.member}"
                    else:  # a Parquet row's column, in decode_image's field order
                        assert image.member is None and image.field == ("png", "jpg")[image.index]
                        assert seg.image_where(image) == f"{seg.where}:{image.field}"
                    pixels = decoded(stored(seg, image.field, image.member))
                    assert np.array_equal(pixels, sample[image.field])
                    named += 1
    assert named >= 30  # 17 single images and 12 pairs, less what batch(2) drops


def test_zephon_trace_names_each_image(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    yaml = str(corpus / "images.yaml")
    assert main(["trace", yaml, "--step", "1", "--json"]) == 0
    traced: dict[str, Any] = json.loads(capsys.readouterr().out)
    images = [image for seg in traced["segments"] for image in seg["images"]]
    assert images and all(image["where"].startswith(str(corpus)) for image in images)
    assert main(["trace", yaml, "--step", "1"]) == 0
    table = capsys.readouterr().out
    for image in images:
        assert image["where"].rsplit("/", 1)[-1][:8] in table  # rich may fold long cells
        assert f"{image['start']}-{image['end']}" in table

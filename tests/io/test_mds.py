"""MDS: every supported encoding (scalars, text, arrays, images, pickles) against files written
by mosaicml-streaming, and damage."""

from __future__ import annotations

import io
import json
import shutil
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.io._corpus import media_rows, pixels, types_rows
from tests.io._formats import FIXTURES
from zephon import Pipeline, StaticMixtureWorkSource
from zephon.config import load_config
from zephon.errors import DataError, DataFormatError
from zephon.io import Dataset, build_index


def expected(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """The rows as zephon returns them: numpy scalars become Python numbers."""
    return [{k: v.item() if hasattr(v, "item") else v for k, v in r.items()} for r in rows]


def test_every_encoding_decodes_like_the_writer_wrote_it() -> None:
    ds = Dataset.from_path("types", FIXTURES / "mds-types")
    assert ds.total() == 300 and ds.shard_count() > 1
    want = expected(types_rows(300))
    got = [row for s, n in enumerate(ds.counts()) for row in ds.read(s, range(n))]
    assert got == want
    assert isinstance(got[3]["sd"], Decimal) and isinstance(got[3]["f32"], float)


def test_projection_decodes_only_the_chosen_columns(tmp_path: Path) -> None:
    root = tmp_path / "mds"
    shutil.copytree(FIXTURES / "mds-types", root)
    index = json.loads((root / "index.json").read_text())
    for shard in index["shards"]:  # an encoding zephon does not decode
        shard["column_encodings"][shard["column_names"].index("b")] = "webp"
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(DataFormatError, match=r"column 'b' has encoding 'webp'.*columns=\["):
        Dataset.from_path("t", root)
    ds = Dataset.from_path("t", root, columns=["s", "i"])
    assert ds.read(0, [2, 0]) == [{"s": "row 2 xx", "i": 2_000_001}, {"s": "row 0 ", "i": -5}]


def test_truncated_raw_shard_names_the_file(tmp_path: Path) -> None:
    root = tmp_path / "mds"
    shutil.copytree(FIXTURES / "mds-types", root)
    target = root / "shard.00002.mds"
    target.write_bytes(target.read_bytes()[:-10])
    ds = Dataset.from_path("t", root)
    assert ds.read(1, [0]) == expected(types_rows(300))[ds.counts()[0] : ds.counts()[0] + 1]
    with pytest.raises(
        DataFormatError,
        match=r"shard\.00002\.mds is damaged: it has 4008 bytes, index.json says 4018",
    ):
        ds.read(2, [0])


def test_zephon_index_refuses_an_mds_folder(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "mds-types", tmp_path / "mds")
    with pytest.raises(DataError, match=r"is a mds folder, which lists its own shards"):
        build_index(tmp_path / "mds")


def _media(**options: bool) -> list[dict[str, object]]:
    ds = Dataset.from_path("media", FIXTURES / "mds-media", allow_pickle=True, **options)
    assert ds.total() == 40 and ds.shard_count() > 1
    return [row for s, n in enumerate(ds.counts()) for row in ds.read(s, range(n))]


def test_arrays_images_and_pickles_decode_like_the_writer_wrote_them() -> None:
    encoded, decoded = _media(), _media(decode_images=True)
    for want, enc, dec in zip(media_rows(40), encoded, decoded, strict=True):
        assert enc["id"] == dec["id"] == want["id"]
        for name in ("arr", "grid"):
            assert enc[name].dtype == want[name].dtype and np.array_equal(enc[name], want[name])
        assert enc["obj"] == want["obj"] and isinstance(enc["obj"]["pair"], tuple)
        assert enc["png"][:8] == b"\x89PNG\r\n\x1a\n" and enc["jpeg"][:2] == b"\xff\xd8"
        with Image.open(io.BytesIO(enc["jpeg"])) as jpeg:
            assert np.array_equal(dec["jpeg"], np.asarray(jpeg))  # lossy: as Pillow reads it
        assert dec["jpeg"].shape == (4, 5, 3)
        for pixels_of in (dec["png"], enc["pil"], dec["pil"]):  # lossless
            assert np.array_equal(pixels_of, pixels(want["id"]))


def test_pickles_need_consent_and_images_project_away(tmp_path: Path) -> None:
    with pytest.raises(
        DataFormatError, match=r"column 'obj' has encoding 'pkl', pickled .*allow_pickle=True"
    ):
        Dataset.from_path("m", FIXTURES / "mds-media")
    ds = Dataset.from_path("m", FIXTURES / "mds-media", columns=["id", "grid"])
    assert ds.read(0, [1])[0]["id"] == 1


def test_media_rows_reach_process_workers() -> None:
    ds = Dataset.from_path("m", FIXTURES / "mds-media", decode_images=True, allow_pickle=True)
    source = StaticMixtureWorkSource([ds], chunk_size=8, seed=1)
    pipe = Pipeline(source).batch(5, drop_last=False).options(runner="process")
    rows = {r.payload["id"]: r.payload for b in pipe for r in b}
    assert sorted(rows) == list(range(40))
    assert np.array_equal(rows[7]["png"], pixels(7)) and rows[7]["obj"]["set"] == frozenset({7})


def test_yaml_takes_the_media_options(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        f"datasets: [{{name: m, path: '{FIXTURES / 'mds-media'}', decode_images: true, "
        "allow_pickle: true}]\noperators: [{op: batch, microbatch_size: 40}]\n"
    )
    rows = {r.payload["id"]: r.payload for b in load_config(tmp_path / "p.yaml").build() for r in b}
    assert np.array_equal(rows[3]["png"], pixels(3)) and rows[3]["obj"]["k"] == 3

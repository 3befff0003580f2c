"""MDS: every supported encoding against files written by mosaicml-streaming, and damage."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from pathlib import Path

import pytest

from tests.io._corpus import types_rows
from tests.io._formats import FIXTURES
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
        shard["column_encodings"][shard["column_names"].index("b")] = "jpeg"
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(DataFormatError, match=r"column 'b' has encoding 'jpeg'.*columns=\["):
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

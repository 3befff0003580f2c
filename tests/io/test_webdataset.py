"""WebDataset tar shards: written by the ``webdataset`` package, read by zephon with random
access through a byte-offset index (built, cached or from an Energon sidecar), local and remote."""

from __future__ import annotations

import pickle
import tarfile
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import webdataset

from tests._media import as_read, write_shards
from zephon import Pipeline, StaticMixtureWorkSource
from zephon.config import load_config
from zephon.errors import DataFormatError
from zephon.io import Dataset
from zephon.testing import run_with_stops
from zephon.types import SampleBatch


def everything(ds: Dataset) -> list[dict[str, Any]]:
    return [row for s, n in enumerate(ds.counts()) for row in ds.read(s, range(n))]


def sample_starts(path: Path) -> list[int]:
    """Where each sample's first header starts, found with the standard library."""
    starts, key = [], None
    with tarfile.open(path) as tar:
        for info in tar:
            prefix = info.name.split(".", 1)[0]
            if prefix != key:
                starts.append(info.offset)
                key = prefix
    return starts


def test_shards_read_back_as_webdataset_iterates_them(tmp_path: Path) -> None:
    written = write_shards(tmp_path / "wds", [7, 5, 9])
    ds = Dataset.from_path("w", tmp_path / "wds", cache_dir=tmp_path / "c")
    assert ds.counts() == [7, 5, 9]
    reference = [
        {k: v for k, v in s.items() if k not in ("__url__", "__local_path__")}
        for s in webdataset.WebDataset(
            sorted(str(p) for p in (tmp_path / "wds").glob("*.tar")), shardshuffle=False
        )
    ]
    assert everything(ds) == reference == [as_read(s) for s in written]
    # random access, any order, repeats included; bytes stay encoded
    assert ds.read(2, [8, 0, 8]) == [reference[20], reference[12], reference[20]]
    assert isinstance(ds.read(0, [0])[0]["jpg"], bytes)


def test_shards_travel_to_worker_processes_without_their_index(tmp_path: Path) -> None:
    write_shards(tmp_path / "wds", [5])
    shard = Dataset.from_path("w", tmp_path / "wds").shards[0]
    want = shard.read([3, 1])
    copy = pickle.loads(pickle.dumps(shard))
    assert shard._bounds is not None and "_bounds" not in shard.__getstate__()
    assert copy.read([3, 1]) == want and len(copy) == 5


def test_index_is_kept_in_the_cache_folder_not_next_to_the_data(tmp_path: Path) -> None:
    write_shards(tmp_path / "wds", [6, 6])
    before = sorted(p.name for p in (tmp_path / "wds").iterdir())
    first = everything(Dataset.from_path("w", tmp_path / "wds", cache_dir=tmp_path / "c"))
    indexes = sorted((tmp_path / "c").rglob("*.wdsidx"))
    assert len(indexes) == 2
    assert sorted(p.name for p in (tmp_path / "wds").iterdir()) == before
    # a damaged cached index is never trusted: the shard is indexed again
    indexes[0].write_bytes(indexes[0].read_bytes()[:-3])
    assert everything(Dataset.from_path("w", tmp_path / "wds", cache_dir=tmp_path / "c")) == first


@pytest.mark.parametrize("end_marker", [True, False])
def test_an_energon_sidecar_index_is_used(tmp_path: Path, end_marker: bool) -> None:
    write_shards(tmp_path / "wds", [8])
    shard = tmp_path / "wds" / "shard-00000.tar"
    want = everything(Dataset.from_path("w", shard, cache_dir=tmp_path / "c0"))
    starts = sample_starts(shard)
    if end_marker:  # Energon's writer ends the list where the end-of-archive marker begins
        with tarfile.open(shard) as tar:
            tar.getmembers()
            starts.append(tar.offset)
    Path(f"{shard}.idx").write_bytes(np.array(starts, dtype="<u8").tobytes())
    ds = Dataset.from_path("w", tmp_path / "wds", cache_dir=tmp_path / "c1")
    assert everything(ds) == want  # the sidecar is not taken for a shard of its own
    assert not list((tmp_path / "c1").rglob("*.wdsidx"))  # the sidecar was enough


def test_a_sidecar_that_does_not_match_is_named(tmp_path: Path) -> None:
    write_shards(tmp_path / "wds", [4])
    shard = tmp_path / "wds" / "shard-00000.tar"
    Path(f"{shard}.idx").write_bytes(np.array([0, 0, 9], dtype="<u8").tobytes())
    with pytest.raises(DataFormatError, match=r"shard-00000\.tar\.idx does not match .*delete"):
        Dataset.from_path("w", shard)
    # a sidecar that merges two samples into one span is caught when the span is read
    starts = sample_starts(shard)
    Path(f"{shard}.idx").write_bytes(np.array([starts[0], starts[2]], dtype="<u8").tobytes())
    ds = Dataset.from_path("w", shard)
    with pytest.raises(DataFormatError, match=r"shard-00000\.tar, sample 0 .*another sample"):
        ds.read(0, [0])
    with pytest.raises(DataFormatError, match=r"delete .*shard-00000\.tar\.idx if it is older"):
        ds.read(0, [0])


@pytest.mark.parametrize("cut", ["data", "header", "end marker"])
def test_a_truncated_shard_is_named_in_one_line(tmp_path: Path, cut: str) -> None:
    write_shards(tmp_path / "wds", [5])
    shard = tmp_path / "wds" / "shard-00000.tar"
    data = shard.read_bytes()
    last = sample_starts(shard)[-1]
    at = {"data": last + 512 + 5, "header": last + 100, "end marker": len(data) - 1024}[cut]
    if cut == "end marker":
        at = len(data.rstrip(b"\0"))
        at += -at % 512
    shard.write_bytes(data[:at])
    with pytest.raises(DataFormatError) as info:
        Dataset.from_path("w", shard, cache_dir=tmp_path / "c")
    message = str(info.value)
    assert "shard-00000.tar" in message and "\n" not in message
    assert "truncated" in message or "cut short" in message or "end-of-archive" in message


def test_remote_shards_are_read_by_byte_range(tmp_path: Path) -> None:
    written = write_shards(tmp_path / "wds", [6, 4])
    fs = fsspec.filesystem("memory")
    for p in sorted((tmp_path / "wds").glob("*.tar")):
        fs.pipe(f"/zephon-wds/{p.name}", p.read_bytes())
    try:
        ds = Dataset.from_path("m", "memory://zephon-wds", cache_dir=tmp_path / "c")
        assert ds.counts() == [6, 4]
        assert ds.read(1, [3, 0]) == [as_read(written[9]), as_read(written[6])]
        assert fs.ls("/zephon-wds", detail=False) == [
            "/zephon-wds/shard-00000.tar", "/zephon-wds/shard-00001.tar",
        ]  # fmt: skip
    finally:
        fs.rm("/zephon-wds", recursive=True)


def test_columns_project_fields_and_name_a_missing_one(tmp_path: Path) -> None:
    written = write_shards(tmp_path / "wds", [6])
    ds = Dataset.from_path("w", tmp_path / "wds", columns=["__key__", "txt"])
    assert ds.read(0, [4]) == [{"__key__": written[4]["__key__"], "txt": b"picture 4"}]
    ds = Dataset.from_path("w", tmp_path / "wds", columns=["jpg"])
    with pytest.raises(DataFormatError, match=r"sample 1 \(key 'part/00001'\) has no field.*jpg"):
        ds.read(0, [1])


def test_yaml_reads_webdataset_shards(tmp_path: Path) -> None:
    written = write_shards(tmp_path / "wds", [5, 5])
    (tmp_path / "p.yaml").write_text(
        f"datasets: [{{name: w, path: '{tmp_path / 'wds'}', format: webdataset}}]\n"
        "operators: [{op: batch, microbatch_size: 10}]\n"
    )
    rows = [r.payload for b in load_config(tmp_path / "p.yaml").build() for r in b]
    assert sorted(rows, key=lambda r: r["__key__"]) == [as_read(s) for s in written]


def _build(folder: Path, runner: str) -> Pipeline:
    ds = Dataset.from_path("w", folder)
    source = StaticMixtureWorkSource([ds], chunk_size=4, seed=3, shuffle_within_shard=True)
    return Pipeline(source).batch(3, drop_last=False).options(runner=runner)


def _key(batch: Any) -> Any:
    assert isinstance(batch, SampleBatch)
    return [(r.meta.sample_id, r.payload["__key__"], r.payload["txt"]) for r in batch]


def test_stop_restore_and_runners_agree_over_tar_shards(tmp_path: Path) -> None:
    write_shards(tmp_path / "wds", [9, 7, 8])
    reference = [_key(b) for b in _build(tmp_path / "wds", "inline")]
    assert sum(len(b) for b in reference) == 24
    assert [_key(b) for b in _build(tmp_path / "wds", "process")] == reference
    stops = run_with_stops(lambda: _build(tmp_path / "wds", "threads"), _key, [1, 4, 7])
    assert stops == reference

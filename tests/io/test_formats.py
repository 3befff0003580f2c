"""Formats and locations: compressed JSONL, Parquet, fsspec URLs, globs, lists, index.json."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import multiprocessing as mp
import threading
from pathlib import Path

import cloudpickle
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from zephon.cli._index import main as index_main
from zephon.errors import DataError, DataFormatError
from zephon.io import Dataset, build_index


def rows_for(shard: int, n: int) -> list[dict[str, object]]:
    return [{"text": f"shard {shard} row {i}", "i": i, "s": shard} for i in range(n)]


def jsonl_bytes(rows: list[dict[str, object]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def write_mixed_folder(folder: Path) -> dict[int, list[dict[str, object]]]:
    """Shards in all formats; sorted names give shard ids 0..3."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {s: rows_for(s, 20 + 3 * s) for s in range(4)}
    (folder / "a.jsonl").write_bytes(jsonl_bytes(data[0]))
    (folder / "b.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(data[1])))
    (folder / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl_bytes(data[2])))
    pq.write_table(pa.Table.from_pylist(data[3]), folder / "d.parquet", row_group_size=7)
    (folder / "README.md").write_text("not a shard")
    return data


def test_every_format_reads_back(tmp_path: Path) -> None:
    data = write_mixed_folder(tmp_path / "ds")
    before = sorted(p.name for p in (tmp_path / "ds").iterdir())
    ds = Dataset.from_path("mixed", tmp_path / "ds", cache_dir=tmp_path / "cache")
    assert ds.counts() == [len(data[s]) for s in range(4)]
    for s in range(4):
        idx = [len(data[s]) - 1, 0, 5, 5, 13]
        assert ds.read(s, idx) == [data[s][i] for i in idx]
    # Decompressed copies and every offset index live in the cache; the data folder is untouched.
    assert len(list((tmp_path / "cache").rglob("*.raw"))) == 2
    assert len(list((tmp_path / "cache").rglob("*.zidx"))) == 3
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == before


def test_parquet_column_projection_and_row_groups(tmp_path: Path) -> None:
    rows = rows_for(0, 50)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "x.parquet", row_group_size=8)
    ds = Dataset.from_path("p", tmp_path / "x.parquet", columns=["i"])
    idx = [49, 0, 8, 7, 16, 3, 41]
    assert ds.read(0, idx) == [{"i": i} for i in idx]


def test_missing_parquet_column_names_path_and_column(tmp_path: Path) -> None:
    pq.write_table(pa.Table.from_pylist(rows_for(0, 3)), tmp_path / "x.parquet")
    with pytest.raises(DataFormatError, match=r"x\.parquet has no column\(s\) \['txt'\]"):
        Dataset.from_path("p", tmp_path, columns=["txt"])


def test_memory_and_file_urls(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    data = {s: rows_for(s, 12) for s in range(3)}
    for s in range(3):
        fs.pipe(f"/zephon-test-mem/part-{s}.jsonl", jsonl_bytes(data[s]))
    fs.pipe("/zephon-test-mem/part-3.jsonl.gz", gzip.compress(jsonl_bytes(data[0])))
    try:
        ds = Dataset.from_path("m", "memory://zephon-test-mem", cache_dir=tmp_path / "c")
        assert ds.counts() == [12, 12, 12, 12]
        assert ds.read(2, [11, 1]) == [data[2][11], data[2][1]]
        assert ds.read(3, [4]) == [data[0][4]]
        # The index of remote shards goes to the cache folder; reads are byte ranges.
        assert not fs.glob("/zephon-test-mem/*.zidx")
    finally:
        fs.rm("/zephon-test-mem", recursive=True)
    write_mixed_folder(tmp_path / "ds")
    via_url = Dataset.from_path("f", f"file://{tmp_path / 'ds'}", cache_dir=tmp_path / "c")
    via_path = Dataset.from_path("f", tmp_path / "ds", cache_dir=tmp_path / "c")
    assert via_url.counts() == via_path.counts()
    assert via_url.read(3, [2]) == via_path.read(3, [2])


def test_glob_and_list(tmp_path: Path) -> None:
    data = write_mixed_folder(tmp_path / "ds")
    globbed = Dataset.from_path("g", str(tmp_path / "ds" / "*.jsonl*"), cache_dir=tmp_path / "c")
    assert globbed.counts() == [len(data[s]) for s in range(3)]
    listed = Dataset.from_path(
        "l", [tmp_path / "ds" / "d.parquet", tmp_path / "ds" / "a.jsonl"], cache_dir=tmp_path / "c"
    )
    assert listed.counts() == [len(data[3]), len(data[0])]  # list order is kept
    assert listed.read(1, [0]) == [data[0][0]]


def test_index_json_makes_discovery_scan_free(tmp_path: Path) -> None:
    data = write_mixed_folder(tmp_path / "ds")
    cache = tmp_path / "c"
    assert index_main([str(tmp_path / "ds"), "--cache-dir", str(cache)]) == 0
    index = json.loads((tmp_path / "ds" / "index.json").read_text())
    assert [s["rows"] for s in index["shards"]] == [len(data[s]) for s in range(4)]
    assert index["total_rows"] == sum(len(v) for v in data.values())
    # Remove every derived file: discovery through index.json must not recreate them.
    for p in [*(tmp_path / "ds").glob("*.zidx"), *cache.rglob("*")]:
        if p.is_file():
            p.unlink()
    ds = Dataset.from_path("d", tmp_path / "ds", cache_dir=cache)
    assert ds.counts() == [len(data[s]) for s in range(4)]
    assert not list((tmp_path / "ds").glob("*.zidx"))
    assert not [p for p in cache.rglob("*") if p.is_file()]
    assert ds.read(1, [2]) == [data[1][2]]  # first read builds the index lazily


def test_stale_index_json_is_detected_on_read(tmp_path: Path) -> None:
    write_mixed_folder(tmp_path / "ds")
    build_index(tmp_path / "ds", cache_dir=tmp_path / "c")
    (tmp_path / "ds" / "a.jsonl").write_bytes(jsonl_bytes(rows_for(0, 3)))
    pq.write_table(pa.Table.from_pylist(rows_for(3, 2)), tmp_path / "ds" / "d.parquet")
    ds = Dataset.from_path("d", tmp_path / "ds", cache_dir=tmp_path / "c")
    with pytest.raises(DataFormatError, match=r"a\.jsonl has 3 rows but the dataset index says 20"):
        ds.read(0, [0])
    with pytest.raises(DataFormatError, match=r"d\.parquet has 2 rows but the dataset index says"):
        ds.read(3, [0])


def test_index_on_memory_url() -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe("/zephon-idx/a.jsonl", jsonl_bytes(rows_for(0, 9)))
    try:
        index = build_index("memory://zephon-idx")
        assert index["shards"] == [{"path": "a.jsonl", "format": "jsonl", "rows": 9}]
        ds = Dataset.from_path("m", "memory://zephon-idx")
        assert ds.counts() == [9]
        assert ds.read(0, [8]) == [rows_for(0, 9)[8]]
    finally:
        fs.rm("/zephon-idx", recursive=True)


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=rf"no shards found in {tmp_path}"):
        Dataset.from_path("e", tmp_path)


def test_unknown_format(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match=r"unknown shard format for .*data\.csv"):
        Dataset.from_path("u", tmp_path / "data.csv")
    with pytest.raises(DataError, match=r"unsupported files found: data\.csv"):
        Dataset.from_path("u", tmp_path)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope does not exist"):
        Dataset.from_path("u", tmp_path / "nope")


COMPRESS = {
    "gz": gzip.compress,
    "zst": zstandard.compress,
    "bz2": bz2.compress,
    "xz": lzma.compress,
}


@pytest.mark.parametrize("suffix", ["bz2", "xz"])
def test_bz2_and_xz_jsonl_read_back(tmp_path: Path, suffix: str) -> None:
    rows = rows_for(0, 120)
    (tmp_path / f"a.jsonl.{suffix}").write_bytes(COMPRESS[suffix](jsonl_bytes(rows)))
    ds = Dataset.from_path("c", tmp_path / f"a.jsonl.{suffix}", cache_dir=tmp_path / "c")
    assert ds.counts() == [120]
    assert ds.read(0, [119, 0, 7]) == [rows[119], rows[0], rows[7]]
    assert ds.locate(0, 7).endswith(f"a.jsonl.{suffix}, line 8")


@pytest.mark.parametrize("name", [f"bad.jsonl.{s}" for s in COMPRESS])
def test_corrupt_compressed_shard(tmp_path: Path, name: str) -> None:
    good = jsonl_bytes(rows_for(0, 200))
    blob = COMPRESS[name.rsplit(".", 1)[1]](good)
    (tmp_path / name).write_bytes(blob[: len(blob) // 2])  # truncated
    with pytest.raises(DataFormatError, match=rf"compressed shard .*{name} is corrupt"):
        Dataset.from_path("c", tmp_path, cache_dir=tmp_path / "c")


def test_corrupt_parquet(tmp_path: Path) -> None:
    (tmp_path / "x.parquet").write_bytes(b"PAR1 garbage")
    with pytest.raises(DataFormatError, match=r"x\.parquet is corrupt or not Parquet"):
        Dataset.from_path("c", tmp_path)


@pytest.mark.timeout(60)
def test_concurrent_reads_from_threads(tmp_path: Path) -> None:
    data = write_mixed_folder(tmp_path / "ds")
    ds = Dataset.from_path("t", tmp_path / "ds", cache_dir=tmp_path / "c")
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            for k in range(60):
                s = (seed + k) % 4
                n = len(data[s])
                idx = [(seed * 7 + k * 13 + j) % n for j in range(9)]
                assert ds.read(s, idx) == [data[s][i] for i in idx]
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def _read_in_child(blob: bytes, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    ds = cloudpickle.loads(blob)
    queue.put([ds.read(s, [0, 1]) for s in range(ds.shard_count())])


@pytest.mark.timeout(60)
def test_dataset_read_in_spawned_process(tmp_path: Path) -> None:
    data = write_mixed_folder(tmp_path / "ds")
    ds = Dataset.from_path("p", tmp_path / "ds", cache_dir=tmp_path / "c")
    ds.read(3, [0])  # open handles in the parent first; they must not travel
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_read_in_child, args=(cloudpickle.dumps(ds), queue))
    proc.start()
    got = queue.get(timeout=50)
    proc.join(timeout=10)
    assert got == [[data[s][0], data[s][1]] for s in range(4)]


def test_cli_register_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from zephon.cli._index import register

    parser = argparse.ArgumentParser(prog="zephon")
    register(parser.add_subparsers(dest="command"))
    write_mixed_folder(tmp_path / "ds")
    args = parser.parse_args(["index", str(tmp_path / "ds"), "--cache-dir", str(tmp_path / "c")])
    assert args.func(args) == 0
    assert "4 shards, 98 rows" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert index_main([str(tmp_path / "empty")]) == 1
    assert "no shards found" in capsys.readouterr().err

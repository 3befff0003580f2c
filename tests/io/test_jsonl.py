"""JSONL shards: offset index, cached sidecar, random reads, malformed lines."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import cloudpickle
import pytest

from zephon.errors import DataFormatError
from zephon.io import Dataset, JsonlShard


def write_jsonl(path: Path, rows: list[dict[str, object]], blank_every: int = 0) -> None:
    with open(path, "w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps(r) + "\n")
            if blank_every and i % blank_every == 0:
                f.write("\n  \n")


def test_folder_counts_and_random_reads(tmp_path: Path) -> None:
    expected = {}
    for s in range(3):
        rows = [{"text": f"s{s}-r{i}", "i": i} for i in range(10 + s)]
        expected[s] = rows
        write_jsonl(tmp_path / f"part-{s:02d}.jsonl", rows, blank_every=4)
    ds = Dataset.from_path("d", tmp_path, cache_dir=tmp_path / ".c")
    assert ds.counts() == [10, 11, 12]
    assert ds.total() == 33
    for s, rows in expected.items():
        idx = [7, 0, 3, 3, len(rows) - 1]
        assert ds.read(s, idx) == [rows[i] for i in idx]
    # The indexes go to the cache folder, never next to the data.
    assert not list(tmp_path.glob("*.zidx"))
    assert sorted(p.name.split(".")[0] for p in (tmp_path / ".c").rglob("*.zidx")) == [
        f"part-{s:02d}" for s in range(3)
    ]


def test_last_line_without_newline_and_crlf(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"a": 1}\r\n\r\n{"a": 2}\n{"a": 3}')
    shard = JsonlShard(str(p))
    assert len(shard) == 3
    assert shard.read([2, 0, 1]) == [{"a": 3}, {"a": 1}, {"a": 2}]


def test_cached_index_is_reused_and_invalidated(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    cache = tmp_path / "cache"
    write_jsonl(p, [{"i": i} for i in range(5)])
    assert len(JsonlShard(str(p), cache_dir=cache)) == 5
    (sidecar,) = cache.rglob("*.zidx")
    stamp = sidecar.stat().st_mtime_ns
    assert len(JsonlShard(str(p), cache_dir=cache)) == 5
    assert sidecar.stat().st_mtime_ns == stamp  # reused, not rebuilt
    write_jsonl(p, [{"i": i} for i in range(8)])
    os.utime(p, ns=(stamp + 10**9, stamp + 10**9))
    shard = JsonlShard(str(p), cache_dir=cache)
    assert len(shard) == 8
    assert shard.read([7]) == [{"i": 7}]


def test_index_files_follow_the_umask_and_stay_out_of_the_data_folder(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", [{"i": i} for i in range(4)])
    old = os.umask(0o022)
    try:
        ds = Dataset.from_path("d", data, cache_dir=tmp_path / "cache")
    finally:
        os.umask(old)
    assert ds.read(0, [3, 1]) == [{"i": 3}, {"i": 1}]
    assert [p.name for p in data.iterdir()] == ["a.jsonl"]
    (index,) = (tmp_path / "cache").rglob("*.zidx")
    assert index.stat().st_mode & 0o777 == 0o644  # readable by the other users of the node


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"a": 1}\n\n{"a": 2}\n{"a": oops}\n{"a": 4}\n')
    shard = JsonlShard(str(p))
    assert shard.read([0, 1, 3]) == [{"a": 1}, {"a": 2}, {"a": 4}]
    with pytest.raises(DataFormatError, match=r"bad\.jsonl, line 4: malformed JSON"):
        shard.read([2])


def test_non_object_line_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "arr.jsonl"
    p.write_text("[1, 2]\n")
    with pytest.raises(DataFormatError, match=r"arr\.jsonl, line 1: expected a JSON object"):
        JsonlShard(str(p)).read([0])


def test_shard_pickles_without_handles(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    write_jsonl(p, [{"i": i} for i in range(100)])
    ds = Dataset.from_path("d", [str(p)])
    assert ds.read(0, [5]) == [{"i": 5}]  # opens the file descriptor
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, pickle.loads)):
        clone = loads(dumps(ds))
        assert clone.read(0, [99, 0]) == [{"i": 99}, {"i": 0}]
        assert len(dumps(ds)) < 2000  # the offset index is not shipped


def _first_error(path: Path) -> str:
    shard = JsonlShard(str(path))
    with pytest.raises(DataFormatError) as info:
        shard.read(list(range(len(shard))))
    return str(info.value)


def test_a_pretty_printed_json_array_is_named_as_such(tmp_path: Path) -> None:
    p = tmp_path / "data.json"
    p.write_text(json.dumps([{"text": "a"}, {"text": "b"}], indent=2))
    message = _first_error(p)
    assert message.startswith(f"{p}, line 1: the file is one JSON array, not JSON Lines")
    assert "jq -c '.[]'" in message and "truncated" not in message


def test_a_byte_order_mark_is_named_as_such(tmp_path: Path) -> None:
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + b'{"text": "a"}\n{"text": "b"}\n')
    message = _first_error(p)
    assert message.startswith(f"{p}, line 1: the file starts with a UTF-8 byte order mark")
    assert "byte 0" not in message


def test_a_binary_file_given_as_jsonl_is_named_as_such(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "really-parquet.jsonl"
    pq.write_table(pa.table({"text": ["a", "b"]}), p)
    assert "the file is binary, not JSON Lines text" in _first_error(p)


@pytest.mark.parametrize("bad", [b"\x00\x01\x02garbage", b'{"text": "\xff\xfe"}'])
@pytest.mark.parametrize("where", [0, 2])
def test_one_binary_line_in_text_is_a_bad_line_not_a_binary_file(
    tmp_path: Path, bad: bytes, where: int
) -> None:
    lines = [json.dumps({"text": f"doc {i}"}).encode() for i in range(4)]
    lines[where] = bad
    p = tmp_path / "data.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    message = _first_error(p)
    assert message.startswith(f"{p}, line {where + 1}: ")
    assert "on_error: skip" in message
    assert "binary, not JSON Lines" not in message and "format:" not in message


def test_pretty_printed_objects_are_named_as_such(tmp_path: Path) -> None:
    p = tmp_path / "pretty.jsonl"
    p.write_text(json.dumps({"text": "a"}, indent=2) + "\n")
    assert "pretty-printed JSON spread over several lines" in _first_error(p)


def test_crlf_lines_read_exactly(tmp_path: Path) -> None:
    p = tmp_path / "crlf.jsonl"
    p.write_bytes(b'{"text": "a"}\r\n\r\n{"text": "b"}\r\n')
    shard = JsonlShard(str(p))
    assert shard.read([0, 1]) == [{"text": "a"}, {"text": "b"}]
    assert shard.line_of(1) == 3

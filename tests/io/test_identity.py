"""A shard's identity: pinned once, carried to worker processes, compared on every fetch."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon.errors import DataFormatError
from zephon.io import _blob as blob_module
from zephon.io._blob import Blob
from zephon.io._identity import FileIdentity
from zephon.io._parquet import ParquetShard


def test_another_machine_compares_size_and_time_not_inode() -> None:
    here = FileIdentity(10, 5, inode=(1, 2), host="a")
    assert here.same_file(FileIdentity(10, 5, inode=(9, 9), host="b"))
    assert not here.same_file(FileIdentity(10, 5, inode=(9, 9), host="a"))
    assert not here.same_file(FileIdentity(11, 5, inode=(1, 2), host="a"))
    assert not here.same_file(FileIdentity(10, 6, inode=(1, 2), host="b"))


def test_a_pickled_blob_compares_against_the_file_pinned_before(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n')
    blob = Blob(str(path))
    blob.pin()
    worker_copy = pickle.loads(pickle.dumps(blob))  # what a process worker gets
    (tmp_path / "b.jsonl").write_text('{"a": 2}\n')
    os.replace(tmp_path / "b.jsonl", path)
    with pytest.raises(DataFormatError, match=r"a\.jsonl was replaced by another file while"):
        worker_copy.check_unchanged()


def test_a_file_rewritten_in_place_with_the_same_size_is_changed(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n')
    blob = Blob(str(path))
    blob.pin()
    blob.check_unchanged()  # unchanged: nothing to say
    path.write_text('{"a": 2}\n')
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 1_000_000))  # a coarse clock still ticks
    with pytest.raises(DataFormatError, match=r"a\.jsonl changed while the run was reading it"):
        blob.check_unchanged()


def test_a_parquet_shard_renamed_over_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"x": 1}, {"x": 2}]), path)
    shard = ParquetShard(str(path))
    shard.pin()
    pq.write_table(pa.Table.from_pylist([{"x": 3}, {"x": 4}]), tmp_path / "new.parquet")
    os.replace(tmp_path / "new.parquet", path)
    with pytest.raises(DataFormatError, match=r"d\.parquet was replaced by another file"):
        shard.check_unchanged()


def test_a_remote_object_is_pinned_by_its_first_request_and_a_rewrite_detected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(blob_module, "REMOTE_RECHECK_S", 0.0)  # ask the store at every check
    fs = fsspec.filesystem("memory")
    fs.pipe("/zephon-identity/a.jsonl", b'{"a": 1}\n')
    try:
        blob = Blob("memory://zephon-identity/a.jsonl")
        assert blob.size() == 9 and blob.pinned is not None  # no request of its own
        blob.check_unchanged()
        fs.pipe("/zephon-identity/a.jsonl", b'{"a": 22}\n')
        with pytest.raises(DataFormatError, match=r"a\.jsonl changed while the run was reading"):
            blob.check_unchanged()
    finally:
        fs.rm("/zephon-identity", recursive=True)

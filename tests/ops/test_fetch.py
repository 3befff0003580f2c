"""fetch: rows of mixed datasets and shards come back in the micro-batch's order."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from zephon._engine.feed.fetch import FetchOp
from zephon.errors import DataError
from zephon.io import Dataset, InMemoryShard, Row, Shard
from zephon.types import SampleMeta, SampleRecord, Tombstone


def pointer(ds: int, shard: int, row: int, offset: int) -> SampleRecord:
    return SampleRecord(SampleMeta((ds, shard, row), 0, 1, offset, (), ds), None)


def rows(prefix: str, n: int) -> InMemoryShard:
    return InMemoryShard([{"text": f"{prefix}{i}"} for i in range(n)])


class BrokenRow(Shard):
    """Row ``bad`` cannot be read; the rest can."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    @property
    def location(self) -> str:
        return "broken.jsonl"

    def __len__(self) -> int:
        return self.n

    def read(self, indices: Sequence[int]) -> list[Row]:
        if self.bad in indices:
            raise DataError(f"row {self.bad} is damaged")
        return [{"text": f"c{i}"} for i in indices]


class ShortReads(Shard):
    """Returns one row fewer than asked: a broken reader."""

    location = "short"

    def __len__(self) -> int:
        return 10

    def read(self, indices: Sequence[int]) -> list[Row]:
        return [{"text": "x"} for _ in indices[1:]]


def test_mixed_shards_and_datasets_keep_the_micro_batch_order():
    datasets = [Dataset("a", [rows("a0-", 5), rows("a1-", 5)]), Dataset("b", [rows("b0-", 5)])]
    ids = [(0, 1, 3), (1, 0, 0), (0, 0, 4), (0, 1, 0), (1, 0, 4), (0, 0, 0)]
    elems = [pointer(*sid, offset) for offset, sid in enumerate(ids)]
    out = FetchOp(datasets).process_many(list(elems))
    assert [r.payload["text"] for r in out] == ["a1-3", "b0-0", "a0-4", "a1-0", "b0-4", "a0-0"]
    assert [r.meta for r in out] == [e.meta for e in elems]


def test_skip_turns_only_the_unreadable_row_into_a_tombstone_in_place():
    datasets = [Dataset("a", [rows("a0-", 5)]), Dataset("c", [BrokenRow(5, bad=2)])]
    ids = [(1, 0, 1), (0, 0, 0), (1, 0, 2), (1, 0, 3)]
    elems = [pointer(*sid, offset) for offset, sid in enumerate(ids)]
    with pytest.raises(DataError, match="row 2 is damaged"):
        FetchOp(datasets).process_many(list(elems))
    out = FetchOp(datasets, on_error="skip").process_many(list(elems))
    assert [r.payload for r in out] == [{"text": "c1"}, {"text": "a0-0"}, None, {"text": "c3"}]
    skipped = out[2].meta
    assert skipped.is_tombstone and isinstance(skipped.control, Tombstone)
    assert skipped.control.skipped is not None and skipped.control.skipped["row"] == 2
    assert skipped.control.skipped["file"] == "broken.jsonl"
    assert skipped.control.reason is not None and skipped.control.reason.startswith("skipped:")


def test_a_reader_returning_too_few_rows_is_named():
    datasets = [Dataset("short", [ShortReads()])]
    elems = [pointer(0, 0, i, i) for i in range(4)]
    with pytest.raises(ValueError, match="dataset 'short' shard 0 returned 3 rows for 4"):
        FetchOp(datasets).process_many(elems)

"""The source's pointer records are the records the SampleMeta constructor would build."""

from __future__ import annotations

import pickle

from zephon._engine.source import pointer_records
from zephon.types import SampleMeta, SampleRecord


def test_pointer_records_equal_constructed_records_in_every_field():
    rows = [(0, 3, 7), (2, 0, 1), (1, 1, 99)]
    got = pointer_records(rows, lane_id=5, chunk_id=11, first_offset=40)
    expected = [
        SampleRecord(SampleMeta(row, 5, 11, 40 + i, (), row[0]), None) for i, row in enumerate(rows)
    ]
    assert got == expected
    for record, want in zip(got, expected, strict=True):
        assert isinstance(record, SampleRecord)
        for name in SampleMeta.__struct_fields__:  # a new field must be set there too
            assert getattr(record.meta, name) == getattr(want.meta, name)
        assert record.meta.tags is not want.meta.tags  # each record has its own tags dict
        assert pickle.loads(pickle.dumps(record)) == want
        assert hash(record.meta.cursor) == hash(want.meta.cursor)

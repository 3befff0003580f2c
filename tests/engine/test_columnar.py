"""Micro-batches across a process pipe as columns: the receiver gets the same records back."""

from __future__ import annotations

import pickle

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon._engine.handoff import shm
from zephon._engine.handoff.columnar import ColumnarItems
from zephon.types import SampleBatch, SampleMeta, SampleRecord, tombstone_meta

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = ("<i4", "<i8", "|u1", "<f4", ">i4", "<u2")


def meta(i: int, **tags) -> SampleMeta:
    return SampleMeta((0, 1, i), 0, 3, i, (i % 2,), i % 3, None, tags)


def describe(value):
    """Everything a receiver can observe of a value (arrays: dtype, shape, bytes, writeable)."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes(), value.flags.writeable)
    if isinstance(value, dict):
        return ("dict", [(k, describe(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [describe(v) for v in value])
    if isinstance(value, SampleRecord):
        return ("record", value.meta, describe(value.payload))
    if isinstance(value, SampleBatch):
        return ("batch", [describe(r) for r in value.records])
    return value


def through_pipe(items, min_bytes: int = 64 * 1024):
    """``items`` pickled as a worker pickles its reply and read back as the engine reads it."""
    session = shm.ShmSession(min_bytes=min_bytes)
    try:
        data, _keep = session.encoder("t").dumps(ColumnarItems(items, session.min_bytes))
        return shm.loads(data), data
    finally:
        session.close()


@st.composite
def micro_batches(draw):
    n = draw(st.integers(0, 12))
    dtype = draw(st.sampled_from(DTYPES))
    extra = draw(st.sampled_from(["none", "array", "list", "text"]))
    records = []
    for i in range(n):
        length = draw(st.integers(0, 40))
        payload = {"input_ids": (np.arange(length) * (i + 1)).astype(dtype)}
        if extra == "array":  # a second array field, of another dtype
            payload["loss_mask"] = (np.arange(length) % 2).astype(np.uint8)
        elif extra == "list":
            payload["labels"] = list(range(length))
        elif extra == "text":
            payload["text"] = "x" * length
        tags = {"_target_mixture": {"a": 1.0}} if i == 0 else {}
        records.append(SampleRecord(meta(i, **tags), payload))
    return records


@SETTINGS
@given(micro_batches())
def test_a_micro_batch_reads_back_as_the_records_pickled_one_by_one(records):
    got, _ = through_pipe(records)
    assert type(got) is list
    assert describe(got) == describe(pickle.loads(pickle.dumps(records, protocol=5)))


def test_arrays_travel_as_one_buffer_per_field_and_come_back_as_disjoint_views():
    records = [
        SampleRecord(meta(i), {"input_ids": np.arange(5, dtype=np.int32) + 10 * i, "id": i})
        for i in range(4)
    ]
    got, data = through_pipe(records)
    arrays = [r.payload["input_ids"] for r in got]
    assert len({id(a.base) for a in arrays}) == 1  # views on the one buffer of the field
    plain = pickle.dumps(records, protocol=5)
    assert len(data) < len(plain)  # one array header for the field, not one per record
    arrays[1][:] = -1  # writeable, and a record's array is its own
    assert [int(a[0]) for a in arrays] == [0, -1, 20, 30]
    assert [r.payload["id"] for r in got] == [0, 1, 2, 3]


def test_batches_tombstones_and_mixed_payloads_keep_their_ordinary_pickle():
    record = SampleRecord(meta(0), {"input_ids": np.arange(3)})
    cases = [
        [record, SampleRecord(tombstone_meta(meta(1), reason="x: y"), None)],
        [record, SampleBatch([record])],
        [record, SampleRecord(meta(1), {"tokens": np.arange(3)})],  # other keys
        [record, SampleRecord(meta(1), {"input_ids": [1, 2, 3]})],  # a list, not an array
        [record, SampleRecord(meta(1), {"input_ids": np.arange(3, dtype=np.int8)})],  # dtype
        [record, SampleRecord(meta(1), {"input_ids": np.zeros((2, 2))})],  # not 1-D
        [record],
        [],
    ]
    for items in cases:
        got, _ = through_pipe(items)
        assert describe(got) == describe(items)


def test_a_read_only_array_stays_read_only():
    frozen = np.arange(4)
    frozen.flags.writeable = False
    items = [SampleRecord(meta(i), {"input_ids": frozen.copy() if i else frozen}) for i in range(2)]
    got, _ = through_pipe(items)
    assert [r.payload["input_ids"].flags.writeable for r in got] == [False, True]


def test_an_array_over_the_shared_memory_threshold_still_crosses_by_segment():
    big = np.arange(4096, dtype=np.int64)  # 32 KiB
    items = [SampleRecord(meta(i), {"input_ids": big + i}) for i in range(2)]
    got, data = through_pipe(items, min_bytes=1024)
    assert len(data) < big.nbytes  # the pickle names segments, not the bytes
    refs = [r.payload["input_ids"] for r in got]
    assert all(isinstance(ref, shm.ShmArrayRef) for ref in refs)
    np.testing.assert_array_equal(refs[1].resolve(), big + 1)


def test_a_micro_batch_of_empty_arrays_reads_back_empty_and_writeable():
    items = [SampleRecord(meta(i), {"input_ids": np.zeros(0, dtype=np.int32)}) for i in range(3)]
    got, _ = through_pipe(items)
    assert describe(got) == describe(items)

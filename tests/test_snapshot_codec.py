"""Snapshot states through JSON: records by meta, every Python type back as it was."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon._snapshot_codec import (
    HeldPayloads,
    HeldRecord,
    decode,
    decode_meta,
    encode,
    encode_meta,
    fill,
    held_records,
    pack_state,
    unpack_state,
)
from zephon.errors import CheckpointError, ContractError
from zephon.types import (
    TAG_CONTRIBUTORS,
    TAG_PACKING,
    TAG_TARGET_MIXTURE,
    ContributorRef,
    SampleCursor,
    SampleMeta,
    SampleRecord,
    SnapshotMarker,
    Tombstone,
    cut_note,
    end_of_data,
    flush_sentinel,
    snapshot_marker,
    tombstones_for_record,
)

ints = st.integers(min_value=-5, max_value=10**9)
cursors = st.builds(
    SampleCursor,
    ints,
    ints,
    st.tuples(*[st.integers(0, 9)] * 2) | st.just(()),
    st.tuples(ints, ints, ints),
)
metas = st.builds(
    lambda cursor, lane, refs, segments, counts, target: SampleMeta(
        cursor.sample_id,
        lane,
        cursor.chunk_id,
        cursor.chunk_offset,
        cursor.lineage,
        cursor.sample_id[0],
        counts,
        {
            TAG_CONTRIBUTORS: tuple(ContributorRef(c, last) for c, last in refs),
            TAG_PACKING: {"segments": tuple(segments), "component_tokens": {0: 3, 1: 4}},
            TAG_TARGET_MIXTURE: target,
            "user": [1, "two", {"three": 3.5}],
        },
    ),
    cursors,
    st.integers(0, 7),
    st.lists(st.tuples(cursors, st.booleans()), min_size=1, max_size=4),
    st.lists(st.tuples(cursors, st.integers(0, 99), st.integers(0, 99)), min_size=1),
    st.none() | st.dictionaries(st.integers(0, 3), st.integers(0, 9)),
    st.dictionaries(st.sampled_from(["a", "b"]), st.floats(0.01, 1.0)),
)


@settings(deadline=None)  # timed by the load of a shared machine, not by the code
@given(st.lists(metas, max_size=4), st.integers(), st.floats(allow_nan=False))
def test_records_come_back_as_their_metas_and_everything_else_equal(metas_, n, x):
    state: dict[str, Any] = {
        "items": [SampleRecord(m, {"input_ids": [1, 2, 3]}) for m in metas_],
        "queues": {0: deque([(1, SampleRecord(m, None), {0: 1.0}) for m in metas_])},
        "counters": (n, x, True, None),
        "$zt": "a plain key that looks like a tag",
    }
    text = json.dumps(encode(state))
    assert "input_ids" not in text  # payloads are never written
    back = decode(json.loads(text))
    held = held_records(back)
    assert all(isinstance(h, HeldRecord) for h in held)
    assert sorted(map(repr, (h.meta for h in held))) == sorted(map(repr, metas_ * 2))
    filled = fill(back, {id(h): "rebuilt" for h in held})
    assert [r.meta for r in filled["items"]] == metas_
    assert all(r.payload == "rebuilt" for r in filled["items"])
    assert [(a, r.meta, c) for a, r, c in filled["queues"][0]] == [(1, m, {0: 1.0}) for m in metas_]
    assert isinstance(filled["queues"][0], deque)
    assert filled["counters"] == (n, x, True, None)
    assert filled["$zt"] == "a plain key that looks like a tag"


def test_numpy_scalars_become_numbers_and_infinities_survive():
    back = decode(json.loads(json.dumps(encode([np.int64(3), np.float32(0.5), float("inf")]))))
    assert back == [3, 0.5, float("inf")]


def test_what_a_checkpoint_cannot_hold_is_named():
    with pytest.raises(ContractError, match=r"operator 'x'.*cannot save a ndarray"):
        encode({"buffer": np.zeros(3)}, "operator 'x'")


def test_large_states_are_deflated_and_come_back_exactly():
    from zephon._snapshot_codec import PACK_MIN_BYTES, pack_state, unpack_state

    records = [
        SampleRecord(SampleMeta((0, 3, i), 1, i // 64, i % 64, (), 0), None) for i in range(256)
    ]
    state = encode({"items": records, "emitted": 10, "nan": float("nan")})
    packed = pack_state(state)
    assert list(packed) == ["$zz"] and len(json.dumps(packed)) * 4 < len(json.dumps(state))
    back = json.loads(json.dumps(unpack_state(json.loads(json.dumps(packed)))))
    assert json.dumps(back) == json.dumps(state)
    small = encode({"items": records[:1]})
    assert len(json.dumps(small)) < PACK_MIN_BYTES and pack_state(small) is small
    assert unpack_state(small) is small
    own = {"$zz": "a key of a user's own"}  # never mistaken for a deflated state
    assert unpack_state(pack_state(own)) == own


def test_a_damaged_deflated_state_is_refused_clearly():
    from zephon._snapshot_codec import unpack_state
    from zephon.errors import CheckpointError

    with pytest.raises(CheckpointError, match="operator state is damaged"):
        unpack_state({"$zz": "bm90IHpsaWI="})


def test_control_records_are_written_in_the_tag_form_and_come_back_typed():
    """A checkpoint holds a control record's meta as the tags it always had, so checkpoints
    written before control records were typed restore, and the format did not change."""
    rec = SampleRecord(SampleMeta((0, 0, 4), 1, 2, 4), {"input_ids": [1, 2, 3]})
    marker = snapshot_marker(1, 2, 5)
    stamped = marker.meta.with_control(SnapshotMarker((2, 5), rec.meta.cursor))
    metas = [
        flush_sentinel(1, 8).meta,
        end_of_data(1).meta,
        marker.meta,
        stamped,
        tombstones_for_record(rec, reason="filtered")[0].meta,
        cut_note(rec, reason="truncate", tokens=2).meta,
        rec.meta.with_tags(**{TAG_TARGET_MIXTURE: {0: 1.0}}),
    ]
    for meta in metas:
        written = json.loads(json.dumps(encode_meta(meta)))
        assert decode_meta(written) == meta
    sentinel_tags = encode_meta(flush_sentinel(1, 8).meta)[7]
    assert sentinel_tags == {"_flush_sentinel": True, "_boundary_cid": 8}
    assert encode_meta(stamped)[7]["_snapshot"] == {"$zt": [2, 5]}
    old = [[0, 0, 4], 1, 2, 4, [], 0, None, {"_tombstone": True, "_error": "filtered: x"}]
    assert decode_meta(old).control == Tombstone("filtered: x")
    assert decode_meta(old).tags == {}


# -- records with their payloads (checkpoints with held payloads) -----------------------------

dtypes = st.sampled_from(["<i4", "<i8", ">i2", "|u1", "<f4", "<f8", "|b1", "<U3", "|S2", "<c8"])
arrays = st.builds(
    lambda dtype, shape, seed: (
        np.random.default_rng(seed)
        .integers(0, 255, size=(int(np.prod(shape)) * np.dtype(dtype).itemsize), dtype=np.uint8)
        .view(dtype)
        .reshape(shape)
    ),
    dtypes,
    st.lists(st.integers(0, 3), max_size=3).map(tuple),
    st.integers(0, 2**32 - 1),
)
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=5)
    | st.binary(max_size=5)
    | arrays
    | arrays.map(lambda a: a[()] if a.ndim == 0 else a.reshape(-1)[:1][0] if a.size else a)
)
payloads = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=4) | st.sampled_from(["$zA", "$zt"]), inner, max_size=3)
        | st.dictionaries(st.integers(), inner, max_size=2)
    ),
    max_leaves=8,
)


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types, arrays by dtype, shape and bytes (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@settings(deadline=None)  # a loaded machine: the first examples build numpy dtypes
@given(payloads)
def test_held_payloads_come_back_with_their_exact_types_and_bytes(payload):
    meta = SampleMeta((0, 1, 2), 1, 3, 4, (), 0)
    held = HeldPayloads()
    state = {"items": [SampleRecord(meta, payload)]}
    text = json.dumps(encode(state, "s", held))
    (record,) = decode(json.loads(text))["items"]
    assert held.written == 1 and held.by_meta == 0
    assert type(record) is SampleRecord and record.meta == meta
    assert same(record.payload, payload)


def test_held_arrays_are_writable_copies_of_the_viewed_bytes_only():
    base = np.arange(12, dtype=np.int32)
    meta = SampleMeta((0, 1, 2), 1, 3, 4, (), 0)
    encoded = encode([SampleRecord(meta, {"ids": base[3:9:2]})], "s", HeldPayloads())
    (record,) = decode(json.loads(json.dumps(encoded)))
    ids = record.payload["ids"]
    assert ids.tolist() == [3, 5, 7] and ids.dtype == np.int32 and ids.flags.writeable


def test_a_held_shared_memory_array_is_written_as_the_array_it_maps():
    """The engine registers its shared-memory references with the codec below it."""
    from zephon._engine.handoff import shm

    session = shm.ShmSession(min_bytes=64)
    try:
        big = np.arange(256, dtype=np.int64).reshape(16, 16)
        data, keep = session.encoder("codec").dumps({"ids": big})
        payload = shm.loads(data)
        assert isinstance(payload["ids"], shm.ShmArrayRef)
        meta = SampleMeta((0, 1, 2), 1, 3, 4, (), 0)
        held = HeldPayloads()
        encoded = encode([SampleRecord(meta, payload)], "s", held)
        (record,) = decode(json.loads(json.dumps(encoded)))
        assert held.written == 1 and same(record.payload["ids"], big)
        del data, keep, payload
    finally:
        session.close()


def test_a_payload_without_an_exact_form_is_written_by_meta():
    meta = SampleMeta((0, 1, 2), 1, 3, 4, (), 0)
    odd = [
        {"x": object()},
        np.array([1, None], dtype=object),
        np.zeros(2, dtype=[("a", "<i4")]),
        bytearray(b"x"),
    ]
    held = HeldPayloads()
    encoded = encode([SampleRecord(meta, p) for p in odd], "s", held)
    assert (held.written, held.by_meta) == (0, len(odd))
    assert all(type(r) is HeldRecord for r in decode(encoded))
    assert encode([SampleRecord(meta, {"x": 1})]) == [{"$zrec": encode_meta(meta)}]  # default


def test_a_damaged_held_array_is_refused_clearly():
    meta = SampleMeta((0, 1, 2), 1, 3, 4, (), 0)
    encoded = encode([SampleRecord(meta, np.arange(4))], "s", HeldPayloads())
    encoded[0]["$zrp"][1]["$zA"][1] = [5]  # the shape no longer matches the bytes
    with pytest.raises(CheckpointError, match=r"damaged at \$zrp"):
        decode(encoded)


def test_a_held_text_with_lone_surrogates_survives_deflation():
    meta = SampleMeta((0, 1, 2), 1, 3, 4, (), 0)
    payload = {"text": "caf\udce9 " * 80, "big": 2**70}
    packed = pack_state(encode([SampleRecord(meta, payload)], "s", HeldPayloads()), payloads=True)
    (record,) = decode(unpack_state(json.loads(json.dumps(packed))))
    assert record.payload == payload

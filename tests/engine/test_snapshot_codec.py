"""Snapshot states through JSON: records by meta, every Python type back as it was."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon._engine.snapshot_codec import (
    HeldRecord,
    decode,
    decode_meta,
    encode,
    encode_meta,
    fill,
    held_records,
)
from zephon.errors import ContractError
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
    from zephon._engine.snapshot_codec import PACK_MIN_BYTES, pack_state, unpack_state

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
    from zephon._engine.snapshot_codec import unpack_state
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

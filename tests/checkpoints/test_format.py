"""The checkpoint format: a typed parsed checkpoint, version 4 written as before (the source
settings summary now in one lane only), and the public package loads without the engine."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.checkpoints._written import as_written_now
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.checkpoints import (
    LaneCheckpoint,
    ParsedCheckpoint,
    delivered_counts,
    parse_checkpoint,
    refetch_counts,
    seal,
)
from zephon.checkpoints.format import (
    FORMAT,
    HELD_PAYLOADS_VERSION,
    PLAIN_VERSION,
    VERSION,
    build,
    checksum,
    cursor_to_json,
)
from zephon.errors import CheckpointError
from zephon.types import SampleCursor

FIXTURE = Path(__file__).with_name("fixtures") / "v4-shuffle-pack.json"
HELD_FIXTURE = Path(__file__).with_name("fixtures") / "v5-shuffle-pack-held.json"
STOP = 5  # batches delivered when the fixture was taken


def pipeline(runner: str = "inline") -> Pipeline:
    rows = [{"text": f"document {i} " * (1 + i % 5)} for i in range(300)]
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("docs", rows)],
        mixture=MixtureSpec({"docs": 1.0}),
        chunk_size=20,
        seed=4,
    )
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes", max_length=48)
        .shuffle(32, seed=1)
        .pack_flat(64, pad_token_id=0)
        .batch(2)
        .options(canonical_replicas=2, runner=runner)
    )


def checkpoint_after(batches: int, epoch: int = 0, held_records: bool = False) -> tuple[dict, list]:
    pipe = pipeline()
    if epoch:
        pipe.set_epoch(epoch)
    it = iter(pipe)
    seen = [content(next(it)) for _ in range(batches)]
    state = pipe.checkpoint(held_records=held_records)
    it.close()
    return state, seen


def content(batch: Any) -> list[Any]:
    """A batch in full: each record's cursor and every payload field's dtype and bytes."""
    return [
        (r.meta.cursor, {k: (v.dtype.str, v.tobytes()) for k, v in r.payload.items()})
        for r in batch.records
    ]


def file_text(state: dict) -> str:
    """The bytes ``save_checkpoint`` writes for ``state``."""
    return json.dumps(state, indent=1) + "\n"


def test_version_4_is_written_byte_for_byte_as_before_and_restores() -> None:
    """The fixture was written by the release before the package existed."""
    state, seen = checkpoint_after(STOP)
    assert state["version"] == PLAIN_VERSION == 4
    assert file_text(state) == as_written_now(FIXTURE)
    saved = json.loads(FIXTURE.read_text())
    rest = [content(b) for b in pipeline().restore(saved)]
    assert seen + rest == [content(b) for b in pipeline()]


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_version_5_holds_the_held_records_payloads_and_restores_exactly(runner: str) -> None:
    """The fixture holds the shuffle's and the packer's records with their token ids: its
    restore re-reads none of them, and delivers what an uninterrupted run does."""
    state, seen = checkpoint_after(STOP, held_records=True)
    assert state["version"] == HELD_PAYLOADS_VERSION == 5
    assert file_text(state) == as_written_now(HELD_FIXTURE)
    saved = json.loads(HELD_FIXTURE.read_text())
    assert set(refetch_counts(saved).values()) == {0} and sum(refetch_counts(state).values()) == 0
    pipe = pipeline(runner).restore(saved)
    rest = [content(b) for b in pipe]
    assert seen + rest == [content(b) for b in pipeline(runner)]
    stats = pipe.stats()
    assert stats is not None and stats.samples_refetched == 0
    passed_on = pipeline().restore(saved).checkpoint()
    assert file_text(passed_on) == as_written_now(HELD_FIXTURE)


def test_a_version_this_zephon_does_not_know_is_refused_naming_it() -> None:
    """What a reader of version 4 says of a version 5 file, said here of a version 7 one."""
    saved = json.loads(HELD_FIXTURE.read_text())
    assert VERSION == 6
    with pytest.raises(CheckpointError, match="checkpoint version 7 is newer than this zephon"):
        parse_checkpoint(seal(saved | {"version": 7}))


def test_a_parsed_checkpoint_names_every_part() -> None:
    state, _ = checkpoint_after(STOP)
    parsed = parse_checkpoint(json.loads(json.dumps(state)))
    assert isinstance(parsed, ParsedCheckpoint)
    assert (parsed.version, parsed.fingerprint, parsed.checksum) == (
        4,
        state["fingerprint"],
        state["checksum"],
    )
    assert parsed.epoch == 0 and parsed.canonical_replicas == 2
    assert parsed.world["canonical_replicas"] == 2
    assert parsed.source.type == "StaticMixtureWorkSource"
    assert parsed.source.fingerprint == state["config"]["source"]["fingerprint"]
    assert [d["name"] for d in parsed.source.datasets] == ["docs"]
    assert [(op.index, op.name) for op in parsed.operators] == [
        (i, op["name"]) for i, op in enumerate(state["config"]["operators"])
    ]
    shuffle = next(op for op in parsed.operators if op.type == "ShuffleOp")
    assert shuffle.config["buffer_size"] == 32
    assert parsed.flush_every_k_chunks == state["config"]["flush_every_k_chunks"]
    assert sorted(parsed.lanes) == [0, 1]
    for lane, lc in parsed.lanes.items():
        raw = state["lanes"][str(lane)]
        assert isinstance(lc, LaneCheckpoint)
        assert isinstance(lc.replay_cursor, SampleCursor)
        assert cursor_to_json(lc.replay_cursor) == raw["replay_cursor"]
        assert (lc.start_chunk_id, lc.delivered, lc.done) == (
            raw["start_chunk_id"],
            raw["delivered"],
            raw["done"],
        )
        assert lc.operator_state == raw.get("operator_state")
    assert parsed.delivered == sum(delivered_counts(parsed).values()) == STOP  # batches
    assert refetch_counts(parsed) == refetch_counts(state)
    assert any(lc.operator_state for lc in parsed.lanes.values())  # shuffle and pack state
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.epoch = 3  # type: ignore[misc]


def test_the_epoch_is_a_field_of_the_parsed_checkpoint() -> None:
    state, _ = checkpoint_after(2, epoch=2)
    parsed = parse_checkpoint(state)
    assert parsed.epoch == 2 == state["config"]["epoch"]
    resumed = pipeline().restore(state)
    assert resumed.epoch == 2


def test_older_versions_parse_with_their_version() -> None:
    state, _ = checkpoint_after(2)
    v1 = {k: v for k, v in state.items() if k != "checksum"} | {"version": 1}
    parsed = parse_checkpoint(v1)
    assert (parsed.version, parsed.checksum) == (1, None)
    v2 = seal(state | {"version": 2})
    assert parse_checkpoint(v2).version == 2


def test_build_round_trips_through_parse() -> None:
    state, _ = checkpoint_after(3)
    parsed = parse_checkpoint(state)
    rebuilt = build(
        parsed.config,
        parsed.world,
        list(parsed.lanes.values()),
        parsed.tail_lanes,
        parsed.tail_order,
        parsed.tail_turn,
    )
    assert file_text(rebuilt) == file_text(state)


def test_a_damaged_field_is_named() -> None:
    state, _ = checkpoint_after(1)
    bad = json.loads(json.dumps(state))
    bad["lanes"]["1"]["delivered"] = "many"
    with pytest.raises(CheckpointError, match=r"lanes\[1\]\.'delivered' has type str"):
        parse_checkpoint(seal(bad))
    with pytest.raises(CheckpointError, match="not a zephon pipeline checkpoint"):
        parse_checkpoint({"format": "other", "version": VERSION})
    assert parse_checkpoint(state).config is not None and state["format"] == FORMAT


def test_the_public_package_loads_without_the_engine() -> None:
    code = (
        "import sys, zephon.checkpoints, zephon.checkpoints.format, zephon.checkpoints.gather;"
        "print(sorted(m for m in sys.modules if m.startswith('zephon._engine')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5)
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.integers(-50, 50) | st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=4), _VALUES, max_size=5))
def test_a_state_has_the_checksum_of_its_json_round_trip(state: dict[str, Any]) -> None:
    """Integer keys, tuples, NaN and infinities as operator states may hold them: the checksum
    sealed before saving is the one a reader computes from the file."""
    import msgspec

    saved = msgspec.json.decode(msgspec.json.encode(state))
    assert checksum(state) == checksum(saved, plain_json=True)

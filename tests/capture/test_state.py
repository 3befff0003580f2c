"""The pure rollout state machine: clause-by-clause units and a replay property."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.capture.protocols import (
    CaptureAdmissionRefused,
    CaptureOrderError,
    RolloutRetiredError,
    TokenCaptureFrozenError,
    TokenCaptureRetiredError,
)
from zephon.capture.records import CaptureLedgerCommit, EngineRefusalRecord
from zephon.capture.stores._events import (
    Event,
    Put,
    decode_event,
    encode_event,
    event_from_builtins,
    event_to_builtins,
)
from zephon.capture.stores._state import RolloutState, Transition
from zephon.capture.testing import sample_commit


class Live:
    """A store in miniature: persists events to a list, applies them, unwraps."""

    def __init__(self, rollout_id: str = "r") -> None:
        self.state = RolloutState.empty(rollout_id)
        self.log: list[Event] = []

    def __call__(self, t: Transition[Any]) -> Any:
        self.log.extend(t.events)
        self.state.apply_all(t.events)
        return t.unwrap()


def _payload(n: int) -> bytes:
    return b'{"n":%d}' % n


def _commit(call_id: str, variant: int = 0) -> CaptureLedgerCommit:
    return sample_commit("r", call_id, request_items=[], response_items=[], weight_version=variant)


def test_reference_version_sequence() -> None:
    # The observed sequence of the reference file store (contracts §3.2).
    live = Live()
    s = live.state
    assert live(s.put("c1", _payload(1))) == "stored" and s.version == 1
    assert live(s.put("c1", _payload(1))) == "duplicate" and s.version == 1
    live(s.put("c2", _payload(2)))
    assert s.version == 2
    with pytest.raises(ValueError, match="different bytes"):
        live(s.put("c2", _payload(3)))
    assert s.version == 3 and s.incomplete
    live(s.freeze("S1"))
    assert s.version == 4 and s.snapshot_id == "S1"
    live(s.freeze("S2"))
    assert s.version == 4 and s.snapshot_id == "S1"
    live(s.mark_incomplete("x"))
    assert s.version == 5
    assert live(s.drop("S1", 4)) is False
    assert live(s.drop("S1", 5)) is True and s.phase == "retired"
    assert live(s.drop("S1", 5)) is True
    assert live(s.drop("S1", 4)) is False


def test_fences_raise_typed_errors() -> None:
    live = Live()
    s = live.state
    live(s.put("c1", _payload(1)))
    live(s.freeze("S"))
    for t in (s.put("c2", _payload(2)), s.put("c1", _payload(1)), s.begin_call("c3")):
        with pytest.raises(TokenCaptureFrozenError) as info:
            live(t)
        assert not isinstance(info.value, TokenCaptureRetiredError)
    with pytest.raises(TokenCaptureFrozenError):
        live(s.record_engine_refusal(EngineRefusalRecord(model_call_id="c4", code="x")))
    live(s.mark_incomplete())  # allowed after freeze
    assert live(s.retire()) is True
    for t in (
        s.put("c2", _payload(2)),
        s.begin_call("c3"),
        s.mark_incomplete(),
        s.record_engine_refusal(EngineRefusalRecord(model_call_id="c4", code="x")),
    ):
        with pytest.raises(TokenCaptureRetiredError):
            live(t)
    for t in (s.freeze("T"), s.read_manifest(), s.read_has_rows(), s.close_admissions()):
        with pytest.raises(RolloutRetiredError):
            live(t)
    assert live(s.retire()) is False
    assert live(s.ledger_record(_commit("c9"))) == "discarded"
    assert live(s.ledger_record_failure("c9", "late")) == "discarded"
    assert live(s.delete()) is True and s.is_empty()
    assert live(s.delete()) is False
    assert live(s.put("c2", _payload(2))) == "stored"


def test_conflict_poisons_before_raising() -> None:
    t = RolloutState.empty("r")
    live = Live()
    live(live.state.put("c1", _payload(1)))
    t = live.state.put("c1", _payload(2))
    assert t.error is not None and len(t.events) == 1  # the poison is persisted first
    with pytest.raises(ValueError):
        live(t)
    assert live.state.snapshot_incomplete()


def test_dangling_intents_fold_into_the_frozen_flag() -> None:
    live = Live()
    s = live.state
    live(s.begin_call("c1"))
    live(s.begin_call("c2"))
    live(s.put("c1", _payload(1)))
    assert s.dangling_intents() == ["c2"] and s.snapshot_incomplete()
    live(s.freeze("S"))
    v = s.version
    live(s.ledger_record(_commit("c2")))  # ledger rows still land after freeze ...
    assert s.snapshot_incomplete() and s.version == v  # ... but cannot change the snapshot


def test_refusal_settles_intent_and_conflicts_poison() -> None:
    live = Live()
    s = live.state
    live(s.begin_call("c1"))
    rec = EngineRefusalRecord(model_call_id="c1", code="too_long")
    live(s.record_engine_refusal(rec))
    live(s.record_engine_refusal(rec))  # identical: no-op
    assert s.refusals == [rec] and not s.snapshot_incomplete()
    with pytest.raises(ValueError, match="different"):
        live(s.record_engine_refusal(EngineRefusalRecord(model_call_id="c1", code="other")))
    with pytest.raises(ValueError, match="engine refusal"):
        live(s.put("c1", _payload(1)))
    live(s.put("c2", _payload(2)))
    with pytest.raises(ValueError, match="committed"):
        live(s.record_engine_refusal(EngineRefusalRecord(model_call_id="c2", code="x")))
    assert s.incomplete


def test_admissions_and_ledger() -> None:
    live = Live()
    s = live.state
    live(s.begin_call("c1"))
    live(s.begin_call("c2"))
    assert live(s.ledger_record(_commit("c1"))) == "stored"
    assert live(s.ledger_record(_commit("c1"))) == "duplicate"
    live(s.close_admissions())
    with pytest.raises(CaptureAdmissionRefused):
        live(s.begin_call("c3"))
    assert live(s.refuse_call("c2")) == "stored"
    with pytest.raises(CaptureOrderError, match=r"without an admitted intent; call begin_call"):
        live(s.refuse_call("c3"))
    with pytest.raises(ValueError, match="different data"):
        live(s.ledger_record(_commit("c1", variant=1)))
    manifest = live(s.read_manifest())
    assert [r.model_call_id for r in manifest.records] == ["c1"]
    assert [(f.model_call_id, f.reason) for f in manifest.failures] == [
        ("c1", "conflicting_ledger_record")
    ]
    assert live(s.read_has_rows()) is True
    assert "c2" in s.refused_calls and not s.dangling_intents()


def test_event_wire_round_trip() -> None:
    live = Live()
    s = live.state
    live(s.put("c1", _payload(1)))
    live(s.begin_call("c2"))
    live(s.record_engine_refusal(EngineRefusalRecord(model_call_id="c2", code="x")))
    live(s.ledger_record(_commit("c3")))
    live(s.freeze("S"))
    line = encode_event(live.log[0])
    assert line.startswith(b'{"op":"put"') and line.endswith(b',"entry":{"n":1}}')
    put = decode_event(line)
    assert isinstance(put, Put) and put.entry_bytes == _payload(1)
    assert put.without_entry().entry_bytes == b""
    assert b"entry" not in encode_event(put.without_entry())
    via_json = RolloutState.replay("r", [decode_event(encode_event(e)) for e in live.log])
    via_dict = RolloutState.replay(
        "r", [event_from_builtins(event_to_builtins(e)) for e in live.log]
    )
    assert via_json == via_dict == s
    assert RolloutState.from_json(s.to_json()) == s
    with pytest.raises(ValueError, match="invalid capture event"):
        decode_event(b'{"op":"explode"}')


# --------------------------------------------------------------------------- property

CALLS = st.sampled_from(["c0", "c1", "c2"])
OPS = st.one_of(
    st.tuples(st.just("put"), CALLS, st.integers(0, 2)),
    st.tuples(st.just("mark"), CALLS),
    st.tuples(st.just("begin"), CALLS),
    st.tuples(st.just("refusal"), CALLS, st.sampled_from(["a", "b"])),
    st.tuples(st.just("freeze")),
    st.tuples(st.just("drop"), st.booleans()),
    st.tuples(st.just("retire")),
    st.tuples(st.just("delete")),
    st.tuples(st.just("record"), CALLS, st.integers(0, 1)),
    st.tuples(st.just("failure"), CALLS),
    st.tuples(st.just("close")),
    st.tuples(st.just("refuse"), CALLS),
)


def _decide(s: RolloutState, op: tuple[Any, ...], n: int) -> Transition[Any]:
    kind = op[0]
    if kind == "put":
        return s.put(op[1], _payload(op[2]))
    if kind == "mark":
        return s.mark_incomplete(op[1])
    if kind == "begin":
        return s.begin_call(op[1])
    if kind == "refusal":
        return s.record_engine_refusal(EngineRefusalRecord(model_call_id=op[1], code=op[2]))
    if kind == "freeze":
        return s.freeze(f"snap-{n}")
    if kind == "drop":
        return s.drop(s.snapshot_id, s.version if op[1] else s.version + 1)
    if kind == "retire":
        return s.retire()
    if kind == "delete":
        return s.delete()
    if kind == "record":
        return s.ledger_record(_commit(op[1], op[2]))
    if kind == "failure":
        return s.ledger_record_failure(op[1], "worker_capture_failed")
    if kind == "close":
        return s.close_admissions()
    return s.refuse_call(op[1])


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=40))
def test_replay_rebuilds_live_state_and_fence_holds(ops: list[tuple[Any, ...]]) -> None:
    live = Live()
    for n, op in enumerate(ops):
        before = live.state.copy()
        t = _decide(live.state, op, n)
        assert live.state == before, f"decision {op} mutated the state"
        try:
            result = live(t)
            ok = True
        except Exception:
            result, ok = None, False
        s = live.state
        if before.frozen or before.retired:
            # No sink write succeeds after freeze; marks only move the version.
            if op[0] in {"put", "begin", "refusal"}:
                assert not ok
            if op[0] != "mark" and op[0] not in {"retire", "delete", "drop"}:
                assert s.version == before.version
                assert s.snapshot_incomplete() == before.snapshot_incomplete()
                assert s.refusals == before.refusals
        if op[0] == "mark" and not before.retired:
            assert ok and s.version == before.version + 1 and s.snapshot_incomplete()
        if op[0] == "drop" and ok and result:
            assert s.retired and before.frozen
    replayed = RolloutState.replay("r", [decode_event(encode_event(e)) for e in live.log])
    assert replayed == live.state

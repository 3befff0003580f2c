"""MemoryStore specifics, the open_store registry and the protocol surface."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from zephon.capture import protocols as P
from zephon.capture.records import ParentResolutionStatus, TokenEntry
from zephon.capture.stores import STORE_SCHEMES, open_store, store_class
from zephon.capture.stores._memory import MemoryStore, drop_memory_backend
from zephon.capture.stores._state import RolloutState


def _entry(rid: str, cid: str, **kw: Any) -> TokenEntry:
    return TokenEntry.from_dict(
        {
            "rollout_id": rid,
            "model_call_id": cid,
            "prompt_token_ids": [1, 2],
            "generation_token_ids": [3],
            "generation_log_probs": [-0.5],
            "x_extra": {"z": 1, "a": [2.5e20]},
            **kw,
        }
    )


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_unknown_scheme_lists_the_known_ones() -> None:
    with pytest.raises(ValueError) as info:
        open_store("redis://x")
    for scheme in ("memory://", "file://", "sqlite://", "postgresql://", "postgres://"):
        assert scheme in str(info.value)
    with pytest.raises(ValueError, match=r"\(none\)"):
        open_store("/just/a/path")


def test_registry_maps_every_scheme_lazily() -> None:
    assert store_class("memory://a") is MemoryStore
    assert set(STORE_SCHEMES) == {"memory", "file", "sqlite", "postgresql", "postgres"}
    for target in STORE_SCHEMES.values():
        module, _, cls = target.partition(":")
        assert module.startswith("zephon.capture.stores._") and cls.endswith("Store")


def test_clients_share_a_named_backend_and_names_isolate() -> None:
    name = uuid.uuid4().hex
    a, b = open_store(f"memory://{name}"), open_store(f"memory://{name}/")
    other = open_store(f"memory://{name}-other")
    _run(a.put(_entry("r", "c1")))
    snap = _run(b.freeze("r"))
    assert [e.model_call_id for e in snap.entries] == ["c1"]
    assert not _run(other.freeze("r")).entries
    assert open_store("memory://").name == "default"
    drop_memory_backend(name)
    assert not _run(open_store(f"memory://{name}").freeze("r")).entries


def test_payload_round_trips_byte_for_byte_with_extras() -> None:
    store = MemoryStore(uuid.uuid4().hex)
    entry = _entry("r", "c1")
    _run(store.put(entry))
    (got,) = _run(store.freeze("r")).entries
    assert got.canonical_bytes() == entry.canonical_bytes()
    assert got.extra_fields == {"x_extra": {"z": 1, "a": [2.5e20]}}


def test_refreeze_is_served_from_cache_until_the_version_moves() -> None:
    store = MemoryStore(uuid.uuid4().hex)
    _run(store.put(_entry("r", "c1")))
    s1 = _run(store.freeze("r"))
    assert _run(store.freeze("r")) is s1
    _run(store.mark_incomplete("r", "c9"))
    s2 = _run(store.freeze("r"))
    assert s2 is not s1 and s2.version == s1.version + 1 and s2.incomplete


def test_persisted_events_replay_to_the_live_state() -> None:
    store = MemoryStore(uuid.uuid4().hex)
    _run(store.begin_call("r", "c1"))
    _run(store.put(_entry("r", "c1")))
    _run(store.record_engine_refusal("r", model_call_id="c2", code="x", parent_resolution="root"))
    _run(store.freeze("r"))
    _run(store.mark_incomplete("r"))
    assert RolloutState.replay("r", store.events_of("r")) == store.state_of("r")
    _run(store.delete("r"))
    assert store.events_of("r") == [] and store.state_of("r").is_empty()


def test_invalid_rollout_ids_are_refused_everywhere() -> None:
    store = MemoryStore(uuid.uuid4().hex)
    for call in (
        store.freeze("../x"),
        store.mark_incomplete("a b"),
        store.begin_call("", "c"),
        store.manifest("x/y"),
        store.put(_entry("r", "c").with_changes(rollout_id="bad id")),
    ):
        with pytest.raises(ValueError, match="rollout_id"):
            _run(call)
    with pytest.raises(ValueError, match="capture key"):
        _run(store.retire(["ok", "not ok"]))
    assert not store.state_of("ok").retired  # the batch was validated before any mutation


def test_close_is_idempotent_and_final() -> None:
    store = MemoryStore(uuid.uuid4().hex)
    _run(store.close())
    _run(store.close())
    with pytest.raises(RuntimeError, match="closed"):
        _run(store.freeze("r"))


def test_resolve_never_guesses() -> None:
    store = MemoryStore(uuid.uuid4().hex)
    _run(store.put(_entry("r", "c1")))
    root = _run(store.resolve("r", [{"role": "user", "content": "hi"}]))
    assert root.status is ParentResolutionStatus.ROOT and root.match is None
    res = _run(
        store.resolve(
            "r", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "?"}]
        )
    )
    assert res.status is ParentResolutionStatus.UNRESOLVED and res.match is None
    assert store.is_process_shared() is False


def test_memory_store_satisfies_every_protocol() -> None:
    store = MemoryStore(uuid.uuid4().hex)
    for proto in (
        P.TokenSink,
        P.TokenSource,
        P.LineageResolver,
        P.CaptureLedger,
        P.SupportsBeginCall,
        P.SupportsEngineRefusal,
        P.SupportsCloseAdmissions,
        P.SupportsRefuseCall,
    ):
        assert isinstance(store, proto), proto.__name__
    assert not isinstance(object(), P.SupportsBeginCall)


def test_error_hierarchy() -> None:
    assert issubclass(P.TokenCaptureRetiredError, P.TokenCaptureFrozenError)
    assert issubclass(P.TokenCaptureFrozenError, RuntimeError)
    assert issubclass(P.RolloutRetiredError, LookupError)
    assert issubclass(P.CaptureAdmissionRefused, ValueError)
    assert issubclass(P.CaptureHistoryUnrepresentable, ValueError)
    assert P.TokenCaptureRequestRefused is P.CaptureAdmissionRefused


def test_lineage_resolution_invariant() -> None:
    match = P.LineageMatch(model_call_id="c", cumulative_token_ids=(1,), digest="d")
    P.LineageResolution(ParentResolutionStatus.RESOLVED, match=match)
    with pytest.raises(ValueError, match="RESOLVED"):
        P.LineageResolution(ParentResolutionStatus.RESOLVED)
    with pytest.raises(ValueError, match="RESOLVED"):
        P.LineageResolution(ParentResolutionStatus.ROOT, match=match)


def test_memory_store_is_the_durable_store_over_memory() -> None:
    """Only the primitives are its own: the conformance suite run on it checks the surface
    the file, sqlite and postgres stores share."""
    from zephon.capture.stores import DurableStore

    assert issubclass(MemoryStore, DurableStore)
    surface = [
        name
        for name, value in vars(DurableStore).items()
        if callable(value) and not name.startswith("_") and name not in ("describe",)
    ]
    assert {"put", "freeze", "peek", "drop", "retire", "record", "resolve"} <= set(surface)
    own = sorted(name for name in surface if name in vars(MemoryStore))
    primitives = ["fetch_lineage", "freeze_rollout", "peek_rollout", "transact_rollout"]
    assert own == sorted([*primitives, "is_process_shared", "transact_stream"])

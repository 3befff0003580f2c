"""Every store refuses, at ``put``, an entry no reader could read back, with the same error.

A directly built ``TokenEntry`` is not type-checked, so these entries are what a library user
can hand a store. Each case is refused on every store kind with the memory store's exact
message, nothing of it is stored, and the rollout stays usable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import store_url
from tests.capture._workload import make_entry
from zephon.capture.protocols import CaptureStore
from zephon.capture.records import MAX_TOKEN_ID, TokenEntry
from zephon.capture.stores import open_store
from zephon.capture.testing import STORE_KINDS, durable_kinds

RID = "rules"


def _deep(levels: int) -> list[object]:
    node: list[object] = []
    for _ in range(levels):
        node = [node]
    return node


def _with(**changes: object) -> Callable[[TokenEntry], TokenEntry]:
    def change(entry: TokenEntry) -> TokenEntry:
        for name, value in changes.items():  # after construction: no __post_init__ checks
            setattr(entry, name, value)
        return entry

    return change


POISON: dict[str, Callable[[TokenEntry], TokenEntry]] = {
    "float_prompt_id": lambda e: _with(prompt_token_ids=[1.0, *e.prompt_token_ids[1:]])(e),
    "bool_prompt_id": lambda e: _with(prompt_token_ids=[True, *e.prompt_token_ids[1:]])(e),
    "float_generation_id": lambda e: _with(
        generation_token_ids=[*e.generation_token_ids[:-1], 7.0]
    )(e),
    "bool_generation_id": lambda e: _with(
        generation_token_ids=[False, *e.generation_token_ids[1:]]
    )(e),
    "negative_id": lambda e: _with(prompt_token_ids=[-1, *e.prompt_token_ids[1:]])(e),
    "id_beyond_int64": lambda e: _with(prompt_token_ids=[MAX_TOKEN_ID + 1])(e),
    "id_beyond_uint64": lambda e: _with(prompt_token_ids=[2**64])(e),
    "string_id": lambda e: _with(prompt_token_ids=["5"])(e),
    "log_probs_shorter": lambda e: _with(generation_log_probs=e.generation_log_probs[:-1])(e),
    "cum_len_wrong": _with(cum_len=3),
    "token_item_index_out_of_range": _with(token_item_index=5),
    "nul_call_id": _with(model_call_id="c\x00d"),
    "long_call_id": _with(model_call_id="c" * 10_000),
    "surrogate_call_id": _with(model_call_id="c\udc80"),
    "nul_parent_call_id": _with(parent_call_id="p\x00"),
    "deep_output_items": lambda e: _with(output_items=[{"x": _deep(2_000)}])(e),
    "positive_log_prob": lambda e: _with(generation_log_probs=[5.0, *e.generation_log_probs[1:]])(
        e
    ),
    "routed_experts_not_a_list": _with(routed_experts={"layer0": [1, 2]}),
    "routed_experts_a_string": _with(routed_experts="1,2"),
}


async def _refusal(store: CaptureStore, case: str) -> str:
    entry = POISON[case](make_entry(RID, f"bad-{case}"[:40]))
    with pytest.raises(ValueError) as info:
        await store.put(entry)
    return str(info.value)


def _expected(case: str) -> str:
    async def go() -> str:
        store = open_store("memory://rules-reference")
        try:
            return await _refusal(store, case)
        finally:
            await store.close()

    return asyncio.run(go())


@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
def test_poison_puts_are_refused_alike_and_store_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    expected = {case: _expected(case) for case in POISON}

    async def go() -> None:
        store = open_store(url)
        try:
            for case in POISON:
                assert await _refusal(store, case) == expected[case], case
            good = make_entry(RID, "good")
            await store.put(good)
            snap = await store.peek(RID)
            assert [e.model_call_id for e in snap.entries] == ["good"]
            assert not snap.incomplete
            snap = await store.freeze(RID)
            assert [e.to_dict() for e in snap.entries] == [good.to_dict()]
        finally:
            await store.close()

    asyncio.run(go())


def test_refusals_name_the_field() -> None:
    for case, field in [
        ("float_prompt_id", "prompt_token_ids[0]"),
        ("bool_generation_id", "generation_token_ids[0]"),
        ("negative_id", "prompt_token_ids[0]"),
        ("id_beyond_int64", "prompt_token_ids[0]"),
        ("cum_len_wrong", "cum_len"),
        ("nul_call_id", "model_call_id"),
        ("long_call_id", "at most 256"),
        ("nul_parent_call_id", "parent_call_id"),
        ("deep_output_items", "nested too deeply"),
        ("positive_log_prob", "generation_log_probs[0] is 5.0"),
        ("routed_experts_not_a_list", "routed_experts is a dict"),
        ("routed_experts_a_string", "routed_experts is a str"),
    ]:
        assert field in _expected(case), (case, _expected(case))


@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
def test_call_ids_a_store_cannot_hold_are_refused_everywhere(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)

    async def go() -> None:
        store = open_store(url)
        try:
            for bad in ["c\x00", "x" * 257, "\ud800"]:
                with pytest.raises(ValueError, match=r"model_call_id .* is invalid"):
                    await store.begin_call(RID, bad)
                with pytest.raises(ValueError, match=r"model_call_id .* is invalid"):
                    await store.record_engine_refusal(RID, model_call_id=bad, code="http_400")
            longest = "x" * 256
            await store.begin_call(RID, longest)
            await store.put(make_entry(RID, longest))
            snap = await store.freeze(RID)
            assert [e.model_call_id for e in snap.entries] == [longest]
        finally:
            await store.close()

    asyncio.run(go())


def _poison_behind_put(store: object, entry: TokenEntry) -> None:
    """Write bytes no reader can decode through the store's own decision path, skipping
    ``put``'s rules (what an older release acknowledged, or a damaged payload)."""
    raw = entry.canonical_bytes().replace(b'"prompt_token_ids":[', b'"prompt_token_ids":[1.5,')
    asyncio.run(
        store._decide(entry.rollout_id, lambda s: s.put(entry.model_call_id, raw))  # type: ignore[attr-defined]
    )


@pytest.mark.parametrize("kind", durable_kinds())
def test_a_freeze_that_fails_does_not_fence(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    store = open_store(url)
    try:
        asyncio.run(store.put(make_entry(RID, "c1")))
        _poison_behind_put(store, make_entry(RID, "c2"))

        async def after() -> None:
            with pytest.raises(ValueError, match="Expected `int`, got `float`"):
                await store.freeze(RID)
            await store.put(make_entry(RID, "c3"))  # not fenced: the freeze did not happen
            manifest_reader = open_store(url)
            try:
                with pytest.raises(ValueError, match="Expected `int`, got `float`"):
                    await manifest_reader.freeze(RID)
                await manifest_reader.put(make_entry(RID, "c4"))
            finally:
                await manifest_reader.close()
            removal = await store.delete([RID])
            assert removal.changed == (RID,)
            await store.put(make_entry(RID, "c1"))
            snap = await store.freeze(RID)
            assert [e.model_call_id for e in snap.entries] == ["c1"]

        asyncio.run(after())
    finally:
        asyncio.run(store.close())

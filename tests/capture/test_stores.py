"""Clauses every store kind of the registry must honour the same way."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import store_url
from tests.capture._workload import make_entry
from zephon.capture.protocols import (
    CaptureAdmissionRefused,
    CaptureConflictError,
    CaptureStore,
    RolloutRetiredError,
)
from zephon.capture.records import CaptureLedgerCommit, ParentResolutionStatus
from zephon.capture.scores import RolloutScore
from zephon.capture.stores import open_store
from zephon.capture.testing import STORE_KINDS, sample_commit
from zephon.errors import ZephonError

UNRESOLVED = ParentResolutionStatus.UNRESOLVED


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
def test_non_finite_log_probs_are_refused_at_put(
    kind: str, bad: float, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)

    async def go() -> None:
        store = open_store(url)
        try:
            entry = make_entry("nan", "c1")
            lps = list(entry.generation_log_probs)
            lps[2] = bad
            with pytest.raises(ValueError, match=r"generation_log_probs\[2\] is .*finite"):
                await store.put(entry.with_changes(generation_log_probs=lps))
            await store.put(make_entry("nan", "c2"))
            snap = await store.freeze("nan")  # the rollout stays readable
            assert [e.model_call_id for e in snap.entries] == ["c2"]
        finally:
            await store.close()

    asyncio.run(go())


@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
def test_a_conflicting_re_put_is_a_capture_conflict_error_that_poisons_durably(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    first = make_entry("dup", "c1")
    score = RolloutScore(rollout_id="dup", verifier="math", reward=1.0)

    async def go() -> None:
        store = open_store(url)
        try:
            await store.put(first)
            await store.put(first)  # an identical retry is a no-op
            with pytest.raises(CaptureConflictError, match="'c1' was already put with differ"):
                await store.put(first.with_changes(created_at=first.created_at + 1))
            await store.put_score(score)
            with pytest.raises(CaptureConflictError, match="already has a different score"):
                await store.put_score(RolloutScore(rollout_id="dup", verifier="math", reward=0.0))
        finally:
            await store.close()
        reader = open_store(url)
        try:
            snap = await reader.freeze("dup")  # the first write stands, the conflict is kept
            assert snap.incomplete and snap.entries == (first,)
            assert [s.reward for s in await reader.scores("dup")] == [1.0]
        finally:
            await reader.close()

    asyncio.run(go())
    assert issubclass(CaptureConflictError, ZephonError) and issubclass(
        CaptureConflictError, ValueError
    )


def _commit(rid: str, call_id: str, request: list[dict[str, Any]]) -> CaptureLedgerCommit:
    answer = [{"role": "assistant", "content": "4"}]
    return sample_commit(
        rid, call_id, request_items=request, response_items=answer, resolvable=True
    )


@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
def test_ledger_records_take_part_in_parent_resolution(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    ask = [{"role": "user", "content": "2+2?"}]

    async def go() -> None:
        writer, reader = open_store(url), open_store(url)
        try:
            commit = _commit("led", "s1", ask)
            await writer.record(commit)
            follow = [*ask, *commit.response_items, {"role": "user", "content": "and 3+3?"}]
            res = await reader.resolve("led", follow)
            assert res.status is ParentResolutionStatus.RESOLVED, res
            assert res.match is not None and res.match.model_call_id == "s1"
            assert res.match.staging_chain == commit.staging_chain
            assert (res.match.prev_len, res.match.chain_hash) == (4, "3" * 64)
            assert res.match.cumulative_token_ids == ()
            rewritten = [{"role": "user", "content": "2+3?"}, *follow[1:]]
            assert (await reader.resolve("led", rewritten)).status is UNRESOLVED
            await writer.record(_commit("led", "s2", ask))  # same fingerprint: never a guess
            assert (await reader.resolve("led", follow)).status is UNRESOLVED
        finally:
            await writer.close()
            await reader.close()

    asyncio.run(go())


@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
def test_the_admission_cut_refuses_calls_without_an_intent(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    ask = [{"role": "user", "content": "hi"}]

    async def go() -> None:
        store = open_store(url)
        try:
            await store.begin_call("cut", "admitted")
            await store.close_admissions("cut")
            with pytest.raises(CaptureAdmissionRefused, match=r"'stray'.*no intent"):
                await store.put(make_entry("cut", "stray"))
            with pytest.raises(CaptureAdmissionRefused, match=r"'stray'.*no intent"):
                await store.record(_commit("cut", "stray", ask))
            await store.record(_commit("cut", "admitted", ask))  # admitted before the cut
            await store.put(make_entry("cut", "admitted"))
            manifest = await store.manifest("cut")
            assert [r["model_call_id"] for r in manifest["records"]] == ["admitted"]
            snap = await store.freeze("cut")
            assert [e.model_call_id for e in snap.entries] == ["admitted"]
            assert not snap.incomplete
        finally:
            await store.close()

    asyncio.run(go())


@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
def test_peek_reads_without_freezing_and_never_creates(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)

    async def go() -> None:
        store = open_store(url)
        assert isinstance(store, CaptureStore)
        try:
            with pytest.raises(LookupError, match="no rollout 'nobody'"):
                await store.peek("nobody")
            await store.begin_call("p", "c1")
            await store.put(make_entry("p", "c1"))
            await store.begin_call("p", "c2")
            seen = await store.peek("p")
            assert [e.model_call_id for e in seen.entries] == ["c1"]
            assert seen.snapshot_id == "" and seen.incomplete  # c2 is still in flight
            await store.put(make_entry("p", "c2"))  # not fenced by the look
            snap = await store.freeze("p")
            assert not snap.incomplete and len(snap.entries) == 2
            assert await store.peek("p") == snap
            await store.retire("p")
            with pytest.raises(RolloutRetiredError):
                await store.peek("p")
            assert (await store.delete("nobody")).changed == ()  # the look created nothing
        finally:
            await store.close()

    asyncio.run(go())


@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
def test_weight_versions_persist_and_an_entry_without_one_keeps_its_bytes(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    versioned = make_entry("wv", "c1").with_changes(weight_version=5)
    old_bytes = make_entry("wv", "c2").canonical_bytes()  # what a store held before the field
    assert b"weight_version" not in old_bytes

    async def go() -> None:
        writer = open_store(url)
        await writer.put(versioned)
        await writer.put(make_entry("wv", "c2"))
        with pytest.raises(CaptureConflictError):  # another version is another call
            await writer.put(versioned.with_changes(weight_version=6))
        bad = make_entry("wv2", "c1")
        bad.weight_version = -1  # set after construction: put validates it again
        with pytest.raises(ValueError, match="weight_version: -1 is not a version"):
            await writer.put(bad)
        await writer.close()
        reader = open_store(url)
        entries = {e.model_call_id: e for e in (await reader.freeze("wv")).entries}
        assert entries["c1"].weight_version == 5
        assert entries["c2"].weight_version is None
        assert entries["c2"].canonical_bytes() == old_bytes
        await reader.close()

    asyncio.run(go())

"""Rollout scores: validated like entries, one per verifier, durable with their rollout."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import store_url
from tests.capture._workload import make_entry
from zephon.capture.protocols import (
    CaptureOrderError,
    RolloutRetiredError,
    TokenCaptureRetiredError,
)
from zephon.capture.scores import RolloutScore
from zephon.capture.stores import open_store
from zephon.capture.testing import STORE_KINDS
from zephon.errors import ZephonError


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"reward": math.nan}, "reward is nan: a score must be finite"),
        ({"reward": -math.inf}, "reward is -inf"),
        ({"reward": True}, "reward is True: a score must be a finite number"),
        ({"reward": "1"}, "reward is '1'"),
        ({"verifier": ""}, "verifier '' is invalid"),
        ({"details": {"len": math.inf}}, r"details\['len'\] is inf"),
        ({"details": {"": 1.0}}, "details key '' is invalid"),
        ({"rollout_id": "a/b"}, "rollout_id 'a/b' is invalid"),
    ],
)
def test_invalid_scores_are_refused_naming_the_field(
    fields: dict[str, object], message: str
) -> None:
    base: dict[str, object] = {"rollout_id": "r", "verifier": "math", "reward": 1.0}
    with pytest.raises(ValueError, match=message):
        RolloutScore(**{**base, **fields})  # type: ignore[arg-type]


def test_canonical_bytes_are_sorted_and_make_ints_floats() -> None:
    score = RolloutScore(rollout_id="r", verifier="math", reward=1, details={"b": 2, "a": 0.5})
    assert score.canonical_bytes() == (
        b'{"details":{"a":0.5,"b":2.0},"reward":1.0,"rollout_id":"r","verifier":"math"}'
    )
    assert RolloutScore.from_json(score.canonical_bytes()) == RolloutScore(
        rollout_id="r", verifier="math", reward=1.0, details={"a": 0.5, "b": 2.0}
    )


@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
def test_scores_are_read_back_by_a_new_client_until_the_rollout_is_retired(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    score = RolloutScore(rollout_id="r1", verifier="math", reward=0.25, details={"steps": 3})

    async def go() -> None:
        writer = open_store(url)
        await writer.put(make_entry("r1", "c1"))
        snap = await writer.freeze("r1")
        await writer.put_score(score)  # scoring follows the freeze
        await writer.close()
        reader = open_store(url)
        assert await reader.scores("r1") == [score]
        assert await reader.drop("r1", snapshot_id=snap.snapshot_id, version=snap.version)
        with pytest.raises(RolloutRetiredError, match="cannot read its scores"):
            await reader.scores("r1")
        with pytest.raises(TokenCaptureRetiredError, match="score a rollout before retiring"):
            await reader.put_score(score)
        with pytest.raises(TypeError, match="needs a RolloutScore"):
            await reader.put_score({"reward": 1.0})  # type: ignore[arg-type]
        await reader.close()

    asyncio.run(go())


@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
def test_a_score_before_any_entry_is_refused_saying_to_put_the_entries_first(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    score = RolloutScore(rollout_id="r1", verifier="math", reward=0.25)

    async def go() -> None:
        store = open_store(url)
        with pytest.raises(CaptureOrderError) as caught:
            await store.put_score(score)
        assert isinstance(caught.value, ZephonError) and isinstance(caught.value, ValueError)
        assert str(caught.value) == (
            "rollout 'r1' has no captured entries: put its entries before the score by 'math'"
        )
        await store.put(make_entry("r1", "c1"))
        await store.put_score(score)  # in order, the same score is stored
        assert await store.scores("r1") == [score]
        await store.close()

    asyncio.run(go())


@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
def test_refusing_a_call_never_begun_is_refused_saying_to_begin_it_first(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)

    async def go() -> None:
        store = open_store(url)
        await store.put(make_entry("r2", "c1"))
        with pytest.raises(CaptureOrderError) as caught:
            await store.refuse_call("r2", "c9")
        assert str(caught.value) == (
            "rollout 'r2': refuse_call for 'c9' without an admitted intent; "
            "call begin_call('c9') first"
        )
        await store.begin_call("r2", "c9")
        await store.refuse_call("r2", "c9")  # in order, the refusal is recorded
        await store.close()

    asyncio.run(go())

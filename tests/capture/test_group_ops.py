"""Group operators: deterministic drops, each member left out filtered in the ledger."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import store_url
from tests.capture._stream_fill import issue, roll
from tests.capture._workload import make_entry
from zephon import Pipeline
from zephon.capture.group_ops import DifficultyPool, DropEqualRewards, KeepPerPrompt
from zephon.capture.ledger import PromptState
from zephon.capture.scores import RolloutScore
from zephon.capture.stores import open_store
from zephon.capture.streaming import StreamingCaptureSource
from zephon.errors import ConfigError, DataError

PROMPTS = 9


def _filled(url: str) -> dict[int, int]:
    """Issue and complete PROMPTS prompts; their pipeline ``i`` by position."""

    async def go() -> dict[int, int]:
        store = open_store(url)
        groups = await issue(store, "s", PROMPTS, version=0)
        for group in groups:
            await roll(store, "s", group)
        await store.close()
        return {g.position: g.payload["i"] for g in groups}

    return asyncio.run(go())


def _run(store: Any, k: int) -> list[tuple[int, list[int]]]:
    source = StreamingCaptureSource(
        store, "s", groups_per_step=2, max_staleness=100, prompts=PROMPTS
    )
    pipe = Pipeline(source).add_op(DropEqualRewards(store)).add_op(KeepPerPrompt(store, k))
    return [(r.payload["position"], [m["index"] for m in r.payload["members"]]) for r in pipe]


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_equal_groups_are_dropped_and_k_kept_with_reasons_in_the_ledger(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    i_of = _filled(url)
    store = open_store(url)
    try:
        got = _run(store, 1)
        signal = [p for p in range(PROMPTS) if i_of[p] % 3 != 0]
        assert got == [(p, [0]) for p in signal]
        assert _run(store, 1) == got  # a replay: the same groups, the same (no-op) filters
        ledger = asyncio.run(store.stream_ledger("s"))
    finally:
        asyncio.run(store.close())
    for row in ledger.prompts:
        states = [(m.state, m.reason) for m in row.members]
        if row.position in signal:
            assert states == [(PromptState.SCORED, ""), (PromptState.FILTERED, "keep 1 per prompt")]
        else:
            assert states == [(PromptState.FILTERED, "all rewards equal")] * 2


def test_keep_per_prompt_needs_a_positive_k() -> None:
    with pytest.raises(ConfigError, match="KeepPerPrompt k is 0"):
        KeepPerPrompt(open_store("memory://group-ops"), 0)


PASS = {0: [1.0, 1.0], 1: [0.0, 1.0], 2: [0.0, 0.0]}  # by i % 3: solved, half, failed


def _filled_by_pass_rate(url: str) -> dict[int, int]:
    """PROMPTS prompts whose members' 0/1 rewards give a mean of 1, 0.5 or 0 (by ``i % 3``)."""

    async def go() -> dict[int, int]:
        store = open_store(url)
        groups = await issue(store, "s", PROMPTS, version=0)
        for group in groups:
            for m in group.members:
                ref = [(group.position, m.index, m.attempt)]
                await store.put(make_entry(m.rollout_id, "call-0", prompt=8, gen=4))
                await store.advance("s", ref, "captured")
                reward = PASS[group.payload["i"] % 3][m.index]
                score = RolloutScore(rollout_id=m.rollout_id, verifier="pass", reward=reward)
                await store.put_score(score)
                await store.advance("s", ref, "scored")
        await store.close()
        return {g.position: g.payload["i"] for g in groups}

    return asyncio.run(go())


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_a_difficulty_pool_keeps_groups_in_its_band_and_files_the_others_with_the_mean(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    i_of = _filled_by_pass_rate(url)
    store = open_store(url)

    def run() -> list[int]:
        source = StreamingCaptureSource(
            store, "s", groups_per_step=2, max_staleness=100, prompts=PROMPTS
        )
        pipe = Pipeline(source).add_op(DifficultyPool(store, 0.5, 0.9))  # bounds included
        return [r.payload["position"] for r in pipe]

    try:
        got = run()
        assert got == [p for p in range(PROMPTS) if i_of[p] % 3 == 1]
        assert run() == got  # a replay: the same groups, the same (no-op) filters
        ledger = asyncio.run(store.stream_ledger("s"))
    finally:
        asyncio.run(store.close())
    reasons = {0: "mean reward 1 outside [0.5, 0.9]", 2: "mean reward 0 outside [0.5, 0.9]"}
    for row in ledger.prompts:
        kind_of = i_of[row.position] % 3
        states = [(m.state, m.reason) for m in row.members]
        if kind_of == 1:
            assert states == [(PromptState.SCORED, "")] * 2
        else:
            assert states == [(PromptState.FILTERED, reasons[kind_of])] * 2


def test_a_difficulty_pool_refuses_bad_bands_and_unscored_members() -> None:
    store = open_store("memory://difficulty")
    for low, high, match in [
        (0.8, 0.2, "low 0.8 is above high 0.2"),
        (float("nan"), 1, "low is nan"),
        (0, True, "high is True"),
    ]:
        with pytest.raises(ConfigError, match=match):
            DifficultyPool(store, low, high)
    pool = DifficultyPool(store, 0.0, 1.0)
    assert pool.config() == {"low": 0.0, "high": 1.0}
    group = {"stream": "s", "position": 3, "members": [{"index": 0, "reward": None}]}
    with pytest.raises(DataError, match="position 3 member 0 has no reward"):
        pool.decide(group)
    kept, reason, dropped = pool.decide(
        {"stream": "s", "position": 3, "members": [{"index": 0, "reward": 1.0}]}
    )
    assert (kept is not None, reason, dropped) == (True, "", [])


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_the_group_operators_are_builder_methods_that_take_a_store_url(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    i_of = _filled_by_pass_rate(url)
    source = StreamingCaptureSource(
        open_store(url), "s", groups_per_step=2, max_staleness=100, prompts=PROMPTS
    )
    pipe = (
        source.pipeline()
        .drop_equal_rewards(url)
        .difficulty_pool(url, 0.0, 0.5)
        .keep_per_prompt(url, 1)
    )
    got = [(r.payload["position"], [m["index"] for m in r.payload["members"]]) for r in pipe]
    assert got == [(p, [0]) for p in range(PROMPTS) if i_of[p] % 3 == 1]


def test_yaml_names_the_group_operators_and_they_refuse_records_that_are_not_groups(
    tmp_path: Path,
) -> None:
    from zephon.config import parse_config

    url = (tmp_path / "capture").as_uri()
    config = parse_config(
        {
            "datasets": [{"name": "web", "path": str(tmp_path / "web.jsonl")}],
            "operators": [
                {"op": "drop_equal_rewards", "store": url},
                {"op": "difficulty_pool", "store": url, "low": 0.2, "high": 0.8},
            ],
        }
    )
    assert [(o.name, o.params.get("low")) for o in config.operators] == [
        ("drop_equal_rewards", None),
        ("difficulty_pool", 0.2),
    ]
    (tmp_path / "web.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(DataError, match="drop_equal_rewards reads the group records"):
        list(config.build())
    with pytest.raises(ConfigError, match="store is a int, not a capture store"):
        Pipeline(StreamingCaptureSource(open_store(url), "s", groups_per_step=1, max_staleness=0))
        DropEqualRewards(7)

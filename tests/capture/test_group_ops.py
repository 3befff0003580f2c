"""Group operators: deterministic drops, each member left out filtered in the ledger."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import store_url
from tests.capture._stream_fill import issue, roll
from zephon import Pipeline
from zephon.capture.group_ops import DropEqualRewards, KeepPerPrompt
from zephon.capture.ledger import PromptState
from zephon.capture.stores import open_store
from zephon.capture.streaming import StreamingCaptureSource
from zephon.errors import ConfigError

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

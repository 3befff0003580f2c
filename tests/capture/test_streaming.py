"""StreamingCaptureSource: admitted groups served to a pipeline, replayable exactly."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import store_url
from tests.capture._rl_loop import GROUP
from tests.capture._stream_fill import issue, roll
from zephon import Pipeline
from zephon.capture.streaming import StreamingCaptureSource
from zephon.capture.stores import open_store
from zephon.errors import ConfigError

PROMPTS = 10


def _fill(url: str, stream: str, order: list[int]) -> None:
    """Issue PROMPTS prompts, then complete them in ``order`` (positions)."""

    async def go() -> None:
        store = open_store(url)
        groups = await issue(store, stream, PROMPTS, version=0)
        for p in order:
            await roll(store, stream, groups[p])
        await store.close()

    asyncio.run(go())


def _pipe(url: str, stream: str) -> Pipeline:
    source = StreamingCaptureSource(
        open_store(url), stream, groups_per_step=2, max_staleness=100, prompts=PROMPTS
    )
    return Pipeline(source)


def _key(record: Any) -> tuple[int, list[tuple[str, float, list[int]]]]:
    p = record.payload
    members = [(m["rollout_id"], m["reward"], m["input_ids"].tolist()) for m in p["members"]]
    return p["position"], members


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_stop_and_restore_at_any_point_equals_the_uninterrupted_stream(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    _fill(url, "s", [3, 0, 1, 2, 4, 5, 6, 7, 8, 9])
    whole = [_key(r) for r in _pipe(url, "s")]
    assert [p for p, _ in whole] == list(range(PROMPTS))
    assert all(len(members) == GROUP for _, members in whole)
    for stop in (1, 4, 7):
        pipe = _pipe(url, "s")
        it = iter(pipe)
        head = [_key(next(it)) for _ in range(stop)]
        state = pipe.checkpoint()
        restored = _pipe(url, "s").restore(state)
        assert head + [_key(r) for r in restored] == whole, stop


def test_a_too_long_stream_and_bad_options_are_refused() -> None:
    store = open_store("memory://streaming-options")
    with pytest.raises(ConfigError, match="admission log"):
        StreamingCaptureSource(store, "x" * 115, groups_per_step=1, max_staleness=0)
    with pytest.raises(ConfigError, match="groups_per_step is 0"):
        StreamingCaptureSource(store, "s", groups_per_step=0, max_staleness=0)
    with pytest.raises(TypeError, match="keeps no prompt ledger"):
        StreamingCaptureSource(object(), "s", groups_per_step=1, max_staleness=0)

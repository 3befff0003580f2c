"""Group operators over a streaming source give the same records, and file the same ledger
moves, inline, on threads and in worker processes, also across a checkpoint and restore."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.capture._pg import fresh_schema_url, pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import store_url
from tests.capture._stream_fill import fill
from zephon import Pipeline
from zephon.capture.stores import open_store
from zephon.capture.streaming import StreamingCaptureSource
from zephon.errors import ConfigError

PROMPTS = 9
RUNNERS = ("inline", "threads", "process")
pytestmark = pytest.mark.timeout(600)  # worker processes start slowly on a loaded machine


def _pipe(url: str, runner: str) -> Pipeline:
    source = StreamingCaptureSource(url, "s", groups_per_step=2, max_staleness=1, prompts=PROMPTS)
    pipe = source.pipeline().drop_equal_rewards(url).keep_per_prompt(url, 1)
    return pipe.difficulty_pool(url, 0.0, 0.5).options(runner=runner)


def _full(record: Any) -> Any:
    """Everything a record holds (arrays as lists), to compare records exactly."""
    group = dict(record.payload)
    group["members"] = [
        {k: v.tolist() if hasattr(v, "tolist") else v for k, v in m.items()}
        for m in group["members"]
    ]
    return group


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_every_runner_serves_and_files_the_same_groups_across_a_restore(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    outputs: dict[str, list[Any]] = {}
    counts: dict[str, dict[str, int]] = {}
    for runner in RUNNERS:
        if kind == "postgres":  # a fresh schema per runner
            url = fresh_schema_url(request.getfixturevalue("pg_dsn"))
        else:
            url = store_url(kind, tmp_path / runner, request)
        fill(url, PROMPTS)
        if runner == "inline":
            outputs[runner] = [_full(r) for r in _pipe(url, runner)]
        else:  # stop after two groups, restore in a fresh pipeline
            pipe = _pipe(url, runner)
            it = iter(pipe)
            head = [_full(next(it)) for _ in range(2)]
            state = pipe.checkpoint()
            outputs[runner] = head + [_full(r) for r in _pipe(url, runner).restore(state)]
        store = open_store(url)
        counts[runner] = asyncio.run(store.stream_ledger("s")).counts()
        asyncio.run(store.close())
    assert len(outputs["inline"]) >= 3
    assert outputs["threads"] == outputs["inline"]
    assert outputs["process"] == outputs["inline"]
    assert counts["threads"] == counts["process"] == counts["inline"]
    assert counts["inline"]["filtered"] > 0


def test_a_store_worker_processes_cannot_share_is_refused_naming_the_fix(tmp_path: Path) -> None:
    url = (tmp_path / "c").as_uri()
    fill(url, PROMPTS)
    store = open_store(url)
    given_object = StreamingCaptureSource(
        store, "s", groups_per_step=1, max_staleness=1, prompts=PROMPTS
    )
    with pytest.raises(ConfigError, match="pass the store's URL instead"):
        list(given_object.pipeline().drop_equal_rewards(url).options(runner="process"))
    asyncio.run(store.close())
    memory = "memory://runners"
    fill(memory, PROMPTS)
    in_memory = StreamingCaptureSource(
        memory, "s", groups_per_step=1, max_staleness=1, prompts=PROMPTS
    )
    with pytest.raises(ConfigError, match="lives in one process; use a file, sqlite"):
        list(in_memory.pipeline().options(runner="process"))

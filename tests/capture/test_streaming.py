"""StreamingCaptureSource: admitted groups served to a pipeline, replayable exactly."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import REPO, store_url
from tests.capture._rl_loop import GROUP
from tests.capture._stream_fill import issue, roll
from zephon import Pipeline
from zephon.capture.streaming import StreamingCaptureSource
from zephon.capture.stores import open_store
from zephon.errors import ConfigError

PROMPTS = 10
CONSUMER_TIMEOUT_S = 240  # one run takes a few seconds; generous for a loaded machine


def _fill(url: str, stream: str, order: list[int]) -> None:
    """Issue PROMPTS prompts, then complete them in ``order`` (positions)."""

    async def go() -> None:
        store = open_store(url)
        groups = await issue(store, stream, PROMPTS, version=0)
        for p in order:
            await roll(store, stream, groups[p])
        await store.close()

    asyncio.run(go())


def _pipe(store: Any, stream: str) -> Pipeline:
    source = StreamingCaptureSource(
        store, stream, groups_per_step=2, max_staleness=100, prompts=PROMPTS
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
    store = open_store(url)
    whole = [_key(r) for r in _pipe(store, "s")]
    assert [p for p, _ in whole] == list(range(PROMPTS))
    assert all(len(members) == GROUP for _, members in whole)
    for stop in (1, 4, 7):
        pipe = _pipe(store, "s")
        it = iter(pipe)
        head = [_key(next(it)) for _ in range(stop)]
        state = pipe.checkpoint()
        restored = _pipe(store, "s").restore(state)
        assert head + [_key(r) for r in restored] == whole, stop
    asyncio.run(store.close())


def test_a_too_long_stream_and_bad_options_are_refused() -> None:
    store = open_store("memory://streaming-options")
    with pytest.raises(ConfigError, match="admission log"):
        StreamingCaptureSource(store, "x" * 115, groups_per_step=1, max_staleness=0)
    with pytest.raises(ConfigError, match="groups_per_step is 0"):
        StreamingCaptureSource(store, "s", groups_per_step=0, max_staleness=0)
    with pytest.raises(TypeError, match="keeps no prompt ledger"):
        StreamingCaptureSource(object(), "s", groups_per_step=1, max_staleness=0)


def _consume(url: str, workdir: Path, kill: int, outside_after: int = 0) -> tuple[int, str]:
    """Run the consumer until it exits (or, with ``outside_after``, SIGKILL it after that
    many operations); its return code and output."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "src")]))
    cmd = [sys.executable, "-m", "tests.capture._stream_consumer", url, str(workdir)]
    proc = subprocess.Popen(
        [*cmd, str(kill), str(PROMPTS)], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if outside_after and len(lines) >= outside_after:
            proc.send_signal(signal.SIGKILL)
            break
    rest, _ = proc.communicate(timeout=CONSUMER_TIMEOUT_S)
    return proc.returncode, "".join(lines) + rest


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_a_sigkilled_trainer_resumes_and_every_admitted_group_is_delivered_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    _fill(url, "s", list(range(PROMPTS)))
    rng = random.Random(kind)
    kills = [1, 2, 3, 6, 9] + [rng.randrange(1, 2 * PROMPTS) for _ in range(3)]
    planned = len(kills)
    runs = 0
    while True:
        runs += 1
        assert runs <= planned + 1, "the consumer died without a planned kill"
        kill = kills.pop(0) if kills else 0
        outside = rng.randrange(1, 8) if runs % 2 == 0 and kill else 0
        rc, out = _consume(url, tmp_path, 0 if outside else kill, outside)
        if rc == 0:
            assert out.rstrip().endswith("done"), out
            break
        assert rc == -signal.SIGKILL, out
    model = json.loads((tmp_path / "model.json").read_text())
    assert model["delivered"] == list(range(PROMPTS))

    async def ledger_of() -> tuple[Any, Any]:
        store = open_store(url)
        try:
            return await store.stream_ledger("s"), await store.stream_ledger("s.admitted")
        finally:
            await store.close()

    ledger, log = asyncio.run(ledger_of())
    assert [row.payload["position"] for row in log.prompts] == list(range(PROMPTS))
    assert ledger.counts()["trained"] == GROUP * PROMPTS
    steps = [m.step for row in ledger.prompts for m in row.members]
    assert steps == [p // 2 for p in range(PROMPTS) for _ in range(GROUP)]

"""StreamingCaptureSource: admitted groups served to a pipeline, replayable exactly."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import REPO, rest_of_output, store_url
from tests.capture._rl_loop import GROUP, prompt_pipeline
from tests.capture._stream_fill import issue, roll
from tests.capture._workload import make_entry
from zephon import Pipeline
from zephon.capture.ledger import PromptState
from zephon.capture.rl import PromptSource
from zephon.capture.scores import RolloutScore
from zephon.capture.stores import open_store
from zephon.capture.streaming import StreamingCaptureSource
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


def _flushed(store: Any, stream: str) -> Pipeline:
    """Each group handed on as soon as it is admitted (no micro-batch holds it back)."""
    source = StreamingCaptureSource(
        store, stream, groups_per_step=2, max_staleness=100, prompts=PROMPTS
    )
    return source.pipeline()


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


@pytest.mark.parametrize("kind", ["memory", "file", "sqlite", "postgres"])
def test_admission_tails_moves_of_another_client_and_a_restore_replays_them_exactly(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The source reads only what changed since its last look, yet sees every move another
    client appended meanwhile; a restore on a fresh client replays the admissions exactly."""
    url = f"memory://tail-{kind}" if kind == "memory" else store_url(kind, tmp_path, request)

    async def complete(groups: list[Any], positions: list[int]) -> None:
        writer = open_store(url)
        for p in positions:
            await roll(writer, "s", groups[p])
        await writer.close()

    reader = open_store(url)
    writer = open_store(url)
    groups = asyncio.run(issue(writer, "s", PROMPTS, version=0))
    asyncio.run(writer.close())
    asyncio.run(complete(groups, [2, 0]))
    pipe = _flushed(reader, "s")
    it = iter(pipe)
    head = [_key(next(it)) for _ in range(2)]
    asyncio.run(complete(groups, [1, 5]))
    head.append(_key(next(it)))
    state = pipe.checkpoint()
    asyncio.run(complete(groups, [3, 4, 6, 7, 8, 9]))
    tail = [_key(r) for r in it]
    assert [p for p, _ in head] == [0, 2, 1]  # oldest first of what was complete
    assert sorted(p for p, _ in head + tail) == list(range(PROMPTS))  # each once
    fresh = open_store(url)
    assert [_key(r) for r in _flushed(fresh, "s").restore(state)] == tail
    for store in (reader, fresh):
        asyncio.run(store.close())


def test_timings_split_what_the_source_spent_on_the_ledger_the_engine_and_builds() -> None:
    url = "memory://timings"
    writer = open_store(url)
    groups = asyncio.run(issue(writer, "s", 2, version=0))
    source = StreamingCaptureSource(
        open_store(url), "s", groups_per_step=1, max_staleness=100, prompts=2
    )
    assert source.timings == {"ledger_s": 0.0, "engine_wait_s": 0.0, "build_s": 0.0}

    def engine() -> None:
        deadline = time.monotonic() + 120
        while source.timings["ledger_s"] == 0.0:  # the source looked and found nothing
            assert time.monotonic() < deadline
            time.sleep(0.001)  # polling a condition of the consumer thread
        for group in groups:
            asyncio.run(roll(writer, "s", group))

    thread = threading.Thread(target=engine)
    thread.start()
    served = [r.payload["position"] for r in source.pipeline()]
    thread.join(120)
    assert served == [0, 1]
    spent = source.timings
    assert spent["engine_wait_s"] > 0  # it waited for the groups (no complete one at first)
    assert spent["ledger_s"] > 0 and spent["build_s"] > 0


@pytest.mark.timeout(180)
@pytest.mark.parametrize("lanes", [1, 2])
def test_a_run_closed_while_the_source_waits_for_generation_closes_and_resumes_exactly(
    lanes: int,
) -> None:
    """Generation stalls after 4 groups; the trainer takes them and stops while the source
    thread waits for the 5th. Closing must not wait for generation (the source held the lock
    the close takes, for ever), and the checkpoint taken then resumes exactly."""
    url = f"memory://stall-{lanes}"
    writer = open_store(url)
    groups = asyncio.run(issue(writer, "s", PROMPTS, version=0))
    for group in groups[:4]:
        asyncio.run(roll(writer, "s", group))

    def pipe() -> tuple[StreamingCaptureSource, Pipeline]:
        source = StreamingCaptureSource(
            open_store(url), "s", groups_per_step=1, max_staleness=100, prompts=PROMPTS
        )
        return source, source.pipeline().options(canonical_replicas=lanes)

    source, first = pipe()
    items = iter(first)
    taken = [_key(next(items)) for _ in range(4)]
    deadline = time.monotonic() + 120
    while source.timings["engine_wait_s"] == 0.0:  # the source thread waits for group 5
        assert time.monotonic() < deadline
        time.sleep(0.001)  # polling a condition of the source thread
    assert [e["position"] for e in source.admissions] == [0, 1, 2, 3]  # read while it waits
    items.close()  # type: ignore[attr-defined]
    assert [t.name for t in threading.enumerate() if t.name.startswith("zephon-engine")] == []
    state = first.checkpoint()
    for group in groups[4:]:
        asyncio.run(roll(writer, "s", group))
    rest = [_key(r) for r in pipe()[1].restore(state)]
    whole = [_key(r) for r in pipe()[1]]
    assert [p for p, _ in whole] == list(range(PROMPTS))
    assert taken + rest == whole


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
    rest = rest_of_output(proc, timeout=CONSUMER_TIMEOUT_S)
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


STALE_K = 1
STEP_GROUPS = 2
SLOW_S = 0.4  # the generation time of a slow group (a workload, not a synchronisation)


async def _generate(url: str, trainer_version: list[int], prompts: int) -> None:
    """Issue prompts at the trainer's version, at most STEP_GROUPS * (version + k + 1) in all
    (the in-flight cap that keeps the bound reachable); every fourth group is slow."""

    async def rollout(group: Any) -> None:
        await asyncio.sleep(SLOW_S if group.position % 4 == 1 else 0.01)
        await roll(store, "s", group)

    store = open_store(url)
    source = await PromptSource.open(store, "s", prompt_pipeline(), n=GROUP)
    tasks = []
    while len(tasks) < prompts:
        version = trainer_version[0]
        if len(tasks) >= STEP_GROUPS * (version + STALE_K + 1):
            await asyncio.sleep(0.01)  # poll the trainer's version
            continue
        group = await source.next_group(weight_version=version)
        assert group is not None
        tasks.append(asyncio.create_task(rollout(group)))
    await asyncio.gather(*tasks)
    await store.close()


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_with_a_bound_of_k_no_trained_group_is_older_and_slow_ones_are_waited_for(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    prompts = 16
    trainer_version = [0]
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            asyncio.run(_generate(url, trainer_version, prompts))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=producer)
    thread.start()
    store = open_store(url)
    source = StreamingCaptureSource(
        store, "s", groups_per_step=STEP_GROUPS, max_staleness=STALE_K, prompts=prompts
    )
    delivered = []
    for n, record in enumerate(source.pipeline(), 1):
        group = record.payload
        refs = [(group["position"], m["index"], m["attempt"]) for m in group["members"]]
        asyncio.run(store.advance("s", refs, "trained", step=group["trained_version"]))
        delivered.append(group["position"])
        trainer_version[0] = n // STEP_GROUPS
    thread.join(CONSUMER_TIMEOUT_S)
    assert not errors and not thread.is_alive(), errors
    ledger = asyncio.run(store.stream_ledger("s"))
    asyncio.run(store.close())
    assert sorted(delivered) == list(range(prompts))
    assert ledger.counts()["trained"] == GROUP * prompts  # none filtered, slow ones included
    ages = [row.members[0].step - row.weight_version for row in ledger.prompts]
    assert max(ages) <= STALE_K, ages


def test_a_member_past_the_wall_clock_cap_is_filtered_and_its_group_served(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url("file", tmp_path, request)

    async def fill() -> None:
        store = open_store(url)
        groups = await issue(store, "s", 2, version=0)
        await roll(store, "s", groups[1])
        stuck = groups[0]  # member 1 never finishes generating
        first = stuck.members[0]
        await store.put(make_entry(first.rollout_id, "call-0", prompt=8, gen=4))
        for to in ("captured", "scored"):
            await store.advance("s", [(0, 0, first.attempt)], to)
        await store.put_score(RolloutScore(rollout_id=first.rollout_id, verifier="v", reward=1.0))
        await store.close()

    asyncio.run(fill())
    store = open_store(url)
    source = StreamingCaptureSource(
        store, "s", groups_per_step=1, max_staleness=0, prompts=2, cap_s=0.001
    )
    got = [
        (r.payload["position"], [m["index"] for m in r.payload["members"]])
        for r in source.pipeline()
    ]
    ledger = asyncio.run(store.stream_ledger("s"))
    asyncio.run(store.close())
    assert got == [(0, [0]), (1, [0, 1])]
    stuck = ledger.prompts[0].members[1]
    assert (stuck.state, stuck.reason) == (PromptState.FILTERED, "over the 0.001 s cap")

"""PromptSource: prompts from a pipeline, issued in the ledger, exactly once across SIGKILLs."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import REPO, store_url
from tests.capture._rl_loop import (
    GROUP,
    MAX_STALENESS,
    PROMPTS,
    STREAM,
    equal_rewards,
    prompt_pipeline,
)
from zephon.capture.ledger import PromptState
from zephon.capture.rl import PromptSource, view_stream
from zephon.capture.stores import open_store
from zephon.errors import ConfigError

LOOP_TIMEOUT_S = 240  # one run of the loop takes a few seconds; generous for a loaded machine


def _uninterrupted_keys() -> list[str]:
    return [".".join(map(str, r.meta.sample_id)) for r in prompt_pipeline()]  # type: ignore[union-attr]


async def _drain(source: PromptSource, limit: int) -> list[tuple[int, str, bool]]:
    out = []
    for _ in range(limit):
        group = await source.next_group()
        if group is None:
            break
        out.append((group.position, group.prompt_key, group.resumed))
    return out


def test_prompts_are_issued_in_pipeline_order_with_the_cursor() -> None:
    async def go() -> None:
        store = open_store("memory://rl-order")
        source = await PromptSource.open(store, "s", prompt_pipeline(), n=3)
        first = await source.next_group(weight_version=7)
        assert first is not None and first.position == 0
        got = [(0, first.prompt_key, False), *await _drain(source, PROMPTS + 5)]
        assert [k for _, k, _ in got] == _uninterrupted_keys()
        assert [p for p, _, _ in got] == list(range(PROMPTS))
        ledger = await store.stream_ledger("s")
        assert ledger.counts()["issued"] == 3 * PROMPTS
        assert ledger.cursor is not None
        assert {len(row.members) for row in ledger.prompts} == {3}
        assert [row.weight_version for row in ledger.prompts[:2]] == [7, -1]

    asyncio.run(go())


def test_restart_hands_out_owed_prompts_first_then_continues_the_pipeline() -> None:
    async def go() -> None:
        store = open_store("memory://rl-restart")
        first = await PromptSource.open(store, "s", prompt_pipeline(), n=2)
        groups = [await first.next_group() for _ in range(5)]
        assert all(g is not None for g in groups)
        g0, g1 = groups[0], groups[1]
        assert g0 is not None and g1 is not None
        # Prompt 0 finished; prompt 1 captured one member; 2-4 only issued.
        for to in ("captured", "scored"):
            await first.advance(g0.refs(), to)
        await first.advance(g0.refs(), "trained", step=1)
        await first.advance([(1, 0)], "captured")

        again = await PromptSource.open(store, "s", prompt_pipeline(), n=2)
        resumed = [await again.next_group() for _ in range(4)]
        assert [(g.position, g.resumed) for g in resumed if g] == [(p, True) for p in range(1, 5)]
        r1 = resumed[0]
        assert r1 is not None
        kept, fresh = r1.members
        assert kept.rollout_id == g1.members[0].rollout_id  # captured: resumed as it is
        assert (fresh.attempt, fresh.rollout_id) == (1, "s.p1.m1.a1")  # issued: new attempt
        assert fresh.started_at >= g1.members[1].started_at > 0  # its cap clock restarts
        rest = await _drain(again, PROMPTS)
        assert [p for p, _, _ in rest] == list(range(5, PROMPTS))
        assert [k for _, k, _ in rest] == _uninterrupted_keys()[5:]

    asyncio.run(go())


def test_a_batched_pipeline_and_a_store_without_ledger_are_refused() -> None:
    async def go() -> None:
        store = open_store("memory://rl-refuse")
        source = await PromptSource.open(store, "s", prompt_pipeline().batch(2), n=1)
        with pytest.raises(ConfigError, match=r"remove \.batch\(\)"):
            await source.next_group()
        with pytest.raises(TypeError, match="keeps no prompt ledger"):
            await PromptSource.open(object(), "s", prompt_pipeline())  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="n is 0"):
            await PromptSource.open(store, "s", prompt_pipeline(), n=0)
        await store.issue_prompt("by-hand", 0, prompt_key="k", payload=None)
        with pytest.raises(ConfigError, match="'by-hand' holds 1 prompts but no pipeline cursor"):
            await PromptSource.open(store, "by-hand", prompt_pipeline())

    asyncio.run(go())


def _run_loop(url: str, workdir: Path, kill: str, outside_after: int = 0) -> tuple[int, str]:
    """Run the loop once: it kills itself as ``kill`` plans, or (``outside_after`` > 0) this
    process sends it SIGKILL once it has started that many operations, wherever it then is."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "src")]))
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.capture._rl_loop", url, str(workdir), kill],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert child.stdout is not None
    last = ""
    started = 0
    for line in child.stdout:
        last = line.strip()
        started += last.startswith("op ")
        if outside_after and started == outside_after:
            child.kill()
    _, err = child.communicate(timeout=LOOP_TIMEOUT_S)
    return child.returncode, last if child.returncode == 0 else err


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_every_prompt_is_trained_exactly_once_across_sigkills(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    rng = random.Random(f"rl-sigkill-{kind}")
    # Every named gap once (between a step's ledger mark and its model save; mid-replay;
    # between generation and capture mark; ...), then random operations.
    planned = ["save:1", "replay:1", "captured:3", "scored:2", "filter:1", "put:4", "trained:2"]
    kills = 0
    for cycle in range(40):
        if cycle < len(planned):
            rc, out = _run_loop(url, tmp_path, planned[cycle])
        elif cycle % 2:
            rc, out = _run_loop(url, tmp_path, str(rng.randint(1, 30)))
        else:
            rc, out = _run_loop(url, tmp_path, "0", outside_after=rng.randint(1, 30))
        if rc == 0:
            assert out == "done"
            break
        assert rc == -9, out  # only a SIGKILL may stop it
        kills += 1
    else:
        pytest.fail("the loop never finished in 40 cycles")
    print(f"{kind}: {kills} SIGKILLs before the loop finished")

    model = json.loads((tmp_path / "model.json").read_text())
    trained = Counter(tuple(ref) for ref in model["trained"])
    assert max(trained.values()) == 1  # none trained twice

    async def read() -> None:
        store = open_store(url)
        ledger = await store.stream_ledger(STREAM)
        await store.close()
        keys = [row.prompt_key for row in ledger.prompts]
        assert keys == _uninterrupted_keys()  # every prompt issued once, none skipped
        for row in ledger.prompts:
            states = {m.state for m in row.members}
            refs = {(row.position, m.index) for m in row.members}
            assert len(row.members) == GROUP
            if equal_rewards(row.payload["i"]):
                assert states == {PromptState.FILTERED}
                assert not refs & set(trained)
            else:
                assert states == {PromptState.TRAINED}
                assert refs <= set(trained)  # trained, and in the model
                # Trained at step S with the weights of version S - 1: within the bound.
                staleness = max(m.step - 1 for m in row.members) - row.weight_version
                assert 0 <= staleness <= MAX_STALENESS
        steps = sorted({m.step for row in ledger.prompts for m in row.members if m.step >= 0})
        assert steps == list(range(1, model["step"] + 1))  # no step lost or repeated

    asyncio.run(read())
    assert len(trained) == GROUP * sum(not equal_rewards(i) for i in range(PROMPTS))
    assert kills >= len(planned)  # each planned kill point was reached


def test_a_paced_backfill_never_issues_more_than_the_staleness_bound_can_admit() -> None:
    async def go() -> None:
        store = open_store("memory://rl-pace")
        source = await PromptSource.open(store, "s", prompt_pipeline(), n=GROUP)
        first = await source.backfill(10, weight_version=0, pace=(2, 1))
        assert [g.position for g in first] == [0, 1, 2, 3]  # 2 * (0 + 1 + 1) groups
        assert await source.backfill(10, weight_version=0, pace=(2, 1)) == []
        await source.advance(first[1].refs(), "filtered", reason="all rewards equal")
        again = await source.backfill(10, weight_version=0, pace=(2, 1))
        assert [g.position for g in again] == [4]  # a wholly filtered group frees its slot
        await source.advance([(2, 0)], "filtered", reason="over the cap")  # half: no slot
        assert await source.backfill(10, weight_version=0, pace=(2, 1)) == []
        later = await source.backfill(10, weight_version=1, pace=(2, 1))
        assert [g.position for g in later] == [5, 6]
        unpaced = await source.backfill(10, weight_version=1)
        assert len(unpaced) == 10 - 6  # in flight: 7 issued, 1 filtered
        await store.close()

    asyncio.run(go())


class _ProtocolOnly:
    """A prompt ledger with only the protocol's methods (no ``read_stream``), as a third
    party's store may be."""

    def __init__(self, store: Any) -> None:
        self._store = store

    async def issue_prompt(self, stream: str, position: int, **kw: Any) -> Any:
        return await self._store.issue_prompt(stream, position, **kw)

    async def advance(self, stream: str, refs: Any, to: Any, **kw: Any) -> bool:
        return bool(await self._store.advance(stream, refs, to, **kw))

    async def reissue(self, stream: str, ref: Any, attempt: int, **kw: Any) -> Any:
        return await self._store.reissue(stream, ref, attempt, **kw)

    async def stream_ledger(self, stream: str) -> Any:
        return await self._store.stream_ledger(stream)


def test_view_stream_reads_a_copy_from_a_store_without_read_stream() -> None:
    async def go() -> None:
        store = open_store("memory://rl-view")
        plain = _ProtocolOnly(store)
        source = await PromptSource.open(plain, "s", prompt_pipeline(), n=GROUP)
        groups = await source.backfill(5, weight_version=0, pace=(2, 1))
        assert [g.position for g in groups] == [0, 1, 2, 3]
        await source.advance(groups[0].refs(), "filtered", reason="r")

        def view(led: Any) -> tuple[list[int], int]:
            return [row.position for row in led.pending()], led.unfiltered

        assert await view_stream(plain, "s", view) == ([1, 2, 3], 3)
        assert await view_stream(store, "s", view) == ([1, 2, 3], 3)
        await store.close()

    asyncio.run(go())

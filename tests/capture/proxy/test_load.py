"""Load over loopback: many concurrent rollouts against two proxy worker processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.capture.proxy._harness import (
    RolloutRun,
    chat_rollout,
    responses_rollout,
    verify_rollout,
)
from tests.capture.proxy._procs import Proc, start_inference_stub, start_proxy, wait_for_workers
from zephon.capture.records import TokenCaptureSnapshot
from zephon.capture.stores import open_store


async def _freeze_all(url: str, rids: list[str]) -> list[TokenCaptureSnapshot]:
    store = open_store(url)
    try:
        return list(await asyncio.gather(*(store.freeze(r) for r in rids)))
    finally:
        await store.close()


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=128))


@pytest.mark.timeout(90)
def test_64_rollouts_x_8_turns_on_two_workers_lose_nothing(
    tokenizer: Path, logs: Path, tmp_path: Path
) -> None:
    engine = start_inference_stub(tokenizer, logs)
    url = f"file://{tmp_path / 'capture'}"
    proxy = start_proxy(engine.url, url, logs, "--workers", "2")
    wait_for_workers(proxy, 2)
    rids = [f"load-{i:02d}" for i in range(64)]

    async def drive() -> list[RolloutRun]:
        async with _client() as client:
            return list(
                await asyncio.gather(*(chat_rollout(client, proxy.url, r, 8) for r in rids))
            )

    try:
        runs = asyncio.run(drive())
    finally:
        proxy.stop()
        engine.stop()
    assert "Traceback" not in proxy.log.read_text(), proxy.log.read_text()[-3000:]
    assert sum(len(r.turns) for r in runs) == 64 * 8
    assert len(set().union(*(r.workers for r in runs))) == 2  # both workers served
    snaps = asyncio.run(_freeze_all(url, rids))
    call_ids = [e.model_call_id for s in snaps for e in s.entries]
    assert len(call_ids) == len(set(call_ids)) == 64 * 8  # none lost, none duplicated
    for snap, run in zip(snaps, runs):
        verify_rollout(snap, run)  # every continuation resolved; exact tokens


@pytest.mark.timeout(90)
def test_engine_killed_mid_run_masks_only_the_affected_rollouts(
    tokenizer: Path, logs: Path, tmp_path: Path
) -> None:
    engine: Proc = start_inference_stub(tokenizer, logs)
    url = f"file://{tmp_path / 'capture'}"
    proxy = start_proxy(
        engine.url, url, logs, "--workers", "2", "--connect-timeout", "2", "--connect-retry", "0.5"
    )
    done_before = [f"before-{i:02d}" for i in range(16)]
    during = [f"during-{i:02d}" for i in range(32)]
    answered = 0

    def count() -> None:
        nonlocal answered
        answered += 1
        if answered == 48:
            engine.kill()  # SIGKILL: calls in flight lose their connection

    async def drive() -> tuple[list[RolloutRun], list[RolloutRun]]:
        async with _client() as client:
            first = await asyncio.gather(
                *(chat_rollout(client, proxy.url, r, 8) for r in done_before)
            )
            second = await asyncio.gather(
                *(chat_rollout(client, proxy.url, r, 8, on_turn=count) for r in during)
            )
            return list(first), list(second)

    try:
        intact, affected = asyncio.run(drive())
    finally:
        proxy.stop()
        engine.stop()
    assert engine.popen.returncode == -9
    for snap, run in zip(asyncio.run(_freeze_all(url, done_before)), intact):
        verify_rollout(snap, run)
    hit = 0
    for snap, run in zip(asyncio.run(_freeze_all(url, during)), affected):
        if not run.failures:
            verify_rollout(snap, run)
            continue
        hit += 1
        codes = {s for s, _ in run.failures}
        assert codes <= {502, 503, 504}, run.failures
        if codes == {503}:  # refused at connect: nothing was sent, so nothing is masked
            assert not snap.incomplete, run.rollout_id
            assert [r.code for r in snap.engine_refusals] == ["engine_unreachable"]
        else:  # the call was at the engine when it died: it may have generated
            assert snap.incomplete, run.rollout_id
        # Every call acknowledged before the kill is still there, nothing else.
        assert {e.model_call_id for e in snap.entries} == {t.call_id for t in run.turns}
    assert hit >= 16


@pytest.mark.timeout(90)
def test_two_workers_share_a_postgres_store(tokenizer: Path, logs: Path, pg_url: str) -> None:
    engine = start_inference_stub(tokenizer, logs)
    proxy = start_proxy(engine.url, pg_url, logs, "--workers", "2")
    rids = [f"pg-{i:02d}" for i in range(12)]

    async def drive() -> list[RolloutRun]:
        async with _client() as client:
            chats = [chat_rollout(client, proxy.url, r, 5) for r in rids[:6]]
            resps = [responses_rollout(client, proxy.url, r, 5) for r in rids[6:]]
            return list(await asyncio.gather(*chats, *resps))

    try:
        runs = asyncio.run(drive())
    finally:
        proxy.stop()
        engine.stop()
    for snap, run in zip(asyncio.run(_freeze_all(pg_url, rids)), runs):
        verify_rollout(snap, run)

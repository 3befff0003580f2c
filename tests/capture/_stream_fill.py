"""Fill a prompt-ledger stream for the streaming-source tests: issue, generate, score."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.capture._rl_loop import GROUP, prompt_pipeline
from tests.capture._workload import make_entry
from zephon.capture.rl import PromptGroup, PromptSource
from zephon.capture.scores import RolloutScore
from zephon.capture.stores import open_store

__all__ = ["fill", "issue", "reward_of", "roll"]


def reward_of(i: int, index: int) -> float:
    """Every third prompt's group is all-equal; the others differ by member."""
    return 1.0 if i % 3 == 0 else float(index)


async def issue(store: Any, stream: str, count: int, version: int = -1) -> list[PromptGroup]:
    source = await PromptSource.open(store, stream, prompt_pipeline(), n=GROUP)
    out = []
    for _ in range(count):
        group = await source.next_group(weight_version=version)
        assert group is not None
        out.append(group)
    return out


async def roll(store: Any, stream: str, group: PromptGroup) -> None:
    """Generate (one entry), capture and score every member of ``group``."""
    for m in group.members:
        ref = [(group.position, m.index, m.attempt)]
        await store.put(make_entry(m.rollout_id, "call-0", prompt=8, gen=4))
        await store.advance(stream, ref, "captured")
        reward = reward_of(group.payload["i"], m.index)
        await store.put_score(RolloutScore(rollout_id=m.rollout_id, verifier="sum", reward=reward))
        await store.advance(stream, ref, "scored")


def fill(url: str, prompts: int, stream: str = "s") -> None:
    """Issue ``prompts`` groups at version 0 in ``stream`` of the store at ``url``, and
    generate, capture and score every member (a client of its own, closed after)."""

    async def go() -> None:
        store = open_store(url)
        for group in await issue(store, stream, prompts, version=0):
            await roll(store, stream, group)
        await store.close()

    asyncio.run(go())

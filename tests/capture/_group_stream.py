"""A prompt-ledger stream of complete, scored groups in a file store, for operator checks."""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile

from tests.capture._stream_fill import issue
from tests.capture._workload import make_entry
from zephon.capture.scores import RolloutScore
from zephon.capture.stores import open_store

__all__ = ["filled_stream_url"]

REWARDS = {0: [1.0, 1.0], 1: [0.0, 1.0], 2: [1.0, 0.0]}  # by i % 3: means 1, 0.5, 0.5


def filled_stream_url(prompts: int = 24) -> str:
    """A new file store whose stream ``s`` holds ``prompts`` scored groups of two members."""
    directory = tempfile.mkdtemp(prefix="zephon-groups-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    url = "file://" + directory

    async def go() -> None:
        store = open_store(url)
        for group in await issue(store, "s", prompts, version=0):
            for m in group.members:
                ref = [(group.position, m.index, m.attempt)]
                await store.put(make_entry(m.rollout_id, "call-0", prompt=8, gen=4))
                await store.advance("s", ref, "captured")
                reward = REWARDS[group.payload["i"] % 3][m.index]
                score = RolloutScore(rollout_id=m.rollout_id, verifier="pass", reward=reward)
                await store.put_score(score)
                await store.advance("s", ref, "scored")
        await store.close()

    asyncio.run(go())
    return url

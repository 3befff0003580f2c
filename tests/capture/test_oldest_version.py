"""The streaming source's staleness bound counts from the oldest weights in a group's rollouts."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import store_url
from tests.capture._stream_fill import issue, roll
from tests.capture._workload import make_entry
from zephon.capture._oldest_version import OldestVersions
from zephon.capture.ledger import StreamLedger
from zephon.capture.rl import PromptGroup
from zephon.capture.scores import RolloutScore
from zephon.capture.stores import open_store
from zephon.capture.streaming import StreamingCaptureSource

CONSUMER_TIMEOUT_S = 240


async def _lagging_member(store: Any, group: PromptGroup, index: int) -> None:
    """Member ``index`` of ``group``: two calls, under weights 0 then 2 (a partial rollout
    the engine started before it loaded the trainer's version 2), captured and scored."""
    m = group.members[index]
    first = make_entry(m.rollout_id, "call-0", prompt=8, gen=4).with_changes(weight_version=0)
    prompt = [*first.prompt_token_ids, *first.generation_token_ids, 9]
    second = make_entry(m.rollout_id, "call-1", prompt=len(prompt), gen=3).with_changes(
        prompt_token_ids=prompt,
        weight_version=2,
        parent_call_id="call-0",
        parent_resolution="resolved",
    )
    for entry in (first, second):
        await store.put(entry)
    ref = [(group.position, m.index, m.attempt)]
    await store.advance("s", ref, "captured")
    await store.put_score(RolloutScore(rollout_id=m.rollout_id, verifier="sum", reward=0.0))
    await store.advance("s", ref, "scored")


def test_a_group_with_older_tokens_is_waited_for_at_its_oldest_version(tmp_path: Path) -> None:
    async def go() -> None:
        store = open_store((tmp_path / "c").as_uri())
        groups = await issue(store, "s", 2, version=2)
        await _lagging_member(store, groups[0], 0)  # member 1 of prompt 0 still generating
        await roll(store, "s", groups[1])
        ledger = await store.stream_ledger("s")
        assert [g.position for g in ledger.admit(2, 1, 8).groups] == [1]  # by issue version
        view = StreamLedger(stream="s", prompts=await OldestVersions(store).rows(ledger.pending()))
        assert [r.weight_version for r in view.prompts] == [0, 2]
        admission = view.admit(2, 1, 8)
        assert admission.groups == () and admission.wait_for is not None
        assert admission.wait_for.position == 0  # its version-0 tokens reached the bound
        await store.close()

    asyncio.run(go())


@pytest.mark.parametrize("kind", ["memory", "file", "sqlite", "postgres"])
def test_the_streaming_source_serves_partial_rollouts_oldest_first_with_segments(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    store = open_store(url)
    groups = asyncio.run(issue(store, "s", 2, version=2))
    asyncio.run(_lagging_member(store, groups[0], 0))
    asyncio.run(roll(store, "s", groups[1]))
    start = threading.Event()

    def finish_prompt_0() -> None:  # the slow member ends once the trainer is reading
        start.wait(CONSUMER_TIMEOUT_S)
        asyncio.run(_lagging_member(store_two, groups[0], 1))

    store_two = open_store(url) if kind != "memory" else store
    thread = threading.Thread(target=finish_prompt_0)
    thread.start()
    source = StreamingCaptureSource(
        store, "s", groups_per_step=1, max_staleness=1, prompts=2, first_version=2
    )
    pipe = source.pipeline()
    start.set()
    records = [r.payload for r in pipe]
    thread.join(CONSUMER_TIMEOUT_S)
    assert [r["position"] for r in records] == [0, 1]  # waited for the older group
    assert [(r["weight_version"], r["oldest_version"]) for r in records] == [(2, 0), (2, 2)]
    lagging = records[0]["members"][0]
    segments = lagging["version_segments"]
    assert segments == [[8, 12, 0], [13, len(lagging["input_ids"]), 2]]  # 12: the new prompt token
    assert lagging["behaviour_logprobs"].tolist() == lagging["logprobs"].tolist()
    assert "version_segments" not in records[1]["members"][0]  # captured without versions
    if store_two is not store:
        asyncio.run(store_two.close())
    asyncio.run(store.close())

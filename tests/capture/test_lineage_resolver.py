"""The incremental resolver of every store: sees every returned put from any client, reads
only what is new, and rebuilds when the rollout's entries were retired or replaced."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import store_url
from zephon.capture.lineage import stamp_continuation
from zephon.capture.records import ParentResolutionStatus, TokenEntry, compute_digest
from zephon.capture.stores import open_store
from zephon.capture.testing import STORE_KINDS


def turn_entry(rid: str, k: int, request: list[dict[str, Any]], parent: str | None) -> TokenEntry:
    prompt = list(range(1, 3 + 4 * k))
    gen = [1000 + k]
    full = prompt + gen
    entry = TokenEntry(
        rollout_id=rid,
        model_call_id=f"c{k}",
        prompt_token_ids=prompt,
        generation_token_ids=gen,
        generation_log_probs=[-0.5],
        output_items=[{"role": "assistant", "content": f"answer {k}"}],
        parent_call_id=parent,
        parent_resolution=ParentResolutionStatus.RESOLVED
        if parent
        else ParentResolutionStatus.ROOT,
        cum_len=len(full),
        digest=compute_digest(full),
    )
    return stamp_continuation(entry, request)


@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
@pytest.mark.timeout(60)
def test_incremental_cross_client_resolution(kind: str, tmp_path: Path, request: Any) -> None:
    url = store_url(kind, tmp_path, request)

    async def go() -> None:
        writer, reader = open_store(url), open_store(url)
        rid = "rollout-1"
        items: list[dict[str, Any]] = [{"role": "user", "content": "q0"}]
        parent = None
        for k in range(5):
            entry = turn_entry(rid, k, items, parent)
            await writer.put(entry)
            items = [*items, *entry.output_items, {"role": "user", "content": f"q{k + 1}"}]
            res = await reader.resolve(rid, items)
            assert res.status is ParentResolutionStatus.RESOLVED, res
            assert res.match is not None and res.match.model_call_id == entry.model_call_id
            assert list(res.match.cumulative_token_ids) == [*entry.prompt_token_ids, 1000 + k]
            parent = entry.model_call_id
        # Five looks, five entries parsed: each look read only the new entry.
        assert reader._resolver.entries_read == 5
        # Retire + delete + reuse of the id: the cache notices and rebuilds from scratch.
        await writer.retire(rid)
        await writer.delete(rid)
        res = await reader.resolve(rid, items)
        assert res.status is ParentResolutionStatus.UNRESOLVED and res.reason == "no_match"
        other = turn_entry(rid, 0, [{"role": "user", "content": "q0"}], None)
        await writer.put(other.with_changes(model_call_id="fresh"))
        follow = [
            {"role": "user", "content": "q0"},
            *other.output_items,
            {"role": "user", "content": "x"},
        ]
        res = await reader.resolve(rid, follow)
        assert res.match is not None and res.match.model_call_id == "fresh"
        await writer.close()
        await reader.close()

    asyncio.run(go())

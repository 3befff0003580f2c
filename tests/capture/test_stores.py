"""Clauses every store kind of the registry must honour the same way."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import store_url
from tests.capture._workload import make_entry
from zephon.capture.stores import open_store
from zephon.capture.testing import STORE_KINDS


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
def test_non_finite_log_probs_are_refused_at_put(
    kind: str, bad: float, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)

    async def go() -> None:
        store = open_store(url)
        try:
            entry = make_entry("nan", "c1")
            lps = list(entry.generation_log_probs)
            lps[2] = bad
            with pytest.raises(ValueError, match=r"generation_log_probs\[2\] is .*finite"):
                await store.put(entry.with_changes(generation_log_probs=lps))
            await store.put(make_entry("nan", "c2"))
            snap = await store.freeze("nan")  # the rollout stays readable
            assert [e.model_call_id for e in snap.entries] == ["c2"]
        finally:
            await store.close()

    asyncio.run(go())

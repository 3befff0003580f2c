"""The sqlite store: conformance, WAL durability settings, storage life cycle, URLs."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from tests.capture._workload import make_entry
from zephon.capture.conformance import run_conformance
from zephon.capture.protocols import TokenCaptureFrozenError
from zephon.capture.stores import open_store
from zephon.capture.stores._sqlite import SqliteStore
from zephon.capture.testing import Mutation, assert_mutation_caught


@pytest.mark.parametrize("offload", ["thread", "inline"])
def test_sqlite_store_passes_conformance(tmp_path: Path, offload: str) -> None:
    url = f"sqlite://{tmp_path}/cap.db?offload={offload}"
    report = asyncio.run(run_conformance(*(lambda: open_store(url),) * 4))
    assert not [r for r in report.results if r.status == "failed"]
    assert sum(r.status == "passed" for r in report.results) >= 25


def test_database_is_in_wal_mode_with_full_sync(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "a" / "cap.db"))
    try:
        assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    finally:
        asyncio.run(store.close())


def test_payloads_are_removed_by_retire_and_delete(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SqliteStore(str(tmp_path / "cap.db"))
        for cid in ("c1", "c2"):
            await store.put(make_entry("r", cid))
        snap = await store.freeze("r")
        with pytest.raises(TokenCaptureFrozenError):
            await store.put(make_entry("r", "c3"))
        assert store.entry_count() == 2
        assert await store.drop("r", snapshot_id=snap.snapshot_id, version=snap.version)
        assert store.entry_count() == 0 and store.state_of("r").retired
        await store.delete("r")
        assert store.state_of("r").is_empty()
        # Another client sees the same database file.
        other = SqliteStore(str(tmp_path / "cap.db"))
        await other.put(make_entry("r", "again"))
        assert [e.model_call_id for e in (await store.freeze("r")).entries] == ["again"]
        await store.close()
        await other.close()
        with sqlite3.connect(tmp_path / "cap.db") as raw:
            assert raw.execute("SELECT count(*) FROM capture_entries").fetchone() == (1,)

    asyncio.run(scenario())


def test_closed_client_refuses_calls(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "cap.db"))
    asyncio.run(store.close())
    asyncio.run(store.close())
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(store.put(make_entry("r", "c1")))


def test_sqlite_urls(tmp_path: Path) -> None:
    four = SqliteStore.from_url(f"sqlite:///{tmp_path}/x.db")
    assert four.path == str(tmp_path / "x.db")
    asyncio.run(four.close())
    with pytest.raises(ValueError, match="sqlite"):
        SqliteStore.from_url("sqlite://host/x.db")
    with pytest.raises(ValueError, match="unknown option"):
        SqliteStore.from_url(f"sqlite://{tmp_path}/x.db?journal=delete")


def test_sqlite_store_mutations_are_caught(tmp_path: Path, mutation: Mutation) -> None:
    url = f"sqlite://{tmp_path}/cap.db"
    assert_mutation_caught(lambda: open_store(url), mutation)

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


def test_processes_opening_a_new_store_at_once_all_open_it(tmp_path: Path) -> None:
    """Switching a new database to WAL needs it to itself, and SQLite can refuse at once (no
    busy wait) while another opener does the same: every opener retries instead of failing."""
    import subprocess
    import sys

    path = tmp_path / "capture.db"
    opener = (
        "import sys; from zephon.capture.stores._sqlite import SqliteStore; "
        "sys.stdin.read(); SqliteStore(sys.argv[1]).close(); print('opened')"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", opener, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    for proc in procs:  # all go at once
        assert proc.stdin is not None
        proc.stdin.close()
    outs = [(p.stdout.read(), p.stderr.read()) for p in procs if p.stdout and p.stderr]
    for proc in procs:
        proc.wait(timeout=120)
        for pipe in (proc.stdout, proc.stderr):
            assert pipe is not None
            pipe.close()
    assert [(p.returncode, out) for p, (out, _) in zip(procs, outs)] == [(0, "opened\n")] * 8, [
        err[-500:] for _, err in outs
    ]

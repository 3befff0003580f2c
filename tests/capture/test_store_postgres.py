"""The postgres store on a real server: conformance, compare-and-set, isolation, URLs."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from tests.capture._pg import fresh_schema_url, pg_dsn, pg_url  # noqa: F401
from tests.capture._pgserver import EmbeddedPostgres
from tests.capture._workload import make_entry
from zephon.capture.conformance import run_conformance
from zephon.capture.stores import open_store
from zephon.capture.stores._postgres import PostgresStore
from zephon.capture.testing import Mutation, assert_mutation_caught


@pytest.mark.timeout(90)
def test_postgres_store_passes_conformance(pg_url: str) -> None:  # noqa: F811
    report = asyncio.run(run_conformance(*(lambda: open_store(pg_url),) * 4))
    assert not [r for r in report.results if r.status == "failed"]
    assert sum(r.status == "passed" for r in report.results) >= 25


def test_racing_conflicting_puts_store_exactly_one_and_poison(pg_url: str) -> None:  # noqa: F811
    """Two clients put different bytes for one call id at once: one wins, one fails."""

    async def scenario() -> None:
        a, b = PostgresStore.from_url(pg_url), PostgresStore.from_url(pg_url)
        first = make_entry("race", "c1")
        second = make_entry("race", "c1", gen=7)
        results = await asyncio.gather(a.put(first), b.put(second), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1 and isinstance(errors[0], ValueError)
        snap = await a.freeze("race")
        assert len(snap.entries) == 1 and snap.incomplete
        stored = snap.entries[0].canonical_bytes()
        assert stored in (first.canonical_bytes(), second.canonical_bytes())
        await a.close()
        await b.close()

    asyncio.run(scenario())


def test_schemas_isolate_backends(pg_dsn: str) -> None:  # noqa: F811
    async def scenario() -> None:
        one = PostgresStore.from_url(fresh_schema_url(pg_dsn))
        two = PostgresStore.from_url(fresh_schema_url(pg_dsn))
        await one.put(make_entry("same-id", "c1"))
        assert (await two.freeze("same-id")).entries == ()
        assert len((await one.freeze("same-id")).entries) == 1
        await one.close()
        await two.close()

    asyncio.run(scenario())


def test_schema_is_created_when_missing_and_options_are_stripped(pg_dsn: str) -> None:  # noqa: F811
    url = f"{pg_dsn}?schema=zt_created_here&offload=inline&connect_timeout=5"
    store = PostgresStore.from_url(url)
    assert store.schema == "zt_created_here"
    asyncio.run(store.put(make_entry("r", "c1")))
    asyncio.run(store.close())
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM zt_created_here.capture_entries").fetchone()
    assert row == (1,)
    with pytest.raises(ValueError, match="offload"):
        PostgresStore.from_url(f"{pg_dsn}?offload=fast")


@pytest.mark.timeout(60)
def test_postgres_store_mutations_are_caught(pg_url: str, mutation: Mutation) -> None:  # noqa: F811
    assert_mutation_caught(lambda: open_store(pg_url), mutation)


@pytest.mark.timeout(90)
def test_a_client_idle_through_a_server_restart_works_on_its_first_call() -> None:
    """Every pooled client that sat idle while the server restarted held a dead connection;
    its next operation (a proxy's lineage lookup, intent or put, possibly long after the
    outage) must not be the one that fails."""
    server = EmbeddedPostgres()
    server.start()
    try:
        url = fresh_schema_url(server.dsn)
        writer, reader = PostgresStore.from_url(url), PostgresStore.from_url(url)
        asyncio.run(writer.put(make_entry("idle", "c1")))
        server.pause()
        server.resume()  # the same port and data: both clients' connections are gone
        asyncio.run(writer.put(make_entry("idle", "c2")))
        snap = asyncio.run(reader.freeze("idle"))
        assert sorted(e.model_call_id for e in snap.entries) == ["c1", "c2"]
        asyncio.run(writer.close())
        asyncio.run(reader.close())
    finally:
        server.stop()

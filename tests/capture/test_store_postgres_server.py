"""The embedded PostgreSQL server used by the postgres store tests and benchmark."""

from __future__ import annotations

import os

import psycopg
import pytest

from tests.capture._pg import fresh_schema_url, pg_dsn  # noqa: F401
from tests.capture._pgserver import EmbeddedPostgres, EmbeddedPostgresError


@pytest.mark.timeout(90)
def test_embedded_server_starts_on_loopback_and_cleans_up() -> None:
    server = EmbeddedPostgres()
    with pytest.raises(EmbeddedPostgresError, match="not running"):
        _ = server.dsn
    server.start()
    root = server.log_path.parent
    try:
        assert server.dsn.startswith(f"postgresql://postgres@127.0.0.1:{server.port}/")
        with psycopg.connect(server.dsn) as conn:
            row = conn.execute("SHOW fsync").fetchone()
            assert row == ("on",)
            row = conn.execute("SHOW listen_addresses").fetchone()
            assert row == ("127.0.0.1",)
    finally:
        server.stop()
    assert not root.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{server.port}/postgres", connect_timeout=2
        )
    server.stop()  # idempotent


def test_session_server_gives_each_test_its_own_schema(pg_dsn: str) -> None:  # noqa: F811
    first = fresh_schema_url(pg_dsn)
    second = fresh_schema_url(pg_dsn)
    assert first != second
    schema = first.rsplit("schema=", 1)[1]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        names = {r[0] for r in conn.execute("SELECT schema_name FROM information_schema.schemata")}
    assert schema in names
    assert "ZEPHON_TEST_POSTGRES_DSN" in os.environ or "127.0.0.1" in pg_dsn

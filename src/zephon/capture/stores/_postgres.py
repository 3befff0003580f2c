"""PostgreSQL capture store (``postgresql://user@host:port/db[?schema=NAME]``), psycopg 3.

The distributed deployment: any number of machines share one database. Each operation is one
transaction that locks the rollout's row (``SELECT ... FOR UPDATE``; the row is created with
``INSERT ... ON CONFLICT DO NOTHING`` first when missing), so the state machine's decision is a
compare-and-set on that row; the primary key on ``(rollout_id, call_id)`` backs it up for the
entries. A commit returns after the server has flushed its WAL (``synchronous_commit`` on, the
server default), which is when ``put`` returns.

URL options (removed before connecting): ``schema`` puts the tables in that schema (created if
missing), ``offload`` is ``thread`` (default) or ``inline``. Everything else is passed to libpq.
"""

from __future__ import annotations

import contextlib
import functools
import select
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from zephon._optional import require
from zephon.capture.stores._durable import Offload, parse_offload
from zephon.capture.stores._sql import Cursor, SqlStore, iter_statements
from zephon.capture.stores._state import RolloutState

__all__ = ["PostgresStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS capture_rollouts (
    rollout_id TEXT PRIMARY KEY,
    state BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS capture_entries (
    rollout_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    payload BYTEA NOT NULL,
    PRIMARY KEY (rollout_id, call_id)
);
CREATE TABLE IF NOT EXISTS capture_streams (
    stream TEXT PRIMARY KEY,
    ledger BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS capture_stream_moves (
    stream TEXT NOT NULL,
    seq BIGINT NOT NULL,
    delta BYTEA NOT NULL,
    PRIMARY KEY (stream, seq)
);
ALTER TABLE capture_entries ALTER COLUMN payload SET STORAGE EXTERNAL
"""


def _closed_by_server(conn: Any) -> bool:
    """Whether the server dropped this idle connection (restart, failover, idle timeout).

    Between transactions the server sends nothing unasked, so a readable socket means it
    said goodbye (a termination notice, then EOF). Found before a transaction starts, a
    reconnect is safe: nothing of the operation was sent yet. Otherwise every client idle
    through a restart would fail its next operation, however long after the outage.
    """
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except Exception:  # no socket any more (a broken connection)
        return True
    return bool(readable)


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PostgresStore(SqlStore):
    """A client (one connection) of a capture database."""

    kind = "postgres"
    P = "%b"  # binary parameters: payloads travel as raw bytes, not hex text

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        offload: Offload = "thread",
        create: bool = True,
    ) -> None:
        super().__init__(offload=offload)
        psycopg = require("psycopg", "a postgresql:// capture store")

        self.schema = schema
        self._dsn_for_errors = urlsplit(dsn)._replace(netloc=urlsplit(dsn).hostname or "").geturl()
        options: dict[str, Any] = {}
        if schema:
            options["options"] = f"-c search_path={schema}"
        self._connect = functools.partial(psycopg.connect, dsn, autocommit=True, **options)
        self._conn = self._connect()
        row = self._conn.execute(
            "SELECT to_regclass('capture_entries'), "
            "to_regclass('capture_streams') IS NOT NULL AND "
            "to_regclass('capture_stream_moves') IS NOT NULL"
        ).fetchone()
        if row is not None and row[0] is not None and (row[1] or not create):
            return  # tables exist (the common case): skip the DDL and its lock
        if not create:
            self._conn.close()
            where = f"schema {schema}" if schema else "the database"
            raise FileNotFoundError(
                f"postgres capture store {self._dsn_for_errors}: {where} has no capture tables "
                "(check the URL; a store is only created by a writer)"
            )
        with self._conn.transaction(), self._conn.cursor() as cur:
            # Serialise schema creation between clients starting at the same time.
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (zlib.crc32(b"zephon-capture"),))
            if schema:
                cur.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote_ident(schema)}")
            for stmt in iter_statements(_SCHEMA):
                cur.execute(stmt)

    @classmethod
    def from_url(cls, url: str, *, create: bool = True) -> PostgresStore:
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError(f"postgres capture store URL {url!r} must start with postgresql://")
        params = parse_qsl(parts.query, keep_blank_values=True)
        mine = {k: v for k, v in params if k in ("schema", "offload")}
        rest = [(k, v) for k, v in params if k not in ("schema", "offload")]
        dsn = urlunsplit(parts._replace(query=urlencode(rest)))
        offload = parse_offload(mine.get("offload"), url)
        return cls(dsn, schema=mine.get("schema") or None, offload=offload, create=create)

    def describe(self) -> str:
        where = f" schema {self.schema}" if self.schema else ""
        return f"postgres store {self._dsn_for_errors}{where}"

    @contextmanager
    def _txn(self, write: bool) -> Iterator[Cursor]:
        # Pipeline mode: statements whose results are not read (the inserts and the state
        # update after the decision) go out without waiting, so a put costs ~2 round trips.
        if self._conn.broken or self._conn.closed or _closed_by_server(self._conn):
            # The server went away (restart, failover): a call that saw it failed; this one
            # reconnects, or fails the same way while the server is still down.
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = self._connect()
        with (
            self._conn.pipeline(),
            self._conn.transaction(),
            self._conn.cursor(binary=True) as cur,
        ):
            yield cur

    def _lock_row(self, cur: Cursor, rollout_id: str) -> None:
        cur.execute(
            "INSERT INTO capture_rollouts (rollout_id, state) VALUES (%b, %b) "
            "ON CONFLICT (rollout_id) DO NOTHING",
            (rollout_id, RolloutState.empty(rollout_id).to_json()),
        )

    def _lock_stream(self, cur: Cursor, stream: str) -> None:
        cur.execute(
            "INSERT INTO capture_streams (stream, ledger) VALUES (%b, %b) "
            "ON CONFLICT (stream) DO NOTHING",
            (stream, b""),
        )

    def close_backend(self) -> None:
        with self._lock:
            self._conn.close()

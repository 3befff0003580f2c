"""SQLite capture store (``sqlite:///path/to/capture.db``): one file, many local processes.

WAL journal with ``synchronous=FULL`` (a commit is fsynced before it returns), one
``BEGIN IMMEDIATE`` transaction per write (SQLite's single writer lock orders all writers of
the database; readers never block), and the two tables of :mod:`._sql`. Safe across processes
on one machine; do not put the file on a network file system (SQLite's locks are not reliable
there).

Writers first queue on ``flock`` of a side file ``<db>.writer-lock``: SQLite's own busy handler
sleeps and retries (up to tens of milliseconds per attempt), which under several writer
processes wastes most of the time asleep; the kernel lock hands the database over as soon as
the previous commit is done. SQLite's lock still guards correctness (other programs, or a
writer that does not take the side lock, only cost latency).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qs, unquote, urlsplit

from zephon.capture.stores._durable import Offload, parse_offload
from zephon.capture.stores._sql import Cursor, SqlStore, iter_statements
from zephon.capture.stores._state import RolloutState

__all__ = ["SqliteStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS capture_rollouts (
    rollout_id TEXT PRIMARY KEY,
    state BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS capture_entries (
    rollout_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (rollout_id, call_id)
);
CREATE TABLE IF NOT EXISTS capture_streams (
    stream TEXT PRIMARY KEY,
    ledger BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS capture_stream_moves (
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    delta BLOB NOT NULL,
    PRIMARY KEY (stream, seq)
)
"""


class SqliteStore(SqlStore):
    """A client (one connection) of a capture database file."""

    kind = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        offload: Offload = "thread",
        timeout: float = 60.0,
        create: bool = True,
    ) -> None:
        super().__init__(offload=offload)
        self.path = os.path.abspath(path)
        if not create and not os.path.isfile(self.path):
            raise FileNotFoundError(
                f"sqlite capture store {self.path} does not exist (check the path; a store is "
                "only created by a writer)"
            )
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._writer_lock = os.open(
            self.path + ".writer-lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
        )
        self._conn = sqlite3.connect(
            self.path, timeout=timeout, isolation_level=None, check_same_thread=False
        )
        self._conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        mode = _enable_wal(self._conn, timeout)
        if str(mode).lower() != "wal":
            raise RuntimeError(f"sqlite capture store {self.path}: cannot enable WAL (got {mode})")
        self._conn.execute("PRAGMA synchronous = FULL")
        if not create:
            self._require_tables()
            return
        with self._txn(True) as cur:
            for stmt in iter_statements(_SCHEMA):
                cur.execute(stmt)

    def _require_tables(self) -> None:
        row = self._conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'capture_entries'"
        ).fetchone()
        if not row or not row[0]:
            self.close_backend()
            raise FileNotFoundError(
                f"{self.path} is not a zephon capture store (no capture tables); check the path"
            )

    @classmethod
    def from_url(cls, url: str, *, create: bool = True) -> SqliteStore:
        """``sqlite:///abs/path.db`` (also ``sqlite:////abs/path.db``; ``?offload=inline``)."""
        parts = urlsplit(url)
        if parts.scheme != "sqlite" or parts.netloc not in ("", "localhost") or not parts.path:
            raise ValueError(f"sqlite capture store URL {url!r} must look like sqlite:///path.db")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"offload"}
        if unknown:
            raise ValueError(
                f"sqlite capture store URL {url!r}: unknown option(s) {sorted(unknown)}"
            )
        path = "/" + unquote(parts.path).lstrip("/")
        return cls(path, offload=parse_offload(query.get("offload"), url), create=create)

    def describe(self) -> str:
        return f"sqlite store {self.path}"

    @contextmanager
    def _txn(self, write: bool) -> Iterator[Cursor]:
        if write:
            fcntl.flock(self._writer_lock, fcntl.LOCK_EX)
        cur = self._conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield cur
            except BaseException:
                self._conn.rollback()
                raise
            else:
                cur.execute("COMMIT")
        finally:
            cur.close()
            if write:
                fcntl.flock(self._writer_lock, fcntl.LOCK_UN)

    def _lock_row(self, cur: Cursor, rollout_id: str) -> None:
        # BEGIN IMMEDIATE already holds the database's write lock; just make the row exist.
        cur.execute(
            "INSERT OR IGNORE INTO capture_rollouts (rollout_id, state) VALUES (?, ?)",
            (rollout_id, RolloutState.empty(rollout_id).to_json()),
        )

    def _lock_stream(self, cur: Cursor, stream: str) -> None:
        cur.execute(
            "INSERT OR IGNORE INTO capture_streams (stream, ledger) VALUES (?, ?)", (stream, b"")
        )

    def close_backend(self) -> None:
        with self._lock:
            self._conn.close()
            os.close(self._writer_lock)


def _enable_wal(conn: sqlite3.Connection, timeout: float) -> str:
    """Switch the database to WAL (a no-op read when it already is), retrying while another
    connection holds it: the switch needs the database to itself and SQLite answers "database
    is locked" at once, without waiting ``busy_timeout``, when a second opener races it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0])
            if mode.lower() == "wal":
                return mode
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)

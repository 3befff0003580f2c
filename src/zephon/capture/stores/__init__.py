"""Capture stores opened by URL: ``open_store("memory://name" | "file:///dir" | ...)``.

Each store implements sink, source, lineage resolver and ledger over one shared backend; two
stores opened with the same URL are two clients of that backend. Implementations are imported
lazily so that ``memory://`` never pulls in psycopg.
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import urlsplit

from zephon.capture.protocols import CaptureStore
from zephon.capture.stores._durable import DurableStore
from zephon.capture.stores._fsio import FileSystem
from zephon.capture.stores._fsutil import LogCorruptionError

__all__ = [
    "STORE_CLASSES",
    "STORE_SCHEMES",
    "DurableStore",
    "FileSystem",
    "LogCorruptionError",
    "open_store",
    "store_class",
]

STORE_SCHEMES: dict[str, str] = {
    "memory": "zephon.capture.stores._memory:MemoryStore",
    "file": "zephon.capture.stores._file:FileStore",
    "sqlite": "zephon.capture.stores._sqlite:SqliteStore",
    "postgresql": "zephon.capture.stores._postgres:PostgresStore",
    "postgres": "zephon.capture.stores._postgres:PostgresStore",
}
"""URL scheme -> ``"module:Class"``; every class has a ``from_url(url, *, create)`` classmethod."""

STORE_CLASSES: dict[str, str] = {
    "MemoryStore": "memory",
    "FileStore": "file",
    "SqliteStore": "sqlite",
    "PostgresStore": "postgresql",
}
"""Store class name -> its URL scheme; the classes are attributes of this module, imported on
first access."""


def __getattr__(name: str) -> Any:
    scheme = STORE_CLASSES.get(name)
    if scheme is None:
        raise AttributeError(f"module 'zephon.capture.stores' has no attribute {name!r}")
    return store_class(f"{scheme}://")


def store_class(url: str) -> Any:
    """The store class for ``url``'s scheme (imported on first use)."""
    scheme = urlsplit(url).scheme.lower()
    target = STORE_SCHEMES.get(scheme)
    if target is None:
        known = ", ".join(f"{s}://" for s in STORE_SCHEMES)
        raise ValueError(
            f"unknown capture store URL {url!r}: scheme {scheme + '://' if scheme else '(none)'}"
            f" is not one of {known}"
        )
    module_name, _, class_name = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, class_name)


def open_store(url: str, *, create: bool = True) -> CaptureStore:
    """Open a new client of the store at ``url`` (``memory://name``, ``file:///dir``, ...).

    ``create=False`` is for readers: a store that does not exist yet (a missing directory,
    database file or set of tables) raises :class:`FileNotFoundError` naming it instead of
    being created.
    """
    store: CaptureStore = store_class(url).from_url(url, create=create)
    return store

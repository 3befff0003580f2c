"""Capture stores opened by URL: ``open_store("memory://name" | "file:///dir" | ...)``.

Each store implements sink, source, lineage resolver and ledger over one shared backend; two
stores opened with the same URL are two clients of that backend. Every kind of store is a
:class:`StoreSpec` in one registry (:func:`register_store` adds yours); implementations are
imported lazily so that ``memory://`` never pulls in psycopg. A new kind of store is written
against :mod:`zephon.capture.stores.base`.
"""

from __future__ import annotations

from typing import Any

from zephon.capture.protocols import CaptureStore
from zephon.capture.stores._durable import DurableStore as DurableStore
from zephon.capture.stores._fsio import FileSystem
from zephon.capture.stores._fsutil import LogCorruptionError as LogCorruptionError
from zephon.capture.stores._registry import (
    StoreSpec,
    register_store,
    store_spec,
    store_specs,
    stores_markdown,
    unregister_store,
    url_forms,
)

__all__ = [
    "STORE_CLASSES",
    "FileSystem",
    "StoreSpec",
    "register_store",
    "store_class",
    "store_spec",
    "store_specs",
    "stores_markdown",
    "unregister_store",
    "url_forms",
]

_BUILTIN = (
    StoreSpec(
        "memory",
        ("memory",),
        "zephon.capture.stores._memory:MemoryStore",
        "memory://NAME",
        "the reference; one process; tests (`memory://` = `default`)",
        shared_across_processes=False,
    ),
    StoreSpec(
        "file",
        ("file",),
        "zephon.capture.stores._file:FileStore",
        "file:///DIR",
        "the embedded default: append-only per-rollout logs, flock, fsync",
    ),
    StoreSpec(
        "sqlite",
        ("sqlite",),
        "zephon.capture.stores._sqlite:SqliteStore",
        "sqlite:///FILE",
        "WAL, one transaction per write, many processes on one machine",
    ),
    StoreSpec(
        "postgres",
        ("postgresql", "postgres"),
        "zephon.capture.stores._postgres:PostgresStore",
        "postgresql://...",
        "one transaction per write, many machines",
        extra="postgres",
    ),
)
for _spec in _BUILTIN:
    register_store(_spec, replace=True)

STORE_SCHEMES: dict[str, str] = {
    scheme: spec.store
    for spec in _BUILTIN
    for scheme in spec.schemes
    if isinstance(spec.store, str)
}
"""The built-in stores' URL scheme -> ``"module:Class"`` (the registry, :func:`store_specs`,
also holds the stores registered later)."""

STORE_CLASSES: dict[str, str] = {spec.class_name: spec.schemes[0] for spec in _BUILTIN}
"""Built-in store class name -> its URL scheme; the classes are attributes of this module,
imported on first access."""


def __getattr__(name: str) -> Any:
    scheme = STORE_CLASSES.get(name)
    if scheme is None:
        raise AttributeError(f"module 'zephon.capture.stores' has no attribute {name!r}")
    return store_class(f"{scheme}://")


def store_class(url: str) -> Any:
    """The store class for ``url``'s scheme (imported on first use)."""
    return store_spec(url).load()


def open_store(url: str, *, create: bool = True) -> CaptureStore:
    """Open a new client of the store at ``url`` (``memory://name``, ``file:///dir``, ...).

    ``create=False`` is for readers: a store that does not exist yet (a missing directory,
    database file or set of tables) raises :class:`FileNotFoundError` naming it instead of
    being created.
    """
    store: CaptureStore = store_class(url).from_url(url, create=create)
    return store

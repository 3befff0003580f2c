"""The store kinds the parametrised store tests run over come from the store registry: every
registered store has one, a store without one fails naming what to add, and a kind's URL is
answered by the store of its own name (never silently by another)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from zephon.capture.stores import (
    StoreSpec,
    open_store,
    register_store,
    store_class,
    store_specs,
    unregister_store,
)
from zephon.capture.testing import STORE_KINDS, StoreKind, durable_kinds, store_kinds
from zephon.errors import ConfigError, ZephonError

LMDB = StoreSpec("lmdb", ("lmdb",), "zephon.capture.stores:MemoryStore", "lmdb:///DIR")


@pytest.fixture
def lmdb() -> Iterator[StoreSpec]:
    """A product store kind the test registry does not know."""
    register_store(LMDB)
    yield LMDB
    unregister_store("lmdb")


def test_every_registered_store_has_a_test_kind() -> None:
    assert store_kinds(store_specs()) == STORE_KINDS
    assert list(STORE_KINDS) == [spec.name for spec in store_specs()]
    assert durable_kinds() == ["file", "sqlite", "postgres"]


def test_a_registered_store_without_a_test_kind_fails_naming_what_to_add(
    lmdb: StoreSpec,
) -> None:
    with pytest.raises(ConfigError, match=r"\['lmdb'\] have no test kind: add a StoreKind"):
        store_kinds(store_specs())
    mine = StoreKind("lmdb", durable=True, fresh_url="lmdb://{dir}/capture")
    assert store_kinds(store_specs(), [*STORE_KINDS.values(), mine])["lmdb"] is mine


def test_a_kind_without_a_url_form_fails_instead_of_becoming_sqlite(tmp_path: Path) -> None:
    with pytest.raises(ZephonError, match=r"store kind 'lmdb' has no fresh_url: give StoreKind"):
        StoreKind("lmdb", durable=True).url(str(tmp_path))


def test_a_kind_whose_url_another_store_answers_fails(tmp_path: Path) -> None:
    imposter = StoreKind("lmdb", durable=True, fresh_url="sqlite://{dir}/capture.db")
    with pytest.raises(ConfigError, match=r"answered by store 'sqlite'; register store 'lmdb'"):
        imposter.url(str(tmp_path))


def test_a_registered_kind_url_names_its_own_store(lmdb: StoreSpec, tmp_path: Path) -> None:
    kind = StoreKind("lmdb", durable=True, fresh_url="lmdb://{dir}/capture")
    assert kind.url(str(tmp_path)) == f"lmdb://{tmp_path}/capture"


@pytest.mark.parametrize("name", [k for k, v in STORE_KINDS.items() if not v.needs_server])
def test_each_kind_opens_a_fresh_store_of_its_own_class(name: str, tmp_path: Path) -> None:
    kind = STORE_KINDS[name]
    first, second = kind.url(str(tmp_path / "a")), kind.url(str(tmp_path / "b"))
    assert first != second
    store = open_store(first)
    try:
        assert type(store) is store_class(f"{name}://")
    finally:
        asyncio.run(store.close())


def test_a_server_kind_needs_the_server_url_and_checks_it(tmp_path: Path) -> None:
    postgres = STORE_KINDS["postgres"]
    with pytest.raises(ConfigError, match="needs a server URL"):
        postgres.url(str(tmp_path))
    assert postgres.url(str(tmp_path), "postgresql://u@h/db") == "postgresql://u@h/db"
    with pytest.raises(ConfigError, match="answered by store 'file'"):
        postgres.url(str(tmp_path), f"file://{tmp_path}")


def test_how_a_kind_makes_its_url_is_given_by_keyword() -> None:
    with pytest.raises(TypeError):
        StoreKind("file", True, True)  # type: ignore[misc]

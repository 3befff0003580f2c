"""The public store contract is enough to write a store: one built only on it (``_dbm_store``)
is found by URL through its test kind, passes the whole conformance suite, and the
suite catches each mutant of it; a store that leaves out a primitive fails naming it."""

from __future__ import annotations

import ast
import asyncio
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.capture._dbm_store import DBM_KIND, DBM_SPEC, DbmStore
from tests.capture._workload import make_entry
from zephon.capture.conformance import CHECKS, run_conformance_sync
from zephon.capture.stores import open_store, register_store, store_specs, unregister_store
from zephon.capture.stores.base import DurableStore
from zephon.capture.testing import STORE_KINDS, Mutation, assert_mutation_caught, store_kinds

HERE = Path(__file__).parent


@pytest.fixture
def dbm_url(tmp_path: Path) -> Iterator[str]:
    """A fresh ``dbm://`` store, registered like a user's store and named by its test kind."""
    register_store(DBM_SPEC)
    try:
        kinds = store_kinds(store_specs(), [*STORE_KINDS.values(), DBM_KIND])
        yield kinds["dbm"].url(str(tmp_path))
    finally:
        unregister_store("dbm")


def test_the_store_imports_nothing_private_of_zephon() -> None:
    tree = ast.parse((HERE / "_dbm_store.py").read_text())
    modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    zephon = [m for m in modules if m.startswith("zephon")]
    assert "zephon.capture.stores.base" in zephon
    assert [m for m in zephon if any(p.startswith("_") for p in m.split("."))] == []


def test_a_store_on_the_public_contract_passes_every_conformance_check(dbm_url: str) -> None:
    assert isinstance(open_store(dbm_url), DbmStore)

    def factory() -> object:
        return open_store(dbm_url)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = run_conformance_sync(factory, factory, factory, factory)
    assert report.ok and {r.name for r in report.results} == set(CHECKS)
    assert len(report.passed) >= 25


def test_the_suite_catches_each_mutant_of_the_store(dbm_url: str, mutation: Mutation) -> None:
    assert_mutation_caught(lambda: open_store(dbm_url), mutation)


def test_a_store_without_a_primitive_fails_naming_it() -> None:
    class HalfStore(DurableStore):
        kind = "half"

    async def go() -> None:
        store = HalfStore(offload="inline")
        with pytest.raises(NotImplementedError, match="HalfStore does not implement transact_"):
            await store.put(make_entry("r1", "c1"))
        with pytest.raises(NotImplementedError, match="does not implement freeze_rollout"):
            await store.freeze("r1")
        with pytest.raises(NotImplementedError, match="does not implement transact_stream"):
            await store.stream_ledger("s")

    asyncio.run(go())


def test_a_store_redefining_the_base_plumbing_or_an_old_primitive_name_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Clash defines \['_decide'\], private to DurableStore"):

        class Clash(DurableStore):
            def _decide(self) -> None: ...

    with pytest.raises(TypeError, match=r"renamed primitives: _transact \(now transact_rollout\)"):

        class Old(DurableStore):
            def _transact(self) -> None: ...

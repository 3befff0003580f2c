"""Stores come from one registry: a store registered there is found by URL, passes the
conformance suite, and every list of URL forms (errors, proxy checks, CLI help, docs table)
is the registry's."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from zephon.capture import MemoryStore
from zephon.capture.conformance import run_conformance_sync
from zephon.capture.stores import (
    STORE_SCHEMES,
    StoreSpec,
    open_store,
    register_store,
    store_class,
    store_spec,
    store_specs,
    stores_markdown,
    unregister_store,
    url_forms,
)
from zephon.cli import build_parser
from zephon.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "capture.md"


class ScratchStore(MemoryStore):
    """A user's store: ``scratch://NAME``, an in-process backend of its own namespace."""

    @classmethod
    def from_url(cls, url: str, *, create: bool = True) -> ScratchStore:
        parts = urlsplit(url)
        if parts.scheme != "scratch":
            raise ValueError(f"ScratchStore needs a scratch:// URL, got {url!r}")
        return cls("scratch/" + ((parts.netloc + parts.path).strip("/") or "default"))


SCRATCH = StoreSpec(
    "scratch",
    ("scratch",),
    ScratchStore,
    "scratch://NAME",
    "a user's in-process store",
    shared_across_processes=False,
)


@pytest.fixture
def scratch() -> Iterator[StoreSpec]:
    register_store(SCRATCH)
    yield SCRATCH
    unregister_store("scratch")


def test_builtin_stores_are_found_by_url() -> None:
    assert [s.name for s in store_specs()][:4] == ["memory", "file", "sqlite", "postgres"]
    assert store_spec("postgres://h/db") is store_spec("postgresql://h/db")
    assert store_spec("postgres://h/db").extra == "postgres"
    assert store_spec("MEMORY://x").shared_across_processes is False
    assert store_class("memory://x") is MemoryStore
    assert set(STORE_SCHEMES) == {s for spec in store_specs() for s in spec.schemes}


def test_a_registered_store_passes_the_conformance_suite(scratch: StoreSpec) -> None:
    url = f"scratch://{uuid.uuid4().hex}"
    store = open_store(url)
    assert isinstance(store, ScratchStore) and store_spec(url) is scratch

    def factory() -> object:
        return open_store(url)

    report = run_conformance_sync(factory, factory, factory, factory)
    assert report.ok, [r for r in report.results if not r.ok]


def test_unknown_schemes_list_the_registry(scratch: StoreSpec) -> None:
    with pytest.raises(ValueError, match=r"scheme redis:// is not one of .*scratch://"):
        open_store("redis://cache:6379")
    assert "scratch://NAME" in url_forms()
    assert "scratch://NAME" not in url_forms(shared_only=True)  # it lives in one process


def test_unregistered_store_is_gone() -> None:
    register_store(SCRATCH)
    unregister_store("scratch")
    with pytest.raises(ValueError, match="unknown capture store URL"):
        store_spec("scratch://x")


def test_a_scheme_is_registered_once(scratch: StoreSpec) -> None:
    with pytest.raises(ConfigError, match="already registered"):
        register_store(StoreSpec("other", ("scratch",), ScratchStore, "scratch://X"))
    with pytest.raises(ConfigError, match="lower-case"):
        StoreSpec("upper", ("Scratch",), ScratchStore, "Scratch://X")


def test_proxy_refuses_a_one_process_store_with_several_workers(scratch: StoreSpec) -> None:
    from zephon.capture.proxy._config import ProxyConfig
    from zephon.capture.proxy.server import serve

    config = ProxyConfig(engine_url="http://127.0.0.1:9", store_url="scratch://one")
    with pytest.raises(ValueError, match=r"scratch://NAME stores live in one process.*file:///"):
        serve(config, workers=2, port=0)


def _help(*command: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--help"])


def test_cli_help_names_every_builtin_url_form(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's help is built before any store module is imported (startup time), so its
    URL forms are checked against the registry here."""
    for command, forms in [
        (("capture", "conformance"), url_forms()),
        (("capture", "serve"), url_forms()),
        (("capture", "inspect"), url_forms(shared_only=True)),
        (("capture", "export"), url_forms(shared_only=True)),
    ]:
        _help(*command)
        text = " ".join(capsys.readouterr().out.split())
        assert forms in text, f"zephon {' '.join(command)} --help should list {forms}"


def test_docs_table_is_the_registry() -> None:
    found = re.search(r"<!-- stores:begin -->\n(.*?)<!-- stores:end -->", DOCS.read_text(), re.S)
    assert found is not None, "docs/capture.md lost its stores table markers"
    assert found.group(1) == stores_markdown(), (
        "docs/capture.md's store table differs from zephon.capture.stores.store_specs(); "
        "replace it with zephon.capture.stores.stores_markdown()"
    )

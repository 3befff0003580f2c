"""``zephon.capture`` gathers the store kit: open_store, the stores, errors, conformance; the
protocols are exported by ``zephon.capture.protocols`` and also resolve here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import zephon.capture as capture
from tests.capture._procs import REPO
from zephon.capture import protocols, stores, testing


def test_every_public_name_resolves() -> None:
    assert [n for n in capture.__all__ if not hasattr(capture, n)] == []
    assert {"open_store", "run_conformance"} <= set(capture.__all__)
    for name in ("CaptureStore", "TokenSink", "TokenSource"):
        assert name in protocols.__all__ and name not in capture.__all__
        assert getattr(capture, name) is getattr(protocols, name)
    assert capture.FileStore is stores.FileStore
    assert capture.FileStore.kind == "file" and capture.PostgresStore.kind == "postgres"
    assert testing.run_conformance is capture.run_conformance


def test_open_store_gives_a_capture_store(tmp_path: Path) -> None:
    store = capture.open_store(f"file://{tmp_path}")
    assert isinstance(store, capture.CaptureStore)
    assert isinstance(store, capture.FileStore)


def test_importing_the_package_pulls_in_no_driver_or_server() -> None:
    code = (
        "import sys, zephon.capture, zephon.capture.stores, zephon.capture.testing\n"
        "heavy = [m for m in ('psycopg', 'sqlite3', 'starlette', 'httpx', 'pytest')"
        " if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO / "src")},
    )
    assert out.stdout.strip() == "[]"

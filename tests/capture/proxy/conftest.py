"""Fixtures: a tokenizer, the inference stub and one proxy (file store), all real processes."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401 (fixtures for test modules)
from tests.capture.proxy._procs import Proc, start_inference_stub, start_proxy
from tests.capture.proxy.inference_stub import train_tokenizer
from zephon.capture.records import TokenCaptureSnapshot
from zephon.capture.stores import open_store


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(train_tokenizer(str(tmp_path_factory.mktemp("tok") / "tokenizer.json")))


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def engine(tokenizer: Path, logs: Path) -> Iterator[Proc]:
    proc = start_inference_stub(tokenizer, logs, "--max-model-len", "2048")
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"file://{tmp_path_factory.mktemp('capture')}"


@pytest.fixture(scope="session")
def proxy(engine: Proc, store_url: str, logs: Path) -> Iterator[Proc]:
    proc = start_proxy(engine.url, store_url, logs, "--inference-timeout", "30")
    yield proc
    # uvicorn re-raises the SIGTERM it handled gracefully, hence -15.
    assert proc.stop() in (0, -signal.SIGTERM), proc.log.read_text()[-2000:]
    assert "Traceback" not in proc.log.read_text(), proc.log.read_text()[-4000:]


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


@pytest.fixture
def rid() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


def store_call(url: str, method: str, *args: Any, **kwargs: Any) -> Any:
    """One call on a fresh client of the store (what a trainer process would do)."""

    async def run() -> Any:
        store = open_store(url)
        try:
            return await getattr(store, method)(*args, **kwargs)
        finally:
            await store.close()

    return asyncio.run(run())


def freeze(url: str, rollout_id: str) -> TokenCaptureSnapshot:
    snap: TokenCaptureSnapshot = store_call(url, "freeze", rollout_id)
    return snap

"""The S3-compatible server of the io tests (moto on loopback), for conversions into s3://;
every test gets its own cache folder (where a URL's convert lock lives)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.io.conftest import s3

__all__ = ["s3"]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / ".zephon-cache"))

"""Every io test gets its own default cache folder (none writes to the user's home); the S3
server (``s3``, in the suite's conftest) is shared by the session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.io._corpus import corpus_docs
from tests.io._formats import FORMATS, WRITERS


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / ".zephon-cache"))


@pytest.fixture(scope="session")
def corpus_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The 20,000-document corpus in every format, 5 shards of 4,000 each."""
    root = tmp_path_factory.mktemp("corpus")
    return {fmt: WRITERS[fmt](corpus_docs(), root / fmt, 5) for fmt in FORMATS}

"""Every io test gets its own default cache folder (none writes to the user's home); the S3
server is shared by the session."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.io._corpus import corpus_docs
from tests.io._formats import FORMATS, WRITERS
from tests.io._s3 import BUCKET, S3, Proxy


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / ".zephon-cache"))


@pytest.fixture(scope="session")
def corpus_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The 20,000-document corpus in every format, 5 shards of 4,000 each."""
    root = tmp_path_factory.mktemp("corpus")
    return {fmt: WRITERS[fmt](corpus_docs(), root / fmt, 5) for fmt in FORMATS}


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    """One moto S3 server on loopback for the session, behind the fault-injecting proxy; the
    standard AWS variables point every client (ours and the tests') at the proxy."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    proxy = Proxy(server.get_host_and_port())
    env = {
        "AWS_ACCESS_KEY_ID": "zephon-test",
        "AWS_SECRET_ACCESS_KEY": "zephon-test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": proxy.endpoint,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = boto3.client("s3", endpoint_url=proxy.endpoint)
        client.create_bucket(Bucket=BUCKET)
        yield S3(proxy, client)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proxy.close()
        server.stop()

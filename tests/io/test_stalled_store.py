"""An object store that stops answering (black hole) or trickles its answers, on the wire:
the read ends in a ``DataError`` naming the URL within its deadline, the run says what it
waits for while it waits, and a caller that stops waiting gets a checkpoint that resumes
exactly."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.io._s3 import S3
from tests.io._stall import StallingProxy
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import DataError, WaitInterrupted
from zephon.types import SampleBatch


@pytest.fixture
def stall(s3: S3) -> Iterator[StallingProxy]:
    proxy = StallingProxy(s3.proxy.upstream)
    yield proxy
    proxy.close()


@pytest.fixture
def url(s3: S3, tmp_path: Path) -> str:
    folder = tmp_path / "docs"
    folder.mkdir()
    for shard in range(6):
        rows = [{"id": shard * 100 + i, "text": f"doc {shard}-{i} " * 20} for i in range(100)]
        (folder / f"part-{shard}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return s3.upload(folder, f"stall-{tmp_path.name}")


def pipeline(url: str, endpoint: str, **options: Any) -> Pipeline:
    ds = Dataset.from_path(
        "docs", url, storage_options={"client_kwargs": {"endpoint_url": endpoint}}
    )
    source = StaticMixtureWorkSource([ds], chunk_size=20, seed=1)
    return Pipeline(source).fetch(max_batch=10).batch(5).options(queue_size=1, **options)


def key(batch: Any) -> Any:
    assert isinstance(batch, SampleBatch)
    return [(r.meta.sample_id, r.payload) for r in batch]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["blackhole", "trickle"])
def test_a_store_that_stops_answering_ends_in_a_data_error_naming_the_url(
    s3, stall, url, monkeypatch, caplog, mode
):
    monkeypatch.setenv("ZEPHON_IO_TIMEOUT_S", "3")
    monkeypatch.setenv("ZEPHON_IO_RETRIES", "1")
    monkeypatch.setenv("ZEPHON_IO_BACKOFF_S", "0.1")
    pipe = pipeline(url, stall.endpoint, log_every_s=0.5)
    stall.stall(after=2, mode=mode)
    got = 0
    with caplog.at_level(logging.INFO, logger="zephon"), pytest.raises(DataError) as info:
        for _ in pipe:
            got += 1
    message = str(info.value)
    assert url in message and "no answer within 3 s ($ZEPHON_IO_TIMEOUT_S)" in message, message
    assert "failed after 2 attempt(s)" in message
    # both attempts met the stall and ended at the 3 s deadline (the message says so), not
    # after the client's minutes of its own retries
    assert stall.held >= 2
    waiting = [r.getMessage() for r in caplog.records if "for the next item" in r.getMessage()]
    assert any(
        f"of {url}/part-" in line and "oldest open request: read" in line for line in waiting
    )


@pytest.mark.timeout(180)
def test_stop_while_the_store_stalls_then_resume_exactly(s3, stall, url, monkeypatch):
    monkeypatch.setenv("ZEPHON_IO_TIMEOUT_S", "600")  # only giving the read up can end it
    expected = [key(b) for b in pipeline(url, stall.endpoint)]
    pipe = pipeline(url, stall.endpoint)
    stalled_at: list[float] = []

    def check() -> bool:
        if stall.held and not stalled_at:
            stalled_at.append(time.monotonic())
        return bool(stalled_at) and time.monotonic() - stalled_at[0] > 1.0

    pipe.interrupt_when(check)
    got = []
    with pytest.raises(WaitInterrupted):
        for batch in pipe:
            got.append(key(batch))
            if len(got) == 2:
                stall.stall(after=0)
    # raised and closed (the reader gave its request up) long before the read's deadline
    assert time.monotonic() - stalled_at[0] < 60
    assert 2 <= len(got) < len(expected)
    state = json.loads(json.dumps(pipe.checkpoint()))
    stall.heal()
    resumed = pipeline(url, stall.endpoint).restore(state)
    assert got + [key(b) for b in resumed] == expected


@pytest.mark.timeout(180)
def test_process_workers_read_through_the_deadline_and_fail_naming_the_url(
    s3, stall, url, monkeypatch
):
    monkeypatch.setenv("ZEPHON_IO_TIMEOUT_S", "3")  # workers adopt the engine's environment
    monkeypatch.setenv("ZEPHON_IO_RETRIES", "1")
    monkeypatch.setenv("ZEPHON_IO_BACKOFF_S", "0.1")
    expected = [key(b) for b in pipeline(url, stall.endpoint)]
    assert [key(b) for b in pipeline(url, stall.endpoint, runner="process")] == expected
    pipe = pipeline(url, stall.endpoint, runner="process")
    stall.stall(after=2)
    start = time.monotonic()
    with pytest.raises(DataError) as info:
        list(pipe)
    assert url in str(info.value) and "no answer within 3 s" in str(info.value)
    assert time.monotonic() - start < 90

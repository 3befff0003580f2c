"""Every store client zephon opens from a URL is closed by zephon: when a pipeline's iteration
ends (in its process and in its worker processes), when it is garbage-collected, and when an
operator is torn down; a store object the caller passed in is never closed by zephon.

The PostgreSQL tests count the server's connections that carry the test's own
``application_name`` (part of the store URL), before and after."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path
from typing import Any

import pytest

from tests.capture._pg import connections, drained, pg_dsn, pg_url, tagged  # noqa: F401
from tests.capture._procs import store_url
from tests.capture._stream_fill import fill
from zephon.capture.store_handle import StoreHandle
from zephon.capture.stores import open_store
from zephon.capture.streaming import StreamingCaptureSource

PROMPTS = 6
pytestmark = [
    pytest.mark.timeout(600),  # worker processes start slowly on a loaded machine
    pytest.mark.filterwarnings("error::ResourceWarning"),
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
]


def _pipe(store: Any, runner: str = "inline") -> Any:
    source = StreamingCaptureSource(store, "s", groups_per_step=1, max_staleness=8, prompts=PROMPTS)
    pipe = source.pipeline().drop_equal_rewards(store).keep_per_prompt(store, 1)
    return pipe.options(runner=runner)


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_a_handle_closes_the_client_it_opened_and_reopens_it_on_next_use(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    fill(url, PROMPTS)
    handle = StoreHandle(url=url)
    first = handle.get()
    assert handle.owned and handle.is_open and handle.get() is first
    handle.close()
    assert not handle.is_open
    handle.close()  # twice is fine
    ledger = asyncio.run(handle.get().stream_ledger("s"))  # a fresh client
    assert handle.get() is not first and len(ledger.prompts) == PROMPTS
    handle.close()


def test_a_store_passed_in_is_never_closed_by_zephon(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url("sqlite", tmp_path, request)
    fill(url, PROMPTS)
    store = open_store(url)
    handle = StoreHandle(store=store)
    handle.close()
    assert not handle.owned and handle.get() is store
    served = list(_pipe(store))
    assert served
    ledger = asyncio.run(store.stream_ledger("s"))  # still open after the run
    assert ledger.counts()["filtered"] > 0
    asyncio.run(store.close())


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_a_finished_iteration_leaves_no_postgres_connection_open(
    runner: str,
    pg_dsn: str,  # noqa: F811
    pg_url: str,  # noqa: F811
) -> None:
    url, name = tagged(pg_url)
    fill(url, PROMPTS)
    assert drained(pg_dsn, name) == 0
    pipe = _pipe(url, runner)
    records = list(pipe)
    assert records
    assert drained(pg_dsn, name) == 0
    again = list(pipe.restore(pipe.checkpoint()))  # a closed client reopens for a new run
    assert again == [] and drained(pg_dsn, name) == 0


def test_a_stopped_iteration_closes_its_clients_when_closed_or_collected(
    pg_dsn: str,  # noqa: F811
    pg_url: str,  # noqa: F811
) -> None:
    url, name = tagged(pg_url)
    fill(url, PROMPTS)
    it = iter(_pipe(url))
    next(it)
    assert connections(pg_dsn, name) >= 1
    it.close()  # type: ignore[attr-defined]
    assert drained(pg_dsn, name) == 0
    pipe = _pipe(url)
    it = iter(pipe)
    next(it)
    assert connections(pg_dsn, name) >= 1
    del it, pipe
    gc.collect()
    assert drained(pg_dsn, name) == 0


def test_a_handle_collected_inside_a_thread_pools_submit_closes_its_client_without_deadlock(
    tmp_path: Path,
) -> None:
    """The garbage collector may run a finaliser in a thread that holds a thread pool's
    locks (inside ``submit``); closing the client there needs those locks: it must be left
    to the closer thread."""
    from concurrent.futures import thread as pool_thread

    from zephon.capture import store_handle

    handle = StoreHandle(url=store_url("file", tmp_path, None))
    store = handle.get()
    with pool_thread._global_shutdown_lock:  # as in ThreadPoolExecutor.submit
        del handle
        gc.collect()  # closed here before: run_sync -> submit -> this very lock
    store_handle._drain()  # what the closer thread has not taken yet is closed now
    deadline = time.monotonic() + 60  # or the closer thread is closing it: wait for that
    while not _closed(store):
        assert time.monotonic() < deadline, "the collected handle's client was never closed"
        time.sleep(0.01)


def _closed(store: Any) -> bool:
    try:
        asyncio.run(store.stream_ledger("s"))
    except RuntimeError as error:
        assert "client is closed" in str(error)
        return True
    return False

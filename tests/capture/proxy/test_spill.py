"""The spill journal: an incomplete mark the store cannot take is kept locally and replayed.

The end-to-end test stops a real PostgreSQL server while a call is at the engine: the call's
``put`` and its mark both fail, the mark is journalled before the client is answered, and
once the server is back the proxy's periodic replay lands it in the store.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.capture._pg import fresh_schema_url
from tests.capture._pgserver import EmbeddedPostgres
from tests.capture._workload import make_entry
from tests.capture.proxy._harness import CAP, wait_held
from tests.capture.proxy._procs import Proc, start_proxy
from tests.capture.proxy.conftest import store_call
from zephon.capture.proxy import ProxyConfig
from zephon.capture.proxy._spill import SpilledMark, SpillJournal
from zephon.capture.stores import open_store

pytestmark = pytest.mark.timeout(120)


def _lines(directory: Path) -> list[str]:
    """Every journalled mark under ``directory`` (a file adopted meanwhile is skipped)."""
    out: list[str] = []
    for path in sorted(directory.rglob("*.jsonl")):
        try:
            out += path.read_text().splitlines()
        except FileNotFoundError:
            continue
    return out


def test_journal_survives_a_dead_worker_and_clears_after_replay(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    # A dead worker's journal: two complete marks and a torn, never acknowledged, third.
    orphan = spill / "spill-1-dead.jsonl"
    orphan.write_bytes(
        b'{"call_id": "c1", "reason": "put_error", "rollout_id": "r1"}\n'
        b'{"call_id": "c2", "reason": "put_error", "rollout_id": "r2"}\n'
        b'{"call_id": "c3", "rea'
    )
    journal = SpillJournal(str(spill))
    journal.append(SpilledMark("r3", "c4", "engine_timeout"))
    store = open_store(f"file://{tmp_path / 'store'}")
    down = {"r2"}
    sent: list[tuple[str, str]] = []

    async def send(mark: SpilledMark) -> bool:
        if mark.rollout_id in down:
            return False  # still unreachable for this rollout
        await store.mark_incomplete(mark.rollout_id, mark.call_id)
        sent.append((mark.rollout_id, mark.call_id))
        return True

    assert asyncio.run(journal.replay(send)) == 1
    assert not orphan.exists()  # adopted into this worker's journal
    assert len(_lines(spill)) == 3  # kept until every mark is taken
    down.clear()
    assert asyncio.run(journal.replay(send)) == 0
    assert _lines(spill) == []
    assert sorted(set(sent)) == [("r1", "c1"), ("r2", "c2"), ("r3", "c4")]
    for rid, cid in sent:
        assert cid in store.state_of(rid).incomplete_calls
    journal.close()
    assert list(spill.iterdir()) == []
    asyncio.run(store.close())


def _held_call(proxy: Proc, rid: str, result: dict[str, httpx.Response]) -> threading.Thread:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "q"}]}
    body |= {"test_engine_fault": "hold", "test_engine_hold": rid}

    def call() -> None:
        with httpx.Client(timeout=60) as client:
            url = proxy.url + CAP.format(rid=rid) + "/v1/chat/completions"
            result["resp"] = client.post(url, json=body)

    worker = threading.Thread(target=call)
    worker.start()
    return worker


def test_a_mark_spilled_while_postgres_is_down_lands_after_it_returns(
    engine: Proc, logs: Path, tmp_path: Path, http: httpx.Client
) -> None:
    pg = EmbeddedPostgres()
    pg.start()
    proxy = None
    try:
        url = fresh_schema_url(pg.dsn)
        spill = tmp_path / "spill"
        extra = ("--spill-dir", str(spill), "--spill-replay-interval", "0.2")
        proxy = start_proxy(engine.url, url, logs, "--store-clients", "1", *extra)
        rid = "outage"
        result: dict[str, httpx.Response] = {}
        worker = _held_call(proxy, rid, result)
        wait_held(http, engine.url, rid)
        pg.pause()  # the store goes away while the call is generating
        http.post(f"{engine.url}/test/release/{rid}")
        worker.join(60)
        resp = result["resp"]
        assert resp.status_code == 200  # a capture failure never fails the model call
        assert resp.headers["x-zephon-capture"] == "incomplete"
        call_id = resp.headers["x-zephon-model-call-id"]
        assert [ln for ln in _lines(spill) if call_id in ln], "the mark was not journalled"
        pg.resume()
        deadline = time.monotonic() + 30
        while _lines(spill):  # a condition: the replay clears the journal once it landed
            assert time.monotonic() < deadline, "the spilled mark was never replayed"
        reader = open_store(url)
        state = reader.state_of(rid)
        asyncio.run(reader.close())
        assert state.incomplete and call_id in state.incomplete_calls
        # The store is usable again through the proxy's own client.
        assert store_call(url, "put", make_entry(rid, "after")) is None
    finally:
        if proxy is not None:
            proxy.stop()
        pg.stop()


def test_a_journal_left_by_a_dead_proxy_is_replayed_when_the_next_one_starts(
    engine: Proc, logs: Path, tmp_path: Path
) -> None:
    url = f"file://{tmp_path / 'store'}"
    spill = tmp_path / "spill"
    config = ProxyConfig(engine_url=engine.url, store_url=url, spill_dir=str(spill))
    folder = Path(config.spill_path)
    folder.mkdir(parents=True)
    mark = {"call_id": "lost", "reason": "put_error", "rollout_id": "left"}
    (folder / "spill-999-dead.jsonl").write_text(json.dumps(mark) + "\n")
    # A long interval: only the replay at start can land the mark within the deadline.
    extra = ("--spill-dir", str(spill), "--spill-replay-interval", "600")
    proxy = start_proxy(engine.url, url, logs, *extra)
    try:
        store = open_store(url)
        deadline = time.monotonic() + 30
        while "lost" not in store.state_of("left").incomplete_calls:  # a condition, not a sleep
            assert time.monotonic() < deadline, "the journal was not replayed at start"
        while _lines(spill):  # cleared once the store took the mark
            assert time.monotonic() < deadline, "the replayed journal was not cleared"
        asyncio.run(store.close())
    finally:
        proxy.stop()

"""Bad input and bad engines: each has a defined answer, and nothing committed is lost."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.capture.proxy._harness import CAP, wait_held
from tests.capture.proxy._procs import REPO, Proc, child_env, start_proxy
from tests.capture.proxy.conftest import freeze, store_call
from zephon.capture.records import ParentResolutionStatus
from zephon.capture.stores import open_store

pytestmark = pytest.mark.timeout(60)

CONTROL = "/training-token-capture/control"
MSGS = [{"role": "user", "content": "first question"}]


def _url(proxy: Proc, rid: str, route: str = "/v1/chat/completions") -> str:
    return proxy.url + CAP.format(rid=rid) + route


def _engine_calls(http: httpx.Client, engine: Proc) -> int:
    stats = http.get(f"{engine.url}/test/stats").json()
    return int(stats["chat"] + stats["completions"])


def _good_turn(http: httpx.Client, proxy: Proc, rid: str) -> tuple[str, dict[str, Any]]:
    resp = http.post(_url(proxy, rid), json={"model": "tiny", "messages": MSGS})
    assert resp.status_code == 200 and resp.headers["x-zephon-capture"] == "committed"
    return resp.headers["x-zephon-model-call-id"], resp.json()["choices"][0]["message"]


def test_bad_requests_are_refused_before_any_capture_state(
    proxy: Proc, engine: Proc, store_url: str, rid: str, http: httpx.Client
) -> None:
    first, _ = _good_turn(http, proxy, rid)
    before = _engine_calls(http, engine)
    cases = [
        ("/v1/chat/completions", b'{"model": "tiny", "messages": [', 400, "invalid_json"),
        ("/v1/chat/completions", b"[1, 2]", 400, "invalid_json"),
        ("/v1/chat/completions", b'{"messages": [], "model": "t"}', 400, "invalid_request"),
        ("/v1/chat/completions", b'{"model":"t","n":0,"messages":[{"role":"user","content":"x"}]}',
         400, "unsupported_n"),
        ("/v1/completions", b'{"model": "t", "prompt": ["a", "b"]}', 400, "unsupported_prompt"),
        ("/v1/completions", b'{"model": "t", "prompt": "a", "echo": true}', 400, "unsupported"),
        ("/v1/responses", b'{"model": "t", "input": "x", "previous_response_id": "resp_1"}',
         400, "unsupported_previous_response_id"),
        ("/v1/embeddings", b'{"model": "t", "input": "x"}', 404, "unknown_capture_route"),
        ("/v1/messages", b'{"model": "t", "messages": []}', 404, "unknown_capture_route"),
        ("/v1/chat/completions", b'{"model": "t", "messages": [{"role": "user", "content": '
         b'[{"type": "input_image", "image": ' + b"[" * 300 + b"]" * 300 + b"}]}]}",
         400, "json_too_deep"),
        ("/v1/chat/completions", b'{"model": "t", "messages": [{"role": "user", "content": '
         b'[{"type": "input_image", "image": 100000000000000000000000000}]}]}',
         400, "history_unrepresentable"),
    ]  # fmt: skip
    for route, raw, status, code in cases:
        resp = http.post(_url(proxy, rid, route), content=raw)
        assert resp.status_code == status, (route, raw, resp.text)
        assert resp.json()["error"]["code"] == code, (route, raw, resp.text)
        assert resp.json()["error"]["message"]
    assert http.get(_url(proxy, rid)).status_code == 405
    bad_rid = http.post(_url(proxy, "no/slash"), json={"model": "t", "messages": MSGS})
    assert bad_rid.status_code in (400, 404)
    assert http.post(_url(proxy, "a!b"), json={"model": "t", "messages": MSGS}).status_code == 400
    assert _engine_calls(http, engine) == before  # nothing reached the engine
    snap = freeze(store_url, rid)
    assert not snap.incomplete  # no intent was recorded for a refused request
    assert [e.model_call_id for e in snap.entries] == [first]


@pytest.mark.parametrize("fault", ["partial", "mismatch"])
def test_partial_token_data_marks_incomplete_but_answers(
    proxy: Proc, store_url: str, rid: str, http: httpx.Client, fault: str
) -> None:
    first, msg = _good_turn(http, proxy, rid)
    body = {
        "model": "tiny",
        "messages": [*MSGS, msg, {"role": "user", "content": "again"}],
        "test_engine_fault": fault,
    }
    resp = http.post(_url(proxy, rid), json=body)
    assert resp.status_code == 200  # a capture failure never fails the model call
    assert resp.headers["x-zephon-capture"] == "incomplete"
    assert resp.json()["choices"][0]["message"]["role"] == "assistant"
    snap = freeze(store_url, rid)
    assert snap.incomplete
    assert [e.model_call_id for e in snap.entries] == [first]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_tokenize_fallback_when_the_engine_omits_prompt_ids(
    proxy: Proc, engine: Proc, store_url: str, rid: str, http: httpx.Client, route: str
) -> None:
    if route == "/v1/completions":
        body: dict[str, Any] = {"model": "tiny", "prompt": "tokenize me please"}
        expect = http.post(f"{engine.url}/tokenize", json={"prompt": body["prompt"]})
    else:
        body = {"model": "tiny", "messages": MSGS}
        expect = http.post(f"{engine.url}/tokenize", json={"messages": MSGS})
    resp = http.post(_url(proxy, rid, route), json={**body, "test_engine_fault": "no_prompt_ids"})
    assert resp.status_code == 200 and resp.headers["x-zephon-capture"] == "committed"
    snap = freeze(store_url, rid)
    assert not snap.incomplete
    (entry,) = snap.entries
    assert entry.prompt_token_ids == expect.json()["tokens"] != []


def test_generated_ids_from_logprob_tokens_when_token_ids_are_missing(
    proxy: Proc, engine: Proc, store_url: str, rid: str, http: httpx.Client
) -> None:
    direct = http.post(
        f"{engine.url}/v1/chat/completions",
        json={"model": "tiny", "messages": MSGS, "return_token_ids": True},
    ).json()
    body = {"model": "tiny", "messages": MSGS, "test_engine_fault": "no_token_ids"}
    assert http.post(_url(proxy, rid), json=body).status_code == 200
    (entry,) = freeze(store_url, rid).entries
    assert entry.generation_token_ids == direct["choices"][0]["token_ids"]


def test_context_overflow_is_recorded_as_an_engine_refusal(
    proxy: Proc, store_url: str, rid: str, http: httpx.Client
) -> None:
    first, msg = _good_turn(http, proxy, rid)
    huge = " ".join(["lineage parent child"] * 1500)
    body = {"model": "tiny", "messages": [*MSGS, msg, {"role": "user", "content": huge}]}
    resp = http.post(_url(proxy, rid), json=body)
    assert resp.status_code == 400
    assert "maximum context length" in resp.json()["error"]["message"]  # the engine's own error
    assert resp.headers["x-zephon-capture"] == "refused"
    snap = freeze(store_url, rid)
    assert not snap.incomplete  # the refusal resolved its intent
    assert [e.model_call_id for e in snap.entries] == [first]
    (refusal,) = snap.engine_refusals
    assert refusal.model_call_id == resp.headers["x-zephon-model-call-id"]
    assert refusal.code == "context_length_exceeded"
    assert refusal.parent_call_id == first
    assert refusal.parent_resolution is ParentResolutionStatus.RESOLVED


def test_engine_5xx_passes_through_and_masks(
    proxy: Proc, store_url: str, rid: str, http: httpx.Client
) -> None:
    first, _ = _good_turn(http, proxy, rid)
    body = {"model": "tiny", "messages": MSGS, "test_engine_fault": "error500"}
    resp = http.post(_url(proxy, rid), json=body)
    assert resp.status_code == 500 and resp.json()["error"]["message"] == "boom"
    snap = freeze(store_url, rid)
    assert snap.incomplete and [e.model_call_id for e in snap.entries] == [first]


def test_frozen_rollout_refuses_before_generation(
    proxy: Proc, engine: Proc, store_url: str, rid: str, http: httpx.Client
) -> None:
    _good_turn(http, proxy, rid)
    snap = freeze(store_url, rid)
    before = _engine_calls(http, engine)
    resp = http.post(_url(proxy, rid), json={"model": "tiny", "messages": MSGS})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "capture_refused"
    assert resp.headers["x-zephon-capture"] == "not_sent"
    assert _engine_calls(http, engine) == before
    assert freeze(store_url, rid).version == snap.version


def test_a_store_that_cannot_take_the_intent_answers_503_not_sent(
    proxy: Proc, engine: Proc, store_url: str, rid: str, http: httpx.Client
) -> None:
    """The rollout's log cannot be written (a directory is in its place): the call is not
    dispatched, and the answer says so in the same header as every other capture answer."""
    blocker = Path(urlsplit(store_url).path) / f"{rid}.log"
    blocker.mkdir()
    before = _engine_calls(http, engine)
    resp = http.post(_url(proxy, rid), json={"model": "tiny", "messages": MSGS})
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "capture_store_unavailable"
    assert resp.headers["x-zephon-capture"] == "not_sent"
    assert resp.headers["x-should-retry"] == "true" and resp.headers["retry-after"] == "1"
    assert resp.headers["x-zephon-model-call-id"]
    assert _engine_calls(http, engine) == before
    blocker.rmdir()  # the store is back: the retry the headers ask for is captured
    _good_turn(http, proxy, rid)


def test_client_disconnect_does_not_lose_the_capture(
    proxy: Proc, engine: Proc, store_url: str, rid: str, http: httpx.Client
) -> None:
    first, msg = _good_turn(http, proxy, rid)
    messages = [*MSGS, msg, {"role": "user", "content": "and then?"}]
    expected = http.post(
        f"{engine.url}/v1/chat/completions", json={"model": "tiny", "messages": messages}
    ).json()["choices"][0]["message"]
    body = {"model": "tiny", "messages": messages, "test_engine_fault": "hold"}
    body["test_engine_hold"] = rid
    raw = json.dumps(body).encode()
    path = CAP.format(rid=rid) + "/v1/chat/completions"
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n".encode()
            + raw
        )
        wait_held(http, engine.url, rid)
    # The client is gone; the engine now answers.
    http.post(f"{engine.url}/test/release/{rid}")
    continuation = [*messages, expected, {"role": "user", "content": "next"}]

    async def resolved() -> Any:
        store = open_store(store_url)
        try:
            deadline = time.monotonic() + 20
            while True:
                res = await store.resolve(rid, continuation)
                if res.match is not None or time.monotonic() > deadline:
                    return res
        finally:
            await store.close()

    res = asyncio.run(resolved())
    assert res.match is not None, res  # the abandoned call's entry was committed
    snap = freeze(store_url, rid)
    assert not snap.incomplete
    assert len(snap.entries) == 2
    (entry,) = [e for e in snap.entries if e.model_call_id != first]
    assert entry.parent_call_id == first and entry.model_call_id == res.match.model_call_id


@pytest.fixture
def slow_proxy(engine: Proc, store_url: str, logs: Path) -> Iterator[Proc]:
    """A proxy that gives up on an engine call after 2 s."""
    proxy = start_proxy(engine.url, store_url, logs, "--inference-timeout", "2")
    yield proxy
    proxy.stop()


@pytest.mark.parametrize("after_hold", ["none", "error500", "partial", "timeout"])
def test_a_call_that_ends_after_the_freeze_leaves_the_snapshot_alone(
    request: pytest.FixtureRequest,
    engine: Proc,
    store_url: str,
    rid: str,
    http: httpx.Client,
    after_hold: str,
) -> None:
    """A call still at the engine when the rollout is frozen: its entry, or its failure (HTTP
    500, an answer without token data, a timeout), is dropped and nothing is marked. The
    freeze already masked it through its intent, and the consumed snapshot stays retirable."""
    proxy: Proc = request.getfixturevalue("slow_proxy" if after_hold == "timeout" else "proxy")
    first, _ = _good_turn(http, proxy, rid)
    result: dict[str, httpx.Response] = {}
    body = {"model": "tiny", "messages": MSGS, "test_engine_fault": "hold", "test_engine_hold": rid}
    if after_hold not in ("none", "timeout"):
        body["test_engine_after_hold"] = after_hold

    def call() -> None:
        with httpx.Client(timeout=30) as client:
            result["resp"] = client.post(_url(proxy, rid), json=body)

    worker = threading.Thread(target=call)
    worker.start()
    wait_held(http, engine.url, rid)
    frozen = http.post(f"{proxy.url}{CONTROL}/rollouts/{rid}/freeze").json()
    assert frozen["incomplete"]  # its intent has no entry at freeze time
    if after_hold != "timeout":  # a timeout ends the call while the engine still holds it
        http.post(f"{engine.url}/test/release/{rid}")
    worker.join(30)
    http.post(f"{engine.url}/test/release/{rid}")
    resp = result["resp"]
    assert resp.status_code == {"error500": 500, "timeout": 504}.get(after_hold, 200)
    assert resp.headers["x-zephon-capture"] == "late"
    again = freeze(store_url, rid)
    assert (again.snapshot_id, again.version) == (frozen["snapshot_id"], frozen["version"])
    assert [e.model_call_id for e in again.entries] == [first]
    kw = {"snapshot_id": frozen["snapshot_id"], "version": frozen["version"]}
    assert store_call(store_url, "drop", rid, **kw) is True


# --------------------------------------------------------------------------- broken engines


class BrokenEngine:
    """A loopback TCP server that reads a request and then closes or never answers."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.loop = asyncio.new_event_loop()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = 0
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._handle, sock=self.sock)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        self.requests += 1
        if self.mode == "hang":
            await reader.read()  # until the proxy gives up and closes
        writer.close()

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture(params=["close", "hang"])
def broken(request: pytest.FixtureRequest, store_url: str, logs: Path) -> Iterator[Any]:
    engine = BrokenEngine(request.param)
    proxy = start_proxy(engine.url, store_url, logs, "--inference-timeout", "0.5")
    yield request.param, engine, proxy
    proxy.stop()
    engine.close()


def test_engine_that_closes_or_times_out_masks_and_keeps_earlier_entries(
    proxy: Proc, broken: Any, store_url: str, rid: str, http: httpx.Client
) -> None:
    mode, engine, bad_proxy = broken
    first, msg = _good_turn(http, proxy, rid)  # committed through a healthy worker
    body = {"model": "tiny", "messages": [*MSGS, msg, {"role": "user", "content": "more"}]}
    resp = http.post(_url(bad_proxy, rid), json=body)
    assert engine.requests == 1
    expected = {"close": (502, "engine_connection"), "hang": (504, "engine_timeout")}[mode]
    assert (resp.status_code, resp.json()["error"]["code"]) == expected
    assert resp.headers["x-zephon-parent-resolution"] == "resolved"
    assert resp.headers["x-zephon-capture"] == "incomplete"
    snap = freeze(store_url, rid)
    assert snap.incomplete
    assert [e.model_call_id for e in snap.entries] == [first]
    health = http.get(f"{bad_proxy.url}{CONTROL}/health")
    assert health.status_code == 503


def _serve(*args: str, preamble: str = "") -> subprocess.CompletedProcess[str]:
    code = f"{preamble}import sys; from zephon.cli._capture import main; sys.exit(main())"
    cmd = [
        sys.executable,
        "-c",
        code,
        "serve",
        "--inference-server",
        "http://127.0.0.1:9",
        "--port",
        "0",
    ]
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, timeout=60, cwd=REPO, env=child_env()
    )


@pytest.mark.parametrize("workers", ["1", "2"])
def test_unreachable_store_fails_startup_with_one_line_before_listening(workers: str) -> None:
    done = _serve("--store", "postgresql://zephon@127.0.0.1:1/nowhere", "--workers", workers)
    assert done.returncode == 1  # the documented exit status of a failed startup
    assert "listening" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "store postgresql://zephon@127.0.0.1:1/nowhere is unreachable" in lines[0]


def test_a_missing_server_stack_names_the_extra_to_install(tmp_path: Path) -> None:
    # The interpreter cannot import starlette, as in an install without the extra.
    done = _serve(
        "--store", f"file://{tmp_path}", preamble="import sys; sys.modules['starlette'] = None; "
    )
    assert done.returncode == 2
    assert "listening" not in done.stdout
    assert done.stderr.strip().splitlines() == [
        "zephon capture serve: error: the capture proxy needs starlette, which is not "
        "installed: pip install 'zephon[proxy]'"
    ]

"""What one client may cost a proxy: each limit met by a real client on a real proxy process.

Raw sockets send exactly the bytes a hostile client would (a declared 100 MB body, a chunked
body past the limit, silent and half-sent requests), so what the proxy answers is certain.
Every refusal is a 4xx or a 503, never a 500, and the proxy's log has no traceback.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.capture.proxy._procs import Proc, start_proxy
from tests.capture.proxy.conftest import freeze

CAP = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
LIMIT = 2**20
WAIT_S = 30.0  # bound on any one socket read; the deadlines under test are 1 and 2 seconds


@pytest.fixture(scope="module")
def limited(engine: Proc, logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    store = f"file://{tmp_path_factory.mktemp('limited')}"
    proc = start_proxy(
        engine.url,
        store,
        logs,
        *("--max-body-bytes", str(LIMIT), "--max-buffered-bytes", str(3 * LIMIT)),
        *("--max-json-depth", "32", "--max-header-bytes", "8192"),
        *("--header-timeout", "1", "--body-timeout", "2"),
    )
    yield proc, store
    proc.stop()
    log = proc.log.read_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-4000:]


def _connect(proxy: Proc) -> socket.socket:
    parts = urlsplit(proxy.url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80))
    sock.settimeout(WAIT_S)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the proxy closes the connection (bounded by the socket timeout)."""
    out = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not data:
            return out
        out += data


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def _head(path: str, *lines: str, method: str = "POST") -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "host: proxy", *lines, "", ""]).encode()


def test_a_declared_oversized_body_is_refused_before_it_is_read(limited: Any, rid: str) -> None:
    proxy, store = limited
    for path in (CAP.format(rid=rid), "/v1/chat/completions", "/ng-rollout/x/v1/completions"):
        with _connect(proxy) as sock:
            sock.sendall(_head(path, "content-length: 100000000"))  # 100 MB announced, none sent
            answer = _read_all(sock)
        assert _status(answer) == 413, answer[:300]
        assert b"request_too_large" in answer and b"connection: close" in answer.lower()
    assert freeze(store, rid).entries == ()


def test_a_chunked_body_is_cut_off_at_the_limit(limited: Any, rid: str) -> None:
    proxy, _ = limited
    chunk = b"x" * 65536
    with _connect(proxy) as sock:
        sock.sendall(_head(CAP.format(rid=rid), "transfer-encoding: chunked"))
        for _ in range(LIMIT // len(chunk) + 1):  # one chunk past the limit, then nothing
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer = _read_all(sock)
    assert _status(answer) == 413, answer[:300]


def _deep(levels: int) -> bytes:
    return b'{"model":"m","messages":' + b"[" * levels + b"]" * levels + b"}"


def test_deep_json_is_a_400(limited: Any, http: httpx.Client, rid: str) -> None:
    proxy, store = limited
    url = proxy.url + CAP.format(rid=rid)
    retire = proxy.url + "/training-token-capture/control/retire"
    for levels in (40, 1_000, 100_000):
        for target in (url, retire):
            resp = http.post(target, content=_deep(levels))
            assert resp.status_code == 400, (target, levels, resp.text[:300])
            assert resp.json()["error"]["code"] == "json_too_deep"
    ok = http.post(url, json={**CHAT, "metadata": {"a": {"b": {"c": [[[1]]]}}}})
    assert ok.status_code == 200
    assert len(freeze(store, rid).entries) == 1


def test_odd_paths_and_header_bytes_are_answered_without_a_500(
    limited: Any, http: httpx.Client
) -> None:
    proxy, _ = limited
    for path in ("//v1/models", "//", "//x//y", "/ng-rollout/r//v1/models"):
        with _connect(proxy) as sock:
            sock.sendall(_head(path, "connection: close", method="GET"))
            answer = _read_all(sock)
        assert 400 <= _status(answer) < 500, (path, answer[:300])
    with _connect(proxy) as sock:  # a non-ASCII header value (latin-1 byte) is passed through
        head = _head("/v1/models?q=%E9", "x-note: caf-", "connection: close", method="GET")
        sock.sendall(head.replace(b"caf-", b"caf\xe9"))
        assert _status(_read_all(sock)) == 200
    with _connect(proxy) as sock:  # a non-ASCII byte in the request line is the parser's 400
        sock.sendall(_head("/v1/models?q=-", method="GET").replace(b"q=-", b"q=\xe9"))
        assert _status(_read_all(sock)) == 400


def test_oversized_headers_are_a_431(limited: Any) -> None:
    proxy, _ = limited
    with _connect(proxy) as sock:
        sock.sendall(_head("/v1/models", *[f"x-pad-{i}: {'a' * 1000}" for i in range(20)]))
        answer = _read_all(sock)
    assert _status(answer) == 431, answer[:300]


def test_silent_and_slow_connections_are_closed(limited: Any, http: httpx.Client) -> None:
    proxy, _ = limited
    silent = [_connect(proxy) for _ in range(50)]
    half_headers = _connect(proxy)
    half_headers.sendall(b"GET /v1/models HTTP/1.1\r\nhost: proxy\r\n")
    half_body = _connect(proxy)
    half_body.sendall(_head("/v1/chat/completions", "content-length: 100") + b"{")
    socks = [*silent, half_headers, half_body]
    with ThreadPoolExecutor(len(socks)) as pool:
        # _read_all returns only when the proxy closes the connection; our own read timeout
        # (WAIT_S) would raise TimeoutError here instead
        answers = list(pool.map(_read_all, socks))
    for sock in socks:
        sock.close()
    assert all(_status(a) == 408 for a in answers[:-1]), {a[:40] for a in answers}
    assert answers[-1] == b""  # a request in progress: closed, nothing half-answered
    assert http.get(proxy.url + "/v1/models").status_code == 200


@pytest.fixture(scope="module")
def capped(engine: Proc, logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    store = f"file://{tmp_path_factory.mktemp('capped')}"
    proc = start_proxy(engine.url, store, logs, "--max-concurrent-requests", "2")
    yield proc, store
    proc.stop()
    assert "Traceback" not in proc.log.read_text()


def test_a_full_worker_answers_503_with_retry_after(
    capped: Any, engine: Proc, http: httpx.Client, rid: str
) -> None:
    proxy, store = capped
    token = uuid.uuid4().hex
    held = {**CHAT, "test_engine_fault": "hold", "test_engine_hold": token}
    url = proxy.url + CAP.format(rid=rid)
    with ThreadPoolExecutor(2) as pool, httpx.Client(timeout=60) as slow:
        calls = [pool.submit(slow.post, url, json=held) for _ in range(2)]
        deadline = time.monotonic() + WAIT_S
        while http.get(f"{engine.url}/test/stats").json()["held"].get(token, 0) < 2:
            assert time.monotonic() < deadline, "the two calls never reached the engine"
        for path in (CAP.format(rid=rid), "/v1/models"):
            busy = http.post(proxy.url + path, json=CHAT)
            assert busy.status_code == 503, busy.text
            assert busy.headers["retry-after"] == "1"
            assert busy.json()["error"]["code"] == "proxy_busy"
        health = http.get(proxy.url + "/training-token-capture/control/health")
        assert health.status_code == 200  # the control routes are not capped
        http.post(f"{engine.url}/test/release/{token}")
        assert [c.result().status_code for c in calls] == [200, 200]
    assert http.post(url, json=CHAT).status_code == 200
    assert len(freeze(store, rid).entries) == 3


def test_a_slow_second_request_on_a_kept_alive_connection_is_timed_out(limited: Any) -> None:
    proxy, _ = limited
    with _connect(proxy) as sock:
        sock.sendall(_head("/training-token-capture/control/health", method="GET"))
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
        head, _, body = answer.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += sock.recv(65536)
        assert _status(head) == 200 and b"connection: close" not in head.lower()
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: pro")  # and nothing more
        assert _status(_read_all(sock)) == 408


@pytest.fixture(scope="module")
def budgeted(engine: Proc, logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    store = f"file://{tmp_path_factory.mktemp('budgeted')}"
    limits = ("--max-body-bytes", str(LIMIT), "--max-buffered-bytes", str(2 * LIMIT))
    proc = start_proxy(engine.url, store, logs, *limits)
    yield proc, store
    proc.stop()
    assert "Traceback" not in proc.log.read_text()


def _padded_chat(size: int) -> bytes:
    body = {**CHAT, "metadata": {"pad": ""}}
    pad = size - len(httpx.Request("POST", "http://x", json=body).content)
    return httpx.Request("POST", "http://x", json={**CHAT, "metadata": {"pad": "p" * pad}}).content


def test_bodies_in_flight_share_one_budget(budgeted: Any, http: httpx.Client, rid: str) -> None:
    proxy, store = budgeted
    path = CAP.format(rid=rid)
    body = _padded_chat(LIMIT - 1024)
    hangers = [_connect(proxy) for _ in range(2)]  # each announces a 1 MiB body, sends none
    for sock in hangers:
        sock.sendall(_head(path, f"content-length: {LIMIT}"))
    deadline = time.monotonic() + WAIT_S
    while True:  # until both hangers hold their share (the proxy reads them concurrently)
        resp = http.post(proxy.url + path, content=body)
        if resp.status_code == 503:
            break
        assert resp.status_code == 200 and time.monotonic() < deadline, resp.text[:300]
    assert (
        resp.headers["retry-after"] == "1" and "request bodies" in resp.json()["error"]["message"]
    )
    for sock in hangers:
        sock.close()
    deadline = time.monotonic() + WAIT_S
    while (resp := http.post(proxy.url + path, content=body)).status_code == 503:
        assert time.monotonic() < deadline, "the budget was not given back after a hang-up"
    assert resp.status_code == 200
    snap = freeze(store, rid)
    assert len(snap.entries) >= 1 and not snap.incomplete

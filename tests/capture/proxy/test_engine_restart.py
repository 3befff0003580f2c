"""Engine failures cost only what they must.

A call whose connection the engine refused sent nothing: the proxy retries it (on the next
engine of a fleet) within ``--connect-retry``, then answers a retryable 503 and settles the
call's intent as an engine refusal, so the rollout stays trainable once the harness retries.
Only a call that was at the engine when it died (it may have generated) masks its rollout.
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.capture.proxy._harness import CAP, wait_held
from tests.capture.proxy._procs import Proc, start_inference_stub, start_proxy
from tests.capture.proxy.conftest import freeze
from zephon.capture.builder import build_rollout

pytestmark = pytest.mark.timeout(180)


def _dead_url() -> str:
    """A loopback port nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _chat(
    http: httpx.Client, proxy: Proc, rid: str, msgs: list[dict[str, Any]], **extra: Any
) -> httpx.Response:
    url = proxy.url + CAP.format(rid=rid) + "/v1/chat/completions"
    return http.post(url, json={"model": "tiny", "messages": msgs, **extra})


def _turn(http: httpx.Client, proxy: Proc, rid: str, msgs: list[dict[str, Any]]) -> None:
    resp = _chat(http, proxy, rid, msgs)
    assert resp.status_code == 200 and resp.headers["x-zephon-capture"] == "committed", resp.text
    msgs += [resp.json()["choices"][0]["message"], {"role": "user", "content": "go on"}]


def test_engine_restart_masks_only_the_call_at_the_engine(
    tokenizer: Path, logs: Path, tmp_path: Path
) -> None:
    engine = start_inference_stub(tokenizer, logs)
    port = engine.url.rsplit(":", 1)[1]
    store = f"file://{tmp_path / 'capture'}"
    proxy = start_proxy(engine.url, store, logs, "--connect-retry", "0.3")
    convs: dict[str, list[dict[str, Any]]] = {
        f"b{i}": [{"role": "user", "content": f"task b{i}"}] for i in range(4)
    }
    try:
        with httpx.Client(timeout=60) as http, ThreadPoolExecutor(1) as pool:
            for rid, msgs in convs.items():
                _turn(http, proxy, rid, msgs)
            held = pool.submit(
                _chat,
                http,
                proxy,
                "a0",
                [{"role": "user", "content": "task a0"}],
                test_engine_fault="hold",
                test_engine_hold="a0",
            )
            wait_held(http, engine.url, "a0")
            engine.kill()  # SIGKILL with a0 at the engine
            engine.stop()  # reaped: closes its pipe
            lost = held.result()
            assert lost.status_code == 502 and lost.headers["x-should-retry"] == "false"
            assert lost.headers["x-zephon-capture"] == "incomplete"
            for rid, msgs in convs.items():
                refused = _chat(http, proxy, rid, msgs)
                assert refused.status_code == 503, refused.text
                assert refused.json()["error"]["code"] == "engine_unavailable"
                assert refused.headers["x-should-retry"] == "true"
                assert refused.headers["x-zephon-capture"] == "not_sent"
            engine = start_inference_stub(tokenizer, logs, "--port", port)
            for rid, msgs in convs.items():
                _turn(http, proxy, rid, msgs)  # the harness retries the refused turn
                _turn(http, proxy, rid, msgs)
    finally:
        proxy.stop()
        engine.stop()
    masked = {}
    for rid in ["a0", *convs]:
        snap = freeze(store, rid)
        build = build_rollout(snap)
        masked[rid] = build.masked
        if rid != "a0":
            assert [r.code for r in snap.engine_refusals] == ["engine_unreachable"]
            assert build.trajectory is not None and len(build.trajectory.call_ids) == 3
    assert masked == {"a0": True, "b0": False, "b1": False, "b2": False, "b3": False}


def test_a_fleet_sends_each_call_to_a_live_engine(engine: Proc, logs: Path, tmp_path: Path) -> None:
    store = f"file://{tmp_path / 'capture'}"
    dead = _dead_url()
    proxy = start_proxy(dead, store, logs, "--inference-server", engine.url, "--connect-retry", "5")
    try:
        with httpx.Client(timeout=60) as http:
            health = http.get(proxy.url + "/training-token-capture/control/health").json()
            assert health["engines"] == [dead, engine.url] and health["status"] == "ok"
            for i in range(6):
                _turn(http, proxy, f"f{i}", [{"role": "user", "content": f"fleet {i}"}])
            frozen = _chat(http, proxy, "f0", [{"role": "user", "content": "x"}])
            assert frozen.status_code == 200
            freeze(store, "f1")
            late = _chat(http, proxy, "f1", [{"role": "user", "content": "x"}])
            assert late.status_code == 409 and late.headers["x-should-retry"] == "false"
            boom = _chat(
                http, proxy, "f2", [{"role": "user", "content": "x"}], test_engine_fault="error500"
            )
            assert boom.status_code == 500 and boom.headers["x-should-retry"] == "false"
    finally:
        proxy.stop()
    for i in (3, 4, 5):
        snap = freeze(store, f"f{i}")
        assert not snap.incomplete and not snap.engine_refusals
        assert not build_rollout(snap).masked

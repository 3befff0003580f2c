"""End to end over real HTTP: rollouts through `zephon capture serve` into a file store."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.capture.proxy._harness import (
    CAP,
    TOOLS_CHAT,
    chat_rollout,
    responses_rollout,
    verify_rollout,
)
from tests.capture.proxy._procs import Proc, start_proxy
from tests.capture.proxy._token_in import token_in_rollout
from tests.capture.proxy.conftest import freeze
from zephon.capture.records import ParentResolutionStatus

pytestmark = pytest.mark.timeout(60)

CONTROL = "/training-token-capture/control"


def _url(proxy: Proc, rid: str, route: str) -> str:
    return proxy.url + CAP.format(rid=rid) + route


def _sse(text: str) -> list[Any]:
    out = []
    for block in text.strip().split("\n\n"):
        data = [line[6:] for line in block.splitlines() if line.startswith("data: ")]
        assert data, block
        out.append("[DONE]" if data[0] == "[DONE]" else json.loads(data[0]))
    return out


@pytest.mark.parametrize("dialect", ["chat", "responses"])
def test_multi_turn_tool_rollout_builds_engine_tokens_exactly(
    proxy: Proc, store_url: str, rid: str, dialect: str
) -> None:
    async def drive() -> Any:
        async with httpx.AsyncClient(timeout=30) as client:
            if dialect == "chat":
                return await chat_rollout(client, proxy.url, rid, 6)
            return await responses_rollout(client, proxy.url, rid, 6)

    run = asyncio.run(drive())
    assert len(run.turns) == 6
    verify_rollout(freeze(store_url, rid), run)


def test_delta_prompts_store_suffixes_and_build_the_same_tokens(
    engine: Proc, store_url: str, logs: Path
) -> None:
    delta = start_proxy(engine.url, store_url, logs, "--delta-prompts")
    rids = [f"delta-{uuid.uuid4().hex[:8]}-{i}" for i in range(2)]

    async def drive() -> Any:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(
                chat_rollout(client, delta.url, rids[0], 6),
                responses_rollout(client, delta.url, rids[1], 6),
            )

    try:
        runs = asyncio.run(drive())
        with httpx.Client(timeout=30) as http:  # token-in: the prompt extends the parent's ids
            ids = token_in_rollout(http, delta.url, rids[0] + "-ids", 4, lambda t: list(t.encode()))
    finally:
        delta.stop()
    for run, continuations in ((runs[0], 5), (runs[1], 5), (ids, 3)):
        snap = freeze(store_url, run.rollout_id)
        deltas = [e for e in snap.entries if e.prompt_is_delta]
        assert len(deltas) == continuations  # the root keeps its full prompt
        verify_rollout(snap, run)


def test_freeze_route_summarises_and_drop_retires(
    proxy: Proc, store_url: str, rid: str, http: httpx.Client
) -> None:
    async def drive() -> Any:
        async with httpx.AsyncClient(timeout=30) as client:
            return await chat_rollout(client, proxy.url, rid, 3)

    run = asyncio.run(drive())
    summary = http.post(f"{proxy.url}{CONTROL}/rollouts/{rid}/freeze").json()
    assert summary["incomplete"] is False
    assert summary["entries"] == 3
    assert [c["model_call_id"] for c in summary["calls"]] == [t.call_id for t in run.turns]
    assert [c["parent_resolution"] for c in summary["calls"]] == ["root", "resolved", "resolved"]
    again = http.post(f"{proxy.url}{CONTROL}/rollouts/{rid}/freeze").json()
    assert (again["snapshot_id"], again["version"]) == (summary["snapshot_id"], summary["version"])
    stale = {"snapshot_id": summary["snapshot_id"], "version": summary["version"] + 1}
    assert http.post(f"{proxy.url}{CONTROL}/rollouts/{rid}/drop", json=stale).json() == {
        "dropped": False
    }
    exact = {"snapshot_id": summary["snapshot_id"], "version": summary["version"]}
    assert http.post(f"{proxy.url}{CONTROL}/rollouts/{rid}/drop", json=exact).json() == {
        "dropped": True
    }
    # A retired rollout admits no model call: refused before the engine sees it.
    body = {"model": "tiny", "messages": [{"role": "user", "content": "late"}]}
    late = http.post(_url(proxy, rid, "/v1/chat/completions"), json=body)
    assert late.status_code == 409
    assert late.json()["error"]["code"] == "capture_refused"
    # Manifest of a retired rollout is gone (410); delete clears the fence.
    assert http.get(f"{proxy.url}{CONTROL}/rollouts/{rid}/manifest").status_code == 410
    removed = http.post(f"{proxy.url}{CONTROL}/delete", json={"capture_keys": [rid]}).json()
    assert removed == {"action": "delete", "capture_keys": [rid], "changed": [rid]}
    manifest = http.get(f"{proxy.url}{CONTROL}/rollouts/{rid}/manifest").json()
    assert manifest["records"] == [] and manifest["failures"] == []
    assert http.post(_url(proxy, rid, "/v1/chat/completions"), json=body).status_code == 200


def test_retire_route_fences_and_validates(proxy: Proc, rid: str, http: httpx.Client) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    assert http.post(_url(proxy, rid, "/v1/chat/completions"), json=body).status_code == 200
    out = http.post(f"{proxy.url}{CONTROL}/retire", json={"capture_keys": [rid, rid]}).json()
    assert out == {"action": "retire", "capture_keys": [rid], "changed": [rid]}
    assert http.post(_url(proxy, rid, "/v1/chat/completions"), json=body).status_code == 409
    bad = http.post(f"{proxy.url}{CONTROL}/retire", json={"capture_keys": ["../x"]})
    assert bad.status_code == 400 and "capture key #0" in bad.json()["error"]["message"]
    assert http.post(f"{proxy.url}{CONTROL}/retire", content=b"{").status_code == 400
    assert http.post(f"{proxy.url}{CONTROL}/rollouts/a!b/freeze").status_code == 400


def test_token_arrays_are_stripped_unless_asked(
    proxy: Proc, engine: Proc, store_url: str, rid: str, http: httpx.Client
) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}]}
    served = http.post(_url(proxy, rid, "/v1/chat/completions"), json=body)
    assert served.status_code == 200
    data = served.json()
    assert "prompt_token_ids" not in data
    assert "token_ids" not in data["choices"][0]
    assert data["choices"][0]["logprobs"] is None
    direct = http.post(f"{engine.url}/v1/chat/completions", json=body).json()
    assert data["choices"][0]["message"] == direct["choices"][0]["message"]
    assert served.headers["x-zephon-capture"] == "committed"
    snap = freeze(store_url, rid)
    (entry,) = snap.entries
    assert entry.model_call_id == served.headers["x-zephon-model-call-id"]
    assert entry.response_id == direct["id"]
    assert len(entry.generation_token_ids) == direct["usage"]["completion_tokens"] > 0
    assert entry.output_items[entry.token_item_index or 0]["type"] == "message"


def test_completions_dialect_captures_a_root(
    proxy: Proc, store_url: str, rid: str, http: httpx.Client
) -> None:
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 16}
    resp = http.post(_url(proxy, rid, "/v1/completions"), json=body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert "token_ids" not in choice and choice["logprobs"] is None
    (entry,) = freeze(store_url, rid).entries
    assert entry.parent_resolution is ParentResolutionStatus.ROOT
    assert entry.output_items[0]["content"][0]["text"] == choice["text"]
    assert entry.response_id == resp.json()["id"]


def test_streaming_clients_get_a_stream_synthesised_after_capture(
    proxy: Proc, store_url: str, rid: str, http: httpx.Client
) -> None:
    msgs = [{"role": "user", "content": "stream me"}]
    plain = http.post(
        _url(proxy, rid, "/v1/chat/completions"), json={"model": "tiny", "messages": msgs}
    ).json()
    body = {
        "model": "tiny",
        "messages": msgs,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with http.stream("POST", _url(proxy, rid, "/v1/chat/completions"), json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        call_id = resp.headers["x-zephon-model-call-id"]
        events = _sse(resp.read().decode())
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2] if e["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    assert events[-2]["usage"] == plain["usage"]
    # Tool calls and the Responses event stream.
    tool_body = {**body, "tools": TOOLS_CHAT}
    with http.stream("POST", _url(proxy, rid, "/v1/chat/completions"), json=tool_body) as resp:
        events = _sse(resp.read().decode())
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert any("tool_calls" in d for d in deltas)
    rbody = {"model": "tiny", "input": "stream a response", "stream": True}
    with http.stream("POST", _url(proxy, rid, "/v1/responses"), json=rbody) as resp:
        events = _sse(resp.read().decode())
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
    done = events[-1]["response"]
    assert done["output"][0]["type"] == "message"
    ids = {e.model_call_id for e in freeze(store_url, rid).entries}
    assert call_id in ids and len(ids) == 4


def test_outside_the_prefix_is_passed_through_untouched(
    proxy: Proc, engine: Proc, rid: str, http: httpx.Client
) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "raw"}], "logprobs": True}
    direct = http.post(f"{engine.url}/v1/chat/completions", json=body)
    proxied = http.post(f"{proxy.url}/v1/chat/completions", json=body)
    assert proxied.status_code == direct.status_code == 200
    assert proxied.content == direct.content
    assert "x-zephon-model-call-id" not in proxied.headers
    # A correlation-only prefix (no capture segment) is stripped and forwarded.
    corr = http.post(f"{proxy.url}/ng-rollout/{rid}/v1/chat/completions", json=body)
    assert corr.content == direct.content
    assert http.get(f"{proxy.url}/v1/models").json() == http.get(f"{engine.url}/v1/models").json()
    # Read-only engine routes under the capture prefix are forwarded too.
    assert http.get(_url(proxy, rid, "/v1/models")).status_code == 200
    # Streams pass through as streams.
    with http.stream(
        "POST", f"{proxy.url}/v1/chat/completions", json={**body, "stream": True}
    ) as r:
        raw = r.read()
    assert raw.endswith(b"data: [DONE]\n\n")
    assert http.get(f"{proxy.url}/no/such/engine/route").status_code == 404


def test_health_and_metrics(proxy: Proc, http: httpx.Client, rid: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "count me"}]}
    assert http.post(_url(proxy, rid, "/v1/chat/completions"), json=body).status_code == 200
    health = http.get(f"{proxy.url}{CONTROL}/health")
    assert health.status_code == 200 and health.json()["engine"]["ok"] is True
    text = http.get(f"{proxy.url}{CONTROL}/metrics").text
    assert "# TYPE zephon_proxy_put_seconds histogram" in text
    lines = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert float(lines['zephon_proxy_requests_total{code="200",route="chat"}']) >= 1
    assert float(lines['zephon_proxy_put_seconds_bucket{le="+Inf"}']) >= 1
    assert float(lines["zephon_proxy_put_seconds_count"]) >= 1

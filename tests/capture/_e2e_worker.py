"""A model-server worker process for the end-to-end test: resolve, generate, stamp, put, answer.

Protocol (JSON lines): stdin ``{"rollout_id", "items"}`` (Responses-dialect request items) ->
stdout ``{"call_id", "status", "parent", "prompt", "generation", "logprobs", "output_items"}``
written only after ``put`` returned. The "engine" renders items append-only into tokens and
its generation is the rendering of its own output items, so a faithful continuation's prompt
starts with the parent's cumulative tokens (checked like a supplied prefix).
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

from zephon.capture.lineage import stamp_continuation
from zephon.capture.records import ParentResolutionStatus, TokenEntry, compute_digest
from zephon.capture.stores import open_store

ROLES = {"system": 1, "user": 2, "assistant": 3, "function_call": 4, "function_call_output": 5}


def render(items: list[dict[str, Any]]) -> list[int]:
    out: list[int] = []
    for item in items:
        kind = item.get("role") or item.get("type")
        body = {k: v for k, v in sorted(item.items()) if k not in ("id", "status")}
        out.append(1000 + ROLES[str(kind)])
        out += json.dumps(body, sort_keys=True).encode()
        out.append(999)
    return out


def policy(items: list[dict[str, Any]], seed: str) -> list[dict[str, Any]]:
    turn = sum(1 for i in items if i.get("type") == "function_call_output")
    if turn < 2:
        tool = ["get_weather", "get_time"][turn]
        return [
            {
                "type": "function_call",
                "call_id": f"{seed}-t{turn}",
                "name": tool,
                "arguments": json.dumps({"city": "Paris", "turn": turn}),
            }
        ]
    return [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": f"done {seed}"}],
        }
    ]


async def serve(url: str) -> None:
    store = open_store(url)
    for line in sys.stdin:
        req = json.loads(line)
        rid, items = req["rollout_id"], req["items"]
        res = await store.resolve(rid, items)
        prompt = render(items)
        parent = res.match.model_call_id if res.match is not None else None
        if res.match is not None:
            prefix = list(res.match.cumulative_token_ids)
            if prompt[: len(prefix)] != prefix:
                raise SystemExit(f"engine did not honour the prefix of {parent}")
        output = policy(items, rid)
        gen = render(output)
        logprobs = [-((t % 7) + 1) / 10 for t in gen]
        call_id = uuid.uuid4().hex
        full = prompt + gen
        entry = TokenEntry(
            rollout_id=rid,
            model_call_id=call_id,
            model="sim",
            prompt_token_ids=prompt,
            generation_token_ids=gen,
            generation_log_probs=logprobs,
            output_items=output,
            token_item_index=0,
            response_id=f"resp-{call_id}",
            created_at=float(len(items)),
            parent_call_id=parent,
            parent_resolution=res.status,
            parent_resolution_reason=res.reason,
            cum_len=len(full),
            digest=compute_digest(full),
            prefix_requested=parent is not None,
            prefix_supplied=parent is not None,
        )
        await store.put(stamp_continuation(entry, items))
        status = ParentResolutionStatus(res.status).value
        answer = {
            "call_id": call_id,
            "status": status,
            "parent": parent,
            "prompt": prompt,
            "generation": gen,
            "logprobs": logprobs,
            "output_items": output,
        }
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    await store.close()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))

"""Server-sent event streams synthesised from a complete (already captured) answer.

The engine is never streamed under capture: the entry must be durable before the client sees a
byte, so the proxy waits for the whole answer, captures it, and then replays it as the event
sequence each dialect's clients expect (few, large deltas).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from zephon.capture.proxy._requests import PreparedCall

__all__ = ["sse_events"]


def _data(obj: Any) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def _event(kind: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\n" + _data({"type": kind, **obj})


def _chat_choice(head: dict[str, Any], choice: dict[str, Any], extra: dict[str, Any]) -> Any:
    """The chunks of one choice: role and content, tool calls, then the finish reason."""
    index = choice.get("index", 0)
    message = choice.get("message") or {}
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    for key in ("reasoning_content", "reasoning"):
        if message.get(key):
            delta[key] = message[key]
    first: dict[str, Any] = {
        "index": index,
        "delta": delta,
        "logprobs": choice.get("logprobs"),
        "finish_reason": None,
    }
    if "token_ids" in choice:
        first["token_ids"] = choice["token_ids"]
    yield _data({**head, "choices": [first], **extra})
    calls = message.get("tool_calls") or []
    if calls:
        deltas = [
            {
                "index": i,
                "id": tc.get("id"),
                "type": "function",
                "function": tc.get("function") or {},
            }
            for i, tc in enumerate(calls)
        ]
        yield _data({**head, "choices": [{"index": index, "delta": {"tool_calls": deltas}}]})
    last = {"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}
    yield _data({**head, "choices": [last]})


def _chat(answer: dict[str, Any], call: PreparedCall) -> Iterator[bytes]:
    head = {k: answer.get(k) for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    extra: dict[str, Any] = {}
    if "prompt_token_ids" in answer:
        extra["prompt_token_ids"] = answer["prompt_token_ids"]
    for choice in answer["choices"]:
        yield from _chat_choice(head, choice, extra)
        extra = {}
    if (call.body.get("stream_options") or {}).get("include_usage"):
        yield _data({**head, "choices": [], "usage": answer.get("usage")})
    yield b"data: [DONE]\n\n"


def _completions(answer: dict[str, Any], call: PreparedCall) -> Iterator[bytes]:
    head = {k: answer.get(k) for k in ("id", "created", "model")}
    head["object"] = "text_completion"
    yield _data({**head, "choices": answer["choices"]})
    if (call.body.get("stream_options") or {}).get("include_usage"):
        yield _data({**head, "choices": [], "usage": answer.get("usage")})
    yield b"data: [DONE]\n\n"


def _responses(answer: dict[str, Any]) -> Iterator[bytes]:
    seq = 0

    def ev(kind: str, **fields: Any) -> bytes:
        nonlocal seq
        seq += 1
        return _event(kind, {"sequence_number": seq - 1, **fields})

    start = dict(answer, status="in_progress", output=[], usage=None)
    yield ev("response.created", response=start)
    yield ev("response.in_progress", response=start)
    for idx, item in enumerate(answer["output"]):
        kind = item.get("type")
        item_id = item.get("id")
        if kind == "message":
            yield ev(
                "response.output_item.added",
                output_index=idx,
                item=dict(item, status="in_progress", content=[]),
            )
            for c_idx, part in enumerate(item.get("content") or []):
                text = part.get("text", "")
                loc = {"item_id": item_id, "output_index": idx, "content_index": c_idx}
                yield ev(
                    "response.content_part.added",
                    **loc,
                    part=dict(part, text=""),
                )
                yield ev("response.output_text.delta", **loc, delta=text)
                yield ev("response.output_text.done", **loc, text=text)
                yield ev("response.content_part.done", **loc, part=part)
        elif kind == "function_call":
            yield ev(
                "response.output_item.added",
                output_index=idx,
                item=dict(item, status="in_progress", arguments=""),
            )
            args = item.get("arguments", "")
            loc = {"item_id": item_id, "output_index": idx}
            yield ev("response.function_call_arguments.delta", **loc, delta=args)
            yield ev("response.function_call_arguments.done", **loc, arguments=args)
        else:
            yield ev("response.output_item.added", output_index=idx, item=item)
        yield ev("response.output_item.done", output_index=idx, item=item)
    final = "response.incomplete" if answer.get("status") == "incomplete" else "response.completed"
    yield ev(final, response=answer)


def sse_events(served: dict[str, Any], call: PreparedCall) -> list[bytes]:
    """The whole event stream for a served (stripped) answer."""
    if call.dialect == "responses":
        return list(_responses(served))
    if call.dialect == "completions":
        return list(_completions(served, call))
    return list(_chat(served, call))

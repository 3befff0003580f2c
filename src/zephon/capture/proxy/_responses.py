"""What the client receives: token arrays stripped, Responses answers, output items.

Every dialect's answer is also turned into Responses-shaped output items (message, function
calls, reasoning) for the ``TokenEntry``: that is the shape the record schema stores and the
fingerprints of all dialects agree on it.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from zephon.capture.proxy._requests import PreparedCall
from zephon.capture.proxy._tokens import choice_of

__all__ = ["CallTokens", "output_items_of", "served_answer", "served_id", "token_item_index"]

CallTokens = tuple[list[int], list[int], list[float]]  # prompt ids, generated ids, log-probs


def _choice(answer: dict[str, Any]) -> dict[str, Any]:
    choice: dict[str, Any] = answer["choices"][0]
    return choice


def output_items_of(
    answer: dict[str, Any], call: PreparedCall, call_id: str, index: int = 0
) -> list[dict[str, Any]]:
    """Responses-shaped output items of choice ``index`` of an engine answer (no token
    arrays)."""
    choice = choice_of(answer, index, call.n)
    if call.engine_dialect == "completions":
        text = choice.get("text") or ""
        return [_message_item(call_id, text)]
    message = choice.get("message") or {}
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{call_id}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            }
        )
    content = message.get("content")
    calls = message.get("tool_calls") or []
    if content or not calls:
        items.append(_message_item(call_id, content if isinstance(content, str) else ""))
    for i, tc in enumerate(calls):
        fn = tc.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{call_id}_{i}",
                "call_id": tc.get("id"),
                "name": fn.get("name"),
                "arguments": fn.get("arguments", ""),
                "status": "completed",
            }
        )
    return items


def _message_item(call_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{call_id}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def token_item_index(items: list[dict[str, Any]]) -> int | None:
    """The item that carries the call's tokens: the message, else the first function call."""
    for i, item in enumerate(items):
        if item.get("type") == "message":
            return i
    for i, item in enumerate(items):
        if item.get("type") == "function_call":
            return i
    return None


def _strip_chat_like(answer: dict[str, Any], call: PreparedCall) -> dict[str, Any]:
    out = copy.copy(answer)
    if not call.want_token_ids:
        out.pop("prompt_token_ids", None)
    choices = []
    for choice in answer.get("choices") or []:
        c = dict(choice)
        if not call.want_token_ids:
            c.pop("token_ids", None)
            c.pop("prompt_token_ids", None)
        if not call.want_logprobs:
            c["logprobs"] = None
        choices.append(c)
    out["choices"] = choices
    return out


def _responses_answer(
    answer: dict[str, Any],
    call: PreparedCall,
    call_id: str,
    items: list[dict[str, Any]],
    tokens: CallTokens | None,
) -> dict[str, Any]:
    body = call.body
    choice = _choice(answer)
    usage = answer.get("usage") or {}
    items = copy.deepcopy(items)
    if call.want_token_ids and tokens is not None:
        idx = token_item_index(items)
        if idx is not None:
            prompt, gen, lps = tokens
            items[idx]["prompt_token_ids"] = prompt
            items[idx]["generation_token_ids"] = gen
            items[idx]["generation_log_probs"] = lps
    truncated = choice.get("finish_reason") == "length"
    return {
        "id": f"resp_{call_id}",
        "object": "response",
        "created_at": answer.get("created", int(time.time())),
        "model": answer.get("model", body.get("model")),
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "error": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "output": items,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
            "total_tokens": usage.get("total_tokens", 0),
        },
    }


def served_answer(
    answer: dict[str, Any],
    call: PreparedCall,
    call_id: str,
    items: list[dict[str, Any]],
    tokens: list[CallTokens | None],
) -> dict[str, Any]:
    """The JSON answer the client receives (token arrays only if it asked for them);
    ``tokens`` holds each choice's captured ids, by choice index."""
    if call.dialect == "responses":
        return _responses_answer(answer, call, call_id, items, tokens[0])
    out = _strip_chat_like(answer, call)
    if not call.want_token_ids:
        return out
    for k, choice in enumerate(out["choices"]):
        got = tokens[choice.get("index", k)] if choice.get("index", k) < len(tokens) else None
        if got is None:
            continue
        # Fallbacks (/tokenize, log-prob tokens) may have supplied ids the engine did not return.
        out["choices"][k] = choice = dict(choice, token_ids=got[1])
        if call.dialect == "chat":
            out["prompt_token_ids"] = got[0]
        else:
            choice["prompt_token_ids"] = got[0]
    return out


def served_id(answer: dict[str, Any], call: PreparedCall, call_id: str) -> str | None:
    """The served envelope id (the entry's ``response_id``; never minted for chat)."""
    if call.dialect == "responses":
        return f"resp_{call_id}"
    rid = answer.get("id")
    return rid if isinstance(rid, str) and rid else None

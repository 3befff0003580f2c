"""What the lineage hashes read from a request item, in any of the three serving dialects.

Chat Completions, Responses and Anthropic Messages spell the same conversation differently:
an assistant turn's tool calls live in ``tool_calls`` (Chat), in ``tool_use`` content blocks
(Anthropic) or in standalone ``function_call`` items (Responses); tool results are ``role:
tool`` messages, ``tool_result`` blocks or ``function_call_output`` items. The functions here
flatten one item into typed fields so that :mod:`zephon.capture.lineage` can hash every
dialect the same way. They follow NeMo Gym's fingerprint version 2 field for field (including
its quirks, e.g. ``str()`` of a missing name is ``""`` but of an explicit ``None`` is
``"None"``), because fingerprints written by either side must match bit for bit.
"""

from __future__ import annotations

import json
from typing import Any

from zephon.capture.protocols import CaptureHistoryUnrepresentable as Unrepresentable
from zephon.capture.records import canonical_json

__all__ = [
    "canonical_text",
    "canonicalize_tool_arguments",
    "content_parts",
    "is_model_authored",
    "role_or_type",
    "tool_calls",
    "tool_results",
]

_TEXT_BLOCK_TYPES = frozenset({"", "text", "input_text", "output_text"})
_SKIPPED_BLOCK_TYPES = frozenset({"tool_use", "tool_result"})
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


def _check_json(value: Any, depth: int = 0) -> None:
    """Refuse what the reference's JSON encoder refuses (so both sides fail alike)."""
    if depth > 254:
        raise Unrepresentable("unsupported prompt content: nesting deeper than 254 levels")
    if value is None or isinstance(value, (bool, float, str)):
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise Unrepresentable(f"unsupported prompt content: integer {value} exceeds 64 bits")
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            _check_json(v, depth + 1)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise Unrepresentable(f"unsupported prompt content: non-string key {k!r}")
            _check_json(v, depth + 1)
        return
    raise Unrepresentable(f"unsupported prompt content: {type(value).__name__}")


def canonical_text(value: Any) -> str:
    """Sorted-key compact JSON text of a JSON value (the hashed form of structured content)."""
    _check_json(value)
    return canonical_json(value).decode("utf-8")


def canonicalize_tool_arguments(value: Any) -> str:
    """Tool-call arguments in a form that survives a harness re-serialising them.

    A JSON string is parsed and re-encoded with sorted keys and no spaces; a string that is not
    JSON is compared stripped; a structured value (Anthropic ``input``) is encoded directly;
    ``None`` is the empty string. Only the comparison uses this form; records keep the original.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value.strip()
        return canonical_text(parsed)
    return canonical_text(value)


def is_model_authored(item: dict[str, Any]) -> bool:
    """An assistant turn (Chat, Anthropic, Responses message) or a Responses function call.

    Reasoning items are deliberately not model-authored here: harnesses need not echo them.
    """
    return item.get("role") == "assistant" or item.get("type") == "function_call"


def role_or_type(item: dict[str, Any]) -> str:
    return str(item.get("role") or item.get("type") or "")


def content_parts(content: Any) -> list[tuple[str, str]]:
    """Typed content parts: text blocks of every dialect normalise to ``("text", text)``.

    Other block types are kept as their canonical JSON; tool-use and tool-result blocks are
    left to :func:`tool_calls` / :func:`tool_results`; empty text contributes nothing.
    """
    if content is None:
        return []
    if isinstance(content, str):
        return [("text", content)] if content else []
    if not isinstance(content, list):
        raise Unrepresentable(
            f"unsupported message content of type {type(content).__name__}: expected a string, "
            "a list of content blocks or null"
        )
    parts: list[tuple[str, str]] = []
    for block in content:
        if isinstance(block, str):
            if block:
                parts.append(("text", block))
            continue
        if not isinstance(block, dict):
            raise Unrepresentable(f"unsupported content block of type {type(block).__name__}")
        block_type = str(block.get("type") or "")
        if block_type in _SKIPPED_BLOCK_TYPES:
            continue
        text = block.get("text")
        if isinstance(text, str) and block_type in _TEXT_BLOCK_TYPES:
            if text:
                parts.append(("text", text))
            continue
        if not block_type:
            raise Unrepresentable("content block has neither a 'type' nor a string 'text'")
        parts.append((block_type, canonical_text(block)))
    return parts


def _call_field(obj: dict[str, Any], *keys: str) -> str:
    for key in keys:
        value = obj.get(key)
        if value:
            return str(value)
    return ""


def tool_calls(item: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(call id, function name, canonical arguments)`` for every tool call in ``item``.

    Order: the item itself when it is a Responses ``function_call`` (name prefixed with
    ``namespace__`` when a namespace is given), then Anthropic ``tool_use`` blocks, then Chat
    ``tool_calls``.
    """
    calls: list[tuple[str, str, str]] = []
    if item.get("type") == "function_call":
        name = str(item.get("name", ""))
        namespace = item.get("namespace")
        if namespace:
            name = f"{namespace}__{name}"
        calls.append(
            (
                _call_field(item, "call_id", "id"),
                name,
                canonicalize_tool_arguments(item.get("arguments")),
            )
        )
    content = item.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.append(
                    (
                        _call_field(block, "id"),
                        str(block.get("name", "")),
                        canonicalize_tool_arguments(block.get("input")),
                    )
                )
    for call in item.get("tool_calls") or []:
        call = call or {}
        if not isinstance(call, dict):
            raise Unrepresentable(f"tool_calls holds a {type(call).__name__}, expected objects")
        function = call.get("function") or {}
        if not isinstance(function, dict):
            raise Unrepresentable(f"tool_calls[].function is a {type(function).__name__}")
        calls.append(
            (
                _call_field(call, "id"),
                str(function.get("name", "")),
                canonicalize_tool_arguments(function.get("arguments")),
            )
        )
    return calls


def _payload(value: Any) -> str:
    return value if isinstance(value, str) else canonical_text(value)


def tool_results(item: dict[str, Any]) -> list[tuple[str, str]]:
    """``(call id, output)`` for every tool result in ``item`` (all three dialects)."""
    results: list[tuple[str, str]] = []
    if item.get("type") == "function_call_output":
        results.append((_call_field(item, "call_id", "id"), _payload(item.get("output"))))
    elif item.get("role") == "tool":
        results.append((_call_field(item, "tool_call_id"), _payload(item.get("content"))))
    content = item.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                results.append(
                    (_call_field(block, "tool_use_id", "id"), _payload(block.get("content")))
                )
    return results

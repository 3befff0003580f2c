"""Check and normalise conversations before a template sees them.

A conversation is a list of message mappings with a string ``role``. ``content`` may be a
string, a list of content parts, or absent/None when the message carries ``tool_calls``.
Keys whose value is None are dropped (templates test for missing keys, not for None), and
reasoning given as ``reasoning_content``, ``thinking`` or ``reasoning`` is visible under both
names templates read (``reasoning_content`` and ``thinking``). Errors name the operator, the
record, the field and the turn, and say how to fix the data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zephon.errors import ChatFormatError

REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def _fail(op: str, sample: Any, field: str, turn: int | None, problem: str) -> ChatFormatError:
    where = f"{field}[{turn}]" if turn is not None else repr(field)
    return ChatFormatError(f"{op}: record {sample} {where}: {problem}")


def conversation(payload: Any, field: str, op: str, sample: Any) -> list[Any]:
    """The message list at ``payload[field]`` (unchecked messages)."""
    try:
        messages = payload[field]
    except (KeyError, TypeError):
        fields = sorted(payload) if isinstance(payload, Mapping) else type(payload).__name__
        raise _fail(
            op,
            sample,
            field,
            None,
            f"missing (fields: {fields}); pass field=... naming the list "
            "of {'role': ..., 'content': ...} messages",
        ) from None
    if not isinstance(messages, list | tuple):
        raise _fail(
            op, sample, field, None, f"is {type(messages).__name__}, expected a list of messages"
        )
    return list(messages)


def normalise(messages: Sequence[Any], field: str, op: str, sample: Any) -> list[dict[str, Any]]:
    """Checked, normalised copies of ``messages`` (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for turn, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise _fail(
                op, sample, field, turn,
                f"is {type(message).__name__}, expected a mapping like "
                "{'role': 'user', 'content': '...'}",
            )  # fmt: skip
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise _fail(op, sample, field, turn, f"'role' must be a non-empty string, got {role!r}")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise _fail(
                op, sample, field, turn,
                f"'content' of the {role} message is {type(content).__name__}; use a string, a "
                "list of content parts, or null with 'tool_calls'",
            )  # fmt: skip
        if content is None and role != "assistant" and "tool_calls" not in message:
            raise _fail(
                op, sample, field, turn,
                f"the {role} message has no 'content'; only assistant messages with "
                "'tool_calls' may omit it",
            )  # fmt: skip
        clean = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in REASONING_KEYS if message.get(k) is not None), None)
        if reasoning is not None:
            clean = {"thinking": reasoning, **clean, "reasoning_content": reasoning}
        out.append(clean)
    return out


def assistant_turns(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant"]


def last_user_turn(messages: Sequence[Mapping[str, Any]]) -> int:
    """Index of the last user message, -1 when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return -1

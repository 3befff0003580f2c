"""Client requests of the three dialects: validation, lineage items and the engine request.

Chat Completions and Completions go to the engine's route of the same name. A Responses request
is translated to a Chat Completions request (the route vLLM and SGLang return exact token ids
and log-probs on) and its answer translated back (:mod:`._responses`), so every dialect is
captured the same way.

The engine is always asked for the exact token data: ``return_token_ids`` (prompt and generated
ids), per-token log-probs, and, when the client did not ask for log-probs itself,
``return_tokens_as_token_ids`` so that the log-prob entries name token ids (the fallback when an
engine lacks ``return_token_ids``). Streaming is turned off towards the engine: the proxy
captures the complete answer first and synthesises the stream afterwards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from zephon.capture.lineage import chain_hint_item, token_prompt_item
from zephon.errors import ZephonError

__all__ = [
    "CAPTURE_ROUTES",
    "CHAIN_HEADER",
    "MAX_N",
    "VERSION_HEADER",
    "BadRequest",
    "Dialect",
    "PreparedCall",
    "prepare_call",
    "weight_version_of",
]

Dialect = Literal["chat", "completions", "responses"]
MAX_N = 64  # samples of one request (a GRPO group); each becomes its own captured call
# Request header: the call whose chain a request extends (its parent or an ancestor).
CHAIN_HEADER = "x-zephon-parent-call-id"
# Request header: the policy weight version the engine generates this call with.
VERSION_HEADER = "x-zephon-weight-version"
_MAX_VERSION = 2**63 - 1
_MAX_CHAIN_ID = 256

CAPTURE_ROUTES: dict[str, Dialect] = {
    "v1/chat/completions": "chat",
    "v1/completions": "completions",
    "v1/responses": "responses",
}

# Responses fields the translation consumes or drops (everything else is passed to the engine,
# so engine-specific sampling extras keep working).
_RESPONSES_ONLY = frozenset(
    {
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "stream",
        "store",
        "metadata",
        "reasoning",
        "text",
        "truncation",
        "include",
        "service_tier",
        "user",
        "top_logprobs",
        "return_token_ids",
        "stream_options",
        "prompt_cache_key",
        "safety_identifier",
    }
)


class BadRequest(ZephonError):
    """A client request the proxy refuses before any capture state is written (HTTP 4xx)."""

    def __init__(self, message: str, *, code: str = "invalid_request", status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status


@dataclass(frozen=True, slots=True)
class PreparedCall:
    """A validated capture request: lineage items and the engine request to send."""

    dialect: Dialect
    body: dict[str, Any]
    request_items: list[dict[str, Any]]
    engine_path: str
    engine_body: dict[str, Any]
    stream: bool
    want_token_ids: bool
    want_logprobs: bool
    n: int = 1
    token_in: bool = False
    chain_of: str | None = None

    @property
    def resolve_items(self) -> list[dict[str, Any]]:
        """What parent resolution gets: the request items, and the chain a text request names
        (a token-in request carries it in its token prompt item)."""
        if self.chain_of is None or self.token_in:
            return self.request_items
        return [*self.request_items, chain_hint_item(self.chain_of)]

    @property
    def engine_dialect(self) -> Literal["chat", "completions"]:
        return "completions" if self.dialect == "completions" else "chat"


def _samples(body: dict[str, Any], dialect: Dialect) -> int:
    """``n``: how many samples the request asks for (each is captured as its own call)."""
    n = body.get("n", 1)
    if n is None:
        n = 1
    if type(n) is not int or not 1 <= n <= MAX_N:
        raise BadRequest(
            f"'n' is {n!r}: send an integer from 1 to {MAX_N} (each sample is captured as a "
            "sibling call of one group)",
            code="unsupported_n",
        )
    if n > 1 and dialect == "responses":
        raise BadRequest(
            "'n' is not part of the Responses API; ask /v1/chat/completions or /v1/completions "
            "for a group of samples",
            code="unsupported_n",
        )
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise BadRequest(
            f"'best_of' is {best_of!r}: token capture needs best_of=1 (or omitted); use 'n' "
            "for several captured samples",
            code="unsupported_best_of",
        )
    return n


def _completion_prompt(body: dict[str, Any]) -> str | list[int]:
    """One prompt: a string, or token ids (token-in), each possibly wrapped in a 1-list."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(type(t) is int and 0 <= t < 2**63 for t in prompt)
    ):
        return prompt
    raise BadRequest(
        "'prompt' must be one string or one non-empty list of token ids (ints >= 0): token "
        "capture records one prompt per call; send several prompts as several calls",
        code="unsupported_prompt",
    )


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of message objects")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'")
    return messages


def _part_text(content: Any, where: str) -> str | list[dict[str, Any]] | None:
    """Responses content -> chat content (text blocks joined; other blocks kept)."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or a list of content blocks")
    texts: list[str] = []
    blocks: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            raise BadRequest(f"{where}.content holds a {type(block).__name__}, expected objects")
        kind = block.get("type")
        if kind in ("input_text", "output_text", "text") and isinstance(block.get("text"), str):
            texts.append(block["text"])
            blocks.append({"type": "text", "text": block["text"]})
        elif kind == "input_image":
            blocks.append({"type": "image_url", "image_url": {"url": block.get("image_url")}})
        else:
            raise BadRequest(f"{where}.content block type {kind!r} is not supported by the proxy")
    if len(blocks) == len(texts):
        return "".join(texts)
    return blocks


def responses_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The lineage items of a Responses request: ``instructions`` first, as a system item."""
    raw = body.get("input")
    items: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("'instructions' must be a string")
        items.append({"role": "system", "content": instructions})
    if isinstance(raw, str):
        items.append({"role": "user", "content": raw})
    elif isinstance(raw, list) and raw:
        for i, item in enumerate(raw):
            if not isinstance(item, dict):
                raise BadRequest(f"input[{i}] must be an object")
            items.append(item)
    else:
        raise BadRequest("'input' must be a string or a non-empty list of items")
    return items


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    """Append one Responses input item to ``messages`` as Chat Completions messages."""
    kind = item.get("type")
    if kind in (None, "message"):
        role = item.get("role")
        if not isinstance(role, str):
            raise BadRequest(f"{where} is a message without a string 'role'")
        role = "system" if role == "developer" else role
        messages.append({"role": role, "content": _part_text(item.get("content"), where)})
    elif kind == "function_call":
        call = {
            "id": item.get("call_id") or item.get("id"),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        messages.append(
            {
                "role": "tool",
                "tool_call_id": item.get("call_id"),
                "content": output if isinstance(output, str) else json.dumps(output),
            }
        )
    elif kind != "reasoning":  # harnesses need not echo reasoning; engines re-derive it
        raise BadRequest(f"{where} has type {kind!r}, which the capture proxy cannot send")


def _chat_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list")
    converted = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise BadRequest(f"tools[{i}]: only function tools are supported by the proxy")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        converted.append({"type": "function", "function": fn})
    return converted


def _chat_options(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """Carry tools, tool choice, the token limit and logprobs over into ``chat``."""
    tools = body.get("tools")
    if tools:
        chat["tools"] = _chat_tools(tools)
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        chat["tool_choice"] = choice
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("top_logprobs"):
        chat["top_logprobs"] = body["top_logprobs"]
        chat["logprobs"] = True


def responses_to_chat(body: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    """Translate a Responses request (already itemised) into a Chat Completions request."""
    if body.get("previous_response_id"):
        raise BadRequest(
            "'previous_response_id' needs server-side conversation state, which the capture "
            "proxy does not keep; send the whole conversation in 'input'",
            code="unsupported_previous_response_id",
        )
    if body.get("background"):
        raise BadRequest("'background' responses are not supported by the capture proxy")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        _add_item(messages, item, f"input[{i}]")
    chat: dict[str, Any] = {
        k: v for k, v in body.items() if k not in _RESPONSES_ONLY and k != "previous_response_id"
    }
    chat["messages"] = messages
    _chat_options(body, chat)
    return chat


def _ask_for_tokens(payload: dict[str, Any], engine: Literal["chat", "completions"]) -> None:
    payload["return_token_ids"] = True
    payload["stream"] = False
    payload.pop("stream_options", None)
    if engine == "chat":
        if not payload.get("logprobs"):
            payload["logprobs"] = True
            payload["top_logprobs"] = 0
            payload["return_tokens_as_token_ids"] = True
    elif payload.get("logprobs") is None:
        payload["logprobs"] = 0
        payload["return_tokens_as_token_ids"] = True


def _printable_id(value: str) -> bool:
    return value.isascii() and value.isprintable() and " " not in value


def _chain_of(value: str | None, dialect: Dialect, token_in: bool) -> str | None:
    """The validated :data:`CHAIN_HEADER` value (chat, Responses and token-in requests)."""
    if value is None:
        return None
    if dialect == "completions" and not token_in:
        raise BadRequest(
            f"{CHAIN_HEADER} applies to requests that continue a call (chat, responses, or "
            "token-in completions with 'prompt' as token ids); a text prompt always starts a "
            "new chain: drop the header",
            code="unsupported_parent_hint",
        )
    if not 0 < len(value) <= _MAX_CHAIN_ID or not _printable_id(value):
        raise BadRequest(
            f"{CHAIN_HEADER} must be one model call id (1 to {_MAX_CHAIN_ID} printable ASCII "
            f"characters without spaces, as x-zephon-model-call-id(s) answered), not {value!r}",
            code="unsupported_parent_hint",
        )
    return value


def weight_version_of(value: str | None, default: int | None) -> int | None:
    """The call's weight version: the :data:`VERSION_HEADER` value, else the proxy's
    configured one (raises :class:`BadRequest` on a value that is not a version)."""
    if value is None:
        return default
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) > _MAX_VERSION:
        raise BadRequest(
            f"{VERSION_HEADER} must be the engine's weight version, an integer from 0 to "
            f"{_MAX_VERSION}, not {value[:40]!r}",
            code="invalid_weight_version",
        )
    return int(text)


def prepare_call(dialect: Dialect, body: Any, chain_of: str | None = None) -> PreparedCall:
    """Validate a capture request and build its engine request (raises :class:`BadRequest`).

    ``chain_of`` is the :data:`CHAIN_HEADER` value, if the client sent one.
    """
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", code="invalid_json")
    n = _samples(body, dialect)
    stream = bool(body.get("stream"))
    want_ids = bool(body.get("return_token_ids"))
    if dialect == "chat":
        items = _messages(body)
        engine_body = dict(body)
        want_lp = bool(body.get("logprobs"))
        path = "/v1/chat/completions"
    elif dialect == "completions":
        prompt = _completion_prompt(body)
        if body.get("echo"):
            raise BadRequest("'echo' is not supported under token capture", code="unsupported")
        if isinstance(prompt, str):
            items = [{"role": "user", "content": prompt}]
        else:
            items = [token_prompt_item(prompt, _chain_of(chain_of, dialect, token_in=True))]
        engine_body = dict(body, prompt=prompt)
        want_lp = body.get("logprobs") is not None
        path = "/v1/completions"
    else:
        items = responses_items(body)
        engine_body = responses_to_chat(body, items)
        want_lp = bool(body.get("top_logprobs"))
        path = "/v1/chat/completions"
    token_in = dialect == "completions" and isinstance(engine_body.get("prompt"), list)
    named = _chain_of(chain_of, dialect, token_in)
    _ask_for_tokens(engine_body, "completions" if dialect == "completions" else "chat")
    return PreparedCall(
        dialect=dialect,
        body=body,
        request_items=items,
        engine_path=path,
        engine_body=engine_body,
        stream=stream,
        want_token_ids=want_ids,
        want_logprobs=want_lp,
        n=n,
        token_in=token_in,
        chain_of=named,
    )

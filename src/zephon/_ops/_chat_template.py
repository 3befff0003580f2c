"""Render chat templates the way Hugging Face tokenizers do, and say where the assistant spans are.

Templates are Jinja in the ``chat_template`` convention of ``tokenizer_config.json``: a
sandboxed environment with ``trim_blocks`` and ``lstrip_blocks``, loop controls, a ``tojson``
filter that keeps non-ASCII text, ``raise_exception`` and ``strftime_now``. The template sees
``messages``, ``tools``, ``add_generation_prompt``, the tokenizer's special tokens
(``bos_token``, ``eos_token``, ...) and any extra keyword arguments.

``{% generation %}...{% endgeneration %}`` marks supervised text; :func:`render` returns the
character span of every such block, so the same text a model was trained to produce is what the
loss mask covers. Rendering is pure, so its results can be cached by the template string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from zephon._optional import require
from zephon.errors import ConfigError

GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
TRACKER_VAR = "__zephon_generation_spans__"
Span = tuple[int, int]


class _Spans:
    """Where a render stands: characters emitted so far and the generation spans seen."""

    __slots__ = ("emitted", "spans")

    def __init__(self) -> None:
        self.emitted = 0
        self.spans: list[Span] = []


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


_NEEDED_FOR = "tokenize_chat (rendering chat templates)"


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> Any:
    require("jinja2", _NEEDED_FOR)
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationSpans(jinja2.ext.Extension):
        """``{% generation %}`` blocks render their body and record its character span."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            tracker = nodes.Name(TRACKER_VAR, "load")
            call = self.call_method("_record", [tracker])
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _record(self, tracker: Any, caller: Any) -> str:
            text: str = caller()
            if isinstance(tracker, _Spans):
                tracker.spans.append((tracker.emitted, tracker.emitted + len(text)))
            return text

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationSpans, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=32)
def compile_template(source: str) -> Any:
    """The compiled template for ``source`` (cached; compiled templates are thread-safe)."""
    jinja2 = require("jinja2", _NEEDED_FOR)

    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(
            f"tokenize_chat: the chat template does not compile (line {exc.lineno}: "
            f"{exc.message}); check chat_template"
        ) from None


def has_generation_tags(source: str) -> bool:
    return GENERATION_TAG.search(source) is not None


def render(
    template: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Any,
    add_generation_prompt: bool,
    variables: Mapping[str, Any],
) -> tuple[str, list[Span]]:
    """The rendered text and the character spans of its ``{% generation %}`` blocks."""
    tracker = _Spans()
    parts: list[str] = []
    for block in template.generate(
        {
            **variables,
            "messages": messages,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
            TRACKER_VAR: tracker,
        }
    ):
        parts.append(block)
        tracker.emitted += len(block)
    return "".join(parts), tracker.spans

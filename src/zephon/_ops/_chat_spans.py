"""Which characters of a rendered conversation are supervised, and which tokens that makes.

Two ways to find the assistant text:

* ``generation_tags``: the template marks it with ``{% generation %}`` blocks; one render.
* ``prefix_diff``: for assistant turn ``i`` the span is what rendering ``messages[:i+1]`` adds
  to rendering ``messages[:i]`` with the generation prompt, i.e. exactly what the model would
  have to produce after the prompt (content, tool calls, reasoning, end-of-turn marker). Each
  prefix render must be a prefix of the whole render, otherwise the template rewrites history
  and only generation tags can say what is supervised.

``loss_scope`` then keeps all spans (``all_assistant``), the last one (``last_span``) or those
after the last user message (``after_last_user``). A token is supervised when its character
range overlaps a kept span, which is how Hugging Face builds ``assistant_masks``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from zephon._ops._chat_messages import assistant_turns, last_user_turn
from zephon._ops._chat_template import Span, render
from zephon.errors import ChatFormatError

LossScope = Literal["all_assistant", "last_span", "after_last_user"]
SpanSource = Literal["auto", "generation_tags", "prefix_diff"]
LOSS_SCOPES = ("all_assistant", "last_span", "after_last_user")
SPAN_SOURCES = ("auto", "generation_tags", "prefix_diff")


@dataclass(frozen=True)
class ChatRenderer:
    """Renders one conversation and returns its text and supervised character spans."""

    template: Any
    variables: Mapping[str, Any]
    span_source: Literal["generation_tags", "prefix_diff"]
    loss_scope: LossScope
    op_name: str = "tokenize_chat"

    def _render(self, messages: Sequence[Any], tools: Any, prompt: bool) -> tuple[str, list[Span]]:
        return render(
            self.template,
            messages,
            tools=tools,
            add_generation_prompt=prompt,
            variables=self.variables,
        )

    def __call__(
        self, messages: list[dict[str, Any]], tools: Any, sample: Any, field: str
    ) -> tuple[str, list[Span]]:
        text, tagged = self._render(messages, tools, False)
        if self.span_source == "generation_tags":
            return text, self._scope_tagged(messages, tools, text, tagged, (sample, field))
        turns = assistant_turns(messages)
        if self.loss_scope == "last_span":
            turns = turns[-1:]
        elif self.loss_scope == "after_last_user":
            user = last_user_turn(messages)
            turns = [i for i in turns if i > user]
        spans: list[Span] = []
        for i in turns:
            prompt, _ = self._render(messages[:i], tools, True)
            turn = (
                text if i == len(messages) - 1 else self._render(messages[: i + 1], tools, False)[0]
            )
            if not (text.startswith(turn) and turn.startswith(prompt)):
                raise ChatFormatError(
                    f"{self.op_name}: record {sample} {field}[{i}]: the chat template does not "
                    "render this conversation's prefixes as prefixes of the whole, so prefix "
                    "diffing cannot find the assistant text; use a template with "
                    "{% generation %} tags and span_source='generation_tags'"
                )
            if len(turn) > len(prompt):
                spans.append((len(prompt), len(turn)))
        return text, spans

    def _scope_tagged(
        self,
        messages: list[dict[str, Any]],
        tools: Any,
        text: str,
        spans: list[Span],
        where: tuple[Any, str],
    ) -> list[Span]:
        sample, field = where
        spans = [s for s in spans if s[1] > s[0]]
        if self.loss_scope == "all_assistant" or not spans:
            return spans
        if self.loss_scope == "last_span":
            return spans[-1:]
        user = last_user_turn(messages)
        if user < 0:
            return spans
        cut = len(self._render(messages[: user + 1], tools, False)[0])
        kept = [s for s in spans if s[0] >= cut]
        turns = [
            i
            for i in assistant_turns(messages)
            if i > user and any(messages[i].get(k) for k in ("content", "tool_calls"))
        ]
        if len(kept) < len(turns):
            raise ChatFormatError(
                f"{self.op_name}: record {sample} {field!r}: the chat template's "
                f"{{% generation %}} tags mark {len(kept)} "
                f"span(s) after the last user message (turn {user}) but the conversation has "
                f"{len(turns)} assistant turn(s) there (turns {turns}), so loss_scope="
                "'after_last_user' would miss supervised text; tag every assistant turn "
                "(tool calls included) or use span_source='prefix_diff'"
            )
        return kept

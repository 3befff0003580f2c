"""tokenize_chat against transformers' own apply_chat_template, and its loss masks.

The oracle is ``AutoTokenizer.from_pretrained(dir).apply_chat_template`` on the same local
tokenizer and template; the expected assistant text of a turn is written out independently of
any template engine.
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ops._chat import (
    CHATML,
    CHATML_TAGGED,
    LLAMA3,
    TOOLS,
    chatml_turn,
    conversations,
    make_conversation,
    runs,
)
from zephon._ops.tokenize_chat import TokenizeChatOp
from zephon.errors import ChatFormatError, ConfigError
from zephon.types import SampleMeta, SampleRecord, Tombstone

FIXED = conversations(30, seed=11)


def tokenize(op: TokenizeChatOp, rows: list[dict[str, Any]]) -> list[SampleRecord]:
    records = [SampleRecord(SampleMeta((0, 0, i), 0, 0, i), row) for i, row in enumerate(rows)]
    return list(op.process_many(records))  # type: ignore[arg-type]


def oracle(hf: Any, row: dict[str, Any], template: str) -> dict[str, Any]:
    return hf.apply_chat_template(
        row["messages"],
        tools=row.get("tools"),
        chat_template=template,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask="{% generation %}" in template,
    )


def llama3_turn(message: dict[str, Any]) -> str:
    if message.get("tool_calls"):
        fn = message["tool_calls"][0]["function"]
        body = f'{{"name": "{fn["name"]}", "parameters": {json.dumps(fn["arguments"])}}}'
    else:
        body = message["content"].strip()
    return body + "<|eot_id|>"


def supervised_texts(hf: Any, ids: np.ndarray, mask: np.ndarray) -> list[str]:
    return [hf.decode(ids[a:b].tolist()) for a, b in runs(mask)]


@pytest.mark.parametrize("index", range(len(FIXED)))
def test_tagged_template_matches_transformers(index, chat_tokenizer_dir, hf_chat_tokenizer):
    row = FIXED[index]
    (out,) = tokenize(TokenizeChatOp(chat_tokenizer_dir), [row])
    want = oracle(hf_chat_tokenizer, row, CHATML_TAGGED)
    assert out.payload["input_ids"].tolist() == want["input_ids"]
    assert out.payload["loss_mask"].tolist() == want["assistant_masks"]
    assert out.payload["loss_mask"].dtype == np.int8


@pytest.mark.parametrize("template", [CHATML, LLAMA3], ids=["chatml", "llama3"])
def test_untagged_templates_match_transformers_ids(template, chat_tokenizer_dir, hf_chat_tokenizer):
    op = TokenizeChatOp(chat_tokenizer_dir, chat_template=template)
    assert op.resolved_span_source == "prefix_diff"
    expected_turn = chatml_turn if template is CHATML else llama3_turn
    for row, out in zip(FIXED, tokenize(op, FIXED), strict=True):
        ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
        assert ids.tolist() == oracle(hf_chat_tokenizer, row, template)["input_ids"]
        assistants = [m for m in row["messages"] if m["role"] == "assistant"]
        assert supervised_texts(hf_chat_tokenizer, ids, mask) == [
            expected_turn(m) for m in assistants
        ]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1))
def test_prefix_diff_covers_exactly_the_assistant_text(seed, chat_tokenizer_dir, hf_chat_tokenizer):
    row = make_conversation(random.Random(seed))
    diffed = TokenizeChatOp(chat_tokenizer_dir, chat_template=CHATML)
    tagged = TokenizeChatOp(chat_tokenizer_dir, chat_template=CHATML_TAGGED)
    ((a,), (b,)) = tokenize(diffed, [row]), tokenize(tagged, [row])
    want = oracle(hf_chat_tokenizer, row, CHATML_TAGGED)
    assert a.payload["input_ids"].tolist() == want["input_ids"]
    assert a.payload["loss_mask"].tolist() == want["assistant_masks"]
    assert b.payload["loss_mask"].tolist() == want["assistant_masks"]
    assistants = [m for m in row["messages"] if m["role"] == "assistant"]
    texts = supervised_texts(hf_chat_tokenizer, a.payload["input_ids"], a.payload["loss_mask"])
    assert texts == [chatml_turn(m) for m in assistants]


def _multi_round() -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": "the weather"},
            {"role": "user", "content": "what is the weather"},
            {"role": "assistant", "content": "call a tool"},
            {"role": "user", "content": "how is the city"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"type": "function", "function": {"name": "weather", "arguments": {"city": "rain"}}}
            ]},
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "sunny today"},
        ],
        "tools": TOOLS,
    }  # fmt: skip


@pytest.mark.parametrize("template", [CHATML, CHATML_TAGGED], ids=["prefix_diff", "tags"])
def test_loss_scopes(template, chat_tokenizer_dir, hf_chat_tokenizer):
    row = _multi_round()
    texts = {}
    for scope in ("all_assistant", "last_span", "after_last_user"):
        op = TokenizeChatOp(chat_tokenizer_dir, chat_template=template, loss_scope=scope)
        (out,) = tokenize(op, [row])
        texts[scope] = supervised_texts(
            hf_chat_tokenizer, out.payload["input_ids"], out.payload["loss_mask"]
        )
    turns = [chatml_turn(m) for m in row["messages"] if m["role"] == "assistant"]
    assert texts["all_assistant"] == turns
    assert texts["last_span"] == turns[-1:]
    assert texts["after_last_user"] == turns[1:]


def test_truncation_keeps_the_mask_aligned(chat_tokenizer_dir):
    row = _multi_round()
    (full,) = tokenize(TokenizeChatOp(chat_tokenizer_dir), [row])
    n = len(full.payload["input_ids"])
    first = int(np.flatnonzero(full.payload["loss_mask"])[0])
    for limit in (n - 1, first + 3, n + 5):
        cut = tokenize(TokenizeChatOp(chat_tokenizer_dir, max_length=limit), [row])[0]
        assert cut.payload["input_ids"].tolist() == full.payload["input_ids"][:limit].tolist()
        assert cut.payload["loss_mask"].tolist() == full.payload["loss_mask"][:limit].tolist()
    (gone,) = tokenize(TokenizeChatOp(chat_tokenizer_dir, max_length=first), [row])
    assert isinstance(gone.meta.control, Tombstone)
    assert "no supervised token" in (gone.meta.control.reason or "")


def test_conversation_without_supervised_token_is_a_tombstone(chat_tokenizer_dir):
    rows = [{"messages": [{"role": "user", "content": "hello"}]}, _multi_round()]
    out = tokenize(TokenizeChatOp(chat_tokenizer_dir), rows)
    assert out[0].meta.is_tombstone and out[0].payload is None
    assert out[0].meta.control == Tombstone("tokenize_chat: no supervised token (none in scope)")
    assert not out[1].meta.is_tombstone


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([{"role": "user", "content": "hi"}, {"content": "x"}], "messages[1]: 'role'"),
        ([{"role": "user", "content": 3}], "messages[0]: 'content' of the user message is int"),
        (["hello"], "messages[0]: is str"),
        ([{"role": "user"}], "messages[0]: the user message has no 'content'"),
    ],
)
def test_malformed_messages_name_field_and_turn(messages, needle, chat_tokenizer_dir):
    with pytest.raises(ChatFormatError, match="tokenize_chat: record") as info:
        tokenize(TokenizeChatOp(chat_tokenizer_dir), [{"messages": messages}])
    assert needle in str(info.value)
    with pytest.raises(ChatFormatError, match="'messages': missing"):
        tokenize(TokenizeChatOp(chat_tokenizer_dir), [{"chat": messages}])


def test_template_that_rewrites_history_refuses_prefix_diffing(chat_tokenizer_dir):
    # Shows the reasoning of the final turn only: earlier prefixes render differently.
    template = CHATML.replace(
        "{% if message.reasoning_content %}", "{% if message.reasoning_content and loop.last %}"
    )
    assert template != CHATML
    row = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "a", "reasoning_content": "think"},
            {"role": "user", "content": "and"},
            {"role": "assistant", "content": "b"},
        ]
    }
    with pytest.raises(ChatFormatError, match=r"messages\[1\].*generation"):
        tokenize(TokenizeChatOp(chat_tokenizer_dir, chat_template=template), [row])


def test_span_source_settings(chat_tokenizer_dir):
    with pytest.raises(ConfigError, match="no \\{% generation %\\}"):
        TokenizeChatOp(chat_tokenizer_dir, chat_template=CHATML, span_source="generation_tags")
    forced = TokenizeChatOp(chat_tokenizer_dir, span_source="prefix_diff")
    assert forced.resolved_span_source == "prefix_diff"
    assert "auto -> {% generation %} tags" in TokenizeChatOp(chat_tokenizer_dir).describe()
    with pytest.raises(ConfigError, match="loss_scope must be one of"):
        TokenizeChatOp(chat_tokenizer_dir, loss_scope="assistant")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no chat template found"):
        TokenizeChatOp("bytes")


def test_thinking_key_and_template_kwargs(chat_tokenizer_dir, hf_chat_tokenizer):
    template = CHATML_TAGGED.replace(
        "{% if message.reasoning_content %}",
        "{% if message.reasoning_content and show_thinking %}",
    )
    assert template != CHATML_TAGGED
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a",
                                                             "thinking": "hmm"}]}  # fmt: skip
    for show in (True, False):
        op = TokenizeChatOp(
            chat_tokenizer_dir, chat_template=template, chat_template_kwargs={"show_thinking": show}
        )
        (out,) = tokenize(op, [row])
        want = hf_chat_tokenizer.apply_chat_template(
            row["messages"], chat_template=template, tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True, show_thinking=show,
        )  # fmt: skip
        assert out.payload["input_ids"].tolist() == want["input_ids"]
        assert out.payload["loss_mask"].tolist() == want["assistant_masks"]
        texts = supervised_texts(
            hf_chat_tokenizer, out.payload["input_ids"], out.payload["loss_mask"]
        )
        assert texts == (["<think>hmm</think>\na<|im_end|>\n"] if show else ["a<|im_end|>\n"])


def test_bytes_tokenizer_masks_exactly_the_assistant_bytes():
    row = {
        "messages": [
            {"role": "user", "content": "héllo"},
            {"role": "assistant", "content": "ça va"},
        ]
    }
    (out,) = tokenize(TokenizeChatOp("bytes", chat_template=CHATML), [row])
    data = bytes(out.payload["input_ids"].astype(np.uint8).tolist())
    assert (
        data.decode()
        == "<|im_start|>user\nhéllo<|im_end|>\n<|im_start|>assistant\nça va<|im_end|>\n"
    )
    supervised = bytes(
        out.payload["input_ids"][out.payload["loss_mask"] == 1].astype(np.uint8).tolist()
    )
    assert supervised.decode() == "ça va<|im_end|>\n"

"""tokenize_chat's apply_chat_template=False, eos_token, per-record enable_thinking, and the
check that generation tags cover what loss_scope='after_last_user' needs; transformers'
``apply_chat_template`` on the same local tokenizer is the oracle."""

from __future__ import annotations

from typing import Any

import pytest

from tests.ops._chat import CHATML, CHATML_TAGGED, TOOLS, chatml_turn, conversations, runs
from zephon import Dataset, Pipeline
from zephon import StaticMixtureWorkSource as Source
from zephon._ops.tokenize_chat import TokenizeChatOp
from zephon.errors import ChatFormatError, ConfigError, MissingFieldError
from zephon.types import SampleMeta, SampleRecord

# A Qwen3-style template: reasoning shown unless enable_thinking is false, which renders an
# empty think block instead.
THINKING = """\
{%- for message in messages %}
{%- if message.role == 'assistant' %}<|im_start|>assistant
{% generation %}
{%- if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% elif message.reasoning_content %}<think>
{{ message.reasoning_content }}
</think>

{% endif %}
{{- message.content }}<|im_end|>
{% endgeneration %}
{%- else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Tags only assistant turns with content: a tool-call turn is rendered but never tagged.
CONTENT_TAGGED = """\
{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.role == 'assistant' and message.content %}{% generation %}\
{{ message.content }}<|im_end|>
{% endgeneration %}{% elif message.role == 'assistant' %}\
{% for call in message.tool_calls %}<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}\
<|im_end|>
{% else %}{{ message.content }}<|im_end|>
{% endif %}{%- endfor %}"""

TOOL_ROUND = [
    {"role": "user", "content": "the weather"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "weather", "arguments": {"city": "rain"}}}]},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "it is sunny"},
]  # fmt: skip


def tokenize(op: TokenizeChatOp, rows: list[dict[str, Any]]) -> list[SampleRecord]:
    records = [SampleRecord(SampleMeta((0, 0, i), 0, 0, i), row) for i, row in enumerate(rows)]
    return list(op.process_many(records))  # type: ignore[arg-type]


def test_already_rendered_text_is_tokenized_as_transformers_does(
    chat_tokenizer_dir, hf_chat_tokenizer
):
    chats = conversations(12, seed=5)
    rows = [
        {"id": c["id"], "text": hf_chat_tokenizer.apply_chat_template(
            c["messages"], tools=c.get("tools"), chat_template=CHATML, tokenize=False)}
        for c in chats
    ]  # fmt: skip
    op = TokenizeChatOp(chat_tokenizer_dir, field="text", apply_chat_template=False)
    for chat, out in zip(chats, tokenize(op, rows), strict=True):
        want = hf_chat_tokenizer.apply_chat_template(
            chat["messages"], tools=chat.get("tools"), chat_template=CHATML, tokenize=True,
            return_dict=True,
        )  # fmt: skip
        assert out.payload["input_ids"].tolist() == want["input_ids"]
        assert out.payload["loss_mask"].all() and "text" not in out.payload
    with pytest.raises(ConfigError, match="not read with apply_chat_template=False"):
        TokenizeChatOp(chat_tokenizer_dir, chat_template=CHATML, apply_chat_template=False)
    with pytest.raises(MissingFieldError, match="expected the rendered conversation as a string"):
        tokenize(TokenizeChatOp("bytes", apply_chat_template=False), [chats[0]])


def test_eos_token_override_matches_transformers(chat_tokenizer_dir, hf_chat_tokenizer):
    template = CHATML_TAGGED.replace("<|im_end|>\n{% endgeneration %}",
                                     "{{ eos_token }}\n{% endgeneration %}")  # fmt: skip
    assert template != CHATML_TAGGED
    row = conversations(1, seed=2)[0]
    for eos in (None, "<|eot_id|>"):
        op = TokenizeChatOp(chat_tokenizer_dir, chat_template=template, eos_token=eos)
        (out,) = tokenize(op, [row])
        extra = {} if eos is None else {"eos_token": eos}
        want = hf_chat_tokenizer.apply_chat_template(
            row["messages"], tools=row.get("tools"), chat_template=template, tokenize=True,
            return_dict=True, return_assistant_tokens_mask=True, **extra,
        )  # fmt: skip
        assert out.payload["input_ids"].tolist() == want["input_ids"]
        assert out.payload["loss_mask"].tolist() == want["assistant_masks"]
        ends = [hf_chat_tokenizer.decode(out.payload["input_ids"][b - 2 : b].tolist())
                for _, b in runs(out.payload["loss_mask"])]  # fmt: skip
        assert all(e.startswith(eos or "<|im_end|>") for e in ends)


def test_enable_thinking_is_read_per_record(chat_tokenizer_dir, hf_chat_tokenizer):
    base = [
        {"role": "user", "content": "how is the weather"},
        {"role": "assistant", "content": "sunny", "reasoning_content": "look outside"},
    ]
    rows = [{"messages": base, "enable_thinking": flag} for flag in (True, False, None)]
    rows.append({"messages": base})
    op = TokenizeChatOp(chat_tokenizer_dir, chat_template=THINKING)
    outs = tokenize(op, rows)
    for row, out in zip(rows, outs, strict=True):
        flag = row.get("enable_thinking")
        extra = {} if flag is None else {"enable_thinking": flag}
        want = hf_chat_tokenizer.apply_chat_template(
            base, chat_template=THINKING, tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True, **extra,
        )  # fmt: skip
        assert out.payload["input_ids"].tolist() == want["input_ids"]
        assert out.payload["loss_mask"].tolist() == want["assistant_masks"]
    assert outs[0].payload["input_ids"].tolist() != outs[1].payload["input_ids"].tolist()
    off = TokenizeChatOp(chat_tokenizer_dir, chat_template=THINKING, enable_thinking_field=None)
    assert tokenize(off, rows[1:2])[0].payload["input_ids"].tolist() == (
        outs[0].payload["input_ids"].tolist()
    )
    with pytest.raises(ChatFormatError, match="expected true or false"):
        tokenize(op, [{"messages": base, "enable_thinking": "no"}])


def test_generation_tags_must_cover_every_turn_after_the_last_user(
    chat_tokenizer_dir, hf_chat_tokenizer
):
    row = {"messages": TOOL_ROUND, "tools": TOOLS}
    scoped = TokenizeChatOp(
        chat_tokenizer_dir, chat_template=CONTENT_TAGGED, loss_scope="after_last_user"
    )
    with pytest.raises(
        ChatFormatError,
        match=r"record \(0, 0, 0\) .messages.: .*mark 1 span.*2 assistant turn\(s\) there",
    ):
        tokenize(scoped, [row])
    (fine,) = tokenize(TokenizeChatOp(chat_tokenizer_dir, chat_template=CONTENT_TAGGED), [row])
    assert fine.payload["loss_mask"].any()
    full = TokenizeChatOp(
        chat_tokenizer_dir, chat_template=CHATML_TAGGED, loss_scope="after_last_user"
    )
    (out,) = tokenize(full, [row])
    ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
    texts = [hf_chat_tokenizer.decode(ids[a:b].tolist()) for a, b in runs(mask)]
    assert texts == [chatml_turn(m) for m in TOOL_ROUND if m["role"] == "assistant"]


def test_chat_options_in_a_pipeline(chat_tokenizer_dir):
    rows = [{"text": "<|im_start|>user\nhi<|im_end|>\n" * (1 + i % 5)} for i in range(20)]
    source = Source([Dataset.from_records("r", rows)], chunk_size=8)
    pipe = Pipeline(source).tokenize_chat(
        chat_tokenizer_dir, field="text", apply_chat_template=False, max_length=12
    )
    records = list(pipe)
    assert len(records) == 20 and all(len(r.payload["input_ids"]) <= 12 for r in records)
    stats = pipe.stats()
    assert stats is not None and stats.dropped.cut_records > 0
    assert stats.dropped.cut_by_reason == {"tokenize_chat": stats.dropped.cut_records}


def test_token_mixture_is_measured_through_expand_chat_and_tokenize_chat():
    from zephon import MixtureSpec

    chats = [{"messages": c["messages"]} for c in conversations(40, seed=8, tools=False)]
    short = [{"messages": c["messages"][:2]} for c in conversations(30, seed=9, tools=False)]
    template = CHATML_TAGGED

    def pipe(mixture: MixtureSpec | None) -> Pipeline:
        source = Source(
            [Dataset.from_records("long", chats), Dataset.from_records("short", short)],
            mixture=mixture, chunk_size=8, exhausted_policy="stop" if mixture else None,
        )  # fmt: skip
        return Pipeline(source).expand_chat().tokenize_chat("bytes", chat_template=template)

    # one pass with the default (sample) mixture: the tokens each dataset's rows become
    tokens = [0, 0]
    for record in pipe(None):
        tokens[record.meta.component_id] += len(record.payload["input_ids"])
    measured = pipe(MixtureSpec({"long": 1, "short": 1}, unit="tokens")).work_source
    estimates = measured.state_dict()["config"]["tokens_per_sample"]  # type: ignore[union-attr]
    assert estimates == pytest.approx({"long": tokens[0] / 40, "short": tokens[1] / 30})


def test_a_token_mixture_refuses_to_measure_through_a_stateful_operator():
    from zephon import MixtureSpec

    rows = [Dataset.from_records("a", [{"text": "ab"}] * 4), Dataset.from_records("b", [{"t": 1}])]
    source = Source(rows, mixture=MixtureSpec({"a": 1, "b": 1}, unit="tokens"), chunk_size=2)
    pipe = Pipeline(source).stateful_transform("n", init_state=0, push=_count)
    with pytest.raises(ConfigError, match=r"through operator 'n'.*put it after tokenize"):
        pipe.tokenize("bytes")


def _count(state: int, payload: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    return state + 1, [payload]

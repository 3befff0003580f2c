"""Chat templates, a locally trained tokenizer and conversations for the chat tests.

The templates are written here in the two common shapes: ChatML (``<|im_start|>role ...
<|im_end|>``, with tools in the system turn, ``<tool_call>`` blocks and ``<think>`` reasoning)
and Llama 3 (header ids, ``<|eot_id|>``, tool results as ``ipython``). ``CHATML_TAGGED`` wraps
every assistant turn in ``{% generation %}``; ``CHATML`` is the same template without the tags.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
WORDS = [
    "the",
    "weather",
    "is",
    "nice",
    "today",
    "call",
    "a",
    "tool",
    "with",
    "city",
    "name",
    "result",
    "sunny",
    "rain",
    "what",
    "how",
]

CHATML_TAGGED = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}{% continue %}{% endif %}
{%- if message.role == 'assistant' %}<|im_start|>assistant
{% generation %}
{% if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>
{% endif %}
{% if message.content %}{{ message.content }}{% endif %}
{% for call in message.tool_calls or [] %}
<tool_call>{{ call.function | tojson }}</tool_call>
{%- endfor %}
<|im_end|>
{% endgeneration %}
{%- elif message.role == 'tool' %}<|im_start|>tool
<tool_response>{{ message.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# The same template without generation tags (a plain block keeps the whitespace identical).
CHATML = CHATML_TAGGED.replace("{% generation %}", "{% if true %}").replace(
    "{% endgeneration %}", "{% endif %}"
)

LLAMA3 = """\
{{- bos_token }}
{%- if tools %}<|start_header_id|>system<|end_header_id|>

Tools: {% for tool in tools %}{{ tool | tojson }}{% endfor %}<|eot_id|>
{%- endif %}
{%- for message in messages %}
<|start_header_id|>{{ 'ipython' if message.role == 'tool' else message.role }}<|end_header_id|>

{% if message.tool_calls %}
{%- for call in message.tool_calls %}{"name": "{{ call.function.name }}", "parameters": \
{{ call.function.arguments | tojson }}}{% endfor %}
{%- else %}{{ message.content | trim }}{% endif %}<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "today's weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def make_tokenizer_dir(
    root: Path,
    template: str | None = None,
    *,
    corpus: Iterable[str] | None = None,
    vocab_size: int = 600,
) -> Path:
    """A byte-level BPE with the chat special tokens, saved like a transformers directory
    (trained on ``corpus``, by default pseudo-sentences of WORDS and the templates)."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    if corpus is None:
        rng = random.Random(3)
        corpus = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(200)]
        corpus += [CHATML_TAGGED, LLAMA3, json.dumps(TOOLS)]
    tok.train_from_iterator(corpus, trainer)
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|im_end|>",
    }
    if template is not None:
        config["chat_template"] = template
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def _text(rng: random.Random, lo: int = 1, hi: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _tool_call(rng: random.Random) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": "weather", "arguments": {"city": _text(rng, 1, 2)}},
    }


def make_conversation(rng: random.Random, *, tools: bool = True) -> dict[str, Any]:
    """A random conversation: optional system turn, user/assistant rounds, tool calls and
    results, reasoning; always at least one assistant turn."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": _text(rng)})
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": _text(rng)})
        if tools and rng.random() < 0.4:
            messages.append({"role": "assistant", "content": None, "tool_calls": [_tool_call(rng)]})
            messages.append({"role": "tool", "content": _text(rng, 1, 3)})
        reply: dict[str, Any] = {"role": "assistant", "content": _text(rng)}
        if rng.random() < 0.3:
            reply["reasoning_content"] = _text(rng)
        messages.append(reply)
    row: dict[str, Any] = {"messages": messages}
    if tools and rng.random() < 0.5:
        row["tools"] = TOOLS
    return row


def conversations(n: int, seed: int = 0, *, tools: bool = True) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"id": i, **make_conversation(rng, tools=tools)} for i in range(n)]


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of each run of ones."""
    padded = np.concatenate([[0], mask.astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def chatml_turn(message: dict[str, Any]) -> str:
    """What a ChatML assistant turn must produce after the generation prompt."""
    out = ""
    if message.get("reasoning_content"):
        out += f"<think>{message['reasoning_content']}</think>\n"
    out += message.get("content") or ""
    for call in message.get("tool_calls") or []:
        out += f"<tool_call>{json.dumps(call['function'], ensure_ascii=False)}</tool_call>"
    return out + "<|im_end|>\n"

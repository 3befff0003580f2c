"""Build a tiny randomly initialised Qwen2 model that vLLM can serve on a CPU, fully locally.

A byte-level BPE trained here with ``tokenizers`` (ChatML special tokens), a ChatML chat
template with hermes-style ``<tool_call>`` blocks, and a 2-layer Qwen2 whose embedding is padded
past the tokenizer (as real Qwen vocabularies are): the sampler can pick ids with no text.

Run with the Python of the venv that has ``transformers`` and ``torch`` (the vLLM venv):
``python tests/capture/vllm/make_tiny_model.py OUT_DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # run as a script, any venv
from tests.capture.proxy.inference_stub import train_tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n"
    "Call a function inside <tool_call></tool_call> tags.<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n"
    "{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' and loop.first %}"
    "{%- elif m.role == 'assistant' %}\n<|im_start|>assistant\n{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] %}<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": '
    "{{ tc.function.arguments if tc.function.arguments is string "
    "else tc.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>"
    "{%- elif m.role == 'tool' %}\n<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>"
    "{%- else %}\n<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}\n<|im_start|>assistant\n{%- endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog; 12345 67890 stones by the river.",
    '<tool_call>\n{"name": "search", "arguments": {"query": "river"}}\n</tool_call>',
    "User asks, assistant answers, the tool reports a result: turn 3 of 10.",
    "alpha beta gamma delta search result tool answer river stone cloud light number",
]


def build(out: Path, vocab_size: int = 640, padded_vocab: int = 1024) -> Path:
    import torch
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    bpe = train_tokenizer(str(out / "bpe.json"), vocab_size, SPECIALS, CORPUS * 3)
    tok = Tokenizer.from_file(bpe)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[3:],
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=padded_vocab,
        hidden_size=128,  # head_dim 64: vLLM's CPU attention has no kernel for 16
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tok.token_to_id("<|im_end|>"),
        bos_token_id=tok.token_to_id("<|endoftext|>"),
        torch_dtype="float32",
    )
    Qwen2ForCausalLM(config).save_pretrained(out)
    gen = {"eos_token_id": config.eos_token_id, "bos_token_id": config.bos_token_id}
    (out / "generation_config.json").write_text(json.dumps(gen))
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))

"""Qwen2-VL's chat template, a local tokenizer with its vision tokens and the matching HF
processor: the oracle for conversations with image parts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

from tests.ops._chat import make_tokenizer_dir

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# Qwen2-VL-Instruct's chat template.
QWEN2_VL = """\
{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}\
{% for message in messages %}{% if loop.first and message['role'] != 'system' %}\
<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}<|im_start|>{{ message['role'] }}
{% if message['content'] is string %}{{ message['content'] }}<|im_end|>
{% else %}{% for content in message['content'] %}\
{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}\
{% set image_count.value = image_count.value + 1 %}\
{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}\
<|vision_start|><|image_pad|><|vision_end|>\
{% elif content['type'] == 'video' or 'video' in content %}\
{% set video_count.value = video_count.value + 1 %}\
{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}\
<|vision_start|><|video_pad|><|vision_end|>\
{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def vision_tokenizer_dir(root: Path) -> Path:
    """A local byte-level BPE with the ChatML and the vision special tokens."""
    make_tokenizer_dir(root, QWEN2_VL)
    tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in VISION_TOKENS])
    tokenizer.save(str(root / "tokenizer.json"))
    return root


def processor(root: Path) -> Any:
    """transformers' Qwen2-VL processor over the local tokenizer and the template.

    Built around its constructor, which wants a video processor (torchvision, not installed
    here); images and text go through its own ``__call__`` and ``apply_chat_template``."""
    from transformers import PreTrainedTokenizerFast, Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(root / "tokenizer.json"))
    out = Qwen2VLProcessor.__new__(Qwen2VLProcessor)
    out.chat_template = QWEN2_VL
    out.image_processor = Qwen2VLImageProcessorPil()
    out.tokenizer = tokenizer
    out.video_processor = None
    out.image_token, out.video_token = "<|image_pad|>", "<|video_pad|>"
    out.image_token_id = tokenizer.convert_tokens_to_ids(out.image_token)
    out.video_token_id = tokenizer.convert_tokens_to_ids(out.video_token)
    return out


def conversation(i: int, images: int) -> list[dict[str, Any]]:
    """A user turn with ``images`` image parts among text, then the assistant's answer."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": f"what is in picture {i}?"}]
    for k in range(images):
        parts.insert(k, {"type": "image"})
    if images > 1:  # one image after the question as well
        parts.append(parts.pop(images - 1))
    answer = "the weather is " + " ".join(["sunny", "rain", "nice"][: 1 + i % 3])
    return [{"role": "user", "content": parts}, {"role": "assistant", "content": answer}]

"""A tiny, randomly initialised Qwen2-VL built offline from its config: the real model at the
seam of the multimodal tests (seconds on a CPU)."""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

VOCAB = 320
IMAGE_TOKEN = 300


@cache
def tiny_qwen2_vl(
    vocab: int = VOCAB, image_token: int = IMAGE_TOKEN, video_token: int | None = None
) -> Any:
    """The model, in eval mode and float64 (its loss is still computed in float32); its video
    placeholder is ``video_token``, by default the last id."""
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": vocab,
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 1024,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3], "rope_theta": 10.0},
            "initializer_range": 0.5,
            "bos_token_id": 0,
            "eos_token_id": 1,
        },
        vision_config={
            "depth": 1,
            "embed_dim": 32,
            "hidden_size": 64,
            "num_heads": 4,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
        image_token_id=image_token,
        video_token_id=vocab - 1 if video_token is None else video_token,
        vision_start_token_id=vocab - 2,
        vision_end_token_id=vocab - 3,
    )
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(config).to(torch.float64).eval()

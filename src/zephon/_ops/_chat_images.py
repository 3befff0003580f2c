"""Image parts of a conversation as the model's vision tokens: ``tokenize_chat(image_grids=...)``.

Why after tokenizing, not in the text: a chat template renders each image part as one
placeholder token (Qwen2-VL's ``<|image_pad|>``, between ``<|vision_start|>`` and
``<|vision_end|>``); the model wants that placeholder repeated once per vision token of the
image, which is what Hugging Face processors do to the text before tokenizing. A placeholder
is a special token, so repeating its id gives the same ids, and the count comes from the
record's patch grids (``image_tokens`` reads them from headers, ``decode_image`` from pixels).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon.errors import ChatFormatError, ConfigError


def image_token_id(encoder: Any, token: str, media: str = "image") -> int:
    """The id of the placeholder ``token`` of ``media`` parts in ``encoder``'s vocabulary."""
    lookup = getattr(getattr(encoder, "tokenizer", None), "token_to_id", None)
    found = lookup(token) if lookup is not None else None
    if found is None:
        raise ConfigError(
            f"tokenize_chat: the tokenizer has no token {token!r} for {media} parts; pass "
            f"{media}_token= the placeholder its chat template renders for a {media} part"
        )
    return int(found)


def expand_images(
    ids: np.ndarray,
    mask: np.ndarray,
    token: int,
    counts: Sequence[int],
    where: str,
    media: str = "image",
) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` with the ``k``-th ``token`` repeated ``counts[k]`` times; ``mask`` 0 on them
    (``media`` names what the placeholders stand for in errors: image or video)."""
    at = np.flatnonzero(ids == token)
    if len(at) != len(counts):
        raise ChatFormatError(
            f"{where}: the conversation has {len(at)} {media} parts but {len(counts)} {media}s "
            f"have grids; give every {media} part one {media} of the record, in order"
        )
    repeats = np.ones(len(ids), dtype=np.int64)
    repeats[at] = counts
    is_image = np.repeat(ids == token, repeats)
    expanded_mask = np.repeat(mask, repeats)
    expanded_mask[is_image] = 0
    return np.repeat(ids, repeats), expanded_mask

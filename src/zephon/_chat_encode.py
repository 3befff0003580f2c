"""Tokenize rendered conversations into ids and loss masks, sharing work between prefixes.

The children ``expand_chat`` makes of one conversation render to texts that are prefixes of
the longest one. A Hugging Face tokenizer first splits its input at added tokens and encodes
the pieces between them independently, so a prefix that ends exactly where an added token
starts in the longer text has the longer text's tokens up to that added token. Such a prefix
reuses the longer text's encoding; every other text is encoded on its own. The result is the
same as encoding every text separately, only cheaper (the tests compare with transformers).

Masks: tokens cover the text in order, so a span ``[a, b)`` marks the tokens from the one
holding character ``a`` to the one holding ``b - 1``; only when a boundary character belongs to
no token are the full offsets consulted (tokens overlapping the span, as transformers does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

Spans = Sequence[tuple[int, int]]


def token_mask(offsets: np.ndarray, spans: Spans) -> np.ndarray:
    """1 (int8) on every token whose ``[start, end)`` character range overlaps a span."""
    mask = np.zeros(offsets.shape[0], dtype=np.int8)
    if not spans or offsets.shape[0] == 0:
        return mask
    starts = offsets[:, 0]
    ends = offsets[:, 1]
    hit = np.zeros(offsets.shape[0], dtype=bool)
    for a, b in spans:
        hit |= (ends > a) & (starts < b)
    mask[hit] = 1
    return mask


def added_token_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of added tokens matched verbatim (not normalised, no stripping of neighbours)."""
    decoder = getattr(tokenizer, "get_added_tokens_decoder", None)
    if decoder is None:
        return frozenset()
    return frozenset(
        i
        for i, tok in decoder().items()
        if not (tok.normalized or tok.lstrip or tok.rstrip or tok.single_word)
    )


def span_mask(encoding: Any, n_tokens: int, spans: Spans) -> np.ndarray:
    mask = np.zeros(n_tokens, dtype=np.int8)
    for a, b in spans:
        first, last = encoding.char_to_token(a), encoding.char_to_token(b - 1)
        if first is None or last is None:
            offsets = np.asarray(encoding.offsets[:n_tokens], dtype=np.int64).reshape(-1, 2)
            return token_mask(offsets, spans)
        mask[first : last + 1] = 1
    return mask


def _cut(encoding: Any, ids: np.ndarray, n_chars: int, added: frozenset[int]) -> int | None:
    """Tokens of the first ``n_chars`` characters, when they end right before an added token."""
    k = encoding.char_to_token(n_chars)
    if k is None or int(ids[k]) not in added or encoding.token_to_chars(k)[0] != n_chars:
        return None
    return int(k)


def encode_masked(
    tokenizer: Any,
    added: frozenset[int],
    texts: Sequence[str],
    spans: Sequence[Spans],
    prefix_of: Sequence[int | None],
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(ids, mask)`` per text; ``prefix_of[i]`` names a longer text that starts with text
    ``i`` and is not itself a prefix of another (or None)."""
    roots = [i for i, p in enumerate(prefix_of) if p is None]
    encoded: dict[int, tuple[Any, np.ndarray]] = {}

    def encode(indices: list[int]) -> None:
        batch = tokenizer.encode_batch([texts[i] for i in indices], add_special_tokens=False)
        for i, e in zip(indices, batch, strict=True):
            encoded[i] = (e, np.asarray(e.ids, dtype=np.int32))

    encode(roots)
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    alone: list[int] = []
    for i, parent in enumerate(prefix_of):
        if parent is None:
            continue
        e, ids = encoded[parent]
        k = _cut(e, ids, len(texts[i]), added)
        if k is None:
            alone.append(i)
        else:
            out[i] = (ids[:k].copy(), span_mask(e, k, spans[i]))
    if alone:
        encode(alone)
    for i in roots + alone:
        e, ids = encoded[i]
        out[i] = (ids, span_mask(e, ids.shape[0], spans[i]))
    return [out[i] for i in range(len(texts))]

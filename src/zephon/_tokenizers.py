"""Resolve what users pass as a tokenizer into one batch-encoding interface.

Accepted: ``"bytes"`` (built in, no files), an HF ``tokenizers.Tokenizer``, a path to a
``tokenizer.json``, a local transformers tokenizer directory, or a transformers tokenizer
instance (duck-typed through ``backend_tokenizer``; transformers is never imported).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from zephon._chat_encode import added_token_ids, encode_masked, token_mask
from zephon.errors import ConfigError

_BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "[CLS]", "<|startoftext|>")
_EOS_NAMES = ("</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", "[SEP]")
_BOS_WORDS = ("bos", "begin_of_text", "startoftext", "start_of_text")
_EOS_WORDS = ("eos", "end_of_text", "endoftext", "eot")


class BatchEncoder(Protocol):
    bos_token_id: int | None
    eos_token_id: int | None

    def encode_many(self, texts: list[str]) -> Sequence[Sequence[int] | np.ndarray]: ...


class ByteTokenizer:
    """UTF-8 bytes as token ids (0-255), BOS 256, EOS 257: a tokenizer that needs no files."""

    bos_token_id: int | None = 256
    eos_token_id: int | None = 257
    vocab_size = 258

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int32) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` without BOS/EOS; a character cut at a span edge becomes U+FFFD."""
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def encode_masked(
        self,
        texts: list[str],
        spans: Sequence[Sequence[tuple[int, int]]],
        prefix_of: Sequence[int | None] | None = None,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Ids and a mask that is 1 on the bytes of characters inside a span."""
        out = []
        for text, kept in zip(texts, spans, strict=True):
            data = text.encode("utf-8")
            ids = np.frombuffer(data, dtype=np.uint8).astype(np.int32)
            if len(data) == len(text):
                chars = np.arange(len(text), dtype=np.int64)
            else:
                widths = [len(ch.encode("utf-8")) for ch in text]
                chars = np.repeat(np.arange(len(text), dtype=np.int64), widths)
            out.append((ids, token_mask(np.stack([chars, chars + 1], axis=1), kept)))
        return out


class HFTokenizer:
    """An HF ``tokenizers.Tokenizer`` encoding whole micro-batches (GIL released)."""

    def __init__(self, tokenizer: Any, bos: int | None, eos: int | None) -> None:
        self.tokenizer = tokenizer
        self.bos_token_id = bos
        self.eos_token_id = eos
        self._fast = getattr(tokenizer, "encode_batch_fast", None)
        self._added: frozenset[int] | None = None

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        encode = self._fast or self.tokenizer.encode_batch
        return [e.ids for e in encode(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens left out."""
        return str(self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True))

    def encode_masked(
        self,
        texts: list[str],
        spans: Sequence[Sequence[tuple[int, int]]],
        prefix_of: Sequence[int | None] | None = None,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Ids and a mask that is 1 on tokens overlapping a character span (see
        :mod:`zephon._ops._chat_encode`; ``prefix_of`` lets prefixes share an encoding)."""
        if self._added is None:
            self._added = added_token_ids(self.tokenizer)
        links = prefix_of if prefix_of is not None else [None] * len(texts)
        return encode_masked(self.tokenizer, self._added, texts, spans, links)


def _special_id(tokenizer: Any, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("content")
    if isinstance(value, str):
        tid = tokenizer.token_to_id(value)
        return int(tid) if tid is not None else None
    return None


def _guess(tokenizer: Any, names: Sequence[str]) -> int | None:
    for name in names:
        tid = tokenizer.token_to_id(name)
        if tid is not None:
            return int(tid)
    return None


def _from_added(tokenizer: Any, words: Sequence[str]) -> int | None:
    """The first special added token whose text names the role (``<|im_end|>``-style)."""
    decoder = getattr(tokenizer, "get_added_tokens_decoder", None)
    if decoder is None:
        return None
    for tid, token in sorted(decoder().items()):
        content = str(getattr(token, "content", token)).lower()
        if getattr(token, "special", True) and any(w in content for w in words):
            return int(tid)
    return None


def _from_file(path: Path) -> HFTokenizer:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception naming no file
        hint = ""
        if path.name in ("tokenizer_config.json", "special_tokens_map.json"):
            hint = f"; that is a transformers config: give {path.parent / 'tokenizer.json'}"
        detail = " ".join(str(exc).split())
        raise ConfigError(
            f"tokenizer file {path} cannot be read as a tokenizers JSON file ({detail}){hint}"
        ) from None
    bos = eos = None
    config = path.parent / "tokenizer_config.json"
    special = path.parent / "special_tokens_map.json"
    for cfg_path in (config, special):
        if cfg_path.is_file():
            try:
                cfg = json.loads(cfg_path.read_text())
            except (ValueError, OSError) as exc:
                raise ConfigError(f"tokenizer config {cfg_path} is not valid JSON: {exc}") from None
            bos = bos if bos is not None else _special_id(tok, cfg.get("bos_token"))
            eos = eos if eos is not None else _special_id(tok, cfg.get("eos_token"))
    return HFTokenizer(tok, *_specials(tok, bos, eos))


def _specials(tok: Any, bos: int | None, eos: int | None) -> tuple[int | None, int | None]:
    """BOS and EOS: the configured ids, else well-known names, else added special tokens."""
    if bos is None:
        bos = _guess(tok, _BOS_NAMES)
    if bos is None:
        bos = _from_added(tok, _BOS_WORDS)
    if eos is None:
        eos = _guess(tok, _EOS_NAMES)
    if eos is None:
        eos = _from_added(tok, _EOS_WORDS)
    return bos, eos


def load_tokenizer(spec: Any) -> BatchEncoder:
    """Build the encoder for ``spec`` (see the module docstring for what is accepted)."""
    if isinstance(spec, str) and spec == "bytes":
        return ByteTokenizer()
    if isinstance(spec, (str, os.PathLike)):
        path = Path(spec)
        if path.is_dir():
            candidate = path / "tokenizer.json"
            if not candidate.is_file():
                raise ConfigError(
                    f"tokenizer directory {path} has no tokenizer.json; zephon reads fast "
                    "tokenizers only (save one with tokenizer.save_pretrained(dir))"
                )
            return _from_file(candidate)
        if path.is_file():
            return _from_file(path)
        raise ConfigError(
            f"tokenizer {str(spec)!r} is neither 'bytes', a tokenizer.json file nor a "
            "directory holding one; zephon never downloads tokenizers"
        )
    if hasattr(spec, "encode_batch") and hasattr(spec, "token_to_id"):
        return HFTokenizer(spec, *_specials(spec, None, None))
    backend = getattr(spec, "backend_tokenizer", None)
    if backend is not None:
        return HFTokenizer(
            backend, getattr(spec, "bos_token_id", None), getattr(spec, "eos_token_id", None)
        )
    if hasattr(spec, "encode_many"):
        return spec  # type: ignore[no-any-return]
    raise ConfigError(
        f"unsupported tokenizer {type(spec).__name__}: pass 'bytes', a tokenizers.Tokenizer, "
        "a path to tokenizer.json, a transformers tokenizer directory or a fast transformers "
        "tokenizer instance"
    )

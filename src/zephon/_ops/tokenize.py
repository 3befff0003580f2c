"""tokenize: text field -> ``input_ids`` (numpy int32), one batch call per micro-batch."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any, Literal

import numpy as np

from zephon._ops._cut_watch import CutWatch
from zephon._tokenizers import BatchEncoder, load_tokenizer
from zephon.errors import ConfigError, MissingFieldError, did_you_mean, json_type
from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext, OpTraits
from zephon.types import SampleRecord, StreamItem, cut_note, spawn_child

TOKENIZE_MICRO_BATCH = 64
TOKENIZE_LATENCY_MS = 3.0
SpecialTokens = Literal["bos_eos", "bos", "eos", "none"]
N_SPECIALS = {"bos_eos": 2, "bos": 1, "eos": 1, "none": 0}


class TokenizeOp(BaseOp):
    """Tokenizes ``field`` into ``output_field``; the rest of the payload is kept.

    The tokenizer is built lazily in each worker on its first micro-batch (HF objects should
    not cross process boundaries half-initialised). ``special_tokens`` brackets each document
    with BOS/EOS itself; ``max_length`` truncates (room for the specials is reserved) and every
    cut is reported to the run summary. ``split_long_samples`` instead cuts the bracketed
    document into consecutive pieces of at most ``max_length`` tokens (BOS only on the first,
    EOS only on the last, so the pieces concatenate to the untruncated ids); a document of
    several pieces becomes child records (``spawn_child``), the last of which closes it.
    """

    name = "tokenize"
    # micro-batch sizes cannot change the output (every runner and worker count agree)
    config_exclude = ("max_batch", "max_latency_ms")

    def __init__(
        self,
        tokenizer: Any = "bytes",
        *,
        field: str = "text",
        output_field: str = "input_ids",
        special_tokens: SpecialTokens = "bos_eos",
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        max_length: int | None = None,
        truncation: bool | None = None,
        split_long_samples: bool = False,
        max_batch: int = TOKENIZE_MICRO_BATCH,
    ) -> None:
        super().__init__()
        if special_tokens not in ("bos_eos", "bos", "eos", "none"):
            raise ConfigError(
                f"tokenize: special_tokens must be 'bos_eos', 'bos', 'eos' or 'none', "
                f"got {special_tokens!r}"
                + did_you_mean(special_tokens, ("bos_eos", "bos", "eos", "none"))
            )
        if split_long_samples:
            if max_length is None:
                raise ConfigError(
                    "tokenize: split_long_samples=True needs max_length (the piece length)"
                )
            if truncation:
                raise ConfigError(
                    "tokenize: truncation=True and split_long_samples=True exclude each other "
                    "(truncation drops what split_long_samples keeps); pass one of them"
                )
            truncation = False
        if truncation is None:
            truncation = max_length is not None
        if truncation and max_length is None:
            raise ConfigError("tokenize: truncation=True needs max_length")
        n_specials = N_SPECIALS[special_tokens]
        if max_length is not None and max_length <= n_specials:
            raise ConfigError(
                f"tokenize: max_length={max_length} leaves no room for content next to "
                f"{n_specials} special token(s)"
            )
        self.tokenizer_spec = tokenizer
        self.field = field
        self.output_field = output_field
        self.special_tokens = special_tokens
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.max_length = max_length
        self.truncation = truncation
        self.split_long_samples = split_long_samples
        self._cut_watch = CutWatch(max_length) if truncation else None
        self.max_batch = max_batch
        self._encoder: BatchEncoder | None = None
        # Resolved now, in the driver: a missing BOS/EOS is a config error before any data.
        self._bos, self._eos = self._specials(load_tokenizer(tokenizer))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_encoder"] = None  # each worker builds its own
        return state

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return CountingAccumulator(self.max_batch, None if deterministic else TOKENIZE_LATENCY_MS)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism="auto", elementwise=True)

    def config(self) -> Mapping[str, Any]:
        spec = self.tokenizer_spec
        return {
            "tokenizer": spec if isinstance(spec, str) else type(spec).__name__,
            "field": self.field,
            "output_field": self.output_field,
            "special_tokens": self.special_tokens,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "max_length": self.max_length,
            "truncation": self.truncation,
            "split_long_samples": self.split_long_samples,
        }

    def _specials(self, encoder: BatchEncoder) -> tuple[int | None, int | None]:
        """The BOS and EOS ids ``special_tokens`` needs; raises naming the key to set."""
        bos = self.bos_token_id if self.bos_token_id is not None else encoder.bos_token_id
        eos = self.eos_token_id if self.eos_token_id is not None else encoder.eos_token_id
        for role, tid, modes, other in (
            ("BOS", bos, ("bos_eos", "bos"), "eos"),
            ("EOS", eos, ("bos_eos", "eos"), "bos"),
        ):
            if self.special_tokens in modes and tid is None:
                raise ConfigError(
                    f"tokenize: the tokenizer {self._describe()} defines no {role} token (none in "
                    "tokenizer_config.json, special_tokens_map.json or its added tokens); set "
                    f"special_tokens: none | {other} | bos_eos (now {self.special_tokens!r}) "
                    f"or {role.lower()}_token_id: ID",
                    param="special_tokens",
                )
        return bos, eos

    def _describe(self) -> str:
        spec = self.tokenizer_spec
        return (
            repr(os.fspath(spec)) if isinstance(spec, (str, os.PathLike)) else type(spec).__name__
        )

    def decode(self, ids: Sequence[int]) -> str | None:
        """The text of token ``ids`` (a span of a row), or None when the tokenizer cannot
        decode (a custom encoder without ``decode``)."""
        encoder = self._encoder or self._load()
        decode = getattr(encoder, "decode", None)
        return None if decode is None else str(decode(ids))

    def _load(self) -> BatchEncoder:
        self._encoder = load_tokenizer(self.tokenizer_spec)
        return self._encoder

    def whole_lengths(self, elems: list[StreamItem]) -> list[int]:
        """Each record's token count without truncation, special tokens included: how long a
        document ``max_length`` cut was (provenance asks; records never carry it)."""
        encoder = self._encoder or self._load()
        extra = N_SPECIALS[self.special_tokens]
        return [len(ids) + extra for ids in encoder.encode_many(self._texts(elems))]

    def _texts(self, elems: list[StreamItem]) -> list[str]:
        """The text of every element, or an error naming the record and the field."""
        field = self.field
        texts: list[str] = []
        for elem in elems:
            payload = elem.payload
            try:
                text = payload[field]
            except (KeyError, TypeError):
                fields = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
                raise MissingFieldError(
                    f"tokenize: record {elem.meta.sample_id} has no field {field!r} "
                    f"(fields: {fields})",
                    sample_id=elem.meta.sample_id,
                ) from None
            if not isinstance(text, str):
                raise MissingFieldError(
                    f"tokenize: field {field!r} of record {elem.meta.sample_id} is "
                    f"{json_type(text)}, expected str (add decode_text() before tokenize)",
                    sample_id=elem.meta.sample_id,
                )
            texts.append(text)
        return texts

    def _token_array(self, ids_list: Sequence[Any]) -> tuple[np.ndarray, list[int], list[int]]:
        """Every document's ids, truncated and bracketed by the special tokens, in one array
        filled by one conversion; where each document starts (plus the end); and how many
        tokens truncation cut from each."""
        n_head = 1 if self.special_tokens in ("bos_eos", "bos") else 0
        n_tail = 1 if self.special_tokens in ("bos_eos", "eos") else 0
        lengths = [len(ids) for ids in ids_list]
        cut = [0] * len(lengths)
        if self.truncation and self.max_length is not None:
            limit = self.max_length - n_head - n_tail
            if any(n > limit for n in lengths):
                cut = [max(0, n - limit) for n in lengths]
                ids_list = [ids[:limit] for ids in ids_list]
                lengths = [min(n, limit) for n in lengths]
        bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(np.asarray(lengths, dtype=np.int64) + (n_head + n_tail), out=bounds[1:])
        if ids_list and all(isinstance(ids, np.ndarray) for ids in ids_list):
            body = np.concatenate(ids_list).astype(np.int32, copy=False)
        else:
            body = np.fromiter(chain.from_iterable(ids_list), np.int32, count=sum(lengths))
        if not (n_head or n_tail):
            return body, bounds.tolist(), cut
        flat = np.empty(int(bounds[-1]), dtype=np.int32)
        is_body = np.ones(len(flat), dtype=bool)
        if n_head:
            is_body[bounds[:-1]] = False
            flat[bounds[:-1]] = self._bos or 0
        if n_tail:
            is_body[bounds[1:] - 1] = False
            flat[bounds[1:] - 1] = self._eos or 0
        flat[is_body] = body
        return flat, bounds.tolist(), cut

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        encoder = self._encoder or self._load()
        flat, spans, cut = self._token_array(encoder.encode_many(self._texts(elems)))
        if self._cut_watch is not None:
            self._cut_watch.add(self.name, len(flat), sum(cut))
        out: list[StreamItem] = []
        out_field = self.output_field
        piece = self.max_length if self.split_long_samples else None
        for i, elem in enumerate(elems):
            assert isinstance(elem, SampleRecord)
            ids = flat[spans[i] : spans[i + 1]]
            if piece is not None and len(ids) > piece:
                out.extend(_pieces(elem, out_field, ids, piece))
                continue
            payload = dict(elem.payload)
            payload[out_field] = ids
            out.append(SampleRecord(elem.meta, payload))
            if cut[i]:
                reason = f"{self.name}: truncated to max_length"
                out.append(cut_note(elem, reason=reason, tokens=cut[i]))
        return out


def _pieces(elem: SampleRecord, field: str, ids: np.ndarray, piece: int) -> list[StreamItem]:
    """``ids`` as consecutive child records of at most ``piece`` tokens."""
    starts = range(0, len(ids), piece)
    last = len(starts) - 1
    out: list[StreamItem] = []
    for k, start in enumerate(starts):
        payload = dict(elem.payload)
        payload[field] = ids[start : start + piece]
        out.append(spawn_child(elem, k, payload, is_last=k == last))
    return out

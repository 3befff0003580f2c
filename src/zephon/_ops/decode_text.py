"""decode_text: make text fields ``str`` (decoding bytes) and normalise them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zephon.errors import ConfigError, MissingFieldError, json_type
from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext, OpTraits
from zephon.types import SampleRecord, StreamItem

DECODE_MICRO_BATCH = 128
DECODE_LATENCY_MS = 2.0


class DecodeTextOp(BaseOp):
    """Decodes ``fields`` to ``str``; optionally normalises newlines and lowercases."""

    name = "decode_text"
    # micro-batch sizes cannot change the output (every runner and worker count agree)
    config_exclude = ("max_batch", "max_latency_ms")

    def __init__(
        self,
        fields: Sequence[str] = ("text",),
        *,
        encoding: str = "utf-8",
        errors: str = "strict",
        normalize_newlines: bool = True,
        lowercase: bool = False,
        max_batch: int = DECODE_MICRO_BATCH,
    ) -> None:
        super().__init__()
        if isinstance(fields, str):
            fields = (fields,)
        if not fields:
            raise ConfigError("decode_text needs at least one field")
        self.fields = tuple(fields)
        self.encoding = encoding
        self.errors = errors
        self.normalize_newlines = normalize_newlines
        self.lowercase = lowercase
        self.max_batch = max_batch

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return CountingAccumulator(self.max_batch, None if deterministic else DECODE_LATENCY_MS)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=1, elementwise=True)

    def config(self) -> Mapping[str, Any]:
        return {
            "fields": self.fields,
            "encoding": self.encoding,
            "errors": self.errors,
            "normalize_newlines": self.normalize_newlines,
            "lowercase": self.lowercase,
        }

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        out: list[StreamItem] = []
        for elem in elems:
            payload = elem.payload
            new = dict(payload)
            for name in self.fields:
                try:
                    value = payload[name]
                except (KeyError, TypeError):
                    known = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
                    raise MissingFieldError(
                        f"decode_text: record {elem.meta.sample_id} has no field {name!r}"
                        f" (fields: {known})",
                        sample_id=elem.meta.sample_id,
                    ) from None
                if isinstance(value, (bytes, bytearray, memoryview)):
                    value = bytes(value).decode(self.encoding, self.errors)
                elif not isinstance(value, str):
                    raise MissingFieldError(
                        f"decode_text: field {name!r} of record {elem.meta.sample_id} is "
                        f"{json_type(value)}, expected str or bytes",
                        sample_id=elem.meta.sample_id,
                    )
                if self.normalize_newlines and "\r" in value:
                    value = value.replace("\r\n", "\n").replace("\r", "\n")
                if self.lowercase:
                    value = value.lower()
                new[name] = value
            out.append(SampleRecord(elem.meta, new))
        return out

"""tokenize_chat: conversations -> ``input_ids`` and a ``loss_mask`` that is 1 on supervised tokens.

Each conversation is rendered with its chat template (Hugging Face convention, see
``_chat_template``), the rendered texts of a micro-batch are tokenized in one batch call with
character offsets, and every token overlapping a supervised span gets mask 1
(``_chat_spans`` says how spans are found and scoped). ``input_ids`` are what
``apply_chat_template(..., tokenize=True)`` returns for the same template and tokenizer.

Truncation to ``max_length`` keeps the head and cuts ids and mask together (the run summary
counts the cut tokens). A conversation with no supervised token left (none in scope, or all cut
off) becomes a tombstone whose reason says so; the engine counts it.

``apply_chat_template=False`` reads ``field`` as text that is already rendered: it is tokenized
as is and every token is supervised. ``eos_token`` replaces the tokenizer's EOS string in the
template; ``enable_thinking_field`` names a per-record boolean passed to the template as
``enable_thinking`` (Qwen3-style templates), overriding ``chat_template_kwargs``.

``image_grids`` names the field of the record's image patch grids (``image_tokens`` or
``decode_image`` before): each image placeholder ``image_token`` the template renders for an
image part becomes that image's vision tokens (``t * h * w / merge_size**2`` copies, never
supervised), as a Hugging Face processor expands it; ``video_grids`` (``decode_video``'s grids)
and ``video_token`` do the same for video parts. A ``max_length`` that would cut an image or a
video off makes the record a tombstone (its pixels would no longer match its tokens).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

import numpy as np

from zephon._ops._chat_assets import special_tokens, template_source
from zephon._ops._chat_images import expand_images, image_token_id
from zephon._ops._chat_messages import conversation, normalise
from zephon._ops._chat_spans import (
    LOSS_SCOPES,
    SPAN_SOURCES,
    ChatRenderer,
    LossScope,
    SpanSource,
)
from zephon._ops._chat_template import Span, compile_template, has_generation_tags
from zephon._ops._pack_images import image_token_counts
from zephon._tokenizers import load_tokenizer
from zephon.errors import ChatFormatError, ConfigError, MissingFieldError, did_you_mean, json_type
from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext, OpTraits
from zephon.types import SampleRecord, StreamItem, cut_note, tombstone_meta

CHAT_MICRO_BATCH = 64
CHAT_LATENCY_MS = 3.0
NO_SUPERVISED = "tokenize_chat: no supervised token"


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(
            f"tokenize_chat: {name} must be one of {list(choices)}, got {value!r}"
            + did_you_mean(value, choices)
        )


def prefix_links(elems: list[StreamItem], texts: list[str]) -> list[int | None]:
    """For each text, the last sibling (same parent record) whose text it begins, or None.

    ``expand_chat`` children sit next to each other, the longest last; a micro-batch boundary
    only splits a family, which costs sharing but never changes a result.
    """
    links: list[int | None] = [None] * len(texts)
    end = len(elems)
    while end > 0:
        last = end - 1
        meta = elems[last].meta
        family = (meta.chunk_id, meta.chunk_offset, meta.lineage[:-1])
        start = last
        while start > 0 and meta.lineage:
            prev = elems[start - 1].meta
            if (prev.chunk_id, prev.chunk_offset, prev.lineage[:-1]) != family or not prev.lineage:
                break
            start -= 1
        longest = texts[last]
        for i in range(start, last):
            if longest.startswith(texts[i]):
                links[i] = last
        end = start
    return links


class TokenizeChatOp(BaseOp):
    """Renders and tokenizes ``field`` (a list of messages); see the module docstring.

    ``span_source="auto"`` uses ``{% generation %}`` tags when the template has them and prefix
    diffing otherwise; :meth:`describe` (shown by ``pipeline.explain()``) says which.
    """

    name = "tokenize_chat"
    # micro-batch sizes cannot change the output (every runner and worker count agree)
    config_exclude = ("max_batch", "max_latency_ms")
    config_when_set = ("image_grids", "image_token", "merge_size", "video_grids", "video_token")

    def __init__(
        self,
        tokenizer: Any,
        *,
        field: str = "messages",
        chat_template: str | os.PathLike[str] | None = None,
        loss_scope: LossScope = "all_assistant",
        span_source: SpanSource = "auto",
        tools_field: str | None = "tools",
        max_length: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        output_field: str = "input_ids",
        mask_field: str = "loss_mask",
        apply_chat_template: bool = True,
        eos_token: str | None = None,
        enable_thinking_field: str | None = "enable_thinking",
        max_batch: int = CHAT_MICRO_BATCH,
        image_grids: str | None = None,
        image_token: str = "<|image_pad|>",
        merge_size: int = 2,
        video_grids: str | None = None,
        video_token: str = "<|video_pad|>",
    ) -> None:
        super().__init__()
        _check_choice("loss_scope", loss_scope, LOSS_SCOPES)
        _check_choice("span_source", span_source, SPAN_SOURCES)
        if max_length is not None and (isinstance(max_length, bool) or max_length < 2):
            raise ConfigError(f"tokenize_chat: max_length must be >= 2 or None, got {max_length!r}")
        if not apply_chat_template and chat_template is not None:
            raise ConfigError(
                "tokenize_chat: chat_template is not read with apply_chat_template=False (the "
                "field is already rendered); pass one or the other"
            )
        source = template_source(chat_template, tokenizer) if apply_chat_template else ""
        compile_template(source)  # fail fast on a syntax error, in the driver
        tagged = has_generation_tags(source)
        if span_source == "generation_tags" and not tagged:
            raise ConfigError(
                "tokenize_chat: span_source='generation_tags' but the chat template has no "
                "{% generation %} ... {% endgeneration %} block; add them around the assistant "
                "text or use span_source='prefix_diff' (or 'auto')"
            )
        if merge_size < 1:
            raise ConfigError(f"tokenize_chat: merge_size must be >= 1, got {merge_size}")
        if isinstance(tokenizer, str | os.PathLike) and tokenizer != "bytes":
            encoder = load_tokenizer(tokenizer)  # fail fast on a bad path
            for grids, token, media in (
                (image_grids, image_token, "image"),
                (video_grids, video_token, "video"),
            ):
                if grids is not None:
                    image_token_id(encoder, token, media)  # and on a missing placeholder
        self.tokenizer_spec = tokenizer
        self.field = field
        self.template = source
        self.loss_scope: LossScope = loss_scope
        self.span_source: SpanSource = span_source
        self.resolved_span_source: Literal["generation_tags", "prefix_diff"] = (
            "generation_tags" if span_source != "prefix_diff" and tagged else "prefix_diff"
        )
        self.tools_field = tools_field
        self.max_length = max_length
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.output_field = output_field
        self.mask_field = mask_field
        self.apply_chat_template = apply_chat_template
        self.eos_token = eos_token
        self.enable_thinking_field = enable_thinking_field
        self.max_batch = max_batch
        self.image_grids = image_grids
        self.image_token = image_token
        self.merge_size = merge_size
        self.video_grids, self.video_token = video_grids, video_token
        eos = {} if eos_token is None else {"eos_token": eos_token}
        self.variables = {**special_tokens(tokenizer), **eos, **self.chat_template_kwargs}
        self._encoder: Any = None
        #: (grid field, placeholder id) of image parts, then of video parts, as asked
        self._media: list[tuple[str, int]] = []

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_encoder"] = None  # each worker builds its own
        return state

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return CountingAccumulator(self.max_batch, None if deterministic else CHAT_LATENCY_MS)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism="auto", elementwise=True)

    def describe(self) -> str:
        how = (
            "{% generation %} tags"
            if self.resolved_span_source == "generation_tags"
            else ("prefix diffing")
        )
        chosen = "auto -> " if self.span_source == "auto" else ""
        return f"spans: {chosen}{how}; loss_scope={self.loss_scope}"

    def config(self) -> Mapping[str, Any]:
        spec = self.tokenizer_spec
        return {
            "tokenizer": os.fspath(spec)
            if isinstance(spec, str | os.PathLike)
            else type(spec).__name__,
            "field": self.field,
            "chat_template": self.template,
            "loss_scope": self.loss_scope,
            "span_source": self.resolved_span_source,
            "tools_field": self.tools_field,
            "max_length": self.max_length,
            "chat_template_kwargs": self.chat_template_kwargs,
            "output_field": self.output_field,
            "mask_field": self.mask_field,
            "apply_chat_template": self.apply_chat_template,
            "eos_token": self.eos_token,
            "enable_thinking_field": self.enable_thinking_field,
            **(
                {}  # see config_when_set
                if self.image_grids is None
                else {
                    "image_grids": self.image_grids,
                    "image_token": self.image_token,
                    "merge_size": self.merge_size,
                }
            ),
            **(
                {}
                if self.video_grids is None
                else {
                    "video_grids": self.video_grids,
                    "video_token": self.video_token,
                    "merge_size": self.merge_size,
                }
            ),
        }

    def _load(self) -> Any:
        encoder = load_tokenizer(self.tokenizer_spec)
        if not hasattr(encoder, "encode_masked"):
            raise ConfigError(
                f"tokenize_chat: tokenizer {type(encoder).__name__} gives no character offsets; "
                "pass 'bytes', a tokenizer.json, a transformers directory or a fast tokenizer"
            )
        self._media = [
            (grids, image_token_id(encoder, token))
            for grids, token in (
                (self.image_grids, self.image_token),
                (self.video_grids, self.video_token),
            )
            if grids is not None
        ]
        self._encoder = encoder
        return encoder

    def _renderer(self) -> ChatRenderer:
        return ChatRenderer(
            compile_template(self.template),
            self.variables,
            self.resolved_span_source,
            self.loss_scope,
            self.name,
        )

    def _thinking(self, renderer: ChatRenderer, payload: Any, sample: Any) -> ChatRenderer:
        """The renderer for a record whose ``enable_thinking_field`` is set."""
        name = self.enable_thinking_field
        if not name or not isinstance(payload, Mapping) or payload.get(name) is None:
            return renderer
        value = payload[name]
        if not isinstance(value, bool):
            raise ChatFormatError(
                f"{self.name}: record {sample} field {name!r} is {json_type(value)}, expected "
                "true or false (or null for the template's default)"
            )
        return replace(renderer, variables={**renderer.variables, "enable_thinking": value})

    def _rendered(self, elems: list[StreamItem]) -> tuple[list[str], list[list[Span]]]:
        """``apply_chat_template=False``: the field's text, supervised throughout."""
        texts: list[str] = []
        for elem in elems:
            payload = elem.payload
            text = payload.get(self.field) if isinstance(payload, Mapping) else None
            if not isinstance(text, str):
                raise MissingFieldError(
                    f"{self.name}: record {elem.meta.sample_id} field {self.field!r} is "
                    f"{json_type(text)}, expected the rendered conversation as a string "
                    "(apply_chat_template=False)",
                    sample_id=elem.meta.sample_id,
                )
            texts.append(text)
        return texts, [[(0, len(t))] if t else [] for t in texts]

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        encoder = self._encoder or self._load()
        if not self.apply_chat_template:
            texts, spans = self._rendered(elems)
            encoded = encoder.encode_masked(texts, spans, [None] * len(texts))
            return self._assemble(elems, encoded, spans)
        base = self._renderer()
        field, tools_field = self.field, self.tools_field
        texts = []
        spans = []
        for elem in elems:
            payload = elem.payload
            sample = elem.meta.sample_id
            messages = normalise(
                conversation(payload, field, self.name, sample), field, self.name, sample
            )
            tools = (
                payload.get(tools_field) if tools_field and isinstance(payload, Mapping) else None
            )
            renderer = self._thinking(base, payload, sample)
            try:
                text, kept = renderer(messages, tools, sample, field)
            except ChatFormatError:
                raise
            except Exception as exc:  # a template's raise_exception or a type error inside it
                raise ChatFormatError(
                    f"{self.name}: record {sample} {field!r}: the chat template failed: {exc}; "
                    "check the messages against what the template expects"
                ) from exc
            texts.append(text)
            spans.append(kept)
        encoded = encoder.encode_masked(texts, spans, prefix_links(elems, texts))
        return self._assemble(elems, encoded, spans)

    def _assemble(
        self,
        elems: list[StreamItem],
        encoded: list[tuple[np.ndarray, np.ndarray]],
        spans: list[list[tuple[int, int]]],
    ) -> list[StreamItem]:
        limit = self.max_length
        drop = {self.field, self.tools_field}
        out: list[StreamItem] = []
        for elem, (ids, mask), kept in zip(elems, encoded, spans, strict=True):
            for field, token in self._media:
                ids, mask = self._with_media(elem, ids, mask, field, token)
            cut = 0
            if limit is not None and ids.shape[0] > limit:
                cut = ids.shape[0] - limit
                if any((ids[limit:] == token).any() for _, token in self._media):
                    reason = f"{self.name}: max_length cuts an image or a video"
                    out.append(SampleRecord(tombstone_meta(elem.meta, reason=reason), None))
                    continue
                ids, mask = ids[:limit], mask[:limit]
            if not mask.any():
                reason = NO_SUPERVISED + (" (none in scope)" if not kept else " (truncated away)")
                out.append(SampleRecord(tombstone_meta(elem.meta, reason=reason), None))
                continue
            payload = {k: v for k, v in elem.payload.items() if k not in drop}
            payload[self.output_field] = ids
            payload[self.mask_field] = mask
            out.append(SampleRecord(elem.meta, payload))
            if cut:
                reason = f"{self.name}: truncated to max_length"
                out.append(cut_note(elem, reason=reason, tokens=cut))
        return out

    def _with_media(
        self, elem: StreamItem, ids: np.ndarray, mask: np.ndarray, field: str, token: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each placeholder ``token`` of ``ids`` as its image's (video's) vision tokens."""
        sample = elem.meta.sample_id
        counts = image_token_counts(elem.payload, field, self.merge_size, sample, self.name)
        where = f"{self.name}: record {sample} field {field!r}"
        media = "video" if field == self.video_grids else "image"
        return expand_images(ids, mask, token, counts, where, media)

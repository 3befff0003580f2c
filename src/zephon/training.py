"""Turn a :class:`~zephon.types.SampleBatch` into model inputs: ``batch.to_training(...)``.

Works on flat packed records (``pack_flat``: equal-length rows with ``positions`` and
``document_ids``), on plain tokenized records (right-padded to the longest row with
``pad_token_id``) and on the pre-tokenized sample views' records (``token_packs``,
``token_chunks``): a record of ``(B, S)`` arrays (``rows_per_item=B``) is ``B`` rows,
``position_ids`` restart at every document and ``num_tokens`` counts each row's real tokens.
Everything is built with vectorised numpy over the whole ``[B, S]`` batch: a record costs one
copy of its block, never a step per row.

Returned keys (numpy arrays, or torch tensors with ``return_tensors="pt"``):

Two conventions (``convention=``):

* ``"shifted"`` (default; Megatron and torchtitan style) returns the keys below.
* ``"hf"`` returns what Hugging Face causal LMs expect, which shift the labels themselves:
  ``input_ids``, unshifted int64 ``labels`` (``ignore_index`` on padding, on loss-masked tokens
  and on the first token of every document and row, so that after the model's own shift no
  target crosses a document boundary), ``position_ids`` restarting at each document, and the
  flash-attention varlen keys of ``transformers.DataCollatorWithFlattening``
  (``cu_seq_lens_q``/``cu_seq_lens_k`` int32 over the flattened ``B*S`` tokens,
  ``max_length_q``/``max_length_k``). There is no ``attention_mask``: with none, and no KV cache,
  transformers derives a block-diagonal causal mask from ``position_ids``, so packed documents
  do not attend to each other under every attention implementation. ``use_cache=False`` is part
  of the inputs because a model that builds a cache (its config's default) skips that mask.

Keys of ``"shifted"``:

* ``input_ids`` ``[B, S]`` and ``labels`` ``[B, S]``. With ``shift_labels=True`` (default)
  ``labels[:, t]`` is the token at ``t + 1``: the label of the last column, of padding, of the
  last token of each document (its successor belongs to another document) and of tokens whose
  target has ``loss_mask == 0`` is ``ignore_index``. With ``shift_labels=False`` labels are the
  inputs with the same masking expressed for models that shift internally: the first token of
  each document and row is ``ignore_index`` (it is no document's target).
* ``positions`` ``[B, S]``: restart at 0 per document (``position_mode="document"``) or run
  0..S-1 (``"sequence"``).
* ``loss_mask`` ``[B, S]`` float32: 1 where the label counts.
* ``padding_mask`` ``[B, S]`` bool (True on padding) and ``attention_mask`` (1 on real tokens).
* ``document_ids`` ``[B, S]`` (-1 on padding), ``cu_seqlens`` (int32, boundaries of every
  document and padding run over the flattened ``B*S`` tokens, for varlen attention kernels),
  ``max_seqlen`` and ``num_valid_tokens``.
* any ``extra_fields`` that are aligned per token, stacked.

With ``image_fields`` (the decoded image fields of ``decode_image``), both conventions add
``pixel_values`` (float32, every image of the batch in row order, as flattened 14-pixel patches
rescaled and normalised as Qwen2-VL's image processor does) and ``image_grid_thw`` (int64, one
``(1, h, w)`` patch grid per image): the image keys of Qwen2-VL's forward. ``video_fields``
(``decode_video``'s) adds ``pixel_values_videos`` and ``video_grid_thw`` the same way, each
patch the same square of two consecutive frames.

Rows of ``pack_sequences(image_grids=...)`` (``packed_samples`` with ``cu_seqlens`` and an image
map) become token rows laid out as the packer planned them: each sample's images as runs of
``image_token_id`` (never a target), then its text; ``pad_token_id`` pads them to the longest.
Their videos (``pack_sequences(video_grids=...)``) follow each sample's images as runs of
``video_token_id``. They add ``mm_token_type_ids`` (1 on image, 2 on video tokens) and the
3-D mRoPE positions, restarting at every sample: with ``"hf"``, ``position_ids`` of shape
``[4, B, S]`` (the per-document text positions that mark the packed documents, then temporal,
height and width), as Qwen2-VL's forward takes packed rows; with ``"shifted"``,
``mrope_positions`` ``[3, B, S]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from zephon._packed_images import (
    FLAT_LOSS_MASK,
    FLAT_TOKENS,
    PackedImageRows,
    is_packed_image_row,
    packed_image_rows,
)
from zephon._pixel_values import pixel_values
from zephon.errors import ConfigError, MissingFieldError
from zephon.types import TAG_PACKING, TOKEN_FIELDS

if TYPE_CHECKING:
    from zephon.types import SampleBatch, SampleRecord

__all__ = ["CONVENTIONS", "TOKEN_FIELDS", "TrainingOptions", "to_training", "training_arrays"]

CONVENTIONS = ("shifted", "hf")
#: Per-token position fields a record may carry: ``pack_flat``'s, then the token views'.
POSITION_FIELDS = ("positions", "position_ids")
#: Real tokens per row (the rest is padding), as ``token_packs`` gives them.
NUM_TOKENS = "num_tokens"


def _tokens_field(payload: Any, tokens_field: str) -> str:
    if tokens_field != "auto":
        return tokens_field
    if isinstance(payload, Mapping):
        for name in TOKEN_FIELDS:
            if name in payload:
                return name
        if "packed_samples" in payload:
            raise ConfigError(
                "to_training cannot consume pack_sequences envelopes ({'packed_samples': "
                "[...]}); use pack_flat(...) to get flat, padded rows"
            )
    raise MissingFieldError(
        f"to_training: no token field among {list(TOKEN_FIELDS)} in the payload; pass "
        "tokens_field=..."
    )


def _padding_length(record: Any) -> int:
    packing = record.meta.tags.get(TAG_PACKING) if record.meta.tags else None
    if packing is None:
        return 0
    return int(packing.get("padding_length", 0))


def _blocks(records: Sequence[SampleRecord], field: str) -> list[np.ndarray]:
    """``field`` of every record as a 2-D block: a ``(S,)`` row is a block of one row, a
    ``(B, S)`` item (the token views' ``rows_per_item``) a block of ``B`` rows."""
    out = []
    for r in records:
        a = np.asarray(r.payload[field])
        out.append(a if a.ndim == 2 else a.reshape(1, -1))
    return out


def _stack(blocks: Sequence[np.ndarray], width: int, fill: Any, dtype: Any) -> np.ndarray:
    """The blocks' rows one under the other, right-padded with ``fill`` to ``width``: one
    concatenation when they are all ``width`` wide, else one copy per block."""
    if all(b.shape[1] == width for b in blocks):
        return np.concatenate(blocks, dtype=dtype, casting="unsafe")
    out = np.full((sum(len(b) for b in blocks), width), fill, dtype=dtype)
    at = 0
    for b in blocks:
        out[at : at + len(b), : b.shape[1]] = b
        at += len(b)
    return out


@dataclass(frozen=True)
class TrainingOptions:
    """The keyword arguments of :func:`to_training`, checked once (see its docstring)."""

    tokens_field: str = "auto"
    pad_token_id: int | None = None
    ignore_index: int = -100
    shift_labels: bool = True
    loss_mask_field: str | None = "loss_mask"
    position_mode: Literal["document", "sequence"] = "document"
    mask_document_boundaries: bool = True
    extra_fields: Sequence[str] = ()
    dtype: Any = np.int64
    return_tensors: Literal["np", "pt"] = "np"
    convention: Literal["shifted", "hf"] = "shifted"
    image_fields: Sequence[str] = ()
    image_token_id: int | None = None
    image_grids: str = "image_grid_thw"
    merge_size: int = 2
    video_fields: Sequence[str] = ()
    video_token_id: int | None = None
    video_grids: str = "video_grid_thw"

    def __post_init__(self) -> None:
        if self.convention not in CONVENTIONS:
            raise ConfigError(
                f"to_training: convention must be 'shifted' or 'hf', got {self.convention!r}"
            )
        if self.position_mode not in ("document", "sequence"):
            raise ConfigError(
                "to_training: position_mode must be 'document' or 'sequence', got "
                f"{self.position_mode!r}"
            )


@dataclass(frozen=True)
class _Rows:
    """The batch's token rows right-padded to ``[B, S]``, and where the padding is."""

    records: Sequence[SampleRecord]
    input_ids: np.ndarray
    padding_mask: np.ndarray
    real: np.ndarray  # real tokens per row; the rest of the row is padding

    @property
    def width(self) -> int:
        return int(self.input_ids.shape[1])

    def stacked(self, field: str, fill: Any, dtype: Any) -> np.ndarray:
        """``field`` of every payload, right-padded with ``fill``."""
        return _stack(_blocks(self.records, field), self.width, fill, dtype)


def _real_tokens(records: Sequence[SampleRecord], blocks: Sequence[np.ndarray]) -> np.ndarray:
    """Real tokens per row: the token views' ``num_tokens``, else the row less the padding
    its packing metadata names."""
    if NUM_TOKENS in records[0].payload:
        counts = [np.asarray(r.payload[NUM_TOKENS]).reshape(-1) for r in records]
        return np.concatenate(counts).astype(np.int64)
    per_block = [b.shape[1] - _padding_length(r) for r, b in zip(records, blocks, strict=True)]
    return np.repeat(np.array(per_block, dtype=np.int64), [len(b) for b in blocks])


def _rows(records: Sequence[SampleRecord], opts: TrainingOptions) -> _Rows:
    name = _tokens_field(records[0].payload, opts.tokens_field)
    blocks = _blocks(records, name)
    width = max(b.shape[1] for b in blocks)
    if opts.pad_token_id is None and any(b.shape[1] != width for b in blocks):
        raise ConfigError(
            "to_training: rows have different lengths (not packed with pack_flat); pass "
            "pad_token_id=... to right-pad them"
        )
    real = _real_tokens(records, blocks)
    fill = 0 if opts.pad_token_id is None else opts.pad_token_id
    input_ids = _stack(blocks, width, fill, opts.dtype)
    padding_mask = np.arange(width)[None, :] >= real[:, None]
    return _Rows(records, input_ids, padding_mask, real)


def _document_ids(rows: _Rows, positions: np.ndarray) -> np.ndarray:
    """The records' ``document_ids``; else a new document at every position reset when the
    records give positions (the token views' ``position_ids``); else one per row."""
    payload = rows.records[0].payload
    if "document_ids" in payload:
        doc_ids = rows.stacked("document_ids", -1, np.int32)
    elif any(name in payload for name in POSITION_FIELDS):
        starts = positions == 0
        starts[:, 0] = True
        doc_ids = (np.cumsum(starts, axis=1, dtype=np.int32) - 1).astype(np.int32)
    else:
        return np.where(rows.padding_mask, -1, 0).astype(np.int32)
    doc_ids[rows.padding_mask] = -1
    return doc_ids


def _positions(rows: _Rows) -> np.ndarray:
    """Positions as the records give them (padding restarts at 0 as its own segment)."""
    for name in POSITION_FIELDS:
        if name in rows.records[0].payload:
            return rows.stacked(name, 0, np.int64)
    cols = np.arange(rows.width)
    positions = np.broadcast_to(cols, rows.input_ids.shape).copy()
    return np.where(rows.padding_mask, cols[None, :] - rows.real[:, None], positions)


def _labels(
    rows: _Rows, doc_ids: np.ndarray, opts: TrainingOptions
) -> tuple[np.ndarray, np.ndarray]:
    """``(labels, loss_mask)``: shifted (or not) targets, ``ignore_index`` where masked."""
    input_ids, padding_mask = rows.input_ids, rows.padding_mask
    valid = ~padding_mask
    field = opts.loss_mask_field
    if field and field in rows.records[0].payload:
        valid &= rows.stacked(field, 0, np.float32) != 0
    if not opts.shift_labels or opts.convention == "hf":
        valid[:, 0] = False  # a row's first token is nobody's target once the model shifts
        if opts.mask_document_boundaries:
            valid[:, 1:] &= doc_ids[:, 1:] == doc_ids[:, :-1]
        labels = np.where(valid, input_ids, opts.ignore_index).astype(input_ids.dtype)
        return labels, valid
    labels = np.full_like(input_ids, opts.ignore_index)
    labels[:, :-1] = input_ids[:, 1:]
    target_ok = np.zeros_like(valid)
    target_ok[:, :-1] = valid[:, 1:] & ~padding_mask[:, :-1]
    if opts.mask_document_boundaries:
        target_ok[:, :-1] &= doc_ids[:, 1:] == doc_ids[:, :-1]
    labels[~target_ok] = opts.ignore_index
    return labels, target_ok


def _segments(positions: np.ndarray) -> tuple[np.ndarray, int]:
    """``(cu_seqlens, max_seqlen)``: every position reset (documents and the padding run)
    starts a segment, over the flattened ``B*S`` tokens."""
    starts = positions == 0
    starts[:, 0] = True
    flat_starts = np.flatnonzero(starts.reshape(-1))
    cu_seqlens = np.append(flat_starts, starts.size).astype(np.int32)
    max_seqlen = int(np.diff(cu_seqlens).max()) if cu_seqlens.size > 1 else 0
    return cu_seqlens, max_seqlen


def to_training(batch: SampleBatch, **options: Any) -> dict[str, Any]:
    """Model inputs for ``batch``; see the module docstring for the keys and
    :class:`TrainingOptions` for the keyword arguments."""
    return training_arrays(batch, TrainingOptions(**options))


def training_arrays(batch: SampleBatch, opts: TrainingOptions) -> dict[str, Any]:
    """:func:`to_training` with its options as one value."""
    records = batch.records
    if not records:
        raise ConfigError("to_training: the batch is empty")
    packed = None
    if is_packed_image_row(records[0].payload):
        packed = _packed_images(records, opts)
        records = packed.records
        opts = replace(opts, tokens_field=FLAT_TOKENS, loss_mask_field=FLAT_LOSS_MASK)
    rows = _rows(records, opts)
    positions = _positions(rows)
    doc_ids = _document_ids(rows, positions)
    if opts.position_mode == "sequence":
        positions_out = np.broadcast_to(np.arange(rows.width), positions.shape).astype(np.int64)
    else:
        positions_out = positions.astype(np.int64)
    labels, loss_mask = _labels(rows, doc_ids, opts)
    cu_seqlens, max_seqlen = _segments(positions)
    if opts.convention == "hf":
        out = _hf_arrays(rows.input_ids, labels, positions_out, cu_seqlens, max_seqlen)
        _add_extra_fields(out, rows, opts)
        _add_images(out, rows, opts, packed, positions_out)
        return _convert(out, opts)
    out = {
        "input_ids": rows.input_ids,
        "labels": labels,
        "positions": positions_out,
        "loss_mask": loss_mask.astype(np.float32),
        "padding_mask": rows.padding_mask,
        "attention_mask": (~rows.padding_mask).astype(np.int64),
        "document_ids": doc_ids,
        "cu_seqlens": cu_seqlens,
        "max_seqlen": max_seqlen,
        "num_valid_tokens": int(loss_mask.sum()),
    }
    _add_extra_fields(out, rows, opts)
    _add_images(out, rows, opts, packed, positions_out)
    return _convert(out, opts)


def _packed_images(records: Sequence[SampleRecord], opts: TrainingOptions) -> PackedImageRows:
    """The flat token rows of packed image rows (``pack_sequences(image_grids=...)``)."""
    return packed_image_rows(
        records,
        token_name=lambda sample: _tokens_field(sample, opts.tokens_field),
        image_token_id=opts.image_token_id,
        pad_token_id=opts.pad_token_id,
        grid_field=opts.image_grids,
        loss_field=opts.loss_mask_field,
        merge_size=opts.merge_size,
        video_token_id=opts.video_token_id,
        video_grid_field=opts.video_grids,
    )


def _add_images(
    out: dict[str, Any],
    rows: _Rows,
    opts: TrainingOptions,
    packed: PackedImageRows | None,
    positions: np.ndarray,
) -> None:
    """``pixel_values`` and ``image_grid_thw`` of the rows' ``image_fields``, when asked; for
    packed image rows also their mRoPE positions and ``mm_token_type_ids``."""
    fields = (opts.image_fields,) if isinstance(opts.image_fields, str) else opts.image_fields
    videos = (opts.video_fields,) if isinstance(opts.video_fields, str) else opts.video_fields
    if packed is not None:
        packed.add_to(out, positions, opts.convention, fields, videos)
        return
    payloads = [r.payload for r in rows.records]
    if fields:
        out.update(pixel_values(payloads, fields))
    if videos:
        out.update(pixel_values(payloads, videos, video=True))


def _hf_arrays(
    input_ids: np.ndarray,
    labels: np.ndarray,
    positions: np.ndarray,
    cu_seqlens: np.ndarray,
    max_seqlen: int,
) -> dict[str, Any]:
    """The keys of ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``, per row."""
    return {
        "input_ids": input_ids.astype(np.int64, copy=False),
        "labels": labels.astype(np.int64, copy=False),
        "position_ids": positions,
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
        "use_cache": False,
    }


def _add_extra_fields(out: dict[str, Any], rows: _Rows, opts: TrainingOptions) -> None:
    payload0 = rows.records[0].payload
    for field in opts.extra_fields:
        if field not in payload0:
            raise MissingFieldError(f"to_training: extra field {field!r} is not in the payload")
        out[field] = rows.stacked(field, 0, np.asarray(payload0[field]).dtype)


def _convert(out: dict[str, Any], opts: TrainingOptions) -> dict[str, Any]:
    if opts.return_tensors == "pt":
        return _to_torch(out)
    if opts.return_tensors != "np":
        raise ConfigError(
            f"to_training: return_tensors must be 'np' or 'pt', got {opts.return_tensors!r}"
        )
    return out


def _to_torch(arrays: dict[str, Any]) -> dict[str, Any]:
    from zephon._optional import require

    torch = require("torch", "to_training(return_tensors='pt') (or use return_tensors='np')")
    return {
        k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
        for k, v in arrays.items()
    }

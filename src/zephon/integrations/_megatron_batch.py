"""A zephon batch of ``pack_flat`` rows as the dict Megatron-LM's ``get_batch`` reads.

Megatron reads ``loss_mask`` rather than an ignore index, so masked labels are 0 (a valid token
id: vocabulary-parallel cross-entropy never indexes outside the vocabulary).
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from zephon.errors import ConfigError

if TYPE_CHECKING:
    from zephon.types import SampleBatch


def thd_pad_multiple(
    *, tensor_parallel: int = 1, context_parallel: int = 1, sequence_parallel: bool = False
) -> int:
    """The multiple every packed sequence's padded length must be: context parallelism splits
    each sequence into ``2 x CP`` chunks, sequence parallelism each chunk over the TP ranks."""
    for name, size in (
        ("tensor_parallel", tensor_parallel),
        ("context_parallel", context_parallel),
    ):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"thd_pad_multiple: {name} must be an integer >= 1, got {size!r}")
    multiple = 2 * context_parallel if context_parallel > 1 else 1
    return multiple * (tensor_parallel if sequence_parallel else 1)


def _shifted(batch: SampleBatch) -> dict[str, Any]:
    out = batch.to_training(convention="shifted")
    labels = np.where(out["loss_mask"] > 0, out["labels"], 0).astype(np.int64)
    return {**out, "labels": labels, "input_ids": out["input_ids"].astype(np.int64)}


def bshd_batch(batch: SampleBatch) -> dict[str, Any]:
    """``[B, S]`` rows with a ``[B, 1, S, S]`` attention mask, True where a token may not look
    (a later token or another document: Megatron's ``reset_attention_mask`` convention)."""
    import torch

    out = _shifted(batch)
    docs = out["document_ids"]
    width = docs.shape[1]
    causal = np.tril(np.ones((width, width), dtype=bool))
    same_doc = docs[:, :, None] == docs[:, None, :]
    allowed = causal[None] & same_doc
    return {
        "tokens": torch.from_numpy(out["input_ids"]),
        "labels": torch.from_numpy(out["labels"]),
        "loss_mask": torch.from_numpy(out["loss_mask"].astype(np.float32)),
        "attention_mask": torch.from_numpy(~allowed[:, None]),
        "position_ids": torch.from_numpy(out["positions"].astype(np.int64)),
    }


def _segments(document_ids: np.ndarray) -> list[tuple[int, int, int]]:
    """(row, start, end) of every document in the rows; padding (-1) is left out."""
    found = []
    for row, docs in enumerate(document_ids):
        edges = np.flatnonzero(np.diff(docs)) + 1
        bounds = np.concatenate(([0], edges, [docs.size]))
        found += [(row, int(a), int(b)) for a, b in pairwise(bounds) if docs[a] >= 0]
    return found


def thd_batch(
    batch: SampleBatch, *, pad_multiple: int = 1, pad_token_id: int = 0
) -> dict[str, Any]:
    """All documents of the batch's rows as one packed ``[1, T]`` sequence: each document padded
    to a multiple of ``pad_multiple`` (:func:`thd_pad_multiple`), ``cu_seqlens`` over the real
    lengths and ``cu_seqlens_padded`` over the padded ones (``[1, N + 1]`` int32, as Megatron's
    batch keeps them), ``max_seqlen`` the longest padded document; no attention mask."""
    import torch

    out = _shifted(batch)
    keys = ("input_ids", "labels", "loss_mask", "positions")
    parts: dict[str, list[np.ndarray]] = {key: [] for key in keys}
    lengths, padded = [], []
    for row, start, end in _segments(out["document_ids"]):
        length = end - start
        width = -(-length // pad_multiple) * pad_multiple
        fill = {"input_ids": pad_token_id, "labels": 0, "loss_mask": 0.0}
        for key in ("input_ids", "labels", "loss_mask"):
            piece = np.full(width, fill[key], dtype=out[key].dtype)
            piece[:length] = out[key][row, start:end]
            parts[key].append(piece)
        parts["positions"].append(np.arange(width, dtype=np.int64))
        lengths.append(length)
        padded.append(width)
    if not lengths:
        raise ConfigError("thd_batch: the batch holds no document (only padding); check the data")
    flat = {key: np.concatenate(parts[key])[None] for key in keys}
    return {
        "tokens": torch.from_numpy(flat["input_ids"]),
        "labels": torch.from_numpy(flat["labels"]),
        "loss_mask": torch.from_numpy(flat["loss_mask"].astype(np.float32)),
        "attention_mask": None,
        "position_ids": torch.from_numpy(flat["positions"]),
        "cu_seqlens": torch.from_numpy(np.cumsum([0, *lengths], dtype=np.int32)[None]),
        "cu_seqlens_padded": torch.from_numpy(np.cumsum([0, *padded], dtype=np.int32)[None]),
        "max_seqlen": torch.tensor([max(padded)], dtype=torch.int32),
    }

"""A zephon batch of ``pack_flat`` rows as the ``(inputs, labels)`` pair torchtitan trains on.

torchtitan's text loaders yield ``({"input": tokens, "positions": positions}, labels)``: labels
already shifted, ``IGNORE_INDEX`` (-100) where no target counts, positions restarting at every
document so that its block-causal masks keep packed documents apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from zephon.errors import ConfigError

if TYPE_CHECKING:
    from zephon.types import SampleBatch

IGNORE_INDEX = -100  # torchtitan.components.loss.IGNORE_INDEX


def _check_rows(out: dict[str, Any], seq_len: int | None, rows: int | None) -> None:
    got_rows, width = out["input_ids"].shape
    if seq_len is not None and width != seq_len:
        raise ConfigError(
            f"the pipeline's rows are {width} tokens but training.seq_len is {seq_len}; end the "
            f"pipeline in .pack_flat({seq_len}) or set --training.seq_len {width}"
        )
    if rows is not None and got_rows != rows:
        raise ConfigError(
            f"the pipeline's batch holds {got_rows} rows but training.local_batch_size is "
            f"{rows}; end the pipeline in .batch({rows})"
        )


def _flat(out: dict[str, Any], tokens: int, pad_token_id: int) -> dict[str, Any]:
    """The batch's rows end to end as one ``[1, tokens]`` row, padded at its end."""
    used = out["input_ids"].size
    if used > tokens:
        raise ConfigError(
            f"the pipeline's batch holds {used} tokens but num_tokens_per_batch is {tokens}; "
            f"batch fewer rows (.batch({max(1, tokens // out['input_ids'].shape[1])})) or raise "
            "num_tokens_per_batch"
        )
    pad = tokens - used
    fill = {"input_ids": pad_token_id, "labels": IGNORE_INDEX}
    flat = {
        key: np.concatenate((out[key].reshape(-1), np.full(pad, fill[key], dtype=np.int64)))
        for key in fill
    }
    flat["positions"] = np.concatenate((out["positions"].reshape(-1), np.arange(pad)))
    return {key: value[None] for key, value in flat.items()}


def titan_batch(
    batch: SampleBatch,
    *,
    seq_len: int | None = None,
    local_batch_size: int | None = None,
    num_tokens_per_batch: int | None = None,
    pad_token_id: int = 0,
) -> tuple[dict[str, Any], Any]:
    """``({"input", "positions"}, labels)`` int64 tensors: ``[rows, seq_len]`` as torchtitan
    0.3's loaders batch them, or with ``num_tokens_per_batch`` one flat ``[1, N]`` row (the
    batch's rows end to end, padded) as its token-budget loaders do. Rows of another width or
    count than the trainer's are refused, naming the setting to change."""
    import torch

    out = batch.to_training(convention="shifted", ignore_index=IGNORE_INDEX)
    _check_rows(out, seq_len, None if num_tokens_per_batch else local_batch_size)
    arrays = {key: out[key].astype(np.int64) for key in ("input_ids", "labels", "positions")}
    if num_tokens_per_batch is not None:
        arrays = _flat(arrays, num_tokens_per_batch, pad_token_id)
    inputs = {
        "input": torch.from_numpy(arrays["input_ids"]),
        "positions": torch.from_numpy(arrays["positions"]),
    }
    return inputs, torch.from_numpy(arrays["labels"])

"""Hugging Face ``datasets``: folders written by ``save_to_disk`` and in-memory objects.

A ``save_to_disk`` folder holds Arrow stream files listed in ``state.json``; each becomes one
memory-mapped :class:`~zephon.io._arrow.ArrowShard`, read with pyarrow alone (``datasets`` is
not imported, nothing touches the network). :func:`from_hf` takes a ``datasets.Dataset``: when
it is exactly its Arrow cache files (no index mapping, nothing held only in memory) the same
file shards are used, so workers map the files instead of receiving a pickled copy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from zephon.errors import ConfigError, DataError, DataFormatError
from zephon.io._arrow import ArrowShard, ArrowTableShard
from zephon.io._dataset import Shard

STATE = "state.json"
INFO = "dataset_info.json"
DICT = "dataset_dict.json"


def is_hf_folder(folder: str) -> bool:
    """A ``save_to_disk`` folder of one Dataset, or of a DatasetDict (refused later)."""
    names = {n for n in (STATE, INFO, DICT) if os.path.isfile(os.path.join(folder, n))}
    return {STATE, INFO} <= names or DICT in names


def hf_data_files(folder: str) -> list[str]:
    """The Arrow files of a ``save_to_disk`` folder, in row order."""
    splits = os.path.join(folder, DICT)
    if os.path.isfile(splits) and not os.path.isfile(os.path.join(folder, STATE)):
        with open(splits) as f:
            names = json.load(f).get("splits", [])
        raise DataError(
            f"{folder} is a Hugging Face DatasetDict with splits {names}; pass one split's "
            f"folder, e.g. {os.path.join(folder, names[0] if names else 'train')}"
        )
    state_path = os.path.join(folder, STATE)
    try:
        with open(state_path) as f:
            state = json.load(f)
        files = [os.path.join(folder, f["filename"]) for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataFormatError(
            f"{state_path} is not a valid `save_to_disk` state file ({e}); save the dataset "
            "again with datasets.Dataset.save_to_disk"
        ) from e
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise DataFormatError(
            f"{folder}: state.json lists {missing[0]}, which does not exist; the folder is "
            "incomplete, save the dataset again"
        )
    return files


def from_hf(
    data: Any, location: str, *, columns: Sequence[str] | None, shard_size: int | None
) -> list[Shard]:
    """Shards for a ``datasets.Dataset`` (its files when it is exactly them, else its table)."""
    if not hasattr(data, "cache_files") or not hasattr(data, "with_format"):
        raise ConfigError(
            f"Dataset.from_hf takes a datasets.Dataset, got {type(data).__name__}; for a "
            "DatasetDict pass one split, e.g. ds['train']"
        )
    files = [f["filename"] for f in data.cache_files]
    if files and getattr(data, "_indices", None) is None:
        whole = [ArrowShard(f) for f in files]
        same_rows = sum(len(s) for s in whole) == len(data)
        if same_rows and all(s.table().column_names == data.column_names for s in whole):
            return [ArrowShard(f, columns=columns) for f in files]
    table = data.with_format("arrow")[0 : len(data)]
    step = shard_size or max(1, len(data))
    if step < 1:
        raise ConfigError(f"shard_size must be >= 1, got {shard_size}")
    return [
        ArrowTableShard(table.slice(i, step), f"{location}#{i // step}", columns)
        for i in range(0, max(1, len(data)), step)
    ]

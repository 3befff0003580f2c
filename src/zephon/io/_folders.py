"""Self-describing dataset folders: Hugging Face ``save_to_disk``, Lance, MDS, LitData.

Each of these formats lists its own shards (``state.json``, Lance's manifest, MDS's and
LitData's ``index.json``), so discovery asks the format instead of listing files, and
``zephon index`` is neither needed nor allowed (it would clobber their own ``index.json``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from zephon.errors import DataFormatError
from zephon.io._arrow import ArrowShard
from zephon.io._dataset import Shard
from zephon.io._formats import ReadOptions
from zephon.io._hf import hf_data_files, is_hf_folder
from zephon.io._lance import is_lance, lance_shards
from zephon.io._litdata import is_litdata_index, litdata_shards
from zephon.io._mds import is_mds_index, mds_shards
from zephon.io._paths import get_fs, split_protocol

#: Entry -> its own index (or None), while :func:`one_probe` is active.
_PROBED: ContextVar[dict[str, Any] | None] = ContextVar("zephon_folder_probe", default=None)


@contextmanager
def one_probe() -> Iterator[None]:
    """Within it, a folder's ``index.json`` is read once, however many formats probe it (the
    MDS and LitData probes read the same file)."""
    token = _PROBED.set({})
    try:
        yield
    finally:
        _PROBED.reset(token)


def _own_index(entry: str, storage_options: dict[str, Any] | None) -> Any:
    memo = _PROBED.get()
    if memo is None:
        return _read_own_index(entry, storage_options)
    if entry not in memo:
        memo[entry] = _read_own_index(entry, storage_options)
    return memo[entry]


def _read_own_index(entry: str, storage_options: dict[str, Any] | None) -> Any:
    protocol, path = split_protocol(entry)
    fs = get_fs(protocol, storage_options)
    index_path = path.rstrip("/") + "/index.json"
    try:
        if not fs.isfile(index_path):
            return None
        with fs.open(index_path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return data if is_mds_index(data) or is_litdata_index(data) else None


def _mds_index(entry: str, storage_options: dict[str, Any] | None) -> Any:
    data = _own_index(entry, storage_options)
    return data if data is not None and is_mds_index(data) else None


def is_hf(entry: str, storage_options: dict[str, Any] | None) -> bool:
    protocol, path = split_protocol(entry)
    return protocol == "file" and is_hf_folder(path)


def is_lance_folder(entry: str, storage_options: dict[str, Any] | None) -> bool:
    protocol, path = split_protocol(entry)
    return is_lance(path) if protocol == "file" else path.rstrip("/").endswith(".lance")


def is_mds(entry: str, storage_options: dict[str, Any] | None) -> bool:
    return _mds_index(entry, storage_options) is not None


def is_litdata(entry: str, storage_options: dict[str, Any] | None) -> bool:
    index = _own_index(entry, storage_options)
    return index is not None and is_litdata_index(index)


def hf_folder_shards(entry: str, options: ReadOptions) -> list[Shard]:
    protocol, path = split_protocol(entry)
    if protocol != "file":
        raise DataFormatError(
            f"{entry}: Hugging Face save_to_disk folders are read from local disk; copy it "
            "locally or load it with datasets and use Dataset.from_hf"
        )
    return [ArrowShard(f, columns=options.columns) for f in hf_data_files(path)]


def lance_folder_shards(entry: str, options: ReadOptions) -> list[Shard]:
    protocol, path = split_protocol(entry)
    return lance_shards(
        path if protocol == "file" else entry,
        columns=options.columns,
        storage_options=options.storage_options,
    )


def litdata_folder_shards(entry: str, options: ReadOptions) -> list[Shard]:
    protocol, path = split_protocol(entry)
    index = _own_index(entry, options.storage_options)
    if protocol != "file" or index is None or not is_litdata_index(index):
        raise DataFormatError(
            f"{entry} is not a local LitData folder (index.json with 'chunks' and 'config'); "
            "point at the folder litdata.optimize wrote, copied to local disk"
        )
    return litdata_shards(path, index, options.columns)


def mds_folder_shards(entry: str, options: ReadOptions) -> list[Shard]:
    protocol, path = split_protocol(entry)
    index = _mds_index(entry, options.storage_options)
    if index is None:
        raise DataFormatError(
            f"{entry} has no MDS index.json (version 2 with 'mds' shards); point at the folder "
            "that MDSWriter wrote"
        )
    return mds_shards(
        path if protocol == "file" else entry,
        index,
        columns=options.columns,
        storage_options=options.storage_options,
        cache=options.cache,
        cache_dir=None if options.cache_dir is None else str(options.cache_dir),
        decode_images=options.decode_images,
        allow_pickle=options.allow_pickle,
    )

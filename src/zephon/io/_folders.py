"""Self-describing dataset folders: Hugging Face ``save_to_disk``, Lance, MDS, LitData.

Each of these formats lists its own shards (``state.json``, Lance's manifest, MDS's and
LitData's ``index.json``), so discovery asks the format instead of listing files, and
``zephon index`` is neither needed nor allowed (it would clobber their own ``index.json``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from zephon.errors import DataFormatError
from zephon.io._arrow import ArrowShard
from zephon.io._cache import CacheOptions
from zephon.io._dataset import Shard
from zephon.io._hf import hf_data_files, is_hf_folder
from zephon.io._lance import is_lance, lance_shards
from zephon.io._litdata import is_litdata_index, litdata_shards
from zephon.io._mds import is_mds_index, mds_shards
from zephon.io._paths import get_fs, split_protocol

FOLDER_FORMATS = ("hf", "lance", "mds", "litdata")


def _own_index(entry: str, storage_options: dict[str, Any] | None) -> Any:
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


def folder_format(entry: str, storage_options: dict[str, Any] | None) -> str | None:
    """``"hf"``, ``"lance"``, ``"mds"`` or ``"litdata"`` for such a folder, else ``None``."""
    protocol, path = split_protocol(entry)
    if protocol == "file" and is_hf_folder(path):
        return "hf"
    if is_lance(path) if protocol == "file" else path.rstrip("/").endswith(".lance"):
        return "lance"
    index = _own_index(entry, storage_options)
    if index is not None:
        return "mds" if is_mds_index(index) else "litdata"
    return None


def folder_shards(
    entry: str,
    fmt: str,
    *,
    columns: Sequence[str] | None,
    storage_options: dict[str, Any] | None,
    cache: CacheOptions | None,
    cache_dir: str | None,
    decode_images: bool = False,
    allow_pickle: bool = False,
) -> list[Shard]:
    """The shards of a self-describing folder of format ``fmt`` (the two flags: MDS columns)."""
    protocol, path = split_protocol(entry)
    if fmt == "hf":
        if protocol != "file":
            raise DataFormatError(
                f"{entry}: Hugging Face save_to_disk folders are read from local disk; copy it "
                "locally or load it with datasets and use Dataset.from_hf"
            )
        return [ArrowShard(f, columns=columns) for f in hf_data_files(path)]
    if fmt == "lance":
        return lance_shards(
            path if protocol == "file" else entry, columns=columns, storage_options=storage_options
        )
    if fmt == "litdata":
        index = _own_index(entry, storage_options)
        if protocol != "file" or index is None or not is_litdata_index(index):
            raise DataFormatError(
                f"{entry} is not a local LitData folder (index.json with 'chunks' and 'config'); "
                "point at the folder litdata.optimize wrote, copied to local disk"
            )
        return litdata_shards(path, index, columns)
    index = _mds_index(entry, storage_options)
    if index is None:
        raise DataFormatError(
            f"{entry} has no MDS index.json (version 2 with 'mds' shards); point at the folder "
            "that MDSWriter wrote"
        )
    return mds_shards(
        path if protocol == "file" else entry,
        index,
        columns=columns,
        storage_options=storage_options,
        cache=cache,
        cache_dir=cache_dir,
        decode_images=decode_images,
        allow_pickle=allow_pickle,
    )

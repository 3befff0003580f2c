"""The built-in formats, registered in the order they are documented and detected."""

from __future__ import annotations

from zephon.io._arrow import ARROW_SUFFIXES, ArrowShard
from zephon.io._converted import is_converted
from zephon.io._dataset import Shard
from zephon.io._folders import (
    hf_folder_shards,
    is_hf,
    is_lance_folder,
    is_litdata,
    is_mds,
    lance_folder_shards,
    litdata_folder_shards,
    mds_folder_shards,
)
from zephon.io._formats import FormatSpec, ReadOptions, register_format
from zephon.io._jsonl import COMPRESSIONS, JSONL_SUFFIXES, JsonlShard
from zephon.io._token_files import TokenDocumentShard
from zephon.io._vortex import VORTEX_SUFFIXES, VortexShard
from zephon.io._webdataset import TAR_SUFFIXES, TarShard

__all__ = ["BUILTIN_FORMATS"]


def _jsonl(url: str, rows: int | None, o: ReadOptions) -> Shard:
    return JsonlShard(
        url,
        rows,
        storage_options=o.storage_options,
        cache_dir=o.cache_dir,
        cache=o.cache,
        columns=o.columns,
    )


def _parquet(url: str, rows: int | None, o: ReadOptions) -> Shard:
    from zephon.io._parquet import ParquetShard  # pyarrow.parquet loads on first use

    return ParquetShard(
        url, rows, columns=o.columns, storage_options=o.storage_options, cache=o.cache
    )


def _arrow(url: str, rows: int | None, o: ReadOptions) -> Shard:
    return ArrowShard(
        url, rows, columns=o.columns, storage_options=o.storage_options, cache=o.cache
    )


def _vortex(url: str, rows: int | None, o: ReadOptions) -> Shard:
    return VortexShard(
        url, rows, columns=o.columns, storage_options=o.storage_options, cache=o.cache
    )


def _megatron(url: str, rows: int | None, o: ReadOptions) -> Shard:
    from zephon.io._megatron import MegatronFile

    return TokenDocumentShard(MegatronFile(url, o.storage_options, o.cache), rows)


def _datatrove(url: str, rows: int | None, o: ReadOptions) -> Shard:
    from zephon.io._datatrove import DatatroveFile

    return TokenDocumentShard(DatatroveFile(url, o.storage_options, o.cache), rows)


def _npy(url: str, rows: int | None, o: ReadOptions) -> Shard:
    from zephon.io._npy_tokens import NpyTokenFile

    file = NpyTokenFile(url, o.storage_options, o.cache, o.format_options)
    return TokenDocumentShard(file, rows)


def _webdataset(url: str, rows: int | None, o: ReadOptions) -> Shard:
    return TarShard(
        url,
        rows,
        storage_options=o.storage_options,
        cache_dir=o.cache_dir,
        cache=o.cache,
        columns=o.columns,
    )


def _converted_folder(entry: str, o: ReadOptions) -> list[Shard]:
    from zephon.io._converted import converted_shards

    return converted_shards(entry, o)


def _stars(suffixes: tuple[str, ...]) -> str:
    return ", ".join(f"*{s}" for s in suffixes)


_JSONL_ALL = (*JSONL_SUFFIXES, *(j + c for j in JSONL_SUFFIXES for c in COMPRESSIONS))

BUILTIN_FORMATS = (
    FormatSpec(
        "jsonl",
        "*.jsonl, *.ndjson, *.json (also .gz, .zst, .bz2, .xz)",
        suffixes=_JSONL_ALL,
        open_file=_jsonl,
    ),
    FormatSpec("parquet", "*.parquet, *.pq", suffixes=(".parquet", ".pq"), open_file=_parquet),
    FormatSpec("arrow", _stars(ARROW_SUFFIXES), suffixes=ARROW_SUFFIXES, open_file=_arrow),
    FormatSpec(
        "vortex",
        _stars(VORTEX_SUFFIXES),
        suffixes=VORTEX_SUFFIXES,
        open_file=_vortex,
        extra="vortex",
    ),
    FormatSpec(
        "hf",
        "a Hugging Face save_to_disk folder",
        detect=is_hf,
        open_folder=hf_folder_shards,
    ),
    FormatSpec(
        "lance",
        "a Lance folder",
        detect=is_lance_folder,
        open_folder=lance_folder_shards,
        extra="lance",
    ),
    FormatSpec("mds", "an MDS folder", detect=is_mds, open_folder=mds_folder_shards),
    FormatSpec(
        "litdata",
        "a LitData folder",
        detect=is_litdata,
        open_folder=litdata_folder_shards,
        extra="litdata",
    ),
    FormatSpec(
        "converted",
        "a zephon convert folder (zephon-convert.json)",
        detect=is_converted,
        open_folder=_converted_folder,
    ),
    FormatSpec("megatron", "*.idx (with its .bin)", suffixes=(".idx",), open_file=_megatron),
    FormatSpec("datatrove", "*.ds (with its .ds.index)", suffixes=(".ds",), open_file=_datatrove),
    FormatSpec("npy", "*.npy (token arrays)", suffixes=(".npy",), open_file=_npy),
    FormatSpec(
        "webdataset",
        "*.tar (WebDataset shards)",
        suffixes=TAR_SUFFIXES,
        open_file=_webdataset,
    ),
)

for _spec in BUILTIN_FORMATS:
    register_format(_spec, replace=True)

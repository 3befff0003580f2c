"""Datasets and shard formats: JSONL (plain, .gz, .zst, .bz2, .xz), Parquet, Arrow IPC /
Feather, Vortex, Hugging Face ``save_to_disk`` folders and Hub splits (``hf://``), Lance, MDS,
LitData and pre-tokenized Megatron ``.bin/.idx``, datatrove ``.ds`` and ``.npy`` token arrays
(:func:`token_chunks` and :func:`token_packs` read their samples at memory speed); local, on any
fsspec URL, or through a node cache. Every format is a
:class:`FormatSpec` in one registry; :func:`register_format` adds yours."""

import zephon.io._builtin_formats  # noqa: F401 - registers the built-in formats
from zephon.io._cache import CacheOptions as CacheOptions
from zephon.io._cache import NodeCache
from zephon.io._dataset import Dataset as Dataset
from zephon.io._dataset import InMemoryShard, Row, Shard
from zephon.io._discover import build_index, list_shards
from zephon.io._formats import (
    FormatSpec,
    ReadOptions,
    format_names,
    format_spec,
    formats,
    formats_markdown,
    register_format,
    unregister_format,
)
from zephon.io._jsonl import JsonlShard
from zephon.io._megatron_order import megatron_blend
from zephon.io._paths import cache_root
from zephon.io._remote import abandon_reads, open_requests
from zephon.io._stats import SourceStats, io_totals
from zephon.io._token_samples import token_chunks, token_packs

__all__ = [
    "FormatSpec",
    "InMemoryShard",
    "JsonlShard",
    "NodeCache",
    "ReadOptions",
    "Row",
    "Shard",
    "SourceStats",
    "abandon_reads",
    "build_index",
    "cache_root",
    "format_names",
    "format_spec",
    "formats",
    "formats_markdown",
    "io_totals",
    "list_shards",
    "megatron_blend",
    "open_requests",
    "register_format",
    "token_chunks",
    "token_packs",
    "unregister_format",
]

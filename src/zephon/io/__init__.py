"""Datasets and shard formats: JSONL (plain, .gz, .zst) and Parquet, local or any fsspec URL."""

from zephon.io._dataset import Dataset, InMemoryShard, Row, Shard
from zephon.io._discover import build_index
from zephon.io._jsonl import JsonlShard

__all__ = ["Dataset", "InMemoryShard", "JsonlShard", "Row", "Shard", "build_index"]

"""Datasets and shard formats."""

from zephon.io._dataset import Dataset, InMemoryShard, Row, Shard

__all__ = ["Dataset", "InMemoryShard", "Row", "Shard"]

"""One rank of the shared-cache test: read every row of a remote dataset through the cache."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from zephon.io import CacheOptions, Dataset


def read_everything(url: str, cache_dir: str, queue: Any) -> None:
    ds = Dataset.from_path("docs", url, cache=CacheOptions(dir=cache_dir, max_bytes=1 << 30))
    digest = hashlib.sha256()
    for shard, n in enumerate(ds.counts()):
        digest.update(json.dumps(ds.read(shard, range(n))).encode())
    queue.put((digest.hexdigest(), ds.stats().to_dict()))

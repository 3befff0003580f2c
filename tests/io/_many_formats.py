"""Read a corpus of many shards in every format, as one mixture, on the runners named.

Usage: ``python -m tests.io._many_formats ROOT LIMIT RUNNER...``. ``ROOT/<format>*`` holds
each format's shards (written by the test, outside the limit). The process first lowers its
own ``RLIMIT_NOFILE`` to ``LIMIT`` (soft and hard: nothing it starts, workers and Ray's own
processes included, may raise it back), then runs the pipeline once per runner and prints one
JSON line: per runner, the sha256 of every row in order, the number of rows and of distinct ids.
"""

from __future__ import annotations

import hashlib
import json
import resource
import sys
from pathlib import Path
from typing import Any

from tests.io._formats import FORMATS
from zephon import Dataset, Pipeline, StaticMixtureWorkSource


def build(root: Path, runner: str) -> Pipeline:
    # the writers name each format's folder after it (Lance's with a ".lance" suffix)
    datasets = [Dataset.from_path(fmt, next(root.glob(f"{fmt}*"))) for fmt in FORMATS]
    source = StaticMixtureWorkSource(datasets, {fmt: 1.0 for fmt in FORMATS}, chunk_size=64, seed=3)
    options: dict[str, Any] = {"runner": runner, "canonical_replicas": 2}
    if runner == "ray":
        options["max_inflight"] = 4
    return Pipeline(source).fetch(parallelism=2).batch(32, drop_last=False).options(**options)


def digest(pipe: Pipeline) -> tuple[str, int, int]:
    """(sha256 of every row in order, rows, distinct ids)."""
    h, rows, ids = hashlib.sha256(), 0, set()
    for batch in pipe:
        for record in batch:
            h.update(json.dumps(record.payload, sort_keys=True).encode())
            ids.add(record.payload["id"])
            rows += 1
    return h.hexdigest(), rows, len(ids)


def main() -> None:
    root, limit, runners = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    out: dict[str, Any] = {}
    if "ray" in runners:
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    for runner in runners:
        out[runner] = digest(build(root, runner))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

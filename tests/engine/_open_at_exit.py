"""Leave a pipeline iterator open and exit: ``python -m tests.engine._open_at_exit RUNNER``.

The iterator stays referenced by a module global, so the interpreter meets it only at exit,
with the engine's threads (and workers) still busy behind it."""

from __future__ import annotations

import sys
import time
from typing import Any

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline


def slow(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.002)
    return payload


def main(runner: str) -> None:
    rows = [{"id": i, "text": f"document number {i}"} for i in range(5000)]
    source = RangeSource([Dataset.from_records("docs", rows, shard_size=500)], 20)
    pipe = Pipeline(source).map_transform(slow, parallelism=2).shuffle(64, seed=1).batch(4)
    in_child = runner == "engine_process"
    pipe.options(runner="process" if in_child else runner, queue_size=2, engine_process=in_child)
    global ITEMS
    ITEMS = iter(pipe)
    for _ in range(3):
        next(ITEMS)


ITEMS: Any = None

if __name__ == "__main__":
    main(sys.argv[1])

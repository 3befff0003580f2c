"""A training script that iterates a process-runner pipeline to its end (the Ctrl-C tests
start it and interrupt it while its workers start): records carry 1 MiB arrays, so they
travel through shared memory, and each takes the workers about 10 ms, so the run lasts
seconds after its first item. It says when the first item arrives: a moment before that line
was one of the start-up."""

from __future__ import annotations

from tests.cli._custom_ops import slow_record
from tests.engine._sources import RangeSource
from tests.runners._pipes import big_array
from zephon import Dataset, Pipeline

FIRST_ITEM = "first item"


def main() -> None:
    ds = Dataset.from_records("rows", [{"id": i} for i in range(2000)], shard_size=50)
    pipe = (
        Pipeline(RangeSource([ds], chunk_size=8))
        .map_transform(big_array, parallelism=2)
        .map_transform(slow_record, parallelism=2)
        .batch(4)
        .options(runner="process", canonical_replicas=2, queue_size=2)
    )
    items = 0
    for _ in pipe:
        if items == 0:
            print(FIRST_ITEM, flush=True)
        items += 1
    print(f"finished: {items} items", flush=True)


if __name__ == "__main__":
    main()

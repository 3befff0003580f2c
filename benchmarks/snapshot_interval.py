"""What the snapshot interval costs a full pass of a cheap plan (markers, state copies).

A byte-tokenized pack plan over short documents (decode_text, tokenize, pack_flat 256, batch
8; two lanes, chunks of 4096), where the engine's own work per record weighs most: CPU and
wall seconds per pass with ``snapshot_every_records`` at each of ``--intervals`` (``none``:
snapshots only at chunk starts), on the inline and threads runners. Configurations take turns
in every round, so machine load hits them alike; the table gives medians and the CPU ratio to
``none`` in the same round. Prints the table and a final JSON line.

Usage: ``python benchmarks/snapshot_interval.py [--docs 40000] [--rounds 5]
[--intervals none,128,32]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from typing import Any

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource


def build(rows: list[dict[str, str]], runner: str, records: int | None) -> Pipeline:
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("r", rows, shard_size=4096)],
        mixture=MixtureSpec({"r": 1.0}),
        chunk_size=4096,
        seed=0,
    )
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes", max_length=256)
        .pack_flat(256, 0)
        .batch(8)
        .options(runner=runner, canonical_replicas=2, snapshot_every_records=records)
    )


def one_pass(pipe: Pipeline) -> tuple[float, float, int]:
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    rows = sum(len(batch) for batch in pipe)
    return time.process_time() - cpu, time.perf_counter() - wall, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--intervals", default="none,128,32")
    args = parser.parse_args()
    rows = [{"text": f"doc {i} " + "w " * (i % 13)} for i in range(args.docs)]
    intervals = [None if v == "none" else int(v) for v in args.intervals.split(",")]
    runs: dict[tuple[str, int | None], list[tuple[float, float, int]]] = {}
    for _ in range(args.rounds):
        for runner in ("inline", "threads"):
            for records in intervals:
                runs.setdefault((runner, records), []).append(
                    one_pass(build(rows, runner, records))
                )
    table: list[dict[str, Any]] = []
    for (runner, records), got in runs.items():
        base = runs[(runner, intervals[0])]
        assert {g[2] for g in got} == {b[2] for b in base}, "intervals changed the output size"
        table.append(
            {
                "runner": runner,
                "interval": "none" if records is None else records,
                "cpu_s": round(statistics.median(g[0] for g in got), 3),
                "wall_s": round(statistics.median(g[1] for g in got), 3),
                "cpu_x_first": round(
                    statistics.median(g[0] / b[0] for g, b in zip(got, base, strict=True)), 3
                ),
            }
        )
    cols = list(table[0])
    print(" | ".join(f"{c:>12}" for c in cols))
    for row in table:
        print(" | ".join(f"{row[c]:>12}" for c in cols))
    print(json.dumps({"benchmark": "snapshot_interval", "docs": args.docs, "rows": table}))


if __name__ == "__main__":
    main()

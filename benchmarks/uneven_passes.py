"""What ranks of uneven lengths cost: whole accumulation groups, and ``pass_length()``.

Rows (one process, the reference pipeline narrowed to rank 0 of 2, no training):

1. ``pipeline``: iterating the rank's pipeline directly: the floor.
2. ``loader accumulation 1``: ``PipelineDataLoader(endless=True)`` without groups: nothing is
   checkpointed per item.
3. ``loader accumulation 4``: whole groups of 4, each read before it is handed out (without
   workers nothing is checkpointed per item: between groups the pipeline is where the last
   item handed out left it).
4. ``pass_length()``: one pass of the rank's pipeline without a consumer, first call and
   again (kept).

Per-item times are medians over interleaved rounds of ``--items`` items. Prints a table and a
final JSON line. Usage: ``python benchmarks/uneven_passes.py [--items 400] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from _reference import reference_pipeline
from zephon.torch_loader import PipelineDataLoader


def rank_pipeline() -> Any:
    return reference_pipeline().options(dp_rank=0, dp_world_size=2)


def per_item_us(make: Callable[[], Iterator[Any]], items: int) -> float:
    it = make()
    next(it)  # the engine's start is not a per-item cost
    start = time.perf_counter()
    for _ in range(items):
        next(it)
    return (time.perf_counter() - start) / items * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows: dict[str, Callable[[], Iterator[Any]]] = {
        "pipeline": lambda: iter(rank_pipeline()),
        "loader accumulation 1": lambda: iter(PipelineDataLoader(rank_pipeline(), endless=True)),
        "loader accumulation 4": lambda: iter(
            PipelineDataLoader(rank_pipeline(), endless=True, accumulation_steps=4)
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, make in rows.items():
            times[name].append(per_item_us(make, args.items))
    medians = {name: statistics.median(values) for name, values in times.items()}
    pipe = rank_pipeline()
    start = time.perf_counter()
    length = pipe.pass_length()
    first = time.perf_counter() - start
    start = time.perf_counter()
    pipe.pass_length()
    again = time.perf_counter() - start
    print(f"{'row':<26}{'per item (us, median)':>24}")
    for name, value in medians.items():
        print(f"{name:<26}{value:>24.1f}")
    print(f"pass_length() = {length} batches: {first:.2f} s, again {again * 1e6:.1f} us")
    result = {
        "per_item_us": {k: round(v, 1) for k, v in medians.items()},
        "pass_length": length,
        "pass_length_s": round(first, 3),
        "pass_length_again_us": round(again * 1e6, 1),
        "items": args.items,
        "rounds": args.rounds,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

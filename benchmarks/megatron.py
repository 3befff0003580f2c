"""What zephon's Megatron-LM external data provider costs per micro-batch, against the same
batches pre-built in memory.

Rows (one process, the reference pipeline: batches of 4 x 256 packed byte tokens):

1. ``prebuilt``: ``next()`` over the provider's own micro-batches, built beforehand: the floor.
2. ``provider bshd``: ``next()`` of ``MegatronDataProvider`` (pipeline, Megatron's keys with the
   ``[B, 1, S, S]`` document mask).
3. ``provider thd``: the same with ``thd=True`` (each batch one packed sequence, documents
   padded to a multiple of 8).
4. ``plain pipeline``: iterating the pipeline with ``to_training()`` (what any loop pays).

Besides: ``save_state()`` (1 rank: the merge and seal) and ``load_generation`` of one rank file.
Times are medians over interleaved rounds. Prints a table and a final JSON line.
Usage: ``python benchmarks/megatron.py [--batches 200] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from _reference import reference_pipeline
from zephon.integrations.megatron import MegatronDataProvider, load_generation, rank_file_name


def provider(**kwargs: Any) -> MegatronDataProvider:
    micro = 1 if kwargs.get("thd") else 4
    return MegatronDataProvider(
        reference_pipeline(), micro_batch_size=micro, global_batch_size=micro, **kwargs
    )


def per_item(make: Callable[[], Iterator[Any]], count: int) -> float:
    items = make()
    next(items)  # start-up is not a step
    start = time.perf_counter()
    for _ in range(count):
        next(items)
    return (time.perf_counter() - start) / count


def state_costs(rounds: int) -> dict[str, float]:
    source = provider()
    next(source)
    saves, loads = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "iter_0000001", "mp_rank_00", rank_file_name(0))
        path.parent.mkdir(parents=True)
        for _ in range(rounds):
            start = time.perf_counter()
            state = source.save_state()
            saves.append(time.perf_counter() - start)
            torch.save({"dataloader_state_dict": state}, path)
            start = time.perf_counter()
            load_generation(tmp, 1)
            loads.append(time.perf_counter() - start)
    return {"save_state_ms": statistics.median(saves) * 1e3,
            "load_generation_ms": statistics.median(loads) * 1e3}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = args.batches
    prebuilt = [b for b, _ in zip(provider(), range(n + 1), strict=False)]
    rows: dict[str, Callable[[], Iterator[Any]]] = {
        "prebuilt": lambda: iter(prebuilt),
        "provider bshd": lambda: provider(),
        "provider thd": lambda: provider(thd=True, pad_multiple=8),
        "plain pipeline": lambda: (b.to_training() for b in reference_pipeline()),
    }
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, make in rows.items():
            times[name].append(per_item(make, n))
    result = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    result.update(state_costs(args.rounds * 5))
    for name, value in result.items():
        print(f"{name:>20}: {value:8.3f} ms")
    print(json.dumps({"benchmark": "megatron", "batches": n, **result}))


if __name__ == "__main__":
    main()

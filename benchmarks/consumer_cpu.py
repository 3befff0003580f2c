"""What the training process pays per delivered batch of 8x2048: engine in or out of process.

A training loop's data cost is the CPU its own process spends to get each batch as model
inputs (``to_training(return_tensors="pt")``): the receive, unpickle and map of an engine
process's hand-off, the engine's own threads when it runs in the training process, the
DataLoader's queue and the checkpoint stamp each item carries. ``iter_training`` and the
DataLoader without workers over an ``engine_process=True`` pipeline build the inputs in the
engine process, with ``lane_workers`` in the lane worker processes; the other modes build them
on the consumer's side (or in DataLoader workers).
Pipeline: generated documents through decode_text -> tokenize (bytes) -> pack_flat(2048) ->
batch(8).

Columns, per batch after the first (steady state), medians over rounds that interleave the
modes: ``thread_us``, the CPU of the consuming thread alone (``time.thread_time``: the time
taken from the training loop's thread), and ``process_us``, the CPU of the whole training
process (``os.times``: every thread of it, none of its child processes). In-process engines
put their worker threads in ``process_us``; ``engine_process`` and DataLoader workers keep
theirs in other processes.

Prints a table and a final JSON line. Usage: ``python benchmarks/consumer_cpu.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.torch_loader import PipelineDataLoader

WORDS = ["token", "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]


def build(docs: int, **options: Any) -> Pipeline:
    rows = [
        {"text": f"document {i} " + " ".join(WORDS[(i + j) % 8] for j in range(i % 400))}
        for i in range(docs)
    ]
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("a", rows, shard_size=4096)],
        mixture=MixtureSpec({"a": 1.0}),
        chunk_size=4096,
        seed=1,
    )
    pipe = Pipeline(source).decode_text().tokenize("bytes", max_length=2048)
    return pipe.pack_flat(2048, 0).batch(8).options(canonical_replicas=2, **options)


def to_model(batch: Any) -> Any:
    return batch.to_training(return_tensors="pt")


def direct(pipe: Pipeline) -> Iterator[Any]:
    for batch in pipe:
        yield to_model(batch)


def loader(pipe: Pipeline, workers: int) -> Iterator[Any]:
    yield from PipelineDataLoader(pipe, to_model, num_workers=workers)


def process_cpu() -> float:
    times = os.times()
    return times.user + times.system


def measure(items: Iterator[Any]) -> tuple[float, float, int]:
    """Consumer-thread and process CPU seconds after the first batch, and batches after it."""
    next(items)
    thread, proc, batches = time.thread_time(), process_cpu(), 0
    for _ in items:
        batches += 1
    return time.thread_time() - thread, process_cpu() - proc, batches


def training(pipe: Pipeline) -> Iterator[Any]:
    yield from pipe.iter_training(return_tensors="pt")


MODES: dict[str, Callable[[int], Iterator[Any]]] = {
    "in process (threads)": lambda docs: direct(build(docs, runner="threads")),
    "engine_process": lambda docs: direct(build(docs, runner="threads", engine_process=True)),
    "iter_training": lambda docs: training(build(docs, runner="threads")),
    "PipelineDataLoader, 0 workers": lambda docs: loader(build(docs, runner="threads"), 0),
    "PipelineDataLoader, 0 workers, engine_process": lambda docs: loader(
        build(docs, runner="threads", engine_process=True), 0
    ),
    "PipelineDataLoader, 2 workers": lambda docs: loader(build(docs, runner="inline"), 2),
    "iter_training, lane_workers=2": lambda docs: training(build(docs, lane_workers=2)),
    "PipelineDataLoader, 0 workers, lane_workers=2": lambda docs: loader(
        build(docs, lane_workers=2), 0
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=12_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, float, int]]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode, items in MODES.items():
            runs[mode].append(measure(items(args.docs)))
    rows = []
    for mode, got in runs.items():
        batches = got[0][2]
        rows.append(
            {
                "mode": mode,
                "batches": batches,
                "thread_us": round(statistics.median(g[0] / g[2] for g in got) * 1e6),
                "process_us": round(statistics.median(g[1] / g[2] for g in got) * 1e6),
            }
        )
    print(f"cores: {os.cpu_count()}  batch: 8x2048  docs: {args.docs}")
    cols = ["mode", "batches", "thread_us", "process_us"]
    print(" | ".join(f"{c:>46}" for c in cols))
    for row in rows:
        print(" | ".join(f"{row[c]:>46}" for c in cols))
    print(json.dumps({"benchmark": "consumer_cpu", "cores": os.cpu_count(), "rows": rows}))


if __name__ == "__main__":
    main()

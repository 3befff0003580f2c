"""What zephon's torchtitan data loader costs per training step, side by side with the same
batches pre-built in memory. (Not named torchtitan.py: run from benchmarks/ it would shadow
the torchtitan package.)

A step is what torchtitan's trainer does with one batch on the CPU here: forward, cross-entropy
over the labels (ignore index -100), backward and an optimizer step of a small model (2 blocks,
width 256) on the reference pipeline's batches of 4 x 256 packed byte tokens.

Side by side: each step of the loader's run is paired with a step over the same batch built
beforehand (two copies of the model; the pair's order alternates), so both see the same load on
a busy machine; steps are timed in this process's CPU time (``time.process_time``), which other
processes' load does not enter. Per-step medians, per row:

1. ``loader, inline``: ``ZephonDataLoader`` with ``num_workers=0`` (the default: the pipeline
   runs between the steps) against ``prebuilt``.
2. ``loader, 1 worker``: ``num_workers=1`` (the pipeline in a DataLoader worker process, beside
   the steps; on a machine with spare cores it is hidden behind them).

Besides: ``next()`` of the inline loader alone (no step) and ``state_dict()`` (1 rank: the
merge, seal and JSON). Prints a table and a final JSON line; ``overhead %`` is a row's median
step over its prebuilt twin's, minus 1.
Usage: ``python benchmarks/torchtitan_loader.py [--steps 100]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from _reference import reference_pipeline
from zephon.integrations.torchtitan import IGNORE_INDEX, ZephonDataLoader

VOCAB, WIDTH = 260, 256
# CPU seconds of this process: on a shared machine other processes' load does not enter (with
# a worker, its own CPU time does not either: that runs beside the steps)
CLOCK = time.process_time


def loader(workers: int) -> ZephonDataLoader:
    config = ZephonDataLoader.Config(num_workers=workers)
    return config.build(
        dp_world_size=1,
        dp_rank=0,
        seq_len=256,
        local_batch_size=4,
        built_pipeline=reference_pipeline(),
    )


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    block = [torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(), torch.nn.Linear(4 * WIDTH, WIDTH)]
    return torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, WIDTH), *block, *block, torch.nn.Linear(WIDTH, VOCAB)
    )


def stepper() -> Callable[[tuple[dict[str, Any], Any]], None]:
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)

    def step(batch: tuple[dict[str, Any], Any]) -> None:
        inputs, labels = batch
        logits = net(inputs["input"])
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def side_by_side(workers: int, count: int) -> tuple[float, float]:
    """Median CPU seconds of a step over the loader and of one over the same batch prebuilt."""
    batches = iter(loader(workers))
    over_loader, over_prebuilt = stepper(), stepper()
    over_loader(next(batches))  # start-up (workers, first batch) is not a step
    prebuilt = [b for b, _ in zip(loader(0), range(count + 1), strict=False)][1:]
    over_prebuilt(prebuilt[0])
    times: tuple[list[float], list[float]] = ([], [])
    for index in range(count):
        pair = [(over_loader, batches, 0), (over_prebuilt, iter(prebuilt[index:]), 1)]
        for step, source, slot in pair if index % 2 else pair[::-1]:
            start = CLOCK()
            step(next(source))
            times[slot].append(CLOCK() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def next_ms(count: int) -> float:
    batches = iter(loader(0))
    next(batches)
    start = time.perf_counter()
    for _ in range(count):
        next(batches)
    return (time.perf_counter() - start) / count * 1e3


def state_ms(rounds: int) -> float:
    source = loader(0)
    batches = iter(source)
    times = []
    for _ in range(rounds):
        next(batches)
        start = time.perf_counter()
        source.state_dict()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result: dict[str, float] = {}
    for name, workers in (("loader, inline", 0), ("loader, 1 worker", 1)):
        with_loader, prebuilt = side_by_side(workers, args.steps)
        result[f"{name} step ms"] = with_loader * 1e3
        result[f"{name} prebuilt step ms"] = prebuilt * 1e3
        result[f"{name} overhead %"] = (with_loader / prebuilt - 1) * 100
    result["next() inline ms"] = next_ms(args.steps)
    result["state_dict ms"] = state_ms(25)
    for name, value in result.items():
        print(f"{name:>34}: {value:9.3f}")
    print(json.dumps({"benchmark": "torchtitan", "steps": args.steps, **result}))


if __name__ == "__main__":
    main()

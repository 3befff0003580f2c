"""What zephon's torchtitan data loader costs per training step, side by side with the same
batches pre-built in memory. (Not named torchtitan.py: run from benchmarks/ it would shadow
the torchtitan package.)

A step is what torchtitan's trainer does with one batch on the CPU here: forward, cross-entropy
over the labels (ignore index -100), backward and an optimizer step of a small model (2 blocks,
width 256) on the reference pipeline's batches of 4 x 256 packed byte tokens.

Rows (one process; medians over interleaved rounds):

1. ``prebuilt``: steps over the loader's own batches, built beforehand: the floor.
2. ``loader, 1 worker``: steps over ``ZephonDataLoader`` with ``num_workers=1`` (the pipeline
   runs in a DataLoader worker process, beside the steps).
3. ``loader, inline``: ``num_workers=0`` (the pipeline runs between the steps).

Besides: ``next()`` alone (no step) for the inline loader and prebuilt, and ``state_dict()`` (1
rank: the merge, seal and JSON). Prints a table and a final JSON line with each row's overhead
over ``prebuilt`` in percent, and the inline loader's own ``next()`` time as a share of a step
(the same overhead, without the noise of two step timings on a busy machine).
Usage: ``python benchmarks/torchtitan_loader.py [--steps 100] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from _reference import reference_pipeline
from zephon.integrations.torchtitan import IGNORE_INDEX, ZephonDataLoader

VOCAB, WIDTH = 260, 256


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


def per_step(make: Callable[[], Iterator[Any]], count: int, train: bool) -> float:
    step = stepper() if train else (lambda _: None)
    items = make()
    step(next(items))  # start-up (workers, first batch) is not a step
    start = time.perf_counter()
    for _ in range(count):
        step(next(items))
    return (time.perf_counter() - start) / count


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
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = args.steps
    prebuilt = [b for b, _ in zip(loader(0), range(n + 1), strict=False)]
    rows: dict[str, tuple[Callable[[], Iterator[Any]], bool]] = {
        "prebuilt": (lambda: iter(prebuilt), True),
        "loader, 1 worker": (lambda: iter(loader(1)), True),
        "loader, inline": (lambda: iter(loader(0)), True),
        "next() prebuilt": (lambda: iter(prebuilt), False),
        "next() inline": (lambda: iter(loader(0)), False),
    }
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, (make, train) in rows.items():
            times[name].append(per_step(make, n, train))
    result = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    floor = result["prebuilt"]
    overhead = {
        f"{name} overhead %": (result[name] / floor - 1) * 100
        for name in ("loader, 1 worker", "loader, inline")
    }
    # the loader's own time per step over a step's time: what the step rows show, less their noise
    overhead["next() inline / step %"] = (
        (result["next() inline"] - result["next() prebuilt"]) / floor * 100
    )
    result["state_dict"] = state_ms(args.rounds * 5)
    for name, value in result.items():
        print(f"{name:>20}: {value:8.3f} ms")
    for name, value in overhead.items():
        print(f"{name:>28}: {value:+6.2f}")
    print(json.dumps({"benchmark": "torchtitan", "steps": n, **result, **overhead}))


if __name__ == "__main__":
    main()

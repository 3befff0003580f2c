"""The cost of saving operator state: snapshots at every chunk start of every lane.

Four pipelines over the same in-memory records, each ending in one operator on the driver:

- ``stateless``: a dedupe accumulator whose seen set is *not* declared (no snapshots; wrong
  after a restore, but the same work per record), the baseline;
- ``dedupe``: the same accumulator with ``state_dict``/``load_state_dict`` (a growing set of
  hashes: each snapshot copies it through JSON);
- ``counter``: a ``stateful_transform`` with a bounded state (two numbers);
- ``counter_sliding``: the same with a bounded state of the last 64 ids.

Rounds are interleaved and the ratio to the baseline is taken per round (the machine is
shared), then the median. Prints a table and one final JSON line.
Usage: ``python benchmarks/operator_state.py [--records N] [--chunk C] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import xxhash

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.ops import Accumulator, BaseOp, MicroBatch, OpTraits, tombstone_meta
from zephon.types import SampleRecord, StreamItem


class Seen(Accumulator):
    reads_payload = True

    def __init__(self) -> None:
        self.seen: dict[int, set[str]] = {}

    def push_many(self, elems: Sequence[StreamItem]) -> list[MicroBatch]:
        out: MicroBatch = []
        for elem in elems:
            digest = xxhash.xxh64_hexdigest(elem.payload["text"].encode())
            seen = self.seen.setdefault(elem.meta.lane_id, set())
            if digest in seen:
                out.append(SampleRecord(tombstone_meta(elem.meta, reason="duplicate"), None))
            else:
                seen.add(digest)
                out.append(elem)
        return [out] if out else []

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[MicroBatch]:
        return []

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        return False


class SavedSeen(Seen):
    def state_dict(self, lane_id: int) -> list[str]:
        return sorted(self.seen.get(lane_id, ()))

    def load_state_dict(self, lane_id: int, state: list[str]) -> None:
        self.seen[lane_id] = set(state)


class DedupeOp(BaseOp):
    def __init__(self, saved: bool) -> None:
        super().__init__(name="dedupe")
        self.saved = saved

    def accumulator(self, *, deterministic: bool, ctx: Any) -> Accumulator:
        return SavedSeen() if self.saved else Seen()

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, runs_in_driver=True)

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return elems


def count(state: dict[str, int], payload: dict[str, Any]) -> tuple[dict[str, int], list[Any]]:
    return {"n": state["n"] + 1, "chars": state["chars"] + len(payload["text"])}, [payload]


def sliding(state: list[int], payload: dict[str, Any]) -> tuple[list[int], list[Any]]:
    return [*state[-63:], payload["id"]], [payload]


def pipelines(records: int, chunk: int) -> dict[str, Callable[[], Pipeline]]:
    rows = [{"id": i, "text": f"text {(i * 7919) % (records // 2)}"} for i in range(records)]
    dataset = Dataset.from_records("d", rows)

    def base() -> Pipeline:
        source = StaticMixtureWorkSource([dataset], chunk_size=chunk, seed=0)
        return Pipeline(source).options(runner="inline", canonical_replicas=2)

    return {
        "stateless": lambda: base().add_op(DedupeOp(saved=False)),
        "dedupe": lambda: base().add_op(DedupeOp(saved=True)),
        "counter": lambda: base().stateful_transform(
            "count", init_state={"n": 0, "chars": 0}, push=count
        ),
        "counter_sliding": lambda: base().stateful_transform("last", init_state=[], push=sliding),
    }


def timed(build: Callable[[], Pipeline]) -> float:
    start = time.perf_counter()
    n = sum(1 for _ in build())
    elapsed = time.perf_counter() - start
    assert n > 0
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    builds = pipelines(args.records, args.chunk)
    times: dict[str, list[float]] = {name: [] for name in builds}
    ratios: dict[str, list[float]] = {name: [] for name in builds}
    for _ in range(args.rounds):
        this = {name: timed(build) for name, build in builds.items()}
        for name, seconds in this.items():
            times[name].append(seconds)
            ratios[name].append(seconds / this["stateless"])
    print(f"{args.records:,} records, chunk {args.chunk}, 2 lanes, median of {args.rounds} rounds")
    print(f"{'pipeline':<16}{'records/s':>12}{'us/record':>11}{'vs stateless':>14}")
    result: dict[str, Any] = {"records": args.records, "chunk": args.chunk}
    for name in builds:
        seconds = statistics.median(times[name])
        ratio = statistics.median(ratios[name])
        rate = args.records / seconds
        print(f"{name:<16}{rate:>12,.0f}{1e6 / rate:>11.2f}{ratio:>13.2f}x")
        result[name] = {"records_per_s": round(rate), "ratio": round(ratio, 3)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Benchmark of the data-source layer: chunk generation per rank and random-access fetch.

1. Pointers/s of ``StaticMixtureWorkSource`` chunk generation with 64 lanes over 8 ranks: one
   rank pulls its 8 lanes round-robin (each lane computes only its own chunks), compared with
   the global, un-laned sequence.
2. Samples/s of ``Dataset.read`` in batches of 64 random indices (one random shard per batch),
   including JSON decoding, from JSONL and Parquet shards on local disk.

Usage: python benchmarks/sources.py [--quick]. Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.io import Dataset, Shard
from zephon.work import MixtureSpec, StaticMixtureWorkSource, lanes_for_rank


class CountOnlyShard(Shard):
    """A shard with a row count and no data (chunk generation reads metadata only)."""

    def __init__(self, n: int) -> None:
        self._n = n

    @property
    def location(self) -> str:
        return "<count-only>"

    def __len__(self) -> int:
        return self._n

    def read(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        raise NotImplementedError


def bench_chunks(quick: bool, shuffle: bool) -> dict[str, float]:
    datasets = [
        Dataset(name, [CountOnlyShard(rows)] * shards)
        for name, shards, rows in (("web", 2000, 20000), ("code", 500, 8000), ("books", 100, 3000))
    ]
    kw: dict[str, Any] = {
        "mixture": MixtureSpec({"web": 0.6, "code": 0.3, "books": 0.1}),
        "chunk_size": 16384,
        "seed": 7,
        "exhausted_policy": "repeat",
    }
    if shuffle:
        kw.update(shuffle_within_shard=True, shuffle_block_size=65536)
    lanes, ranks = 64, 8
    rounds = 4 if quick else 16
    source = StaticMixtureWorkSource(datasets, **kw)
    clones = [source.clone_for_lane(lane, lanes) for lane in lanes_for_rank(0, ranks, lanes)]
    start = time.perf_counter()
    pointers = 0
    for _ in range(rounds):
        for clone in clones:
            chunk = clone.next_chunk()
            assert chunk is not None
            pointers += len(chunk)
    rank_time = time.perf_counter() - start

    global_src = StaticMixtureWorkSource(datasets, **kw)
    n_global = len(clones) * rounds
    start = time.perf_counter()
    g_pointers = sum(len(global_src.next_chunk() or []) for _ in range(n_global))  # type: ignore[arg-type]
    global_time = time.perf_counter() - start
    # What a generate-everything-then-discard lane design would reach per rank: every lane
    # builds all 64 chunks of a block to keep one.
    discard_rate = g_pointers / global_time / lanes
    return {
        "rank_pointers_per_s": pointers / rank_time,
        "global_pointers_per_s": g_pointers / global_time,
        "discard_design_pointers_per_s": discard_rate,
        "ms_per_lane_chunk": rank_time / (len(clones) * rounds) * 1000,
    }


def make_docs(n: int, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    words = [f"w{i}" for i in range(5000)]
    return [
        {"id": i, "text": " ".join(rnd.choices(words, k=rnd.randint(20, 200))), "lang": "en"}
        for i in range(n)
    ]


def bench_fetch(quick: bool, folder: Path) -> dict[str, dict[str, float]]:
    shards, per_shard = (4, 2000) if quick else (8, 5000)
    (folder / "jsonl").mkdir()
    (folder / "parquet").mkdir()
    for s in range(shards):
        docs = make_docs(per_shard, s)
        with open(folder / "jsonl" / f"part-{s:03d}.jsonl", "wb") as f:
            for d in docs:
                f.write(json.dumps(d).encode() + b"\n")
        pq.write_table(
            pa.Table.from_pylist(docs),
            folder / "parquet" / f"part-{s:03d}.parquet",
            row_group_size=1024,
        )
    out: dict[str, dict[str, float]] = {}
    batches = 300 if quick else 1500
    for fmt in ("jsonl", "parquet"):
        start = time.perf_counter()
        ds = Dataset.from_path(fmt, folder / fmt)
        ds.read(0, [0])
        discover = time.perf_counter() - start
        rng = np.random.default_rng(0)
        for mode in ("random", "block"):
            n = 0
            start = time.perf_counter()
            for _ in range(batches):
                shard = int(rng.integers(ds.shard_count()))
                if mode == "random":
                    idx = rng.integers(per_shard, size=64).tolist()
                else:  # 64 rows from a 4096-row neighbourhood, as a block shuffle reads
                    base = int(rng.integers(per_shard - 4096)) if per_shard > 4096 else 0
                    idx = (base + rng.permutation(min(4096, per_shard))[:64]).tolist()
                n += len(ds.read(shard, idx))
            elapsed = time.perf_counter() - start
            out[f"{fmt}_{mode}"] = {"samples_per_s": n / elapsed, "discover_s": discover}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller run (a few seconds)")
    args = parser.parse_args(argv)
    chunks = {
        "plain": bench_chunks(args.quick, shuffle=False),
        "shuffled": bench_chunks(args.quick, shuffle=True),
    }
    with tempfile.TemporaryDirectory() as tmp:
        fetch = bench_fetch(args.quick, Path(tmp))
    print("chunk generation, 64 lanes / 8 ranks, chunk_size 16384, 3 datasets")
    head = ("config", "rank ptr/s", "global ptr/s", "discard ptr/s", "ms/chunk")
    print(f"{head[0]:<10} {head[1]:>14} {head[2]:>14} {head[3]:>14} {head[4]:>9}")
    for name, r in chunks.items():
        print(
            f"{name:<10} {r['rank_pointers_per_s']:>14,.0f} {r['global_pointers_per_s']:>14,.0f} "
            f"{r['discard_design_pointers_per_s']:>14,.0f} {r['ms_per_lane_chunk']:>9.2f}"
        )
    print("\nfetch: Dataset.read, batches of 64, json decode included")
    print(f"{'format/access':<16} {'samples/s':>12} {'discover s':>11}")
    for name, r in fetch.items():
        print(f"{name:<16} {r['samples_per_s']:>12,.0f} {r['discover_s']:>11.3f}")
    print(
        json.dumps({"benchmark": "sources", "quick": args.quick, "chunks": chunks, "fetch": fetch})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

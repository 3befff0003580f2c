"""Benchmark of the data-source layer: chunk generation per rank and random-access fetch.

1. Pointers/s of ``StaticMixtureWorkSource`` chunk generation with 64 lanes over 8 ranks: one
   rank pulls its 8 lanes round-robin (each lane computes only its own chunks), compared with
   the global, un-laned sequence.
2. Samples/s of ``Dataset.read`` (fetch + decode to dicts) in batches of 64 indices, random or
   from a 4096-row neighbourhood (one random shard per batch), for every format on local disk:
   the 20,000 documents of the MDS test fixture (written by mosaicml-streaming) rewritten as
   JSONL, Parquet, Hugging Face ``save_to_disk``, Arrow IPC and Lance.
3. The same for JSONL and Parquet on a local S3 server (moto, in its own process, loopback):
   ranged reads (no cache) against the node cache (first pass downloads, then warm), with
   bytes fetched per sample.

Usage: python benchmarks/sources.py [--quick]. Prints tables and a final JSON line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
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


MDS_FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "io" / "fixtures" / "mds-corpus"
FORMATS = ("jsonl", "parquet", "hf", "arrow", "lance", "mds")
# formats and parts that need a package the core install lacks: skipped (and said) without it
NEEDS = {"hf": ("datasets",), "lance": ("lance",), "s3": ("moto", "s3fs")}


def installed(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def skipped() -> list[str]:
    return [part for part, modules in NEEDS.items() if not all(map(installed, modules))]


def write_formats(folder: Path) -> dict[str, Path]:
    """The MDS fixture's documents in every format it can write, 5 shards of 4,000 rows each."""
    mds = Dataset.from_path("mds", MDS_FIXTURE, cache_dir=folder / "cache")
    parts = [mds.read(s, range(n)) for s, n in enumerate(mds.counts())]
    docs = [d for part in parts for d in part]
    out = {"mds": MDS_FIXTURE}
    for fmt in ("jsonl", "parquet", "arrow"):
        (folder / fmt).mkdir()
        out[fmt] = folder / fmt
    for s, part in enumerate(parts):
        with open(folder / "jsonl" / f"part-{s:02d}.jsonl", "wb") as f:
            f.writelines(json.dumps(d).encode() + b"\n" for d in part)
        table = pa.Table.from_pylist(part)
        pq.write_table(table, folder / "parquet" / f"part-{s:02d}.parquet", row_group_size=1024)
        feather.write_feather(table, folder / "arrow" / f"part-{s:02d}.arrow")
    if installed("datasets"):
        import datasets

        datasets.disable_progress_bars()
        datasets.Dataset.from_list(docs).save_to_disk(str(folder / "hf"), num_shards=len(parts))
        out["hf"] = folder / "hf"
    if installed("lance"):
        import lance

        table = pa.Table.from_pylist(docs)
        lance.write_dataset(table, str(folder / "t.lance"), max_rows_per_file=4000)
        out["lance"] = folder / "t.lance"
    return out


def read_rate(ds: Dataset, batches: int, mode: str, seed: int = 0) -> float:
    """Samples/s of ``ds.read`` over ``batches`` batches of 64 (random or block-local)."""
    rng = np.random.default_rng(seed)
    n = 0
    start = time.perf_counter()
    for _ in range(batches):
        shard = int(rng.integers(ds.shard_count()))
        rows = ds.counts()[shard]
        if mode == "random":
            idx = rng.integers(rows, size=64).tolist()
        else:  # 64 rows from a 4096-row neighbourhood, as a block shuffle reads
            base = int(rng.integers(rows - 4096)) if rows > 4096 else 0
            idx = (base + rng.permutation(min(4096, rows))[:64]).tolist()
        n += len(ds.read(shard, idx))
    return n / (time.perf_counter() - start)


def bench_fetch(quick: bool, folder: Path) -> dict[str, dict[str, float]]:
    paths = write_formats(folder)
    out: dict[str, dict[str, float]] = {}
    batches = 300 if quick else 1500
    for fmt in (f for f in FORMATS if f in paths):
        start = time.perf_counter()
        ds = Dataset.from_path(fmt, paths[fmt], cache_dir=folder / "cache")
        ds.read(0, [0])
        discover = time.perf_counter() - start
        for mode in ("random", "block"):
            rate = read_rate(ds, batches, mode)
            out[f"{fmt}_{mode}"] = {"samples_per_s": rate, "discover_s": discover}
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_s3() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    code = f"from moto.server import main; main(['-H', '127.0.0.1', '-p', '{port}'])"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the moto S3 server did not start")


def bench_s3(quick: bool, folder: Path) -> dict[str, dict[str, float]]:
    import boto3

    from zephon.io import CacheOptions

    proc, endpoint = _start_s3()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint,
    )  # fmt: skip
    out: dict[str, dict[str, float]] = {}
    batches = 40 if quick else 200
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        for fmt in ("jsonl", "parquet"):
            for path in sorted((folder / fmt).iterdir()):
                client.put_object(Bucket="bench", Key=f"{fmt}/{path.name}", Body=path.read_bytes())
            url = f"s3://bench/{fmt}"
            Dataset.from_path(fmt, url, cache_dir=folder / "idx").read(0, [0])  # offset indexes
            for mode in ("random", "block"):
                ranged = Dataset.from_path(fmt, url, cache_dir=folder / "idx")
                before = ranged.stats().bytes_fetched  # counters are per URL and process
                rate = read_rate(ranged, batches, mode, seed=1)
                per = (ranged.stats().bytes_fetched - before) / (batches * 64)
                out[f"{fmt}_{mode}_ranged"] = {"samples_per_s": rate, "bytes_per_sample": per}
                cache = CacheOptions(dir=folder / f"node-{fmt}-{mode}")
                before = ranged.stats().bytes_fetched
                start = time.perf_counter()
                cached = Dataset.from_path(fmt, url, cache=cache)  # downloads every shard
                first = time.perf_counter() - start
                warm = read_rate(cached, batches, mode, seed=1)
                per = (cached.stats().bytes_fetched - before) / (batches * 64)
                out[f"{fmt}_{mode}_cached"] = {
                    "samples_per_s": warm, "bytes_per_sample": per, "download_s": first,
                }  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=10)
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
        s3 = bench_s3(args.quick, Path(tmp)) if "s3" not in skipped() else {}
    print("chunk generation, 64 lanes / 8 ranks, chunk_size 16384, 3 datasets")
    head = ("config", "rank ptr/s", "global ptr/s", "discard ptr/s", "ms/chunk")
    print(f"{head[0]:<10} {head[1]:>14} {head[2]:>14} {head[3]:>14} {head[4]:>9}")
    for name, r in chunks.items():
        print(
            f"{name:<10} {r['rank_pointers_per_s']:>14,.0f} {r['global_pointers_per_s']:>14,.0f} "
            f"{r['discard_design_pointers_per_s']:>14,.0f} {r['ms_per_lane_chunk']:>9.2f}"
        )
    print("\nfetch + decode: Dataset.read, batches of 64, local disk, 5 shards x 4000 docs")
    print(f"{'format/access':<16} {'samples/s':>12} {'discover s':>11}")
    for name, r in fetch.items():
        print(f"{name:<16} {r['samples_per_s']:>12,.0f} {r['discover_s']:>11.3f}")
    print("\nover a local S3 server (moto): ranged reads vs node cache (warm)")
    print(f"{'format/access':<24} {'samples/s':>10} {'bytes/sample':>13} {'download s':>11}")
    for name, r in s3.items():
        dl = f"{r['download_s']:>11.2f}" if "download_s" in r else f"{'-':>11}"
        print(f"{name:<24} {r['samples_per_s']:>10,.0f} {r['bytes_per_sample']:>13,.0f} {dl}")
    if skipped():
        missing = ", ".join(f"{p} ({'+'.join(NEEDS[p])})" for p in skipped())
        print(f"\nskipped, not installed: {missing}")
    doc = {"benchmark": "sources", "quick": args.quick, "chunks": chunks, "fetch": fetch}
    print(json.dumps({**doc, "s3": s3}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

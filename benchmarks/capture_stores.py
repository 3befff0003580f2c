"""Benchmark the capture stores with 4096-token entries (3072 prompt + 1024 generated).

For each store (memory, file, sqlite, postgres on an embedded server): put p50/p99 latency and
puts/s with 1 and 4 writer processes (disjoint rollouts, 10 calls each), then first and
repeated freeze latency of 10- and 40-call rollouts, measured in a fresh consumer process (a
cold client, as in training). Also: a raw ``write`` + ``fdatasync`` loop of the same record
size (the floor any durable file store pays), and the file store's put latency with the
blocking work offloaded to a thread vs run inline on the event loop.

Usage: ``python benchmarks/capture_stores.py [--puts N] [--stores file,sqlite] [--dir PATH]``.
Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from zephon.capture.records import TokenEntry
from zephon.capture.stores import open_store

PROMPT, GEN = 3072, 1024
CALLS_PER_ROLLOUT = 10


def make_entry(rollout_id: str, call_id: str) -> TokenEntry:
    rng = random.Random(f"{rollout_id}/{call_id}")
    return TokenEntry(
        rollout_id=rollout_id,
        model_call_id=call_id,
        model="bench-model",
        prompt_token_ids=[rng.randrange(150_000) for _ in range(PROMPT)],
        generation_token_ids=[rng.randrange(150_000) for _ in range(GEN)],
        generation_log_probs=[-rng.random() * 5 for _ in range(GEN)],
        output_items=[
            {"type": "message", "role": "assistant", "content": [{"type": "output_text"}]}
        ],
        token_item_index=0,
        response_id=f"resp-{call_id}",
        created_at=1_700_000_000.0 + rng.random(),
        parent_resolution="root",  # type: ignore[arg-type]
        continuation_fingerprint="f" * 64,
        continuation_context_len=1,
        continuation_context_digest="c" * 64,
        fingerprint_version=2,
    )


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _reset_file_cache() -> None:
    from zephon.capture.stores._file import reset_process_cache

    reset_process_cache()


# --------------------------------------------------------------------------- workers


def _writer(url: str, prefix: str, n: int, barrier: Any, out: Any) -> None:
    """Put ``n`` entries into rollouts of 10 calls; report latencies and wall time."""
    entries = [
        make_entry(f"{prefix}-r{i // CALLS_PER_ROLLOUT}", f"c{i % CALLS_PER_ROLLOUT}")
        for i in range(n)
    ]

    async def run() -> tuple[list[float], float, float]:
        store = open_store(url)
        barrier.wait()
        lat = []
        start = time.perf_counter()
        for entry in entries:
            t = time.perf_counter()
            await store.put(entry)
            lat.append(time.perf_counter() - t)
        end = time.perf_counter()
        await store.close()
        return lat, start, end

    lat, start, end = asyncio.run(run())
    out.put((lat, start, end))


def run_writers(url: str, procs: int, n_each: int, tag: str) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    ps = [
        ctx.Process(target=_writer, args=(url, f"{tag}-w{i}", n_each, barrier, out))
        for i in range(procs)
    ]
    for p in ps:
        p.start()
    results = [out.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    lat = [x for r in results for x in r[0]]
    wall = max(r[2] for r in results) - min(r[1] for r in results)
    return {
        "p50_ms": pct(lat, 0.5) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "puts_per_s": len(lat) / wall,
    }


def _consumer(url: str, rollouts: list[str], out: Any) -> None:
    async def run() -> tuple[list[float], list[float]]:
        store = open_store(url)
        first, again = [], []
        for rid in rollouts:
            t = time.perf_counter()
            snap = await store.freeze(rid)
            first.append(time.perf_counter() - t)
            assert snap.entries
            for _ in range(5):
                t = time.perf_counter()
                await store.freeze(rid)
                again.append(time.perf_counter() - t)
        await store.close()
        return first, again

    out.put(asyncio.run(run()))


def run_freeze(url: str, calls: int, rollouts: int, tag: str) -> dict[str, float]:
    ids = [f"{tag}-fz{calls}-{i}" for i in range(rollouts)]

    async def fill() -> None:
        store = open_store(url)
        for rid in ids:
            for c in range(calls):
                await store.put(make_entry(rid, f"c{c}"))
        await store.close()

    asyncio.run(fill())
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_consumer, args=(url, ids, out))
    p.start()
    first, again = out.get(timeout=600)
    p.join()
    return {
        "first_p50_ms": pct(first, 0.5) * 1e3,
        "first_p99_ms": pct(first, 0.99) * 1e3,
        "again_p50_ms": pct(again, 0.5) * 1e3,
        "again_p99_ms": pct(again, 0.99) * 1e3,
    }


# --------------------------------------------------------------------------- raw floor


def _raw_fsync(path: str, n: int, barrier: Any, out: Any) -> None:
    buf = b"x" * 46_800 + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    barrier.wait()
    lat = []
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        os.write(fd, buf)
        os.fdatasync(fd)
        lat.append(time.perf_counter() - t)
    end = time.perf_counter()
    os.close(fd)
    out.put((lat, start, end))


def raw_fsync(directory: str, procs: int, n: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    ps = [
        ctx.Process(target=_raw_fsync, args=(f"{directory}/raw{i}", n, barrier, out))
        for i in range(procs)
    ]
    for p in ps:
        p.start()
    res = [out.get(timeout=300) for _ in ps]
    for p in ps:
        p.join()
    lat = [x for r in res for x in r[0]]
    wall = max(r[2] for r in res) - min(r[1] for r in res)
    return {
        "p50_ms": pct(lat, 0.5) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "puts_per_s": len(lat) / wall,
    }


def offload_compare(directory: str, n: int) -> dict[str, float]:
    out = {}
    for mode in ("thread", "inline"):
        url = f"file://{directory}/offload-{mode}?offload={mode}"
        entries = [make_entry(f"off-{i // 10}", f"c{i % 10}") for i in range(n)]

        async def run(url: str = url, entries: list[TokenEntry] = entries) -> list[float]:
            store = open_store(url)
            lat = []
            for e in entries:
                t = time.perf_counter()
                await store.put(e)
                lat.append(time.perf_counter() - t)
            await store.close()
            return lat

        lat = asyncio.run(run())
        out[f"{mode}_p50_ms"] = pct(lat, 0.5) * 1e3
        out[f"{mode}_p99_ms"] = pct(lat, 0.99) * 1e3
    return out


# --------------------------------------------------------------------------- main


def measure(
    args: argparse.Namespace, stores: list[str], base: str, pg: Any, run: int
) -> dict[str, Any]:
    """One full pass over every scenario (fresh backends, named by ``run``)."""
    results: dict[str, Any] = {}
    results["raw_fsync_1"] = raw_fsync(base, 1, 500)
    results["raw_fsync_4"] = raw_fsync(base, 4, 250)
    if "file" in stores:
        results["file_offload"] = offload_compare(f"{base}/off{run}", 300)
    for kind in stores:
        for procs in (1, 4):
            url = _url(kind, base, pg, f"{kind}{run}p{procs}")
            results[f"{kind}_put_{procs}w"] = run_writers(
                url, procs, args.puts // procs, f"{kind}{procs}"
            )
        if kind == "memory":
            # One process only: the consumer must share the backend, so measure in-process.
            results["memory_freeze_10"] = _memory_freeze(10, args.freeze_rollouts, run)
            results["memory_freeze_40"] = _memory_freeze(40, args.freeze_rollouts, run)
            continue
        url = _url(kind, base, pg, f"{kind}{run}freeze")
        results[f"{kind}_freeze_10"] = run_freeze(url, 10, args.freeze_rollouts, kind)
        results[f"{kind}_freeze_40"] = run_freeze(url, 40, args.freeze_rollouts // 2, kind)
    return results


def _median_of(runs: list[Any]) -> Any:
    if isinstance(runs[0], dict):
        return {k: _median_of([r[k] for r in runs]) for k in runs[0]}
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--puts", type=int, default=800, help="puts per scenario (split by writers)")
    ap.add_argument("--stores", default="memory,file,sqlite,postgres")
    ap.add_argument("--dir", default=None, help="directory for file/sqlite data (local disk)")
    ap.add_argument("--freeze-rollouts", type=int, default=20)
    ap.add_argument(
        "--repeat", type=int, default=1, help="full passes; the table shows per-metric medians"
    )
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="zephon-bench-", dir=args.dir)
    stores = args.stores.split(",")
    pg = None
    runs = []
    try:
        if "postgres" in stores:
            # the throwaway server lives with the test support code, in the source checkout
            sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            from tests.capture._pgserver import EmbeddedPostgres

            pg = EmbeddedPostgres()
            pg.start()
        for run in range(args.repeat):
            runs.append(measure(args, stores, base, pg, run))
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(base, ignore_errors=True)
    results: dict[str, Any] = _median_of(runs)
    results.update(
        entry_tokens=PROMPT + GEN,
        entry_bytes=len(make_entry("x", "y").canonical_bytes()),
        cpus=os.cpu_count(),
        repeat=args.repeat,
        load_avg=os.getloadavg()[0],
    )
    _print_table(results, stores)
    print(json.dumps(results, sort_keys=True))


def _memory_freeze(calls: int, rollouts: int, run_no: int) -> dict[str, float]:
    async def run() -> dict[str, float]:
        store = open_store(f"memory://bench-freeze-{run_no}")
        first, again = [], []
        for r in range(rollouts):
            rid = f"m{calls}-{r}"
            for c in range(calls):
                await store.put(make_entry(rid, f"c{c}"))
            t = time.perf_counter()
            await store.freeze(rid)
            first.append(time.perf_counter() - t)
            for _ in range(5):
                t = time.perf_counter()
                await store.freeze(rid)
                again.append(time.perf_counter() - t)
        return {
            "first_p50_ms": pct(first, 0.5) * 1e3,
            "first_p99_ms": pct(first, 0.99) * 1e3,
            "again_p50_ms": pct(again, 0.5) * 1e3,
            "again_p99_ms": pct(again, 0.99) * 1e3,
        }

    return asyncio.run(run())


def _url(kind: str, base: str, pg: Any, name: str) -> str:
    if kind == "memory":
        return f"memory://{name}"
    if kind == "file":
        return f"file://{base}/{name}"
    if kind == "sqlite":
        return f"sqlite://{base}/{name}.db"
    if kind == "postgres":
        import psycopg

        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        return f"{pg.dsn}?schema={name}"
    raise ValueError(kind)


def _print_table(r: dict[str, Any], stores: list[str]) -> None:
    print(
        f"entry: {r['entry_tokens']} tokens, {r['entry_bytes']} bytes canonical JSON; "
        f"median of {r['repeat']} pass(es); load average at the end {r['load_avg']:.1f}"
    )
    head = (
        f"{'store':10s} {'put p50/p99 1w (ms)':>20s} {'puts/s 1w':>10s} "
        f"{'put p50/p99 4w (ms)':>20s} {'puts/s 4w':>10s} {'freeze10 1st/again':>20s} "
        f"{'freeze40 1st/again':>20s}"
    )
    print(head)
    print("-" * len(head))
    for kind in stores:
        one, four = r[f"{kind}_put_1w"], r[f"{kind}_put_4w"]
        f10, f40 = r[f"{kind}_freeze_10"], r[f"{kind}_freeze_40"]
        print(
            f"{kind:10s} {one['p50_ms']:9.2f}/{one['p99_ms']:<9.2f} {one['puts_per_s']:10.0f} "
            f"{four['p50_ms']:9.2f}/{four['p99_ms']:<9.2f} {four['puts_per_s']:10.0f} "
            f"{f10['first_p50_ms']:9.2f}/{f10['again_p50_ms']:<9.3f} "
            f"{f40['first_p50_ms']:9.2f}/{f40['again_p50_ms']:<9.3f}"
        )
    for n in (1, 4):
        raw = r[f"raw_fsync_{n}"]
        print(
            f"raw write+fdatasync of one entry, {n} proc: p50 {raw['p50_ms']:.3f} ms, "
            f"p99 {raw['p99_ms']:.3f} ms, {raw['puts_per_s']:.0f}/s"
        )
    if "file_offload" in r:
        o = r["file_offload"]
        print(
            f"file put offload: thread p50 {o['thread_p50_ms']:.3f} / p99 {o['thread_p99_ms']:.3f}"
            f" ms; inline p50 {o['inline_p50_ms']:.3f} / p99 {o['inline_p99_ms']:.3f} ms"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()

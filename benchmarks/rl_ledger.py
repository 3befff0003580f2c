"""Prompt-ledger moves per second on a stream of 10k prompts (file, sqlite, postgres).

The stream is seeded with ``--prompts`` issued prompts of ``--n`` members each (written as one
whole ledger, the format every version reads), then one client times ``--moves`` single-member
moves (``advance`` to captured) and ``--moves`` issues of new prompts, each one durable
transaction. ``first_ms`` is the client's first move (it reads the whole stream once);
``read_ms`` the median of 5 ``stream_ledger`` reads (a copy of the whole ledger);
``admit_ms`` the median look of a streaming source at a second stream of as many prompts,
all trained but the last 8 (``read_stream`` with ``admit``: what one admission reads once the
client holds the stream; -1 for a tree without ``read_stream``).

``--baseline-src DIR`` also runs the same measurement in a child process against another
source tree (e.g. ``git archive <commit> src | tar -x -C /tmp/before``), so the table shows
before / after on the same machine. Prints a table and a final JSON line.

Usage: ``python benchmarks/rl_ledger.py [--prompts 10000] [--n 4] [--moves 100]
[--stores file,sqlite,postgres] [--baseline-src /tmp/before/src]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _seed_ledger(prompts: int, n: int, stream: str = "bench", in_flight: int = -1) -> bytes:
    """``prompts`` issued prompts; with ``in_flight`` >= 0, all but the last ``in_flight``
    trained and the rest scored (a long run's history: what admission looks at)."""
    from zephon.capture.ledger import StreamLedger

    ledger = StreamLedger(stream=stream)
    for p in range(prompts):
        payload = {"question": f"what is {p} + {p}?", "i": p}
        ledger.issue(p, str(p), payload, n, {"epoch": 0, "offset": p + 1}, 0, 1.7e9)
    if in_flight >= 0:
        refs = [(p, i) for p in range(prompts) for i in range(n)]
        for state in ("captured", "scored"):
            ledger.advance(refs, state)
        ledger.advance([r for r in refs if r[0] < prompts - in_flight], "trained", step=0)
    return ledger.to_json()


def _seed(kind: str, url: str, ledgers: dict[str, bytes], tmp: str) -> None:
    """Write the seeded ledgers where ``kind`` keeps a stream's whole value."""
    from zephon.capture.stores import open_store

    asyncio.run(open_store(url).close())  # creates the tables / directory
    for stream, ledger in ledgers.items():
        if kind == "file":
            line = b"L %08x " % zlib.crc32(ledger) + ledger + b"\n"
            Path(tmp, "capture", f"{stream}.stream").write_bytes(line)
        elif kind == "sqlite":
            with sqlite3.connect(os.path.join(tmp, "capture.db")) as conn:
                conn.execute("INSERT INTO capture_streams VALUES (?, ?)", (stream, ledger))
        else:
            import psycopg

            dsn, schema = url.split("?schema=")
            opts = f"-c search_path={schema}"
            with psycopg.connect(dsn, autocommit=True, options=opts) as conn:
                conn.execute("INSERT INTO capture_streams VALUES (%s, %b)", (stream, ledger))


async def _time(url: str, prompts: int, moves: int, n: int) -> dict[str, float]:
    from zephon.capture.stores import open_store

    store = open_store(url)
    t0 = time.perf_counter()
    await store.advance("bench", [(0, 1)], "captured")
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for k in range(moves):
        await store.advance("bench", [(k, 0)], "captured")
    advance = time.perf_counter() - t0
    t0 = time.perf_counter()
    for k in range(moves):
        await store.issue_prompt("bench", prompts + k, prompt_key=f"new{k}", payload=None, n=n)
    issue = time.perf_counter() - t0
    reads, admits = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        await store.stream_ledger("bench")
        reads.append(time.perf_counter() - t0)
    if hasattr(store, "read_stream"):  # a look of StreamingCaptureSource (after its first)
        for _ in range(6):
            t0 = time.perf_counter()
            await store.read_stream("hist", lambda led: led.admit(1, 100, 1))
            admits.append(time.perf_counter() - t0)
    await store.close()
    return {
        "first_ms": round(first * 1e3, 1),
        "advance_per_s": round(moves / advance, 1),
        "issue_per_s": round(moves / issue, 1),
        "read_ms": round(sorted(reads)[2] * 1e3, 1),
        "admit_ms": round(sorted(admits[1:])[2] * 1e3, 2) if admits else -1.0,
    }


def _pg_url(dsn: str, tmp: str) -> str:
    import psycopg

    schema = "bench_" + os.path.basename(tmp).replace("-", "_").lower()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return f"{dsn}?schema={schema}"


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """This process's source tree, every store of ``--stores``."""
    ledgers = {
        "bench": _seed_ledger(args.prompts, args.n),
        "hist": _seed_ledger(args.prompts, args.n, "hist", in_flight=8),
    }
    rows = []
    for kind in args.stores.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            url = {
                "file": f"file://{tmp}/capture",
                "sqlite": f"sqlite://{tmp}/capture.db",
            }.get(kind) or _pg_url(args.pg_dsn, tmp)
            _seed(kind, url, ledgers, tmp)
            timing = asyncio.run(_time(url, args.prompts, args.moves, args.n))
        rows.append({"store": kind, "prompts": args.prompts, **timing})
    return rows


def _baseline(args: argparse.Namespace) -> list[dict[str, Any]]:
    cmd = [sys.executable, __file__, "--child", "--src", args.baseline_src]
    for name in ("prompts", "n", "moves", "stores", "pg_dsn"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows: list[dict[str, Any]] = json.loads(out.strip().splitlines()[-1])
    return rows


def _table(after: list[dict[str, Any]], before: list[dict[str, Any]]) -> None:
    head = f"{'store':8} {'version':8} {'first ms':>9} {'advance/s':>10} {'issue/s':>9}"
    print(head + f" {'read ms':>8} {'admit ms':>9}")
    for label, rows in (("before", before), ("after", after)):
        for r in rows:
            print(
                f"{r['store']:8} {label:8} {r['first_ms']:9.1f} {r['advance_per_s']:10.1f} "
                f"{r['issue_per_s']:9.1f} {r['read_ms']:8.1f} {r.get('admit_ms', -1.0):9.2f}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=10_000)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--moves", type=int, default=100)
    ap.add_argument("--stores", default="file,sqlite,postgres")
    ap.add_argument("--baseline-src", default="")
    ap.add_argument("--src", default=str(REPO / "src"))
    ap.add_argument("--pg-dsn", default="")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, args.src)
    if args.child:
        print(json.dumps(measure(args)))
        return
    pg = None
    try:
        if "postgres" in args.stores.split(",") and not args.pg_dsn:
            # the throwaway server lives with the test support code, in the source checkout
            sys.path.insert(0, str(REPO))
            from tests.capture._pgserver import EmbeddedPostgres

            pg = EmbeddedPostgres()
            pg.start()
            args.pg_dsn = pg.dsn
        before = _baseline(args) if args.baseline_src else []
        after = measure(args)
    finally:
        if pg is not None:
            pg.stop()
    _table(after, before)
    result = {"after": after, "before": before, "n": args.n, "moves": args.moves}
    result["cpus"] = os.cpu_count()
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()

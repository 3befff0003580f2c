"""The RL data plane's latency per trained batch, and what a trainer waits on.

A generator thread plays the engine: it draws prompts with ``PromptSource.backfill`` (``--in-
flight`` groups), "generates" each member in ``--engine-ms`` (a sleep: the engine's time), puts
its capture and score and marks it captured and scored. The trainer (the main thread) reads a
``StreamingCaptureSource`` pipeline, ``--groups-per-step`` groups a batch, and marks each
batch trained (one durable transaction). Per store it reports, per trained batch:

* ``added_ms``: from the moment the batch's last group was scored (its last ledger move) to
  the moment the trainer holds the batch, minus nothing: all of it is the data plane's (the
  source's poll interval, the admission-log append, reading and building the captures);
* ``trainer_ledger_ms``: the trainer thread's own ledger I/O (marking the batch trained);
* ``trainer_wait_ms``: the trainer thread blocked on the pipeline, and how the source thread
  spent that time: ``engine_wait_ms`` (no complete group yet: the engine), ``ledger_ms``
  (ledger looks and admission-log appends), ``build_ms`` (reading captures and scores).

Usage: ``python benchmarks/rl_loop.py [--stores memory,file,sqlite,postgres] [--prompts 64]
[--engine-ms 20] [--poll-s 0.01]``. Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from tests.capture._workload import make_entry  # noqa: E402

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource  # noqa: E402
from zephon.capture.dataset import run_sync  # noqa: E402
from zephon.capture.rl import PromptSource  # noqa: E402
from zephon.capture.scores import RolloutScore  # noqa: E402
from zephon.capture.stores import open_store  # noqa: E402
from zephon.capture.streaming import StreamingCaptureSource  # noqa: E402

STREAM = "bench"


def _prompts(count: int) -> Pipeline:
    rows = [{"i": i} for i in range(count)]
    return Pipeline(
        StaticMixtureWorkSource(
            datasets=[Dataset.from_records("p", rows)],
            mixture=MixtureSpec({"p": 1.0}),
            chunk_size=8,
            seed=0,
        )
    )


async def _generate(url: str, args: argparse.Namespace, ready: dict[int, float]) -> None:
    """The engine: every member takes ``engine_ms``; ``ready[position]`` = when its group's
    last member was scored."""
    store = open_store(url)
    source = await PromptSource.open(store, STREAM, _prompts(args.prompts), n=args.n)
    version = 0
    while groups := await source.backfill(args.in_flight, weight_version=version):
        for group in groups:
            for m in group.members:
                ref = [(group.position, m.index, m.attempt)]
                await asyncio.sleep(args.engine_ms / 1e3)
                await store.put(make_entry(m.rollout_id, "call-0", prompt=64, gen=64))
                await store.advance(STREAM, ref, "captured")
                reward = float(m.index)  # members differ: no group is all-equal
                score = RolloutScore(rollout_id=m.rollout_id, verifier="v", reward=reward)
                await store.put_score(score)
                await store.advance(STREAM, ref, "scored")
            ready[group.position] = time.perf_counter()
        version = len(ready) // args.groups_per_step
    await store.close()


def _train(url: str, args: argparse.Namespace, ready: dict[int, float]) -> dict[str, float]:
    store = open_store(url)
    source = StreamingCaptureSource(
        store,
        STREAM,
        groups_per_step=args.groups_per_step,
        max_staleness=args.max_staleness,
        prompts=args.prompts,
        poll_s=args.poll_s,
    )
    added, ledger, waits, batch = [], [], [], []
    it = iter(source.pipeline())
    began = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        record = next(it, None)
        waits.append(time.perf_counter() - t0)
        if record is not None:
            batch.append(record.payload)
        if batch and (record is None or len(batch) == args.groups_per_step):
            got = time.perf_counter()
            added.append(got - max(ready[g["position"]] for g in batch))
            refs = [(g["position"], m["index"], m["attempt"]) for g in batch for m in g["members"]]
            t0 = time.perf_counter()
            run_sync(store.advance(STREAM, refs, "trained", step=len(ledger)))
            ledger.append(time.perf_counter() - t0)
            batch = []
        if record is None:
            break
    total = time.perf_counter() - began
    run_sync(store.close())
    steps = len(ledger)
    t = source.timings
    return {
        "batches": steps,
        "added_ms_p50": round(statistics.median(added) * 1e3, 2),
        "added_ms_max": round(max(added) * 1e3, 2),
        "trainer_ledger_ms": round(sum(ledger) / steps * 1e3, 2),
        "trainer_wait_ms": round(sum(waits) / steps * 1e3, 2),
        "engine_wait_ms": round(t["engine_wait_s"] / steps * 1e3, 2),
        "ledger_ms": round(t["ledger_s"] / steps * 1e3, 2),
        "build_ms": round(t["build_s"] / steps * 1e3, 2),
        "engine_ms": round(args.engine_ms * args.n * args.groups_per_step, 2),
        "wall_s": round(total, 2),
    }


def _one(kind: str, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    url = {
        "memory": f"memory://bench-{os.getpid()}",
        "file": f"file://{tmp}/capture",
        "sqlite": f"sqlite://{tmp}/capture.db",
    }.get(kind) or _pg_url(args.pg_dsn, tmp)
    ready: dict[int, float] = {}
    gen = threading.Thread(target=lambda: asyncio.run(_generate(url, args, ready)))
    gen.start()
    try:
        return {"store": kind, **_train(url, args, ready)}
    finally:
        gen.join()


def _pg_url(dsn: str, tmp: str) -> str:
    import psycopg

    schema = "bench_" + os.path.basename(tmp).replace("-", "_").lower()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return f"{dsn}?schema={schema}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", default="memory,file,sqlite,postgres")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--groups-per-step", type=int, default=2)
    ap.add_argument("--max-staleness", type=int, default=2)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--engine-ms", type=float, default=20.0)
    ap.add_argument("--poll-s", type=float, default=0.01)
    ap.add_argument("--pg-dsn", default="")
    args = ap.parse_args()
    pg = None
    rows = []
    try:
        if "postgres" in args.stores.split(",") and not args.pg_dsn:
            from tests.capture._pgserver import EmbeddedPostgres

            pg = EmbeddedPostgres()
            pg.start()
            args.pg_dsn = pg.dsn
        for kind in args.stores.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(_one(kind, args, tmp))
    finally:
        if pg is not None:
            pg.stop()
    keys = [k for k in rows[0] if k != "store"]
    print(f"{'store':8} " + " ".join(f"{k:>17}" for k in keys))
    for r in rows:
        print(f"{r['store']:8} " + " ".join(f"{r[k]:>17}" for k in keys))
    print(json.dumps({"rows": rows, "args": vars(args), "cpus": os.cpu_count()}, sort_keys=True))


if __name__ == "__main__":
    main()

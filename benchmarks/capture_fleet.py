"""A capture fleet under faults: throughput, added latency and what the faults cost.

Starts, as real processes on 127.0.0.1, an embedded PostgreSQL server, the deterministic test
engine and ``--proxies`` ``zephon capture serve`` proxies with ``--workers`` workers each, then
drives ``--rollouts`` multi-turn rollouts whose turns land on random proxies while one whole
proxy is SIGKILLed and restarted, ``zephon capture conformance`` runs against the same server
and PostgreSQL is restarted (``tests/capture/proxy/_fleet.py``). Every acknowledged call is
then checked in the store, every rollout that lost a generation must be masked, and every
trainable trajectory must equal the engine's tokens; the run fails (exit 1) otherwise.

Numbers: acknowledged calls per second over the whole drive (faults included), and the latency
a proxy adds over calling the engine directly (sequential calls after the drive, each sent both
ways with the same conversation; p50 and p99 of the per-call difference).

Usage: ``python benchmarks/capture_fleet.py [--rollouts 1000] [--proxies 3] [--workers 2]
[--concurrency 48]``. Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.capture.proxy._fleet import FleetPlan, run_fleet  # noqa: E402
from tests.capture.proxy.inference_stub import train_tokenizer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=1000)
    ap.add_argument("--proxies", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--probe-calls", type=int, default=200)
    ap.add_argument("--seed", type=int, default=20)
    args = ap.parse_args()
    plan = FleetPlan(
        rollouts=args.rollouts,
        proxies=args.proxies,
        workers=args.workers,
        concurrency=args.concurrency,
        probe_calls=args.probe_calls,
        seed=args.seed,
    )
    tmp = Path(tempfile.mkdtemp(prefix="zephon-bench-fleet-"))
    tokenizer = Path(train_tokenizer(str(tmp / "tokenizer.json")))
    report = asyncio.run(run_fleet(plan, tokenizer, tmp))

    from rich.console import Console
    from rich.table import Table

    row = report.as_json()
    table = Table(
        title=f"capture fleet: {args.proxies} proxies x {args.workers} workers, one engine, "
        "one PostgreSQL; a proxy SIGKILLed and restarted, PostgreSQL restarted"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in row.items():
        table.add_row(key.replace("_", " "), str(value))
    table.add_row("conformance", report.conformance if report.conformance == "passed" else "FAILED")
    table.add_row("problems", str(len(report.problems)))
    Console(width=160).print(table)
    for problem in report.problems[:20]:
        print(problem, file=sys.stderr)
    ok = report.conformance == "passed" and not report.problems
    print(json.dumps({"benchmark": "capture_fleet", "ok": ok, **row}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Capture proxy under a flood: a well-behaved client's latency and the proxy's memory.

Runs the deterministic test engine and ``zephon capture serve`` (one worker, a file store,
default limits unless given) as real processes on 127.0.0.1, measures a well-behaved client's
sequential capture calls alone (baseline), then again while ``zephon.capture.testing.run_flood``
sends 100 MB bodies, slow requests and idle connections. Reports p50/p99/max latency, the
proxy's peak RSS next to its bound (100 MiB + 2 x --max-buffered-bytes), and the attackers'
outcomes.

Usage: ``python benchmarks/proxy_flood.py [--duration 30] [--big 8] [--slow 200] [--idle 500]
[--proxy-args "--header-timeout 2"]``. Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.capture.proxy._procs import start_inference_stub, start_proxy  # noqa: E402
from tests.capture.proxy.inference_stub import train_tokenizer  # noqa: E402

from zephon.capture.testing import FloodPlan, FloodReport, run_flood  # noqa: E402

MIB = 2**20
TOKEN = "bench-secret"


def _row(name: str, report: FloodReport, bound: int) -> dict[str, Any]:
    return {
        "phase": name,
        "calls": len(report.latencies_s),
        "errors": sum(n for code, n in report.good_statuses.items() if code != 200),
        "p50_s": round(report.quantile(0.5), 4),
        "p99_s": round(report.quantile(0.99), 4),
        "max_s": round(max(report.latencies_s, default=0.0), 4),
        "peak_rss_mib": round(report.peak_rss_bytes / MIB, 1),
        "rss_bound_mib": round(bound / MIB, 1),
        "big": dict(report.big_outcomes),
        "slow_closed": report.slow_closed,
        "idle_closed": report.idle_closed,
    }


def _buffered(proxy_args: list[str]) -> int:
    if "--max-buffered-bytes" in proxy_args:
        return int(proxy_args[proxy_args.index("--max-buffered-bytes") + 1])
    return 256 * MIB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--big", type=int, default=8)
    ap.add_argument("--body-mib", type=int, default=100)
    ap.add_argument("--slow", type=int, default=200)
    ap.add_argument("--idle", type=int, default=500)
    ap.add_argument("--proxy-args", default="", help="extra `zephon capture serve` options")
    args = ap.parse_args()
    proxy_args = shlex.split(args.proxy_args)
    tmp = Path(tempfile.mkdtemp(prefix="zephon-bench-flood-"))
    engine = start_inference_stub(Path(train_tokenizer(str(tmp / "tokenizer.json"))), tmp)
    store = f"file://{tmp / 'capture'}"
    proxy = start_proxy(engine.url, store, tmp, "--control-token", TOKEN, *proxy_args)
    headers = {"x-zephon-capture-token": TOKEN}
    bound = 100 * MIB + 2 * _buffered(proxy_args)
    try:
        quiet = FloodPlan(
            duration_s=min(10.0, args.duration),
            big_clients=0,
            slow_clients=0,
            idle_connections=0,
            headers=headers,
        )
        flood = FloodPlan(
            duration_s=args.duration,
            big_clients=args.big,
            big_body_bytes=args.body_mib * MIB,
            slow_clients=args.slow,
            idle_connections=args.idle,
            headers=headers,
        )
        rows = [
            _row("alone", run_flood(proxy.url, proxy.popen.pid, quiet), bound),
            _row("flood", run_flood(proxy.url, proxy.popen.pid, flood), bound),
        ]
    finally:
        proxy.stop()
        engine.stop()
    from rich.console import Console
    from rich.table import Table

    table = Table(title="capture proxy under a flood (1 worker, file store)")
    for key in rows[0]:
        table.add_column(key)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    Console(width=200).print(table)
    print(
        json.dumps({"benchmark": "capture_proxy_flood", "proxy_args": proxy_args, "results": rows})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

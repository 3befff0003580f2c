"""What one prompt-ledger move costs as a stream grows (file, sqlite; postgres with --pg URL).

A store keeps a stream's ledger as one JSON value, so a move writes it whole: this measures
the median time of ``advance`` (one member, captured) and of ``issue_prompt`` after
``--sizes`` prompts of ``--n`` members each, so the docs' "thousands of prompts per stream,
not yet millions" stays a measured statement.

Usage: ``python benchmarks/rl_ledger.py [--sizes 100 1000 4000] [--n 4] [--moves 30]
[--pg postgresql://...]``. Prints one line per (store, size) and a final JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from zephon.capture.stores import open_store  # noqa: E402


async def _measure(url: str, sizes: list[int], n: int, moves: int) -> list[dict[str, Any]]:
    store = open_store(url)
    rows: list[dict[str, Any]] = []
    issued = 0
    for size in sizes:
        while issued < size:
            payload = {"question": f"what is {issued} + {issued}?", "i": issued}
            await store.issue_prompt("bench", issued, prompt_key=str(issued), payload=payload, n=n)
            issued += 1
        advance, issue = [], []
        for k in range(moves):
            t0 = time.perf_counter()
            await store.advance("bench", [(k, 0)], "captured")
            advance.append(time.perf_counter() - t0)
        for _ in range(moves):
            t0 = time.perf_counter()
            await store.issue_prompt("bench", issued, prompt_key=str(issued), payload=None, n=n)
            issue.append(time.perf_counter() - t0)
            issued += 1
        await store.advance("bench", [(k, 0) for k in range(moves)], "filtered", reason="bench")
        ledger_bytes = len((await store.stream_ledger("bench")).to_json())
        rows.append(
            {
                "store": url.split(":", 1)[0],
                "prompts": size,
                "ledger_kb": round(ledger_bytes / 1024, 1),
                "advance_ms_p50": round(statistics.median(advance) * 1e3, 2),
                "issue_ms_p50": round(statistics.median(issue) * 1e3, 2),
            }
        )
        print(rows[-1], flush=True)
    await store.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 4000])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--moves", type=int, default=30)
    parser.add_argument("--pg", default="")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        urls = [f"file://{tmp}/capture", f"sqlite://{tmp}/capture.db"]
        if args.pg:
            urls.append(args.pg)
        for url in urls:
            results += asyncio.run(_measure(url, sorted(args.sizes), args.n, args.moves))
    print(json.dumps(results))


if __name__ == "__main__":
    main()

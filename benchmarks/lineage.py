"""Lineage resolve latency and builder throughput.

* resolve: a 100-call tool-using rollout is written to a store one call at a time; after each
  put a second client (its own incremental cache) resolves the next request, which carries
  the whole history. Reported: p50 / p99 per resolve, and the cost of one resolve by a fresh
  client over the full 100-call rollout (cold cache).
* builder: 10-call rollouts of 4096 tokens (3:1 prompt/generation growth), frozen snapshots
  built into trajectories with :func:`build_rollout`. Reported: rollouts/s and tokens/s.

Usage: ``python benchmarks/lineage.py [--stores memory,file,sqlite] [--rollouts 200]``.
Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from typing import Any

from zephon.capture.builder import build_rollout
from zephon.capture.lineage import stamp_continuation
from zephon.capture.records import (
    ParentResolutionStatus,
    TokenCaptureSnapshot,
    TokenEntry,
    compute_digest,
)
from zephon.capture.stores import open_store


def _entry(rid: str, k: int, prompt: list[int], gen: list[int], parent: str | None) -> TokenEntry:
    full = prompt + gen
    return TokenEntry(
        rollout_id=rid,
        model_call_id=f"call-{k:04d}",
        prompt_token_ids=prompt,
        generation_token_ids=gen,
        generation_log_probs=[-0.5] * len(gen),
        output_items=[
            {
                "type": "function_call",
                "call_id": f"t{k}",
                "name": "search",
                "arguments": json.dumps({"q": f"step {k}", "page": k}),
            }
        ],
        token_item_index=0,
        parent_call_id=parent,
        parent_resolution=ParentResolutionStatus.RESOLVED
        if parent
        else ParentResolutionStatus.ROOT,
        cum_len=len(full),
        digest=compute_digest(full),
        created_at=float(k),
    )


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def bench_resolve(url: str, calls: int, tokens_per_call: int) -> dict[str, float]:
    writer, reader = open_store(url), open_store(url)
    rid = f"bench-{uuid.uuid4().hex[:8]}"
    items: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Research the topic."},
    ]
    prompt = list(range(64))
    parent = None
    latencies = []
    for k in range(calls):
        gen = [(k * 31 + i) % 50000 for i in range(tokens_per_call)]
        entry = stamp_continuation(_entry(rid, k, prompt, gen, parent), items)
        await writer.put(entry)
        items = [
            *items,
            *entry.output_items,
            {"type": "function_call_output", "call_id": f"t{k}", "output": "x" * 400},
        ]
        t0 = time.perf_counter()
        res = await reader.resolve(rid, items)
        latencies.append(time.perf_counter() - t0)
        assert res.match is not None and res.match.model_call_id == entry.model_call_id
        parent = entry.model_call_id
        prompt = prompt + gen + [7] * 32
    cold = []
    for _ in range(5):
        fresh = open_store(url)
        t0 = time.perf_counter()
        res = await fresh.resolve(rid, items)
        cold.append(time.perf_counter() - t0)
        assert res.match is not None
        await fresh.close()
    await writer.close()
    await reader.close()
    return {
        "resolve_p50_ms": statistics.median(latencies) * 1e3,
        "resolve_p99_ms": _pct(latencies, 0.99) * 1e3,
        "resolve_cold_ms": statistics.median(cold) * 1e3,
    }


def make_snapshot(i: int, calls: int = 10, total: int = 4096) -> TokenCaptureSnapshot:
    per = total // calls  # each call adds `per` tokens: 3/4 prompt growth, 1/4 generation
    gen_n = per // 4
    entries = []
    prompt = [(i * 7 + j) % 50000 for j in range(per - gen_n)]
    parent = None
    for k in range(calls):
        gen = [(i + k * 13 + j) % 50000 for j in range(gen_n)]
        e = _entry(f"r{i}", k, prompt, gen, parent)
        entries.append(e)
        parent = e.model_call_id
        prompt = prompt + gen + [(k + j) % 50000 for j in range(per - gen_n)]
    return TokenCaptureSnapshot(
        rollout_id=f"r{i}", entries=tuple(entries), incomplete=False, snapshot_id="s", version=1
    )


def bench_builder(rollouts: int) -> dict[str, float]:
    snaps = [make_snapshot(i) for i in range(rollouts)]
    t0 = time.perf_counter()
    tokens = 0
    for snap in snaps:
        built = build_rollout(snap)
        assert built.trajectory is not None
        tokens += len(built.trajectory)
    dt = time.perf_counter() - t0
    return {"rollouts_per_s": rollouts / dt, "tokens_per_s": tokens / dt, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stores", default="memory,file,sqlite")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--tokens-per-call", type=int, default=40)
    ap.add_argument("--rollouts", type=int, default=200)
    args = ap.parse_args()
    results: dict[str, Any] = {"resolve": {}, "calls": args.calls}
    with tempfile.TemporaryDirectory() as tmp:
        urls = {
            "memory": "memory://bench",
            "file": f"file://{tmp}/file",
            "sqlite": f"sqlite://{tmp}/capture.db",
        }
        for kind in args.stores.split(","):
            results["resolve"][kind] = asyncio.run(
                bench_resolve(urls[kind], args.calls, args.tokens_per_call)
            )
    results["builder"] = bench_builder(args.rollouts)
    print(f"{'store':8} {'resolve p50 ms':>15} {'p99 ms':>8} {'cold (100 calls) ms':>20}")
    for kind, r in results["resolve"].items():
        print(
            f"{kind:8} {r['resolve_p50_ms']:15.3f} {r['resolve_p99_ms']:8.3f} "
            f"{r['resolve_cold_ms']:20.2f}"
        )
    b = results["builder"]
    print(
        f"builder: {b['rollouts_per_s']:.0f} rollouts/s ({b['tokens_per_s'] / 1e6:.2f} M tokens/s)"
        f" for 10-call rollouts of {b['tokens'] // args.rollouts} tokens"
    )
    print(json.dumps({"benchmark": "lineage", **results}, sort_keys=True))


if __name__ == "__main__":
    main()

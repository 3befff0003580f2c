"""Bounded recovery: checkpoint size and restore-to-first-batch time after 10, 100, 1000 steps.

Both must stay flat: a checkpoint holds per-lane cursors and source states, never the
history, and a restore regenerates only the chunks still in flight. Prints a table and a
final JSON line. Usage: ``python benchmarks/checkpoint.py``.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource


def build(docs: int, lanes: int) -> Pipeline:
    rows = [{"id": i, "text": f"document {i} " + "token " * (i % 50)} for i in range(docs)]
    datasets = [
        Dataset.from_records("a", rows[: docs // 2], shard_size=2000),
        Dataset.from_records("b", rows[docs // 2 :], shard_size=2000),
    ]
    source = StaticMixtureWorkSource(
        datasets=datasets,
        mixture=MixtureSpec({"a": 0.7, "b": 0.3}),
        chunk_size=256,
        seed=1,
    )
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes", max_length=256)
        .batch(8)
        .options(runner="threads", canonical_replicas=lanes)
    )


def measure(steps: int, docs: int, lanes: int) -> dict[str, Any]:
    pipe = build(docs, lanes)
    it = iter(pipe)
    for _ in range(steps):
        next(it)
    start = time.perf_counter()
    state = pipe.checkpoint()
    checkpoint_ms = (time.perf_counter() - start) * 1e3
    expected = next(it)
    it.close()  # type: ignore[attr-defined]
    blob = json.dumps(state)

    restored = build(docs, lanes).restore(json.loads(blob))
    start = time.perf_counter()
    first = next(iter(restored))
    restore_s = time.perf_counter() - start
    assert first.ids == expected.ids, "restore did not continue where the checkpoint was taken"
    return {
        "steps": steps,
        "checkpoint_bytes": len(blob),
        "checkpoint_ms": round(checkpoint_ms, 3),
        "restore_to_first_batch_s": round(restore_s, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=60_000)
    parser.add_argument("--lanes", type=int, default=4)
    args = parser.parse_args()
    rows = [measure(steps, args.docs, args.lanes) for steps in (10, 100, 1000)]
    cols = list(rows[0])
    print(" | ".join(f"{c:>24}" for c in cols))
    for row in rows:
        print(" | ".join(f"{row[c]:>24}" for c in cols))
    print(json.dumps({"benchmark": "checkpoint", "lanes": args.lanes, "rows": rows}))


if __name__ == "__main__":
    main()

"""Elastic resume under each lane mapping: global steps kept, packing efficiency, throughput.

Table 1: a run of ``W`` ranks x ``grad_accum`` checkpoints after step 3 (every rank, merged) and
resumes on another layout; how many of the next steps train on the same set of batches as the
uninterrupted run (a resume with another global batch is compared with the union of the
uninterrupted steps it covers). Table 2: each rank of a 2-rank run over 8 lanes, both mappings:
batches/s, tokens/s and packing efficiency (non-padding tokens / all tokens) of
tokenize -> shuffle -> pack_flat -> batch. Throughput is a ratio within one run, best of 3.
Prints the tables and a final JSON line. Usage: ``python benchmarks/elastic.py [--docs 20000]``.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from zephon import Dataset, Pipeline, StaticMixtureWorkSource, merge_checkpoints

ROW = 256
LAYOUTS = [  # (saved ranks, grad-accum) -> (resumed ranks, grad-accum)
    ((2, 1), (1, 2)),
    ((2, 2), (4, 1)),
    ((4, 1), (2, 2)),
    ((2, 1), (4, 1)),
]
CHECKPOINT_AT, LATER = 3, 6


def build(docs: int, lanes: int, **options: Any) -> Pipeline:
    rows = [{"text": f"document {i} " + "token " * (i * 37 % 120)} for i in range(docs)]
    source = StaticMixtureWorkSource([Dataset.from_records("d", rows)], chunk_size=256, seed=1)
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes", max_length=ROW)
        .shuffle(64, seed=2)
        .pack_flat(ROW, pad_token_id=0)
        .batch(4)
        .options(canonical_replicas=lanes, **options)
    )


def key(batch: Any) -> bytes:
    return b"".join(r.payload["input_ids"].tobytes() for r in batch.records)


def steps(iters: list[Any], grad_accum: int, count: int) -> list[frozenset[bytes]]:
    return [
        frozenset(key(next(it)) for it in iters for _ in range(grad_accum)) for _ in range(count)
    ]


def kept(docs: int, mapping: str, saved: tuple[int, int], resumed: tuple[int, int]) -> int:
    (world, accum), (new_world, new_accum) = saved, resumed
    opts = {"runner": "inline", "mapping": mapping}
    per = (new_world * new_accum) // (world * accum)  # uninterrupted steps per resumed step
    ref_iters = [iter(build(docs, 4, dp_rank=r, dp_world_size=world, **opts)) for r in range(world)]
    reference = steps(ref_iters, accum, CHECKPOINT_AT + LATER * per)
    states = []
    for rank in range(world):
        pipe = build(docs, 4, dp_rank=rank, dp_world_size=world, **opts)
        it = iter(pipe)
        for _ in range(CHECKPOINT_AT * accum):
            next(it)
        states.append(pipe.checkpoint())
    merged = merge_checkpoints(states)
    new_iters = [
        iter(build(docs, 4, dp_rank=r, dp_world_size=new_world, **opts).restore(merged))
        for r in range(new_world)
    ]
    got = steps(new_iters, new_accum, LATER)
    expected = [
        frozenset().union(*reference[CHECKPOINT_AT + i * per : CHECKPOINT_AT + (i + 1) * per])
        for i in range(LATER)
    ]
    return sum(a == b for a, b in zip(got, expected, strict=True))


def rank_run(docs: int, mapping: str, rank: int) -> dict[str, float]:
    best, tokens, real = float("inf"), 0, 0
    for _ in range(3):
        pipe = build(docs, 8, dp_rank=rank, dp_world_size=2, mapping=mapping)
        start = time.perf_counter()
        batches = list(pipe)
        best = min(best, time.perf_counter() - start)
        ids = np.concatenate([r.payload["document_ids"] for b in batches for r in b.records])
        tokens, real = len(ids), int((ids >= 0).sum())
    return {"batches_per_s": len(batches) / best, "tokens_per_s": tokens / best,
            "packing_efficiency": real / tokens}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=20_000)
    args = parser.parse_args()
    result: dict[str, Any] = {"kept": {}, "cost": {}}
    print(f"later global steps kept of {LATER} (checkpoint after step {CHECKPOINT_AT}, 4 lanes)")
    print(f"{'resume':<22}{'contiguous':>12}{'interleaved':>12}")
    for saved, resumed in LAYOUTS:
        name = f"{saved[0]}x{saved[1]} -> {resumed[0]}x{resumed[1]}"
        row = {m: kept(args.docs // 4, m, saved, resumed) for m in ("contiguous", "interleaved")}
        result["kept"][name] = row
        print(f"{name:<22}{row['contiguous']:>12}{row['interleaved']:>12}")
    print(f"\n2 ranks x 8 lanes, {args.docs} documents, per rank (best of 3)")
    print(f"{'mapping':<13}{'rank':>5}{'batches/s':>11}{'tokens/s':>12}{'packing':>9}")
    for mapping in ("contiguous", "interleaved"):
        runs = [rank_run(args.docs, mapping, rank) for rank in range(2)]
        result["cost"][mapping] = runs
        for rank, run in enumerate(runs):
            print(f"{mapping:<13}{rank:>5}{run['batches_per_s']:>11.1f}"
                  f"{run['tokens_per_s']:>12,.0f}{run['packing_efficiency']:>9.4f}")  # fmt: skip
    ratio = sum(r["tokens_per_s"] for r in result["cost"]["interleaved"]) / sum(
        r["tokens_per_s"] for r in result["cost"]["contiguous"]
    )
    result["throughput_ratio_interleaved_over_contiguous"] = round(ratio, 3)
    print(f"\nthroughput interleaved / contiguous: {ratio:.3f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

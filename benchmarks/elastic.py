"""Elastic resume under each lane mapping: global steps kept, packing efficiency, throughput.

Table 1: a run of ``W`` ranks x ``grad_accum`` checkpoints after step 3 (every rank, merged) and
resumes on another layout; how many of the next 6 steps train on the same set of batches as the
uninterrupted run (a resume with another global batch is compared with the union of the
uninterrupted steps it covers), and whether the restore logged a regrouping warning. Table 2:
both ranks of a 2-rank run over 8 lanes, both mappings: batches/s, tokens/s and packing
efficiency (non-padding tokens / all tokens) of tokenize -> shuffle -> pack_flat -> batch.
Throughput is a ratio within one run: the mappings alternate, best of 5.
Prints the tables and a final JSON line. Usage: ``python benchmarks/elastic.py [--docs 20000]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

import numpy as np

from zephon import Dataset, Pipeline, StaticMixtureWorkSource, merge_checkpoints

ROW = 256
LAYOUTS = [  # lanes, (saved ranks, grad-accum) -> (resumed ranks, grad-accum)
    (4, (2, 1), (1, 2)),
    (4, (2, 2), (4, 1)),
    (4, (4, 1), (2, 2)),
    (8, (2, 1), (1, 2)),
    (8, (2, 2), (4, 1)),
    (8, (4, 1), (2, 2)),
    (8, (2, 1), (4, 1)),
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


class Warnings(logging.Handler):
    """Counts the zephon warnings logged while it is installed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def kept(docs: int, mapping: str, lanes: int, saved: Any, resumed: Any) -> tuple[int, bool]:
    """Later steps with the uninterrupted run's batch set, and whether the restore warned."""
    (world, accum), (new_world, new_accum) = saved, resumed
    opts = {"runner": "inline", "mapping": mapping}

    def rank(r: int, w: int) -> Pipeline:
        return build(docs, lanes, dp_rank=r, dp_world_size=w, **opts)

    per = (new_world * new_accum) // (world * accum)  # uninterrupted steps per resumed step
    reference = steps([iter(rank(r, world)) for r in range(world)], accum,
                      CHECKPOINT_AT + LATER * per)  # fmt: skip
    states = []
    for r in range(world):
        pipe = rank(r, world)
        it = iter(pipe)
        for _ in range(CHECKPOINT_AT * accum):
            next(it)
        states.append(pipe.checkpoint())
    merged = merge_checkpoints(states)
    logger, counter = logging.getLogger("zephon"), Warnings()
    logger.addHandler(counter)
    logger.propagate = False
    try:
        got = steps([iter(rank(r, new_world).restore(merged)) for r in range(new_world)],
                    new_accum, LATER)  # fmt: skip
    finally:
        logger.removeHandler(counter)
        logger.propagate = True
    expected = [
        frozenset().union(*reference[CHECKPOINT_AT + i * per : CHECKPOINT_AT + (i + 1) * per])
        for i in range(LATER)
    ]
    return sum(a == b for a, b in zip(got, expected, strict=True)), counter.count > 0


def timed_run(docs: int, mapping: str) -> tuple[float, int, int, int]:
    """Both ranks of a 2-rank run: seconds, batches, tokens, non-padding tokens."""
    seconds, batches, tokens, real = 0.0, 0, 0, 0
    for rank in range(2):
        pipe = build(docs, 8, dp_rank=rank, dp_world_size=2, mapping=mapping)
        start = time.perf_counter()
        out = list(pipe)
        seconds += time.perf_counter() - start
        ids = np.concatenate([r.payload["document_ids"] for b in out for r in b.records])
        batches, tokens, real = batches + len(out), tokens + len(ids), real + int((ids >= 0).sum())
    return seconds, batches, tokens, real


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=40_000)
    args = parser.parse_args()
    result: dict[str, Any] = {"kept": {}, "cost": {}}
    print(f"later global steps kept of {LATER} (checkpoint after step {CHECKPOINT_AT}; "
          "* = the restore warned)")  # fmt: skip
    print(f"{'lanes':>5}  {'resume':<14}{'contiguous':>12}{'interleaved':>13}")
    for lanes, saved, resumed in LAYOUTS:
        name = f"{saved[0]}x{saved[1]} -> {resumed[0]}x{resumed[1]}"
        row = {m: kept(args.docs // 4, m, lanes, saved, resumed)
               for m in ("contiguous", "interleaved")}  # fmt: skip
        result["kept"][f"{lanes} lanes {name}"] = {m: n for m, (n, _) in row.items()}
        cells = [f"{n}{'*' if warned else ' '}" for n, warned in row.values()]
        print(f"{lanes:>5}  {name:<14}{cells[0]:>12}{cells[1]:>13}")
    best: dict[str, tuple[float, int, int, int]] = {}
    for _ in range(5):
        for mapping in ("contiguous", "interleaved"):
            run = timed_run(args.docs, mapping)
            if mapping not in best or run[0] < best[mapping][0]:
                best[mapping] = run
    print(f"\n2 ranks x 8 lanes, {args.docs} documents, both ranks (best of 5)")
    print(f"{'mapping':<13}{'batches/s':>11}{'tokens/s':>13}{'packing':>9}")
    for mapping, (seconds, batches, tokens, real) in best.items():
        cost = {"batches_per_s": batches / seconds, "tokens_per_s": tokens / seconds,
                "packing_efficiency": real / tokens}  # fmt: skip
        result["cost"][mapping] = cost
        print(f"{mapping:<13}{cost['batches_per_s']:>11.1f}{cost['tokens_per_s']:>13,.0f}"
              f"{cost['packing_efficiency']:>9.4f}")  # fmt: skip
    costs = result["cost"]
    ratio = costs["interleaved"]["tokens_per_s"] / costs["contiguous"]["tokens_per_s"]
    result["throughput_ratio_interleaved_over_contiguous"] = round(ratio, 3)
    print(f"\nthroughput interleaved / contiguous: {ratio:.3f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""GIL isolation: a consumer that burns Python CPU between batches, engine in or out of process.

A training loop holds the GIL for much of each step (Python-side optimizer logic, logging,
data collation). With the engine in the same process, its Python work (source, accumulators,
reorder, tail) takes turns with the loop for the GIL; with ``engine_process=True`` it runs in
a child process on another core and only the hand-off (receive, unpickle, map) is left here.

Pipelines: *overhead*, 100,000 one-word records, 4 identity ``map_transform`` s, ``batch(64)``;
*tokenize*, 20,000 generated documents through decode_text -> tokenize (BPE) -> batch(64).
The consumer runs a fixed amount of pure-Python work per batch (calibrated to ``--burn-us``
alone), so contention shows as a longer run, not as less work done. Rounds interleave the
modes; the table gives medians after the first batch (steady state): the slowdown against the
burn alone, the time the engine added per batch to the consumer's wall clock, and the consumer
process's CPU beyond the burn (the Python time the engine takes from the training loop, which
is what bounds it once there are cores to spare); then the time to the first batch.

Prints a table and a final JSON line. Usage: ``python benchmarks/engine_process.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from zephon import Dataset, Pipeline, StaticMixtureWorkSource


def _identity(payload: Any) -> Any:
    return payload


def burn(iterations: int) -> int:
    """Pure-Python work that holds the GIL (what a training step's Python side does)."""
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


def calibrate(burn_us: float) -> int:
    """Iterations of ``burn`` that take ``burn_us`` on this machine, alone."""
    n = 10_000
    start = time.perf_counter()
    burn(n)
    per = (time.perf_counter() - start) / n
    return max(1, int(burn_us * 1e-6 / per))


def overhead_pipe(n: int) -> Pipeline:
    rows = [{"text": "word"} for _ in range(n)]
    source = StaticMixtureWorkSource([Dataset.from_records("rows", rows)], chunk_size=4096)
    pipe = Pipeline(source)
    for _ in range(4):
        pipe = pipe.map_transform(_identity)
    return pipe.batch(64)


def tokenizer(folder: Path, texts: list[str]) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        special_tokens=["<s>", "</s>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts[:1000], trainer)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def tokenize_pipe_factory(folder: Path, docs: int) -> Callable[[], Pipeline]:
    rng = random.Random(3)
    words = ["".join(rng.choices("abcdefghij", k=rng.randint(2, 8))) for _ in range(3000)]
    texts = [" ".join(rng.choices(words, k=rng.randint(20, 200))) for _ in range(docs)]
    tok = tokenizer(folder, texts)
    rows = [{"text": t} for t in texts]

    def build() -> Pipeline:
        source = StaticMixtureWorkSource([Dataset.from_records("docs", rows)], chunk_size=1024)
        return Pipeline(source).decode_text().tokenize(tok, max_length=512).batch(64)

    return build


def run(pipe: Pipeline, iterations: int) -> tuple[float, float, int, float]:
    """Wall seconds and this process's CPU seconds after the first batch (steady state),
    batches after the first, and seconds to the first batch, for one consumed pipeline."""
    start = time.perf_counter()
    batches = -1
    for _batch in pipe:
        if batches < 0:
            cpu, wall = time.process_time(), time.perf_counter()
            first = wall - start
        burn(iterations)
        batches += 1
    return time.perf_counter() - wall, time.process_time() - cpu, batches, first


def burn_only(batches: int, iterations: int) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(batches):
        burn(iterations)
    return time.perf_counter() - wall, time.process_time() - cpu


MODES: dict[str, dict[str, Any]] = {
    "no consumer work, threads": {"runner": "threads"},
    "threads, in process": {"runner": "threads"},
    "threads, engine_process": {"runner": "threads", "engine_process": True},
    "inline, engine_process": {"runner": "inline", "engine_process": True},
}


def rows_for(name: str, build: Callable[[], Pipeline], iterations: int, rounds: int) -> list[Any]:
    runs: dict[str, list[tuple[float, float, int, float]]] = {m: [] for m in MODES}
    alone: list[tuple[float, float]] = []
    for _ in range(rounds):
        for mode, opts in MODES.items():
            burn_n = 0 if mode.startswith("no consumer") else iterations
            runs[mode].append(run(build().options(**opts), burn_n))
        alone.append(burn_only(runs["threads, in process"][-1][2], iterations))
    base_wall = statistics.median(a[0] for a in alone)
    base_cpu = statistics.median(a[1] for a in alone)
    rows = [{"pipeline": name, "mode": "burn alone (no pipeline)", "seconds": round(base_wall, 3)}]
    for mode, got in runs.items():
        wall = statistics.median(g[0] for g in got)
        cpu = statistics.median(g[1] for g in got)
        batches = got[0][2]
        busy = not mode.startswith("no consumer")
        rows.append(
            {
                "pipeline": name,
                "mode": mode,
                "seconds": round(wall, 3),
                "batches_per_s": round(batches / wall),
                "vs_burn_alone": round(wall / base_wall, 3) if busy else "",
                "added_us_per_batch": round((wall - base_wall) / batches * 1e6) if busy else "",
                "consumer_cpu_us_per_batch": round(
                    (cpu - (base_cpu if busy else 0)) / batches * 1e6
                ),
                "first_batch_s": round(statistics.median(g[3] for g in got), 3),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--burn-us", type=float, default=1000.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    iterations = calibrate(args.burn_us)
    with tempfile.TemporaryDirectory() as tmp:
        tokenize = tokenize_pipe_factory(Path(tmp), args.docs)
        rows = rows_for("overhead", lambda: overhead_pipe(args.records), iterations, args.rounds)
        rows += rows_for("tokenize", tokenize, iterations, args.rounds)
    cols = [
        "pipeline",
        "mode",
        "seconds",
        "batches_per_s",
        "vs_burn_alone",
        "added_us_per_batch",
        "consumer_cpu_us_per_batch",
        "first_batch_s",
    ]
    print(f"cores: {os.cpu_count()}  consumer burn per batch: {args.burn_us:.0f} us")
    print(" | ".join(f"{c:>24}" for c in cols))
    for row in rows:
        print(" | ".join(f"{row.get(c, ''):>24}" for c in cols))
    summary = {"benchmark": "engine_process", "cores": os.cpu_count(), "burn_us": args.burn_us}
    print(json.dumps({**summary, "rows": rows}))


if __name__ == "__main__":
    main()

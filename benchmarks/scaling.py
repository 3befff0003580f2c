"""Scaling of the reference pipeline with workers, and the ceiling the GIL puts on it.

Reference pipeline: fetch -> decode_text -> tokenize (BPE) -> batch(8) over JSONL shards
(``benchmarks/engine.py``'s corpus), threads runner, every operator on ``W`` workers for
W = 1, 2, 4, 8, 16: documents/s and tokens/s as measured on this machine.

Then the projection. Tokenization runs in native code without the GIL; everything else the
engine does per record (fetch, decode, building arrays, batching, the tail) is Python under
the GIL, so it runs on one core at a time however many workers there are. Measured here:

* ``cpu_us_per_doc``: process CPU per document of the pipeline (inline runner, every thread);
* ``native_us_per_doc``: process CPU per document of the raw tokenizer on the same texts
  (``encode_batch_fast``, 64 documents a call), for reference;
* ``gil_us_per_doc``: CPU per document of the thread that runs the inline pipeline. It does
  all of the engine's Python work (fetch, decode, building arrays, batching, the tail) and
  turns the tokenizer's results into Python objects, while the tokenizer's native work runs
  on its own thread pool: this is the serial, GIL-bound part. (Earlier versions took
  ``cpu - native``, which also counted the tokenizer pool's idle spinning between calls.)

On N cores the pipeline cannot deliver more than ``1 / max(gil, cpu / N)`` documents/s: the
GIL-bound part is serial, the rest divides over the cores. The table gives that ceiling for N
= 1 ... 16 next to what this machine measured (it has ``os.cpu_count()`` cores, so rows above
that are the projection only).

Prints a table and a final JSON line. Usage: ``python benchmarks/scaling.py [--docs N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from tokenizers import Tokenizer

from engine import make_corpus, train_tokenizer
from overhead import print_table
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource

WORKERS = (1, 2, 4, 8, 16)


def reference(folder: Path, tok_path: Path, runner: str, workers: int) -> Pipeline:
    dataset = Dataset.from_path("bench", folder)
    source = StaticMixtureWorkSource(
        datasets=[dataset], mixture=MixtureSpec({"bench": 1.0}), chunk_size=1000, seed=42
    )
    return (
        Pipeline(source)
        .fetch(parallelism=workers)
        .decode_text(parallelism=workers)
        .tokenize(tok_path, parallelism=workers)
        .batch(8, drop_last=False)
        .options(runner=runner)
    )


def measure(pipe: Pipeline) -> tuple[float, float, int, int, float]:
    """Wall seconds, process CPU seconds, documents, tokens and this thread's CPU seconds."""
    cpu, wall, own = time.process_time(), time.perf_counter(), time.thread_time()
    docs = tokens = 0
    for batch in pipe:
        docs += len(batch)
        tokens += sum(int(r.payload["input_ids"].shape[0]) for r in batch)
    own = time.thread_time() - own
    return time.perf_counter() - wall, time.process_time() - cpu, docs, tokens, own


def native_cpu_per_doc(tok: Tokenizer, texts: list[str]) -> float:
    cpu = time.process_time()
    for i in range(0, len(texts), 64):
        tok.encode_batch_fast(texts[i : i + 64], add_special_tokens=False)
    return (time.process_time() - cpu) / len(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data", type=Path, default=Path("bench-data/engine"))
    args = parser.parse_args()
    texts = make_corpus(args.data / "corpus", args.docs, shards=8)
    tok_path = args.data / "tokenizer.json"
    tok = train_tokenizer(texts, tok_path)
    corpus = args.data / "corpus"

    runs: dict[int, list[tuple[float, float, int, int, float]]] = {w: [] for w in WORKERS}
    inline_cpu: list[float] = []
    serial: list[float] = []
    native: list[float] = []
    for _ in range(args.rounds):
        native.append(native_cpu_per_doc(tok, texts))
        _, cpu, docs, _, own = measure(reference(corpus, tok_path, "inline", 1))
        inline_cpu.append(cpu / docs)
        serial.append(own / docs)
        for workers in WORKERS:
            runs[workers].append(measure(reference(corpus, tok_path, "threads", workers)))
    cpu_per_doc = statistics.median(inline_cpu)
    native_per_doc = statistics.median(native)
    # The inline runner does all of the engine's Python work on the calling thread, while
    # the tokenizer's native work runs on its own thread pool: the calling thread's CPU is
    # the serial, GIL-bound part (including turning encodings into Python objects).
    gil = max(statistics.median(serial), 1e-9)
    cores = os.cpu_count() or 1
    rows = []
    for workers in WORKERS:
        got = runs[workers]
        rate = statistics.median(g[2] / g[0] for g in got)
        ceiling = 1 / max(gil, cpu_per_doc / workers)
        rows.append(
            {
                "workers_or_cores": workers,
                "measured_docs_per_s": round(rate),
                "measured_tokens_per_s": round(statistics.median(g[3] / g[0] for g in got)),
                "cpu_us_per_doc": round(statistics.median(g[1] / g[2] for g in got) * 1e6, 1),
                "projected_docs_per_s": round(ceiling),
                "projection_bound": "GIL" if gil >= cpu_per_doc / workers else "cores",
                "on_this_machine": "yes" if workers <= cores else "projection",
            }
        )
    per_doc = {
        "inline_cpu_us_per_doc": round(cpu_per_doc * 1e6, 1),
        "native_us_per_doc": round(native_per_doc * 1e6, 1),
        "gil_us_per_doc": round(gil * 1e6, 1),
        "gil_bound_docs_per_s": round(1 / gil),
        "cores_at_gil_bound": round(cpu_per_doc / gil, 1),
    }
    facts = "  ".join(f"{k}: {v}" for k, v in per_doc.items())
    print(f"cores: {cores}  docs: {args.docs}  {facts}")
    cols = list(rows[0])
    print_table(rows, cols, "scaling", **per_doc)


if __name__ == "__main__":
    main()

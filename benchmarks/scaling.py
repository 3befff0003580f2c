"""Scaling of the reference pipeline with workers, and the ceiling the GIL puts on it.

Reference pipeline: fetch -> decode_text -> tokenize (BPE) -> batch(8) over JSONL shards
(``benchmarks/engine.py``'s corpus), every operator on ``W`` workers for W = 1, 2, 4, 8, 16,
with the threads runner and with the process runner: documents/s and tokens/s as measured on
this machine, and CPU per document (for the process runner its workers' CPU included).

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
GIL-bound part is serial, the rest divides over the cores. For the process runner the serial
part is ``process_engine_us_per_doc``, all of the engine process's CPU per document (it does
no tokenizing: the workers do fetch, decode and tokenize), and ``cpu`` is the engine's and
the workers' CPU together. The table gives that ceiling for N
= 1 ... 16 next to what this machine measured (it has ``os.cpu_count()`` cores, so rows above
that are the projection only).

``--pipeline pack`` measures decode_text -> tokenize(max_length 2048) -> pack_flat(2048) ->
batch(8) instead (every operator on ``W`` workers), counting a packed row's documents. The
per-document figures of the process runner are taken in steady state, from the first batch to
the last (the start-up of the engine's threads and of the workers is left out):
``process_engine_us_per_doc`` (the engine process), ``process_workers_us_per_doc`` (its
workers), their ratios to ``native_us_per_doc`` and the process runner's tokens/s over the
threads runner's at W = the cores.

Prints a table and a final JSON line. Usage:
``python benchmarks/scaling.py [--docs N] [--workers 1,2] [--pipeline reference|pack]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from tokenizers import Tokenizer

from engine import make_corpus, train_tokenizer
from overhead import cpu_since, descendants_cpu_s, print_table
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.types import TAG_PACKING, SampleRecord

WORKERS = (1, 2, 4, 8, 16)
PACK_LENGTH = 2048


def reference(
    folder: Path, tok_path: Path, runner: str, workers: int, pack: bool = False
) -> Pipeline:
    dataset = Dataset.from_path("bench", folder)
    source = StaticMixtureWorkSource(
        datasets=[dataset], mixture=MixtureSpec({"bench": 1.0}), chunk_size=1000, seed=42
    )
    pipe = Pipeline(source).fetch(parallelism=workers).decode_text(parallelism=workers)
    if pack:
        pipe = pipe.tokenize(tok_path, max_length=PACK_LENGTH, parallelism=workers)
        pipe = pipe.pack_flat(PACK_LENGTH, 0, parallelism=workers)
    else:
        pipe = pipe.tokenize(tok_path, parallelism=workers)
    return pipe.batch(8, drop_last=False).options(runner=runner)


def docs_and_tokens(record: SampleRecord) -> tuple[int, int]:
    """Documents and (unpadded) tokens in a delivered record, packed or not."""
    packing = record.meta.tags.get(TAG_PACKING) if record.meta.tags else None
    if packing is not None:
        return int(packing["num_sequences"]), int(packing["total_length"])
    return 1, int(record.payload["input_ids"].shape[0])


class Run(NamedTuple):
    """One pass over the corpus."""

    wall: float  # seconds
    cpu: float  # CPU seconds of this process, every thread
    docs: int
    tokens: int
    own: float  # CPU seconds of the calling thread
    others: float  # CPU seconds of the processes below this one (process workers)
    steady_docs: int  # documents after the first batch
    steady_cpu: float  # CPU seconds of this process from the first batch to the last
    steady_others: float  # the same for the processes below this one


def measure(pipe: Pipeline, expected_docs: int) -> Run:
    before = descendants_cpu_s()
    cpu, wall, own = time.process_time(), time.perf_counter(), time.thread_time()
    docs = tokens = 0
    others = first_cpu = first_others = 0.0
    first_docs = 0
    for batch in pipe:
        for record in batch:
            n_docs, n_tokens = docs_and_tokens(record)
            docs, tokens = docs + n_docs, tokens + n_tokens
        if not first_docs:  # steady state starts after the first batch
            first_docs, first_cpu, first_others = docs, time.process_time(), cpu_since(before)
        if docs == expected_docs:  # the last batch: the workers live until the iteration ends
            others = cpu_since(before)
    own = time.thread_time() - own
    end_cpu = time.process_time()
    return Run(
        time.perf_counter() - wall,
        end_cpu - cpu,
        docs,
        tokens,
        own,
        others,
        docs - first_docs,
        end_cpu - first_cpu,
        others - first_others,
    )


def native_cpu_per_doc(tok: Tokenizer, texts: list[str]) -> float:
    cpu = time.process_time()
    for i in range(0, len(texts), 64):
        tok.encode_batch_fast(texts[i : i + 64], add_special_tokens=False)
    return (time.process_time() - cpu) / len(texts)


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def ceiling(serial: float, total: float, cores: int) -> tuple[float, str]:
    """docs/s at most on ``cores`` cores, and what bounds it."""
    serial = max(serial, 1e-9)
    return 1 / max(serial, total / cores), "GIL" if serial >= total / cores else "cores"


class Costs(NamedTuple):
    """CPU seconds per document that the projections divide by.

    Threads: the calling thread of the inline runner does all of the engine's Python work
    while the tokenizer's native work runs on its own pool, so its CPU is the serial part.
    Process: the engine process does no tokenizing; all of its CPU counts as serial, and the
    workers' CPU divides over the cores.
    """

    inline_cpu: float  # the inline pipeline, every thread
    gil: float  # the thread that runs the inline pipeline
    engine: float  # the process runner's engine process
    process_cpu: float  # the process runner's engine and workers together
    steady_engine: float  # the engine process from the first batch to the last
    steady_workers: float  # its workers from the first batch to the last


def costs(
    runs: dict[tuple[str, int], list[Run]], inline: list[Run], workers: Sequence[int]
) -> Costs:
    process = [r for w in workers for r in runs[("process", w)]]
    return Costs(
        inline_cpu=median(r.cpu / r.docs for r in inline),
        gil=max(median(r.own / r.docs for r in inline), 1e-9),
        engine=median(r.cpu / r.docs for r in process),
        process_cpu=median((r.cpu + r.others) / r.docs for r in process),
        steady_engine=median(r.steady_cpu / max(r.steady_docs, 1) for r in process),
        steady_workers=median(r.steady_others / max(r.steady_docs, 1) for r in process),
    )


def table(
    runs: dict[tuple[str, int], list[Run]], cost: Costs, workers_list: Sequence[int]
) -> list[dict[str, Any]]:
    """A row per worker count: measured here, and the ceilings projected for that many cores."""
    cores = os.cpu_count() or 1
    rows = []
    for workers in workers_list:
        threads, procs = runs[("threads", workers)], runs[("process", workers)]
        threads_ceiling, threads_bound = ceiling(cost.gil, cost.inline_cpu, workers)
        process_ceiling, process_bound = ceiling(cost.engine, cost.process_cpu, workers)
        rows.append(
            {
                "workers_or_cores": workers,
                "measured_docs_per_s": round(median(r.docs / r.wall for r in threads)),
                "measured_tokens_per_s": round(median(r.tokens / r.wall for r in threads)),
                "cpu_us_per_doc": round(median(r.cpu / r.docs for r in threads) * 1e6, 1),
                "projected_docs_per_s": round(threads_ceiling),
                "projection_bound": threads_bound,
                "process_docs_per_s": round(median(r.docs / r.wall for r in procs)),
                "process_cpu_us_per_doc": round(
                    median((r.cpu + r.others) / r.docs for r in procs) * 1e6, 1
                ),
                "process_projected_docs_per_s": round(process_ceiling),
                "process_bound": process_bound,
                "on_this_machine": "yes" if workers <= cores else "projection",
            }
        )
    return rows


def per_document(
    cost: Costs, native: float, runs: dict[tuple[str, int], list[Run]], workers: Sequence[int]
) -> dict[str, Any]:
    """The figures per document the table's rows share, and the ratios to the tokenizer's."""
    at = max((w for w in workers if w <= (os.cpu_count() or 1)), default=workers[0])
    threads = median(r.tokens / r.wall for r in runs[("threads", at)])
    process = median(r.tokens / r.wall for r in runs[("process", at)])
    return {
        "inline_cpu_us_per_doc": round(cost.inline_cpu * 1e6, 1),
        "native_us_per_doc": round(native * 1e6, 1),
        "gil_us_per_doc": round(cost.gil * 1e6, 1),
        "gil_bound_docs_per_s": round(1 / cost.gil),
        "cores_at_gil_bound": round(cost.inline_cpu / cost.gil, 1),
        "process_engine_us_per_doc": round(cost.engine * 1e6, 1),
        "steady_engine_us_per_doc": round(cost.steady_engine * 1e6, 1),
        "steady_workers_us_per_doc": round(cost.steady_workers * 1e6, 1),
        "engine_pct_of_native": round(cost.steady_engine / native * 100, 1),
        "engine_and_workers_x_native": round(
            (cost.steady_engine + cost.steady_workers) / native, 2
        ),
        f"process_vs_threads_tokens_at_w{at}": round(process / threads, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data", type=Path, default=Path("bench-data/engine"))
    parser.add_argument(
        "--workers", default=",".join(map(str, WORKERS)), help="worker counts, e.g. 1,2"
    )
    parser.add_argument("--pipeline", choices=("reference", "pack"), default="reference")
    args = parser.parse_args()
    workers_list = [int(w) for w in args.workers.split(",")]
    pack = args.pipeline == "pack"
    texts = make_corpus(args.data / "corpus", args.docs, shards=8)
    tok_path = args.data / "tokenizer.json"
    tok = train_tokenizer(texts, tok_path)
    corpus = args.data / "corpus"

    runs: dict[tuple[str, int], list[Run]] = {
        (runner, w): [] for runner in ("threads", "process") for w in workers_list
    }
    inline: list[Run] = []
    native: list[float] = []
    for _ in range(args.rounds):
        native.append(native_cpu_per_doc(tok, texts))
        inline.append(measure(reference(corpus, tok_path, "inline", 1, pack), len(texts)))
        for workers in workers_list:
            for runner in ("threads", "process"):
                runs[(runner, workers)].append(
                    measure(reference(corpus, tok_path, runner, workers, pack), len(texts))
                )
    cost = costs(runs, inline, workers_list)
    rows = table(runs, cost, workers_list)
    per_doc = per_document(cost, median(native), runs, workers_list)
    facts = "  ".join(f"{k}: {v}" for k, v in per_doc.items())
    print(f"cores: {os.cpu_count() or 1}  docs: {args.docs}  pipeline: {args.pipeline}  {facts}")
    print_table(rows, list(rows[0]), "scaling", **per_doc)


if __name__ == "__main__":
    main()

"""Engine throughput: per-record overhead per runner, and tokenization against the raw tokenizer.

0. engine overhead: 100,000 one-word records (``Dataset.from_records``, chunk 4096,
   ``batch(64)``) with no map and with 4 identity ``map_transform`` s, inline and threads
   (fused and ``fuse=False``), in interleaved rounds: docs/s and process CPU-us per doc, and
   the threads/inline ratio of docs/s per round;
1. records/s of a passthrough ``map_transform`` pipeline (in-memory rows) for each runner,
   reported as per-record overhead in microseconds;
2. tokens/s of fetch -> decode_text -> tokenize -> batch over JSONL shards, against raw
   ``Tokenizer.encode_batch`` (64-document calls, the tokenizer's own thread pool on all
   cores) on the same documents already in memory. The ratio is the headline number.

Prints a table and one final JSON line. Usage: ``python benchmarks/engine.py [--docs N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from overhead import CONFIGS, rows_for
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource


def zipf_words(rng: random.Random, vocab: list[str], n: int) -> str:
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    return " ".join(rng.choices(vocab, weights=weights, k=n))


def make_corpus(folder: Path, docs: int, shards: int) -> list[str]:
    rng = random.Random(7)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "qua", "pre", "ion"]
    vocab = sorted({"".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(6000)})
    texts = []
    for _ in range(docs):
        n = int(min(2000, max(50, rng.lognormvariate(5.9, 0.8))))
        texts.append(zipf_words(rng, vocab, n))
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-docs // shards)
    for s in range(shards):
        with open(folder / f"part-{s:03d}.jsonl", "w") as fh:
            for i in range(s * per, min(docs, (s + 1) * per)):
                fh.write(json.dumps({"id": i, "text": texts[i]}) + "\n")
    return texts


def train_tokenizer(texts: list[str], path: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=8192,
        special_tokens=["<s>", "</s>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts[:1500], trainer)
    tok.save(str(path))
    return tok


def raw_tokens_per_s(tok: Tokenizer, texts: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    total = 0
    for i in range(0, len(texts), 64):
        for enc in tok.encode_batch_fast(texts[i : i + 64], add_special_tokens=False):
            total += len(enc.ids)
    return total / (time.perf_counter() - start), total


def pipeline_tokens_per_s(
    folder: Path, tok_path: Path, runner: str, workers: int
) -> tuple[float, int, float]:
    dataset = Dataset.from_path("bench", folder)
    source = StaticMixtureWorkSource(
        datasets=[dataset], mixture=MixtureSpec({"bench": 1.0}), chunk_size=1000, seed=42
    )
    pipe = (
        Pipeline(source)
        .fetch(parallelism=1)
        .decode_text(parallelism=1)
        .tokenize(tok_path, parallelism=workers)
        .batch(8, drop_last=False)
        .options(runner=runner)
    )
    start = time.perf_counter()
    first = None
    tokens = 0
    for batch in pipe:
        if first is None:
            first = time.perf_counter() - start
        tokens += sum(int(r.payload["input_ids"].shape[0]) - 2 for r in batch)
    return tokens / (time.perf_counter() - start), tokens, first or 0.0


def steady(run: tuple[float, int, float]) -> float:
    """Tokens/s of a ``pipeline_tokens_per_s`` run after its first batch (worker start-up
    excluded: the process runner spends about 0.3-0.4 s spawning its workers here)."""
    rate, tokens, first = run
    return tokens / max(tokens / rate - first, 1e-9)


def _identity(payload: Any) -> Any:
    return payload


class _Rows:
    """Pointer source over in-memory rows, via the public StaticMixtureWorkSource."""

    @staticmethod
    def source(n: int) -> StaticMixtureWorkSource:
        rows = [{"id": i, "text": "x"} for i in range(n)]
        ds = Dataset.from_records("rows", rows, shard_size=10_000)
        return StaticMixtureWorkSource(
            datasets=[ds], mixture=MixtureSpec({"rows": 1.0}), chunk_size=1000, seed=0
        )


def passthrough_rate(runner: str, n: int, track_stats: bool = True) -> float:
    pipe = (
        Pipeline(_Rows.source(n))
        .map_transform(_identity, parallelism=2)
        .options(runner=runner, track_stats=track_stats)
    )
    start = time.perf_counter()
    count = sum(1 for _ in pipe)
    assert count == n, (count, n)
    return n / (time.perf_counter() - start)


OVERHEAD_CONFIGS = {name: CONFIGS[name] for name in ("inline", "threads", "threads fuse=False")}


def overhead_rows(n: int, rounds: int) -> list[dict[str, Any]]:
    """The engine-overhead rows of benchmarks/overhead.py for inline and threads."""
    return [r for maps in (0, 4) for r in rows_for(maps, n, rounds, configs=OVERHEAD_CONFIGS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("bench-data/engine"))
    parser.add_argument(
        "--only-overhead", action="store_true", help="run the engine-overhead rounds only"
    )
    args = parser.parse_args()

    rows: list[dict[str, Any]] = overhead_rows(args.records, args.repeats + 2)
    if args.only_overhead:
        _print(rows, "")
        return

    texts = make_corpus(args.data / "corpus", args.docs, shards=8)
    tok_path = args.data / "tokenizer.json"
    tok = train_tokenizer(texts, tok_path)

    for runner in ("inline", "threads", "process"):
        rate = statistics.median(passthrough_rate(runner, args.records) for _ in range(2))
        rows.append(
            {
                "bench": "passthrough map",
                "runner": runner,
                "records_per_s": round(rate),
                "us_per_record": round(1e6 / rate, 2),
            }
        )

    # Cost of pipeline.stats() tracking on the most overhead-sensitive pipeline, alternating.
    for runner in ("inline", "threads"):
        on: list[float] = []
        off: list[float] = []
        for _ in range(args.repeats + 2):
            on.append(passthrough_rate(runner, args.records, True))
            off.append(passthrough_rate(runner, args.records, False))
        cost = 1 - statistics.median(on) / statistics.median(off)
        rows.append(
            {
                "bench": "stats tracking cost",
                "runner": runner,
                "records_per_s": round(statistics.median(on)),
                "tracking_cost": round(cost, 4),
            }
        )

    # Rounds interleave the raw tokenizer with every runner, so each ratio compares runs made
    # under the same machine load; the headline is the median of the per-round ratios.
    configs = (("threads", 2), ("inline", 1), ("process", 2))
    raw_runs: list[tuple[float, int]] = []
    runs: dict[tuple[str, int], list[tuple[float, int, float]]] = {c: [] for c in configs}
    ratios: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    for _ in range(args.repeats):
        raw = raw_tokens_per_s(tok, texts)
        raw_runs.append(raw)
        for runner, workers in configs:
            run = pipeline_tokens_per_s(args.data / "corpus", tok_path, runner, workers)
            assert run[1] == raw[1], "pipeline and raw tokenized different text"
            runs[(runner, workers)].append(run)
            ratios[(runner, workers)].append(run[0] / raw[0])
    pairs = list(zip(runs[("process", 2)], runs[("threads", 2)], strict=True))
    rows.append(
        {
            "bench": "process vs threads (tokenize)",
            "runner": "process x2 / threads x2",
            "vs_threads": round(statistics.median(p[0] / t[0] for p, t in pairs), 3),
        }
    )
    rows.append(
        {
            "bench": "process vs threads, after the first batch",
            "runner": "process x2 / threads x2",
            "vs_threads": round(statistics.median(steady(p) / steady(t) for p, t in pairs), 3),
        }
    )
    rows.append(
        {
            "bench": "raw encode_batch (64 docs, all cores)",
            "runner": "-",
            "tokens_per_s": round(statistics.median(r[0] for r in raw_runs)),
            "tokens": raw_runs[0][1],
        }
    )
    for runner, workers in configs:
        rows.append(
            {
                "bench": "decode->tokenize->batch",
                "runner": f"{runner} x{workers}",
                "tokens_per_s": round(statistics.median(r[0] for r in runs[(runner, workers)])),
                "ratio_vs_raw": round(statistics.median(ratios[(runner, workers)]), 3),
                "first_batch_s": round(statistics.median(r[2] for r in runs[(runner, workers)]), 3),
            }
        )

    _print(rows, f"  docs: {args.docs}  tokens: {raw_runs[0][1]:,}")


def _print(rows: list[dict[str, Any]], note: str) -> None:
    cols = [
        "bench",
        "runner",
        "records_per_s",
        "docs_per_s",
        "cpu_us_per_doc",
        "vs_inline",
        "us_per_record",
        "tokens_per_s",
        "ratio_vs_raw",
        "vs_threads",
        "first_batch_s",
        "tracking_cost",
    ]
    print(f"cores: {os.cpu_count()}{note}")
    print(" | ".join(f"{c:>14}" for c in cols))
    for row in rows:
        print(" | ".join(f"{row.get(c, ''):>14}" for c in cols))
    print(json.dumps({"benchmark": "engine", "cores": os.cpu_count(), "rows": rows}))


if __name__ == "__main__":
    main()

"""Scaling of the reference pipeline with workers, against the raw tokenizer on every core.

Reference pipeline: fetch -> decode_text -> tokenize (byte-level BPE, 8,192 ids, max_length
2048) -> pack_flat(2048) -> batch(8) over JSONL shards (``benchmarks/engine.py``'s corpus),
each configuration a fresh pipeline, tokens/s counted from the start of iteration, on three
runners at each worker count ``W``: the threads runner and the process runner (every operator
on ``W`` workers, one lane), and lane workers (``lane_workers=W`` over 64 lanes, chunks small
enough that each lane gets four or more, every operator inline in its lane's worker).
``--pipeline no-pack`` leaves pack_flat out (``reference`` is the same as ``pack``).

Measured in the same run (once a round, before the pipelines), as the ceiling: the raw
tokenizer on ``os.cpu_count()`` processes, each reading its share of the shards,
``json.loads`` on every line and ``encode_batch_fast`` on 64 documents a call (one tokenizer
thread per process): tokens/s from when all of them are ready, and ``native_us_per_doc``,
the CPU per document of ``encode_batch_fast`` alone.

Per document, for the process runner and for the lane workers at the largest W that fits the
cores: ``engine_us_per_doc`` (the engine process; for lane workers the process that merges
their batches), ``workers_us_per_doc`` (its worker processes), their ratios to
``native_us_per_doc`` (``lanes_*`` for lane workers); then ``process_vs_threads`` and
``lanes_vs_threads`` (tokens/s) and ``zephon_vs_ceiling`` (the fastest runner's tokens/s over
the ceiling's). CPU per document is marginal: every configuration also runs over the first
quarter of the shards (the start-up subset, ``start-up/`` beside the corpus), and the figure
is the CPU of the whole pass less that of the subset's, over the documents between them.
Start-up cancels out, while the work that workers do ahead of the first batch (lane workers
may run two rounds of their lanes ahead) is counted.
No projection to other core counts: an earlier one predicted 16,000-19,600 documents/s on 16
cores where a 16-core machine measured 4,500-6,250.

``--grain-python PATH`` adds Grain (``_grain_pipeline.py`` run by PATH, an interpreter with
``grain``, ``tokenizers`` and ``numpy``: ``mp_prefetch`` with W workers, the same tokenizer
calls, Grain's best-fit packing to 2048) at each W; without it, or when PATH cannot run it,
the Grain rows are skipped with the reason printed. Its CPU per document is marginal as
zephon's is (``cpu_us_per_doc_with_start`` in the JSON line is the whole pass's over its
documents, its workers' start-up included).

Prints a table and a final JSON line. Usage: ``python benchmarks/scaling.py [--docs N]
[--workers 1,2] [--pipeline pack|reference|no-pack] [--grain-python PATH]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, NamedTuple

from engine import make_corpus, train_tokenizer
from overhead import cpu_since, descendants_cpu_s, print_table
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.types import TAG_PACKING, SampleRecord

WORKERS = (1, 2, 4, 8, 16)
LANES = 64  # lanes of the lane-worker runs (the unit they share out)
RUNNERS = ("threads", "process", "lanes")
PACK_LENGTH = 2048
GRAIN_SCRIPT = Path(__file__).with_name("_grain_pipeline.py")


def reference(
    folder: Path, tok_path: Path, runner: str, workers: int, pack: bool = True, docs: int = 0
) -> Pipeline:
    """The reference pipeline on ``runner`` (``"lanes"``: ``lane_workers=workers`` over
    ``LANES`` lanes, chunks small enough that every lane gets at least four of the ``docs``)."""
    lanes = runner == "lanes"
    chunk_size = max(16, min(1000, docs // (LANES * 4))) if lanes else 1000
    dataset = Dataset.from_path("bench", folder)
    source = StaticMixtureWorkSource(
        datasets=[dataset], mixture=MixtureSpec({"bench": 1.0}), chunk_size=chunk_size, seed=42
    )
    pipe = Pipeline(source).fetch(parallelism=workers).decode_text(parallelism=workers)
    pipe = pipe.tokenize(tok_path, max_length=PACK_LENGTH, parallelism=workers)
    if pack:
        pipe = pipe.pack_flat(PACK_LENGTH, 0, parallelism=workers)
    pipe = pipe.batch(8, drop_last=False)
    if lanes:
        return pipe.options(lane_workers=workers, canonical_replicas=LANES)
    return pipe.options(runner=runner)


def docs_and_tokens(record: SampleRecord) -> tuple[int, int]:
    """Documents and (unpadded) tokens in a delivered record, packed or not."""
    packing = record.meta.tags.get(TAG_PACKING) if record.meta.tags else None
    if packing is not None:
        return int(packing["num_sequences"]), int(packing["total_length"])
    return 1, int(record.payload["input_ids"].shape[0])


class Run(NamedTuple):
    """One pass over a corpus, CPU counted from the start of iteration to the last batch."""

    wall: float  # seconds from the start of iteration
    cpu: float  # CPU seconds of this process, every thread (for process runs: the engine)
    others: float  # CPU seconds of the processes below this one (workers, lane workers)
    docs: int
    tokens: int


class Pair(NamedTuple):
    """A pass over the corpus and one over its start-up subset, made one after the other."""

    full: Run
    small: Run

    def marginal_us(self, field: str) -> float:
        """CPU per document of ``field`` beyond the start-up subset, in us: what each further
        document costs, start-up and the work done ahead of the first batch left out."""
        extra = getattr(self.full, field) - getattr(self.small, field)
        return extra / max(self.full.docs - self.small.docs, 1) * 1e6


def measure(pipe: Pipeline, expected_docs: int) -> Run:
    before = descendants_cpu_s()
    cpu, wall = time.process_time(), time.perf_counter()
    docs = tokens = 0
    others = 0.0
    for batch in pipe:
        for record in batch:
            n_docs, n_tokens = docs_and_tokens(record)
            docs, tokens = docs + n_docs, tokens + n_tokens
        if docs == expected_docs:  # the last batch: the workers live until the iteration ends
            others = cpu_since(before)
    return Run(time.perf_counter() - wall, time.process_time() - cpu, others, docs, tokens)


def _raw_tokenizer(job: tuple[list[str], str, Any, Any]) -> tuple[int, int, float, float, float]:
    """One ceiling process: (tokens, documents, encode CPU s, all CPU s, end time)."""
    os.environ["RAYON_NUM_THREADS"] = "1"  # before the tokenizer's pool starts: one thread
    from tokenizers import Tokenizer

    paths, tok_path, ready, go = job
    tok = Tokenizer.from_file(tok_path)
    ready.release()
    go.wait()
    cpu = time.process_time()
    tokens = docs = 0
    encode = 0.0
    for path in paths:
        with open(path, "rb") as fh:
            texts = [json.loads(line)["text"] for line in fh]
        for i in range(0, len(texts), 64):
            start = time.process_time()
            encoded = tok.encode_batch_fast(texts[i : i + 64], add_special_tokens=False)
            encode += time.process_time() - start
            tokens += sum(len(e.ids) for e in encoded)
        docs += len(texts)
    return tokens, docs, encode, time.process_time() - cpu, time.monotonic()


def raw_ceiling(corpus: Path, tok_path: Path, processes: int) -> dict[str, Any]:
    """The raw tokenizer on ``processes`` processes, the shards dealt round robin."""
    shards = sorted(str(p) for p in corpus.glob("part-*.jsonl"))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        ready, go = manager.Semaphore(0), manager.Event()
        jobs = [(shards[i::processes], str(tok_path), ready, go) for i in range(processes)]
        with ctx.Pool(processes) as pool:
            pending = pool.map_async(_raw_tokenizer, jobs)
            for _ in range(processes):
                ready.acquire()
            start = time.monotonic()
            go.set()
            results = pending.get()
    tokens, docs = sum(r[0] for r in results), sum(r[1] for r in results)
    seconds = max(r[4] for r in results) - start
    return {
        "processes": processes,
        "tokens_per_s": round(tokens / seconds),
        "docs_per_s": round(docs / seconds),
        "cpu_us_per_doc": round(sum(r[3] for r in results) / docs * 1e6, 1),
        "native_us_per_doc": round(sum(r[2] for r in results) / docs * 1e6, 1),
    }


def grain_run(python: str, corpus: Path, tok_path: Path, workers: int) -> dict[str, Any]:
    """Grain's JSON line at ``workers`` workers, or ``{"skipped": reason}`` when ``python``
    cannot run it."""
    cmd = [python, str(GRAIN_SCRIPT), "--corpus", str(corpus), "--tokenizer", str(tok_path)]
    try:
        proc = subprocess.run(
            [*cmd, "--workers", str(workers)], capture_output=True, text=True, timeout=1800
        )
    except OSError as exc:
        return {"skipped": f"--grain-python {python} cannot be run: {exc.strerror}"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"skipped": f"--grain-python {python} could not run the grain pipeline: {why}"}
    return dict(json.loads(lines[-1]))


def grain_figures(full: dict[str, Any], small: dict[str, Any]) -> dict[str, Any]:
    """Grain's tokens/s over the corpus and its CPU per further document (as zephon's)."""
    if "skipped" in full or "skipped" in small:
        return full if "skipped" in full else small
    extra_docs = max(full["docs"] - small["docs"], 1)
    return {
        "grain": full["grain"],
        "tokens_per_s": round(full["tokens"] / full["seconds"]),
        "docs_per_s": round(full["docs"] / full["seconds"]),
        "cpu_us_per_doc": round((full["cpu_s"] - small["cpu_s"]) / extra_docs * 1e6, 1),
        "cpu_us_per_doc_with_start": round(full["cpu_s"] / full["docs"] * 1e6, 1),
        "first_batch_s": round(full["first_s"], 2),
    }


def median(values: Any) -> float:
    return statistics.median(list(values))


def _marginal_us(pairs: list[Pair], field: str) -> float:
    """The median CPU per further document of ``field`` (``cpu``/``others``), in us."""
    return round(median(pair.marginal_us(field) for pair in pairs), 1)


def row(workers: int, runs: dict[str, list[Pair]], ceiling: float) -> dict[str, Any]:
    """The figures of one worker count (medians over rounds): tokens/s over the whole corpus,
    CPU per further document."""
    tokens = {
        runner: median(p.full.tokens / p.full.wall for p in got) for runner, got in runs.items()
    }
    t_tokens, p_tokens, l_tokens = (tokens[runner] for runner in RUNNERS)
    return {
        "workers": workers,
        "threads_tokens_per_s": round(t_tokens),
        "process_tokens_per_s": round(p_tokens),
        "lanes_tokens_per_s": round(l_tokens),
        "process_vs_threads": round(p_tokens / t_tokens, 2),
        "lanes_vs_threads": round(l_tokens / t_tokens, 2),
        "zephon_vs_ceiling": round(max(tokens.values()) / ceiling, 2),
        "threads_cpu_us_per_doc": _marginal_us(runs["threads"], "cpu"),
        "engine_us_per_doc": _marginal_us(runs["process"], "cpu"),
        "workers_us_per_doc": _marginal_us(runs["process"], "others"),
        "lanes_engine_us_per_doc": _marginal_us(runs["lanes"], "cpu"),
        "lanes_workers_us_per_doc": _marginal_us(runs["lanes"], "others"),
    }


def per_document(rows: list[dict[str, Any]], native: float) -> dict[str, Any]:
    """CPU per document against the tokenizer's at the largest W that fits this machine's
    cores: the process runner's (``engine_*``) and the lane workers' (``lanes_*``)."""
    cores = os.cpu_count() or 1
    at = max((r for r in rows if r["workers"] <= cores), key=lambda r: r["workers"], default=None)
    at = at or rows[0]
    engine, workers = at["engine_us_per_doc"], at["workers_us_per_doc"]
    lanes, lane_workers = at["lanes_engine_us_per_doc"], at["lanes_workers_us_per_doc"]
    return {
        "at_workers": at["workers"],
        "engine_us_per_doc": engine,
        "workers_us_per_doc": workers,
        "native_us_per_doc": native,
        "engine_pct_of_native": round(engine / native * 100, 1),
        "engine_and_workers_x_native": round((engine + workers) / native, 2),
        "lanes_engine_us_per_doc": lanes,
        "lanes_workers_us_per_doc": lane_workers,
        "lanes_engine_pct_of_native": round(lanes / native * 100, 1),
        "lanes_engine_and_workers_x_native": round((lanes + lane_workers) / native, 2),
        "process_vs_threads": at["process_vs_threads"],
        "lanes_vs_threads": at["lanes_vs_threads"],
        "zephon_vs_ceiling": at["zephon_vs_ceiling"],
    }


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def medians(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over rounds, or the first reason a round was skipped."""
    skipped = [r for r in results if "skipped" in r]
    if skipped:
        return skipped[0]
    first = results[0]
    numbers = [k for k, v in first.items() if isinstance(v, int | float)]
    values = {k: median(r[k] for r in results) for k in numbers}
    return {**first, **{k: type(first[k])(round(v, 1)) for k, v in values.items()}}


def start_up_subset(corpus: Path, into: Path) -> Path:
    """The first quarter of ``corpus``'s shards (at least one), copied into ``into``: each
    configuration runs on both, and the difference is the cost of the other documents."""
    shards = sorted(corpus.glob("part-*.jsonl"))
    into.mkdir(parents=True, exist_ok=True)
    for stale in into.glob("part-*.jsonl"):
        stale.unlink()
    for shard in shards[: max(1, len(shards) // 4)]:
        shutil.copyfile(shard, into / shard.name)
    return into


def line_count(corpus: Path) -> int:
    return sum(path.read_bytes().count(b"\n") for path in corpus.glob("part-*.jsonl"))


def runs_for(args: argparse.Namespace, corpus: Path, small: Path, tok_path: Path) -> Any:
    """Every pipeline run (each on the corpus, then on its start-up subset), the ceiling and
    Grain, rounds interleaving them (this machine's load moves between runs)."""
    pack = args.pipeline != "no-pack"
    docs, small_docs = line_count(corpus), line_count(small)
    # what happens once per process (the forkserver, lazy imports) before anything is measured
    for runner in RUNNERS:
        measure(reference(small, tok_path, runner, 1, pack, docs), small_docs)
    runs: dict[tuple[str, int], list[Pair]] = {}
    ceilings, grain = [], {}
    for _ in range(args.rounds):
        ceilings.append(raw_ceiling(corpus, tok_path, os.cpu_count() or 1))
        for workers in args.workers:
            for runner in RUNNERS:
                pair = Pair(
                    measure(reference(corpus, tok_path, runner, workers, pack, docs), docs),
                    measure(reference(small, tok_path, runner, workers, pack, docs), small_docs),
                )
                runs.setdefault((runner, workers), []).append(pair)
            if args.grain_python:
                got = [grain_run(args.grain_python, c, tok_path, workers) for c in (corpus, small)]
                grain.setdefault(str(workers), []).append(grain_figures(*got))
    if not args.grain_python:
        return runs, medians(ceilings), {"skipped": "no --grain-python given"}
    return runs, medians(ceilings), {w: medians(got) for w, got in grain.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data", type=Path, default=Path("bench-data/scaling"))
    parser.add_argument(
        "--workers",
        type=lambda s: [int(w) for w in s.split(",")],
        default=list(WORKERS),
        help="worker counts, e.g. 1,2",
    )
    parser.add_argument("--pipeline", choices=("pack", "reference", "no-pack"), default="pack")
    parser.add_argument("--grain-python", default=None, help="an interpreter that has grain")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    corpus, tok_path = args.data / "corpus", args.data / "tokenizer.json"
    for stale in corpus.glob("part-*.jsonl"):
        stale.unlink()
    texts = make_corpus(corpus, args.docs, shards=max(8, cores))
    train_tokenizer(texts, tok_path)
    small = start_up_subset(corpus, args.data / "start-up")
    load_before = load_average()
    runs, ceiling, grain = runs_for(args, corpus, small, tok_path)
    rows = [
        row(w, {runner: runs[(runner, w)] for runner in RUNNERS}, ceiling["tokens_per_s"])
        for w in args.workers
    ]
    skipped = {grain["skipped"]} if "skipped" in grain else set()
    for r in rows:
        g = grain.get(str(r["workers"]), {})
        skipped |= {g["skipped"]} if "skipped" in g else set()
        r["grain_tokens_per_s"] = g.get("tokens_per_s", "")
        r["grain_cpu_us_per_doc"] = g.get("cpu_us_per_doc", "")
    per_doc = per_document(rows, ceiling["native_us_per_doc"])
    load = f"load average {load_before} before, {load_average()} after"
    print(f"cores: {cores}  docs: {args.docs}  pipeline: {args.pipeline}  {load}")
    print(f"raw tokenizer ceiling on {cores} processes: " + json.dumps(ceiling))
    print("  ".join(f"{k}: {v}" for k, v in per_doc.items()))
    for reason in sorted(skipped):
        print(f"grain: skipped: {reason}")
    extra = {"docs": args.docs, "load": load, "pipeline": args.pipeline, "ceiling": ceiling}
    print_table(rows, list(rows[0]), "scaling", **extra, **per_doc, grain=grain)


if __name__ == "__main__":
    main()

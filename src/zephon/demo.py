"""`make demo`: generate a small corpus, run decode -> tokenize -> batch, show what came out.

Everything is local: the corpus is generated, the tokenizer is the built-in byte tokenizer
(or a ``tokenizer.json`` you pass with ``--tokenizer``).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from rich.table import Table

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon._console import PipeConsole
from zephon._engine.plan.runner_traits import REGISTRY
from zephon._progress import of_total, progress_bar
from zephon.types import SampleBatch

__all__ = ["add_arguments", "closing_lines", "make_corpus", "run", "run_from_argv"]

_TEXT = (
    "the data loader reads shards of text and turns them into token batches that a model "
    "trains on every run gives the same batches whatever machine or worker count replays them"
)
_WORDS = _TEXT.split(" ")


def make_corpus(folder: Path, *, docs: int, shards: int, seed: int = 0) -> Path:
    """Write ``docs`` synthetic documents as ``shards`` JSONL files (skipped if present)."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / ".complete"
    if marker.exists() and marker.read_text() == f"{docs}/{shards}/{seed}":
        return folder
    rng = random.Random(seed)
    per_shard = -(-docs // shards)
    for shard in range(shards):
        with open(folder / f"shard-{shard:04d}.jsonl", "w", encoding="utf-8") as fh:
            for i in range(shard * per_shard, min(docs, (shard + 1) * per_shard)):
                n = int(rng.lognormvariate(4.5, 0.8)) + 5
                text = " ".join(rng.choice(_WORDS) for _ in range(n))
                fh.write(json.dumps({"id": i, "text": text}) + "\n")
    marker.write_text(f"{docs}/{shards}/{seed}")
    return folder


LOCAL_RUNNERS = [name for name, runner in REGISTRY.items() if runner.requires is None]
"""The runners the core install has (the demo needs no extra)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=Path("demo-data"), help="corpus folder")
    parser.add_argument("--docs", type=int, default=20_000, help="documents to generate")
    parser.add_argument("--shards", type=int, default=8, help="JSONL shards to write")
    parser.add_argument("--tokenizer", default="bytes", help="'bytes' or a tokenizer.json path")
    parser.add_argument("--batch-size", type=int, default=8, help="records per batch (8)")
    parser.add_argument(
        "--runner", default="threads", choices=LOCAL_RUNNERS,
        help="where operators run: in the loop, in threads (default) or in processes",
    )  # fmt: skip


def run_from_argv(argv: list[str] | None = None) -> int:
    """``python -m zephon.demo``: :func:`run` with the arguments of ``argv`` (``zephon demo``'s)."""
    parser = argparse.ArgumentParser(prog="zephon demo", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Generate the corpus if needed, run the pipeline, print throughput and the first batch."""
    console = PipeConsole()

    folder = make_corpus(args.data, docs=args.docs, shards=args.shards)
    dataset = Dataset.from_path("demo", folder)
    source = StaticMixtureWorkSource(
        datasets=[dataset], mixture=MixtureSpec({"demo": 1.0}), chunk_size=1024, seed=42
    )
    pipeline = (
        Pipeline(source)
        .decode_text()
        .tokenize(args.tokenizer)
        .batch(args.batch_size)
        .options(runner=args.runner, canonical_replicas=2)
    )
    console.print(f"[bold]corpus[/] {folder} ({dataset.total():,} docs, {args.shards} shards)")
    console.print(str(pipeline.explain()), soft_wrap=True, highlight=False)

    first: SampleBatch | None = None
    tokens = records = batches = 0
    start = time.perf_counter()
    with progress_bar(console, "docs") as progress:
        total = dataset.total()
        task = progress.add_task("decode -> tokenize -> batch", total=total, of=of_total(total))
        for item in pipeline:
            assert isinstance(item, SampleBatch)
            if first is None:
                first = item
            batches += 1
            records += len(item)
            tokens += sum(int(r.payload["input_ids"].shape[0]) for r in item)
            progress.update(task, advance=len(item))
    elapsed = time.perf_counter() - start

    table = Table(title="throughput")
    for col in ("batches", "docs", "tokens", "seconds", "docs/s", "tokens/s"):
        table.add_column(col, justify="right")
    table.add_row(
        f"{batches:,}",
        f"{records:,}",
        f"{tokens:,}",
        f"{elapsed:.2f}",
        f"{records / elapsed:,.0f}",
        f"{tokens / elapsed:,.0f}",
    )
    console.print(table)
    if first is not None:
        shown = Table(title=f"first batch (lane {first.lane_id})")
        for col in ("sample id", "chunk", "offset", "tokens", "first ids"):
            shown.add_column(col)
        for rec in first:
            ids = rec.payload["input_ids"]
            shown.add_row(
                str(rec.meta.sample_id),
                str(rec.meta.chunk_id),
                str(rec.meta.chunk_offset),
                str(len(ids)),
                " ".join(str(x) for x in ids[:8].tolist()) + " ...",
            )
        console.print(shown)
    stats = pipeline.stats()
    if stats is not None and stats.tombstones:
        console.print(
            f"{stats.tombstones} record(s) closed by tombstones "
            "(each lane's final partial batch is dropped: batch(drop_last=True))"
        )
    for line in closing_lines(args, records, tokens, batches):
        console.print(line, highlight=False, soft_wrap=True)
    return 0


def closing_lines(args: argparse.Namespace, docs: int, tokens: int, batches: int) -> list[str]:
    """Three lines: what the demo did, what it guarantees, and the next command to try."""
    return [
        f"done: {docs:,} docs from {args.shards} JSONL shards in {args.data} were decoded, "
        f"tokenized ({args.tokenizer}) into {tokens:,} tokens and batched into {batches:,} "
        f"batches of {args.batch_size}.",
        "every rerun gives these exact batches, on any runner or worker count and after a "
        "stop and resume.",
        "next: point a YAML pipeline at your own data (docs/index.md), then run "
        "`zephon explain pipeline.yaml` and `zephon run pipeline.yaml --checkpoint-dir ckpt`.",
    ]


if __name__ == "__main__":
    raise SystemExit(run_from_argv())

"""Pre-tokenized corpora: training samples/s of zephon against a raw numpy memmap reader.

One corpus (``--docs`` documents of 50-1,200 int32 tokens, written as a Megatron ``.bin/.idx``
pair and as Parquet ``list<int32>``), sequence length ``--seq`` (2048), micro-batches of 8.
The default 30,000 documents (18.7 M tokens) keep a run of each view near 20-40 ms: at 8,000
a fast view's run lasts about 7 ms, and a pipeline's start-up (about 1 ms) weighs in its rate.

- ``memmap ceiling``: a numpy memmap of the ``.bin`` read in GPTDataset order (the tokens
  concatenated, ``seq + 1``-token windows, shuffled window order), each batch sliced into one
  preallocated array: the raw reader every ratio is taken against. It is not a floor: each
  slice of an ``np.memmap`` builds a memmap object, so a loader can beat it.
- ``raw memoryview copies``: the same windows copied through memoryviews of a plain array
  view of the memmap (no per-slice objects): the copy-only floor, for scale.
- ``zephon chunks``: ``token_chunks(seq)`` over the ``.bin/.idx`` -> ``batch(8)`` (one record per
  window), and ``rows_per_item=8`` -> ``batch(1)`` (one record per micro-batch).
- ``zephon packs``: ``token_packs(seq)`` (best-fit rows from the index's lengths), the same two.
- ``zephon parquet``: ``map_transform(np.asarray)`` -> ``pack_flat(seq, algorithm="wrap")`` ->
  ``batch(8)`` over the Parquet copy (the record-per-document path).
- ``megatron-core GPTDataset`` when it is installed: its ``__getitem__`` in its own order.

Tokens/s count ``seq`` tokens per row delivered. Every configuration runs ``--repeats`` times
in interleaved rounds, inline runner, one lane; the table shows medians. Then the time to the
first batch on a corpus of ``--files`` small ``.bin/.idx`` files (discovery, opening every
index header, the work source, the first batch), for ``token_chunks`` and ``token_packs`` (which
also reads every index and packs every file).

Then the ``megatron_blend`` index (which dataset serves each blended sample) over
``--blend-samples`` samples of 3 and of 30 datasets: zephon's numpy build against
megatron-core's C++ ``build_blending_indices`` when it is installed (best of ``--repeats``).

``--cpu`` times the throughput runs by the process's CPU time instead of the wall clock: on a
shared machine, time spent waiting for a core is not the reader's.

Usage: ``python benchmarks/pretokenized.py [--docs 30000] [--files 10000] [--repeats 3]
[--blend-samples 1000000] [--cpu]``.
Prints a table and one final JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.io._token_writers import write_megatron

from zephon import Pipeline, StaticMixtureWorkSource
from zephon.io import Dataset, token_chunks, token_packs
from zephon.io._blend_index import blend_indices

BATCH = 8


def make_corpus(root: Path, docs: int, seed: int = 0) -> tuple[list[np.ndarray], Path]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(50, 1201, size=docs)
    flat = rng.integers(0, 50_000, size=int(lengths.sum())).astype(np.int32)
    parts = np.split(flat, np.cumsum(lengths)[:-1])
    write_megatron(root / "bin" / "corpus", parts, code=4)
    table = pa.table({"input_ids": pa.array(parts, type=pa.list_(pa.int32()))})
    (root / "parquet").mkdir()
    pq.write_table(table, root / "parquet" / "corpus.parquet", row_group_size=1000)
    return parts, root / "bin"


def memmap_ceiling(bin_file: Path, seq: int) -> int:
    tokens = np.memmap(bin_file, np.int32, "r")
    windows = (len(tokens) - 1) // seq
    order = np.random.default_rng(0).permutation(windows)
    delivered = 0
    for lo in range(0, windows - BATCH + 1, BATCH):
        out = np.empty((BATCH, seq + 1), np.int32)
        for row, w in enumerate(order[lo : lo + BATCH].tolist()):
            out[row] = tokens[w * seq : w * seq + seq + 1]
        delivered += BATCH * seq
    return delivered


def memoryview_floor(bin_file: Path, seq: int) -> int:
    tokens = np.asarray(np.memmap(bin_file, np.int32, "r"))
    windows, width = (len(tokens) - 1) // seq, seq + 1
    order = np.random.default_rng(0).permutation(windows)
    src = tokens.data
    delivered = 0
    for lo in range(0, windows - BATCH + 1, BATCH):
        out = np.empty((BATCH, width), np.int32)
        dst = out.reshape(-1).data
        for row, w in enumerate(order[lo : lo + BATCH].tolist()):
            dst[row * width : row * width + width] = src[w * seq : w * seq + width]
        delivered += BATCH * seq
    return delivered


def zephon_view(view: Dataset, per_item: int, seq: int) -> int:
    source = StaticMixtureWorkSource([view], chunk_size=256, seed=0, shuffle_within_shard=True)
    pipe = Pipeline(source).batch(BATCH // per_item).options(runner="inline")
    delivered = 0
    for batch in pipe:
        for record in batch.records:
            ids = record.payload["input_ids"]
            delivered += (ids.shape[0] if ids.ndim == 2 else 1) * seq
    return delivered


def zephon_parquet(folder: Path, seq: int) -> int:
    ds = Dataset.from_path("corpus", folder)
    source = StaticMixtureWorkSource([ds], chunk_size=256, seed=0, shuffle_within_shard=True)
    pipe = (
        Pipeline(source)
        .map_transform(lambda r: {"input_ids": np.asarray(r["input_ids"])})
        .pack_flat(seq, 0, algorithm="wrap")
        .batch(BATCH)
        .options(runner="inline")
    )
    return sum(len(b) * seq for b in pipe)


def _unshadow_megatron() -> None:
    """Drop this folder from the import path: its megatron.py would shadow megatron-core."""
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]


def megatron_gpt(prefix: Path, seq: int, cache: Path) -> Callable[[], int] | None:
    """megatron-core's GPTDataset over the same pair, or None when it is not installed."""
    _unshadow_megatron()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
            from megatron.core.datasets.indexed_dataset import IndexedDataset
            from megatron.core.datasets.utils import Split
    except ImportError:
        return None

    class _Tok:
        eod = pad = 0
        vocab_size = 50_000
        unique_identifiers: Any = {"class": "bench"}

    indexed = IndexedDataset(str(prefix))
    config = GPTDatasetConfig(
        random_seed=0,
        sequence_length=seq,
        blend=([str(prefix)], None),
        split="100,0,0",
        tokenizer=_Tok(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=str(cache),
        create_attention_mask=False,
    )
    docs = np.arange(len(indexed.document_indices) - 1, dtype=np.int32)
    gpt = GPTDataset(indexed, str(prefix), docs, None, Split.train, config)

    def run() -> int:
        delivered = 0
        for lo in range(0, len(gpt) - BATCH + 1, BATCH):
            rows = [gpt[i]["tokens"] for i in range(lo, lo + BATCH)]
            delivered += len(rows) * seq
        return delivered

    return run


def first_batch_seconds(root: Path, files: int, seq: int) -> dict[str, float]:
    """Seconds to the first batch of each view over ``files`` new small files."""
    rng = np.random.default_rng(1)
    for i in range(files):
        lengths = rng.integers(50, 1201, size=6)
        parts = [rng.integers(0, 50_000, size=int(n)).astype(np.int32) for n in lengths]
        write_megatron(root / f"part-{i:05d}", parts, code=4)
    out = {}
    for name, view_of in (("chunks", token_chunks), ("packs", token_packs)):
        start = time.perf_counter()
        view = view_of(Dataset.from_path("many", root), seq, rows_per_item=BATCH)
        source = StaticMixtureWorkSource([view], chunk_size=256, seed=0, shuffle_within_shard=True)
        next(iter(Pipeline(source).batch(1).options(runner="inline")))
        out[name] = time.perf_counter() - start
    return out


def blend_index_seconds(samples: int, repeats: int) -> dict[str, dict[str, float]]:
    """Best-of-``repeats`` seconds to build the blend index of 3 and of 30 datasets."""
    _unshadow_megatron()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.datasets import helpers
    except ImportError:
        helpers = None
    out: dict[str, dict[str, float]] = {}
    for k in (3, 30):
        weights = np.random.default_rng(k).dirichlet(np.ones(k))
        builds = {"zephon numpy": lambda w=weights: blend_indices(w.tolist(), samples)}
        if helpers is not None:
            which, number = np.zeros(samples, np.int16), np.zeros(samples, np.int64)
            builds["megatron-core C++"] = lambda w=weights, a=which, b=number: (
                helpers.build_blending_indices(a, b, w, len(w), samples, False)
            )
        for name, build in builds.items():
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                build()
                best = min(best, time.perf_counter() - start)
            out.setdefault(f"{k} datasets", {})[name] = round(best, 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=30000)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--blend-samples", type=int, default=1_000_000)
    parser.add_argument("--cpu", action="store_true", help="time by CPU time, not wall time")
    args = parser.parse_args()
    seq = args.seq
    clock = time.process_time if args.cpu else time.perf_counter
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        parts, bin_dir = make_corpus(root, args.docs)
        ds = Dataset.from_path("corpus", bin_dir)
        chunks1, chunks8 = token_chunks(ds, seq), token_chunks(ds, seq, rows_per_item=BATCH)
        packs1, packs8 = token_packs(ds, seq), token_packs(ds, seq, rows_per_item=BATCH)
        runs: dict[str, Callable[[], int]] = {
            "memmap ceiling, GPTDataset order": lambda: memmap_ceiling(bin_dir / "corpus.bin", seq),
            "raw memoryview copies, same order": lambda: memoryview_floor(
                bin_dir / "corpus.bin", seq
            ),
            "zephon chunks, record per row": lambda: zephon_view(chunks1, 1, seq),
            "zephon chunks, record per batch": lambda: zephon_view(chunks8, BATCH, seq),
            "zephon packs, record per row": lambda: zephon_view(packs1, 1, seq),
            "zephon packs, record per batch": lambda: zephon_view(packs8, BATCH, seq),
            "zephon parquet + pack_flat(wrap)": lambda: zephon_parquet(root / "parquet", seq),
        }
        gpt = megatron_gpt(bin_dir / "corpus", seq, root / "mcore-cache")
        if gpt is not None:
            runs["megatron-core GPTDataset"] = gpt
        times: dict[str, list[float]] = {name: [] for name in runs}
        tokens: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, run in runs.items():
                start = clock()
                tokens[name] = run()
                times[name].append(clock() - start)
        first = first_batch_seconds(root / "many", args.files, seq) if args.files else None
    rate = {n: tokens[n] / statistics.median(times[n]) for n in runs}
    ceiling = rate["memmap ceiling, GPTDataset order"]
    print(f"{sum(len(p) for p in parts):,} tokens in {args.docs:,} documents, seq {seq}")
    print(f"{'configuration':<36} {'Mtokens/s':>10} {'vs memmap':>10}")
    for name in runs:
        print(f"{name:<36} {rate[name] / 1e6:>10.1f} {rate[name] / ceiling:>10.2f}")
    for name, seconds in (first or {}).items():
        print(f"first batch, {args.files:,} .bin/.idx files, {name}: {seconds:.2f} s")
    blend = blend_index_seconds(args.blend_samples, args.repeats) if args.blend_samples else {}
    for what, secs in blend.items():
        print(f"blend index, {args.blend_samples:,} samples of {what}: {secs} s")
    result = {
        "benchmark": "pretokenized",
        "documents": args.docs,
        "seq": seq,
        "tokens_per_s": {n: round(r) for n, r in rate.items()},
        "vs_memmap": {n: round(r / ceiling, 3) for n, r in rate.items()},
        "first_batch_s": first,
        "files": args.files,
        "blend_index_s": blend,
        "blend_samples": args.blend_samples,
        "clock": "cpu" if args.cpu else "wall",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

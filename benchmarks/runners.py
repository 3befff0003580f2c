"""Runner throughput: inline, threads, process (shared fleet / pool per op, shm / pickle), Ray.

Two pipelines, each run once per runner configuration (2 workers per operator):

1. reference: fetch -> decode_text -> tokenize (a locally trained byte-level BPE) -> batch over
   in-memory documents; reports records/s end to end and the start-up time (first batch);
2. payload-heavy: every record gets a 1 MiB int32 array in one operator, a second operator
   reads it and passes it on, then batch. This is where shared memory matters: with
   ``shm_min_bytes=None`` each array is pickled three times (worker -> engine -> worker ->
   engine); with shared memory it is written once and only a handle moves.

"process reused workers" times a second iteration with ``reuse_workers=True`` (the first one
started the worker processes). Every configuration's output is checked against inline (same
bytes) before it is timed.
Prints a table and one final JSON line. Usage: ``python benchmarks/runners.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from zephon import Dataset, Pipeline
from zephon._engine.workers.worker_registry import shutdown_idle_workers
from zephon.work import WorkChunk, WorkSource

WORDS = ["data", "token", "lane", "chunk", "batch", "shard", "model", "train", "seed", "pack"]
MIB_INT32 = 256 * 1024  # 1 MiB of int32


class Chunks(WorkSource):
    """Consecutive pointers over one dataset in chunks, dealt to lanes modulo replicas."""

    def __init__(self, ds: Dataset, chunk: int, lane: int = 0, replicas: int = 1) -> None:
        self.ds, self.chunk, self.replicas, self.next = ds, chunk, replicas, lane
        self.n = ds.total()

    @property
    def datasets(self) -> list[Dataset]:
        return [self.ds]

    def next_chunk(self) -> WorkChunk | None:
        start = self.next * self.chunk
        if start >= self.n:
            return None
        idx = np.arange(start, min(self.n, start + self.chunk))
        per = self.ds.counts()[0]
        ptrs = np.stack([np.zeros_like(idx), idx // per, idx % per], axis=1).astype(np.int64)
        chunk = WorkChunk(ptrs, self.next)
        self.next += self.replicas
        return chunk

    def state_dict(self) -> dict[str, Any]:
        return {"next": self.next}

    def load_state_dict(self, state: Any) -> None:
        self.next = int(state["next"])

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> Chunks:
        return Chunks(self.ds, self.chunk, lane_id, canonical_replicas)


def make_docs(n: int) -> list[dict[str, Any]]:
    rng = random.Random(3)
    return [
        {"id": i, "text": " ".join(rng.choices(WORDS, k=rng.randint(20, 300)))} for i in range(n)
    ]


def train_tokenizer(docs: list[dict[str, Any]], folder: Path) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<s>", "</s>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator((str(d["text"]) for d in docs[:500]), trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>"})
    )
    return folder


def attach_mib(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "blob": np.full(MIB_INT32, int(payload["id"]), dtype=np.int32)}


def read_mib(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "total": int(payload["blob"][::4096].sum())}


def reference(docs: list[dict[str, Any]], tok: Path, runner: str, **opts: Any) -> Pipeline:
    ds = Dataset.from_records("docs", docs, shard_size=500)
    return (
        Pipeline(Chunks(ds, 64))
        .fetch(parallelism=2)
        .decode_text(parallelism=2)
        .tokenize(tok, max_length=512, parallelism=2)
        .batch(16)
        .options(runner=runner, canonical_replicas=2, **opts)
    )


def heavy(n: int, runner: str, **opts: Any) -> Pipeline:
    ds = Dataset.from_records("rows", [{"id": i} for i in range(n)], shard_size=256)
    return (
        Pipeline(Chunks(ds, 32))
        .map_transform(attach_mib, parallelism=2)
        .map_transform(read_mib, parallelism=2)
        .batch(8)
        .options(runner=runner, canonical_replicas=2, queue_size=4, **opts)
    )


def fingerprint(item: Any) -> tuple[Any, ...]:
    return tuple(
        (
            r.meta.cursor,
            {
                k: (v.tobytes() if isinstance(v, np.ndarray) else v)
                for k, v in r.payload.items()
                if k != "blob"
            }.__repr__(),
            int(r.payload["blob"][-1]) if "blob" in r.payload else None,
        )
        for r in item
    )


def timed(make: Callable[[], Pipeline]) -> tuple[float, float, int, list[Any]]:
    """(seconds to the first batch, seconds in total, records, fingerprints)."""
    start = time.perf_counter()
    first = 0.0
    records = 0
    prints = []
    for item in make():
        if not first:
            first = time.perf_counter() - start
        records += len(item)
        prints.append(fingerprint(item))
    return first, time.perf_counter() - start, records, prints


CONFIGS: list[tuple[str, str, dict[str, Any]]] = [
    ("inline", "inline", {}),
    ("threads", "threads", {}),
    ("process shared+shm", "process", {}),
    ("process per_op+shm", "process", {"process_pool": "per_op"}),
    ("process shared pickle", "process", {"shm_min_bytes": None}),
    ("process reused workers", "process", {"reuse_workers": True}),
    ("ray", "ray", {}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller inputs (CI smoke run)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray runner")
    args = parser.parse_args()
    n_docs, n_heavy = (1500, 160) if args.quick else (6000, 800)
    docs = make_docs(n_docs)
    configs = CONFIGS
    if args.no_ray:
        configs = [c for c in CONFIGS if c[1] != "ray"]
    else:
        try:
            import ray
        except ImportError:
            configs = [c for c in CONFIGS if c[1] != "ray"]
        else:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        tok = train_tokenizer(docs, Path(tmp))
        truth: dict[str, list[Any]] = {}
        for name, runner, opts in configs:
            for pipe_name, make in (
                ("reference", lambda r=runner, o=opts: reference(docs, tok, r, **o)),
                ("payload 1 MiB", lambda r=runner, o=opts: heavy(n_heavy, r, **o)),
            ):
                if opts.get("reuse_workers"):
                    timed(make)  # the iteration that starts the workers; the timed one reuses
                first, total, records, prints = timed(make)
                expected = truth.setdefault(pipe_name, prints)
                if prints != expected:
                    sys.exit(f"{name} on {pipe_name}: output differs from inline")
                rows.append(
                    {
                        "pipeline": pipe_name,
                        "runner": name,
                        "records": records,
                        "first_batch_s": round(first, 3),
                        "total_s": round(total, 3),
                        "records_per_s": round(records / total, 1),
                        "steady_records_per_s": round(records / max(total - first, 1e-9), 1),
                    }
                )
                print(
                    f"{pipe_name:<14} {name:<22} {records:>6} rec  first {first:6.2f} s  "
                    f"total {total:6.2f} s  {records / total:9.1f} rec/s  "
                    f"steady {records / max(total - first, 1e-9):9.1f} rec/s",
                    flush=True,
                )
    shutdown_idle_workers()
    by = {(r["pipeline"], r["runner"]): r for r in rows}
    heavy_shm = by[("payload 1 MiB", "process shared+shm")]["steady_records_per_s"]
    heavy_pickle = by[("payload 1 MiB", "process shared pickle")]["steady_records_per_s"]
    shared = by[("reference", "process shared+shm")]["first_batch_s"]
    per_op = by[("reference", "process per_op+shm")]["first_batch_s"]
    reused = by[("reference", "process reused workers")]["first_batch_s"]
    summary = {
        "benchmark": "runners",
        "quick": args.quick,
        "shm_speedup_payload": round(heavy_shm / heavy_pickle, 2),
        "startup_shared_fleet_s": shared,
        "startup_per_op_pools_s": per_op,
        "startup_reused_workers_s": reused,
        "results": rows,
    }
    print(
        f"\nshared memory vs pickling on 1 MiB payloads (steady state): "
        f"{summary['shm_speedup_payload']}x; process start-up to first batch: shared fleet "
        f"{shared} s, a pool per operator {per_op} s, reused workers {reused} s"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

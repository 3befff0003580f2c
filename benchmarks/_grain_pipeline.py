"""Grain's side of ``benchmarks/scaling.py``, run in an interpreter that has grain.

Grain does not go into zephon's environment; ``scaling.py --grain-python PATH`` runs this file
with PATH. The pipeline matches scaling.py's reference pipeline: read a JSONL line and
``json.loads`` it, ``encode_batch_fast`` on 64 documents a call (bos and eos added as zephon's
``tokenize`` does, truncated to the pack length), grain's best-fit packing to the pack length,
``batch(8)``, every step of it in each of W ``mp_prefetch`` workers (grain runs the whole
per-slice pipeline in its workers). Each worker's tokenizer pool gets the cores divided by W,
as zephon's process workers do.

Prints one JSON line: tokens and documents delivered, seconds from the start of iteration and
to the first batch, and the CPU seconds of this process and its workers over the whole pass
(scaling.py runs it on the corpus and on its start-up subset and takes the difference, as it
does for zephon's).
Usage: ``PYTHON _grain_pipeline.py --corpus DIR --tokenizer FILE --workers W``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

import grain
import numpy as np


class Lines:
    """Random access to the lines of a folder's ``part-*.jsonl`` files (one open file per
    process, opened on first use)."""

    def __init__(self, folder: Path) -> None:
        self.spans: list[tuple[str, int, int]] = []
        for path in sorted(folder.glob("part-*.jsonl")):
            offset = 0
            with open(path, "rb") as fh:
                for line in fh:
                    self.spans.append((str(path), offset, len(line)))
                    offset += len(line)
        self.fds: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"spans": self.spans, "fds": {}}

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, index: int) -> bytes:
        path, offset, size = self.spans[index]
        fd = self.fds.get(path)
        if fd is None:
            fd = self.fds[path] = os.open(path, os.O_RDONLY)
        return os.pread(fd, size, offset)


def text_of(line: bytes) -> str:
    return str(json.loads(line)["text"])


class Encode(grain.transforms.Map):
    """``encode_batch_fast`` on a list of texts; the tokenizer loads on first use in each worker."""

    def __init__(self, path: str, max_length: int, threads: int) -> None:
        self.path, self.max_length, self.threads = path, max_length, threads
        self.tok: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "tok": None}

    def map(self, texts: list[str]) -> list[dict[str, np.ndarray]]:
        if self.tok is None:
            os.environ.setdefault("RAYON_NUM_THREADS", str(self.threads))
            from tokenizers import Tokenizer

            self.tok = Tokenizer.from_file(self.path)
            self.bos, self.eos = self.tok.token_to_id("<s>"), self.tok.token_to_id("</s>")
        body = self.max_length - 2
        return [
            {"input_ids": np.array([self.bos, *enc.ids[:body], self.eos], dtype=np.int32)}
            for enc in self.tok.encode_batch_fast(texts, add_special_tokens=False)
        ]


class Unbatch(grain.experimental.FlatMapTransform):
    max_fan_out = 64

    def flat_map(self, element: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return element


def dataset(corpus: Path, tokenizer: str, workers: int, length: int) -> Any:
    threads = max(1, (os.cpu_count() or 1) // max(1, workers))
    ds = grain.MapDataset.source(Lines(corpus)).map(text_of).batch(64, batch_fn=list)
    it = ds.map(Encode(tokenizer, length, threads)).to_iter_dataset()
    it = grain.experimental.FlatMapIterDataset(it, Unbatch())
    it = grain.experimental.BestFitPackIterDataset(
        it, length_struct={"input_ids": length}, num_packing_bins=16, shuffle_bins=False
    )
    it = it.batch(8)
    if workers > 0:
        it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return it


def tree_cpu_s() -> float:
    """CPU seconds of this process, of the children it reaped and of every live process below
    it (from /proc): grain's workers may have ended, or not, when the iteration ends."""
    tick = os.sysconf("SC_CLK_TCK")
    times = os.times()
    total, todo = times.children_user + times.children_system, [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(stat[11]) + int(stat[12])) / tick
            for child in Path(f"/proc/{pid}/task").glob("*/children"):
                todo += [int(p) for p in child.read_text().split()]
        except FileNotFoundError:
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--length", type=int, default=2048)
    args = parser.parse_args()
    ds = dataset(args.corpus, args.tokenizer, args.workers, args.length)
    cpu, start = tree_cpu_s(), time.perf_counter()
    tokens = docs = 0
    first = 0.0
    iterator = iter(ds)
    for batch in iterator:
        segments = batch["input_ids_segment_ids"]
        tokens += int((segments > 0).sum())
        docs += sum(len(set(row[row > 0].tolist())) for row in segments)
        if not first:
            first = time.perf_counter() - start
    seconds = time.perf_counter() - start
    del iterator  # stops and reaps the workers, so their CPU is counted
    gc.collect()
    end_cpu = tree_cpu_s()
    out = {"grain": grain.__version__, "tokens": tokens, "docs": docs, "seconds": seconds}
    print(json.dumps({**out, "first_s": first, "cpu_s": end_cpu - cpu}))


if __name__ == "__main__":
    main()

"""A two-dataset mixture (JSON Lines with blank lines, and Parquet) and the checks that every
reported segment is exactly the tokens of the document it names."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.types import SampleBatch, SampleMeta, SampleRecord

WORDS = ["data", "token", "lane", "chunk", "shard", "é", "model", "seed", "pack", "mixture"]

PIPELINE_YAML = """\
datasets:
  - name: web
    path: web
  - name: books
    path: books
mixture: {{web: 1, books: 1}}
source:
  chunk_size: 32
  seed: 3
  stop_after_passes: 1
operators:
  - op: tokenize
    tokenizer: bytes
  - op: shuffle
    buffer_size: 48
    seed: {shuffle_seed}
  - pack_flat: {{max_length: {max_length}, pad_token_id: 0, algorithm: wrap}}
  - op: batch
    microbatch_size: 2
runner: {runner}
options:
  canonical_replicas: 2
"""


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))


def make_mixture(
    folder: Path,
    docs: int,
    *,
    shuffle_seed: int = 11,
    max_length: int = 96,
    runner: str = "threads",
) -> Path:
    """``docs`` documents per dataset; returns the pipeline file."""
    rng = random.Random(5)
    (folder / "web").mkdir(parents=True, exist_ok=True)
    (folder / "books").mkdir(parents=True, exist_ok=True)
    half = docs // 2
    for part, (lo, hi) in enumerate([(0, half), (half, docs)]):
        lines = []
        for i in range(lo, hi):
            if i % 17 == 3:
                lines.append("")  # blank lines are not rows: lines and rows differ
            lines.append(json.dumps({"id": i, "text": _text(rng)}))
        (folder / "web" / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")
    texts = [_text(rng) for _ in range(docs)]
    table = pa.table({"id": list(range(docs)), "text": texts})
    pq.write_table(table, folder / "books" / "books-0.parquet", row_group_size=64)
    path = folder / "pipeline.yaml"
    path.write_text(
        PIPELINE_YAML.format(shuffle_seed=shuffle_seed, max_length=max_length, runner=runner)
    )
    return path


def source_text(source: str, line: int | None, row: int) -> str:
    """The document's text, read straight from its file: JSON Lines by line number,
    Parquet by row."""
    if line is not None:
        return str(json.loads(Path(source).read_text().split("\n")[line - 1])["text"])
    return str(pq.read_table(source).slice(row, 1).to_pylist()[0]["text"])


def tokenize_like(pipe: Any, text: str) -> np.ndarray:
    """``text`` through the pipeline's own tokenize operator."""
    op = next(o for o in pipe.operators() if o.name == "tokenize")
    record = SampleRecord(SampleMeta((0, 0, 0), 0, 0, 0), {"text": text})
    return np.asarray(op.process_many([record])[0].payload["input_ids"])


def check_batch(pipe: Any, batch: SampleBatch) -> int:
    """Every segment of every row re-read, re-tokenized and cut: equal to the row's tokens.
    Returns how many segments were checked."""
    checked = 0
    prov = batch.provenance()
    assert len(prov) == len(batch.records)
    for record, segments in zip(batch.records, prov, strict=True):
        ids = np.asarray(record.payload["input_ids"])
        assert segments and segments[0].start == 0
        for seg, after in zip(segments, [*segments[1:], None], strict=True):
            doc = tokenize_like(pipe, source_text(seg.source, seg.line, seg.source_row))
            assert seg.source_length == len(doc)
            cut = doc[seg.source_start : seg.source_end]
            assert np.array_equal(cut, ids[seg.start : seg.end]), seg
            if after is not None:
                assert after.start == seg.end
            checked += 1
        assert not ids[segments[-1].end :].any()  # the rest is padding
    return checked

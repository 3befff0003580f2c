"""Every stateful operator, alone and combined, gives identical output with every runner."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import pytest

from tests.ops._helpers import ListSource
from zephon import Dataset, Pipeline
from zephon.types import TAG_CONTRIBUTORS, TAG_PACKING, SampleBatch

THREADS = [("inline", 1), ("threads", 1), ("threads", 2), ("threads", 4)]


def mixed_source(docs):
    a = Dataset.from_records("a", docs[:400], shard_size=60)
    b = Dataset.from_records("b", docs[400:], shard_size=60)
    rng = random.Random(5)
    pointers = [(0, i // 60, i % 60) for i in range(400)] + [
        (1, i // 60, i % 60) for i in range(len(docs) - 400)
    ]
    rng.shuffle(pointers)
    return ListSource([a, b], pointers, 37)


def build(kind: str, docs, tok, runner: str, workers: int) -> Pipeline:
    p = Pipeline(mixed_source(docs)).fetch(parallelism=workers).decode_text(parallelism=workers)
    p = p.tokenize(tok, max_length=64, parallelism=workers)
    if kind == "pack_flat":
        p = p.pack_flat(96, 0, parallelism=workers)
    elif kind == "pack_wrap":
        p = p.pack_sequences(80, algorithm="wrap", parallelism=workers)
    elif kind == "pack_bfw":
        p = p.pack_flat(96, 0, algorithm="best_fit_wrap", candidate_pool_size=16)
    elif kind.startswith("shuffle_"):
        p = p.shuffle(50, seed=9, algorithm=kind.removeprefix("shuffle_"), parallelism=workers)
    elif kind == "mixture":
        p = p.ensure_mixture(mixture={"a": 1, "b": 1}, max_buffer_size=64)
    elif kind == "combined":
        p = (
            p.shuffle(64, seed=1)
            .pack_flat(128, 0, parallelism=workers)
            .ensure_mixture(mixture={"a": 2, "b": 1}, weight_by="tokens", max_buffer_size=32)
            .batch(4, drop_last=True)
        )
    return p.options(runner=runner, canonical_replicas=2, flush_every_k_chunks=3)


def describe(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (str(value.dtype), hashlib.sha1(value.tobytes()).hexdigest())
    if isinstance(value, dict):
        return sorted((k, describe(v)) for k, v in value.items())
    if isinstance(value, list):
        return [describe(v) for v in value]
    return value


def digest(items) -> list[Any]:
    out = []
    for item in items:
        records = item.records if isinstance(item, SampleBatch) else [item]
        for r in records:
            tags = r.meta.tags
            out.append(
                (
                    r.meta.lane_id,
                    r.meta.cursor,
                    tuple(tags.get(TAG_CONTRIBUTORS, ())),
                    describe(dict(tags.get(TAG_PACKING, {}))),
                    describe(r.payload),
                )
            )
    return out


KINDS = [
    "pack_flat",
    "pack_wrap",
    "pack_bfw",
    "shuffle_streaming",
    "shuffle_block",
    "shuffle_block_warmup",
    "mixture",
    "combined",
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
def test_threads_match_inline(kind, docs, hf_tokenizer_dir):
    outs = {run: digest(build(kind, docs, hf_tokenizer_dir, *run)) for run in THREADS}
    reference = outs[("inline", 1)]
    assert len(reference) > 40
    for run, out in outs.items():
        assert out == reference, f"{kind}: {run} differs from inline"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["combined", "shuffle_block"])
def test_process_runner_matches_inline(kind, docs, hf_tokenizer_dir):
    inline = digest(build(kind, docs, hf_tokenizer_dir, "inline", 1))
    assert digest(build(kind, docs, hf_tokenizer_dir, "process", 2)) == inline


def test_combined_pipeline_delivers_every_token_once(docs, hf_tokenizer_dir):
    pipe = build("combined", docs, hf_tokenizer_dir, "threads", 2)
    batches = list(pipe)
    assert all(len(b) == 4 for b in batches)
    sources = [c for b in batches for r in b for c, _, _ in r.meta.tags[TAG_PACKING]["segments"]]
    assert len(sources) == len(set(sources))  # no document is packed twice
    t = batches[0].to_training()
    assert t["input_ids"].shape == (4, 128)
    assert (t["labels"][t["padding_mask"]] == -100).all()

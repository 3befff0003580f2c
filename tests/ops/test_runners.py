"""Every stateful operator variant, alone and combined, passes check_operator."""

from __future__ import annotations

import random

import pytest

from tests.ops._helpers import ListSource
from zephon import Dataset, Pipeline
from zephon.testing import check_operator
from zephon.types import TAG_PACKING


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


# Variants of the stateful operators, alone and combined; a new variant is one more entry.
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


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", KINDS)
def test_variant_passes_check_operator(kind, docs, hf_tokenizer_dir):
    def variant() -> Pipeline:
        return build(kind, docs, hf_tokenizer_dir, "inline", 2)

    report = check_operator(variant, runners=("inline", "threads", "process"), workers=(1, 2, 4))
    assert report.items >= 40


def test_combined_pipeline_delivers_every_token_once(docs, hf_tokenizer_dir):
    pipe = build("combined", docs, hf_tokenizer_dir, "threads", 2)
    batches = list(pipe)
    assert all(len(b) == 4 for b in batches)
    sources = [c for b in batches for r in b for c, _, _ in r.meta.tags[TAG_PACKING]["segments"]]
    assert len(sources) == len(set(sources))  # no document is packed twice
    t = batches[0].to_training()
    assert t["input_ids"].shape == (4, 128)
    assert (t["labels"][t["padding_mask"]] == -100).all()

"""The pipeline and the tiny model every integration test trains (ranks build them alike)."""

from __future__ import annotations

import hashlib
from typing import Any

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource

# Every document is unique (it holds its index), so a packed row identifies what it holds.
ROWS = [{"text": f"doc {i}: " + "lorem ipsum " * (1 + (i * 7) % 11)} for i in range(3000)]
VOCAB = 260  # byte tokens and a few specials
ROW_LENGTH = 64
BATCH = 2


def build_pipeline(*, docs: int = len(ROWS), **options: Any) -> Pipeline:
    """The pipeline over the first ``docs`` documents (a few make short epochs)."""
    return build_pipeline_unbatched(docs=docs, **options).batch(BATCH)


def build_pipeline_unbatched(*, docs: int = len(ROWS), **options: Any) -> Pipeline:
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("docs", ROWS[:docs])],
        mixture=MixtureSpec({"docs": 1.0}),
        chunk_size=16,
        seed=3,
    )
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes", max_length=ROW_LENGTH)
        .shuffle(32, seed=5)
        .pack_flat(ROW_LENGTH, pad_token_id=0)
        .options(runner="inline", canonical_replicas=4, **options)
    )


def epoch_rows(docs: int, epoch: int) -> list[list[str]]:
    """The row digests of each batch of epoch ``epoch`` over the first ``docs`` documents."""
    pipeline = build_pipeline(docs=docs).set_epoch(epoch)
    return [[row_digest(r) for r in b.to_training(convention="hf")["input_ids"]] for b in pipeline]


def row_digest(row: Any) -> str:
    """A short digest of one row of token ids (a tensor or an array)."""
    data = row.numpy() if hasattr(row, "numpy") else row
    return hashlib.sha256(data.astype("int64").tobytes()).hexdigest()[:16]


def tiny_llama() -> Any:
    """A randomly initialised two-layer Llama, the same on every rank (fixed seed)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2 * ROW_LENGTH,
    )
    return LlamaForCausalLM(config)


def rank_stream(docs: int, rank: int, group: int, count: int) -> list[tuple[int, list[str]]]:
    """The first ``count`` batches rank ``rank`` of 2 trains with ``group`` accumulation steps,
    as (pass, row digests): pass after pass, each cut to whole groups (the rest left out)."""
    out: list[tuple[int, list[str]]] = []
    epoch = 0
    while len(out) < count:
        pipeline = build_pipeline(docs=docs, dp_rank=rank, dp_world_size=2).set_epoch(epoch)
        batches = [
            [row_digest(r) for r in b.to_training(convention="hf")["input_ids"]] for b in pipeline
        ]
        out += [(epoch, rows) for rows in batches[: len(batches) // group * group]]
        epoch += 1
    return out[:count]


Batch = tuple[str, ...]


def lane_streams(docs: int, passes: int) -> dict[int, list[tuple[int, Batch]]]:
    """Each lane's batches, pass after pass, as (pass, row digests)."""
    lanes: dict[int, list[tuple[int, Batch]]] = {}
    for epoch in range(passes):
        for batch in build_pipeline(docs=docs).set_epoch(epoch):
            rows = tuple(row_digest(r) for r in batch.to_training(convention="hf")["input_ids"])
            lanes.setdefault(batch.lane_id, []).append((epoch, rows))
    return lanes


def follow_lanes(
    streams: dict[int, list[tuple[int, Batch]]],
    at: dict[int, int],
    lanes: list[int],
    trained: list[Batch],
) -> dict[int, int] | None:
    """Where each lane is after ``trained`` if every batch of it, in order, is the next batch of
    one of ``lanes`` (from positions ``at``): nothing skipped, nothing twice; None if not.
    Rows are not unique (a row of a long document's middle holds no index), so a batch that is
    the next of two lanes tries both."""
    if not trained:
        return at
    for lane in lanes:
        stream, index = streams[lane], at[lane]
        if index < len(stream) and stream[index][1] == trained[0]:
            found = follow_lanes(streams, {**at, lane: index + 1}, lanes, trained[1:])
            if found is not None:
                return found
    return None

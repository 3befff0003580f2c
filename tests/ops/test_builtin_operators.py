"""Every built-in operator passes ``zephon.testing.check_operator``: one line per operator.

Each entry appends the operator under test to a small upstream pipeline that feeds it the
input it expects; ``check_operator`` then proves it under every runner and worker count, at
many stop points, on other rank counts, and against the contract's direct probes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests._media import samples, video
from tests.ops._chat import CHATML_TAGGED, conversations
from zephon import Dataset, MixtureSpec, Pipeline, SampleBatch, SampleRecord
from zephon import StaticMixtureWorkSource as Source
from zephon.testing import check_operator

TEXTS = [{"id": i, "text": "alpha beta " * (1 + i % 7) + f"doc {i}"} for i in range(200)]
OTHER = [{"id": 1000 + i, "text": "gamma " * (1 + i % 3)} for i in range(120)]
CHATS = conversations(48, seed=3)
IMAGES = samples(40)
VIDEOS = [{"mp4": video(2 + i % 4, size=(32, 24), seed=i)} for i in range(12)]


def text_source() -> Source:
    return Source([Dataset.from_records("a", TEXTS, shard_size=50)], chunk_size=16, seed=1)


def two_sources() -> Source:
    return Source(
        [Dataset.from_records("a", TEXTS, shard_size=50),
         Dataset.from_records("b", OTHER, shard_size=40)],
        mixture=MixtureSpec({"a": 0.6, "b": 0.4}), chunk_size=16, seed=2,
    )  # fmt: skip


def tokens(source: Source) -> Pipeline:
    return Pipeline(source).decode_text().tokenize("bytes", max_length=48)


def keep_short(payload: dict[str, Any]) -> bool:
    return len(payload["text"]) < 60


def shout(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "text": payload["text"].upper()}


def count_words(state: int, payload: dict[str, Any]) -> tuple[int, list[Any]]:
    total = state + len(payload["text"].split())
    return total, [{**payload, "words_so_far": total}]


def lengths(batch: SampleBatch) -> SampleBatch:
    return SampleBatch(
        [SampleRecord(r.meta, {"n": len(r.payload["input_ids"])}) for r in batch.records]
    )


_GROUP_STORES: dict[str, str] = {}


def groups(op: str) -> tuple[Pipeline, str]:
    """The admitted groups of a filled prompt-ledger stream and its store URL (one file store
    per operator: each files its own drops in the ledger)."""
    from tests.capture._group_stream import filled_stream_url
    from zephon.capture.stores import open_store
    from zephon.capture.streaming import StreamingCaptureSource

    if op not in _GROUP_STORES:
        _GROUP_STORES[op] = filled_stream_url()
    url = _GROUP_STORES[op]
    source = StreamingCaptureSource(
        open_store(url), "s", groups_per_step=2, max_staleness=1000, prompts=24
    )
    return Pipeline(source), url


Build = Callable[[Path], Pipeline]
BUILTINS: dict[str, Build] = {
    "decode_text": lambda tok: Pipeline(text_source()).decode_text(),
    "decode_image": lambda tok: Pipeline(
        Source([Dataset.from_records("i", IMAGES, shard_size=16)], chunk_size=8)
    ).decode_image(min_pixels=28 * 28),
    "decode_video": lambda tok: Pipeline(
        Source([Dataset.from_records("v", VIDEOS, shard_size=6)], chunk_size=4)
    ).decode_video(min_pixels=28 * 28, max_pixels=28 * 28 * 4),
    "image_tokens": lambda tok: Pipeline(
        Source([Dataset.from_records("i", IMAGES, shard_size=16)], chunk_size=8)
    ).image_tokens(min_pixels=28 * 28),
    "map_transform": lambda tok: Pipeline(text_source()).decode_text().map_transform(shout),
    "filter": lambda tok: Pipeline(text_source()).decode_text().filter(keep_short),
    "tokenize": lambda tok: Pipeline(text_source()).decode_text().tokenize(tok, max_length=40),
    "expand_chat": lambda tok: Pipeline(
        Source([Dataset.from_records("c", CHATS)], chunk_size=8)
    ).expand_chat(),
    "tokenize_chat": lambda tok: (
        Pipeline(Source([Dataset.from_records("c", CHATS)], chunk_size=8))
        .expand_chat()
        .tokenize_chat(tok, chat_template=CHATML_TAGGED, max_length=96)
    ),
    "batch": lambda tok: tokens(text_source()).batch(4),
    "pack_sequences": lambda tok: tokens(text_source()).pack_sequences(64, algorithm="wrap"),
    "pack_flat": lambda tok: tokens(text_source()).pack_flat(64, 0, num_bins=4),
    "shuffle": lambda tok: tokens(text_source()).shuffle(24, seed=4),
    "ensure_mixture": lambda tok: tokens(two_sources()).ensure_mixture(max_buffer_size=32),
    "stateful_transform": lambda tok: (
        Pipeline(text_source())
        .decode_text()
        .stateful_transform("words", init_state=0, push=count_words)
    ),
    "map_batch": lambda tok: tokens(text_source()).batch(4).map_batch(lengths),
    "materialize": lambda tok: tokens(text_source()).materialize(),
    "drop_equal_rewards": lambda tok: (lambda p, url: p.drop_equal_rewards(url))(
        *groups("drop_equal_rewards")
    ),
    "keep_per_prompt": lambda tok: (lambda p, url: p.keep_per_prompt(url, 1))(
        *groups("keep_per_prompt")
    ),
    "difficulty_pool": lambda tok: (lambda p, url: p.difficulty_pool(url, 0.25, 0.75))(
        *groups("difficulty_pool")
    ),
}
# A StreamingCaptureSource's shards hold a store client, which does not travel to processes.
RUNNERS = {
    name: ("inline", "threads")
    for name in ("drop_equal_rewards", "keep_per_prompt", "difficulty_pool")
}


def test_every_registered_operator_is_checked():
    from zephon.pipeline import OPERATOR_METHODS

    assert sorted(BUILTINS) == sorted(OPERATOR_METHODS)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_operator_passes_check_operator(name, chat_tokenizer_dir):
    def build() -> Pipeline:
        return BUILTINS[name](chat_tokenizer_dir).options(canonical_replicas=2)

    runners = RUNNERS.get(name, ("inline", "threads", "process"))
    report = check_operator(build, runners=runners, workers=(1, 2, 4))
    assert report.items > 10
    assert len(report.passed) >= 10

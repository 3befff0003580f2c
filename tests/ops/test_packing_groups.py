"""pack_flat / pack_sequences with ``homogeneity`` and ``groups``, and the length pre-order.

Token ids encode their document (``doc * STRIDE + position``) and documents of the two datasets
are numbered apart, so a row's groups are read from its tokens, not from the packer's metadata.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from tests.ops._helpers import PAD, STRIDE, token_rows
from zephon import Dataset, MixtureSpec, Pipeline
from zephon import StaticMixtureWorkSource as Source
from zephon.errors import ConfigError, MissingFieldError
from zephon.testing import check_operator
from zephon.types import TAG_PACKING

RNG = random.Random(4)
A = token_rows([RNG.randint(1, 40) for _ in range(150)], first_id=0)
B = token_rows([RNG.randint(1, 40) for _ in range(150)], first_id=1000)
for row in A + B:
    row["topic"] = ["sports", "news", "code"][int(row["id"]) % 3]
TOPIC = {int(r["id"]): r["topic"] for r in A + B}


def source() -> Source:
    return Source(
        [Dataset.from_records("a", A, shard_size=40), Dataset.from_records("b", B, shard_size=40)],
        mixture=MixtureSpec({"a": 1, "b": 1}), chunk_size=12, seed=5,
    )  # fmt: skip


def docs_of(row: dict) -> set[int]:
    tokens = row["input_ids"][row["document_ids"] >= 0]
    return {int(t) // STRIDE for t in tokens}


def flat(**kw) -> list[dict]:
    pipe = Pipeline(source()).pack_flat(48, PAD, num_bins=3, **kw).options(canonical_replicas=2)
    return [r.payload for r in pipe]


def every_token_once(rows: list[dict]) -> None:
    got = Counter(int(t) for row in rows for t in row["input_ids"][row["document_ids"] >= 0])
    want = Counter(int(t) for r in A + B for t in r["input_ids"])
    assert got == want


def test_full_homogeneity_keeps_each_row_inside_one_dataset():
    mixed = flat()
    assert any(min(docs_of(r)) < 1000 <= max(docs_of(r)) for r in mixed)  # the default mixes
    rows = flat(homogeneity="full")
    assert all(len({d >= 1000 for d in docs_of(r)}) == 1 for r in rows)
    every_token_once(rows)


@pytest.mark.parametrize("groups", ["topic", {"a": "web", "b": "web"}])
def test_group_homogeneity_by_field_or_by_dataset(groups):
    rows = flat(homogeneity="group", groups=groups)
    every_token_once(rows)
    if groups == "topic":
        assert all(len({TOPIC[d] for d in docs_of(r)}) == 1 for r in rows)
    else:  # both datasets in one group: rows may mix them again
        assert any(min(docs_of(r)) < 1000 <= max(docs_of(r)) for r in rows)


def test_length_pre_order_packs_tighter_and_loses_nothing():
    def efficiency(rows: list[dict]) -> float:
        return float(np.mean([(r["document_ids"] >= 0).mean() for r in rows]))

    # first-fit decreasing over windows of 16 records, with as many bins open as a window holds
    rows_in_order = [
        r.payload for r in Pipeline(source()).pack_flat(48, PAD, algorithm="first_fit", num_bins=16)
    ]
    rows_sorted = [
        r.payload
        for r in Pipeline(source()).pack_flat(
            48, PAD, algorithm="first_fit", num_bins=16, shuffle_strategy="length",
            candidate_pool_size=16,
        )
    ]  # fmt: skip
    every_token_once(rows_sorted)
    assert len(rows_sorted) < len(rows_in_order)
    assert efficiency(rows_sorted) > efficiency(rows_in_order)


def test_grouped_length_ordered_packing_passes_check_operator():
    def build() -> Pipeline:
        return (
            Pipeline(source())
            .pack_sequences(
                48, num_bins=2, homogeneity="group", groups="topic",
                shuffle_strategy="length", candidate_pool_size=8,
            )
            .options(canonical_replicas=2, flush_every_k_chunks=3)
        )  # fmt: skip

    report = check_operator(build, runners=("inline", "threads", "process"), workers=(1, 2, 4))
    assert report.items > 20
    for record in build():
        topics = {TOPIC[int(p["id"])] for p in record.payload["packed_samples"]}
        assert len(topics) == 1 and record.meta.tags[TAG_PACKING]["total_length"] <= 48


def test_grouping_settings_are_checked():
    pipe = Pipeline(source())
    with pytest.raises(ConfigError, match="homogeneity='group' needs groups="):
        pipe.pack_flat(48, PAD, homogeneity="group")
    with pytest.raises(ConfigError, match="only read with homogeneity='group'"):
        pipe.pack_flat(48, PAD, groups="topic")
    with pytest.raises(ConfigError, match=r"unknown dataset\(s\) \['c'\]"):
        pipe.pack_flat(48, PAD, homogeneity="group", groups={"c": "x"})
    with pytest.raises(ConfigError, match="homogeneity must be one of"):
        pipe.pack_flat(48, PAD, homogeneity="ful")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="shuffle_strategy must be one of"):
        pipe.pack_flat(48, PAD, shuffle_strategy="random")  # type: ignore[arg-type]
    missing = Pipeline(source()).pack_flat(48, PAD, homogeneity="group", groups="domain")
    with pytest.raises(MissingFieldError, match="no group field 'domain'"):
        list(missing)

"""Keyed permutations: bijective, key-dependent, pointwise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.io import Dataset, Shard
from zephon.work import StaticMixtureWorkSource
from zephon.work._hashing import feistel_permute, keys_for, permutation


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=5000), key=st.integers(min_value=0, max_value=2**64 - 1)
)
def test_feistel_is_a_permutation(n: int, key: int) -> None:
    image = feistel_permute(np.arange(n, dtype=np.int64), n, key)
    assert sorted(image.tolist()) == list(range(n))
    # The per-element form agrees with the uniform one.
    vec = feistel_permute(np.arange(n, dtype=np.int64), np.full(n, n), np.full(n, key, np.uint64))
    assert vec.tolist() == image.tolist()


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=8))
def test_mixed_sizes_permute_each_group(sizes: list[int]) -> None:
    ids = np.repeat(np.arange(len(sizes)), sizes)
    pos = np.concatenate([np.arange(n) for n in sizes])
    image = feistel_permute(pos, np.repeat(sizes, sizes), keys_for(99, ids))
    for g, n in enumerate(sizes):
        assert sorted(image[ids == g].tolist()) == list(range(n))


def test_keys_change_the_permutation() -> None:
    a = feistel_permute(np.arange(1000), 1000, 1)
    b = feistel_permute(np.arange(1000), 1000, 2)
    assert (a != b).mean() > 0.9
    assert permutation(50, 1).tolist() != permutation(50, 2).tolist()
    assert sorted(permutation(50, 1).tolist()) == list(range(50))


class CountOnly(Shard):
    def __init__(self, n: int) -> None:
        self.n = n

    @property
    def location(self) -> str:
        return "<count-only>"

    def __len__(self) -> int:
        return self.n

    def read(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        raise AssertionError("a work source never reads rows")


def test_global_shuffle_of_a_billion_rows_is_pointwise() -> None:
    ds = Dataset("huge", [CountOnly(10_000_000)] * 100)
    src = StaticMixtureWorkSource(
        [ds], chunk_size=4096, shuffle_within_shard=True, shuffle_block_size="global"
    ).clone_for_lane(3, 8)
    chunk = src.next_chunk()
    assert chunk is not None and len(chunk) == 4096
    rows = {(s, i) for _, s, i in chunk}
    assert len(rows) == 4096
    assert all(0 <= i < 10_000_000 and 0 <= s < 100 for s, i in rows)
    assert len({s for s, _ in rows}) > 90  # spread over the whole dataset

"""The read order of one dataset: position in its (infinite, repeating) stream -> pointer.

Position ``p`` belongs to pass ``p // N`` (``N`` = rows). Within a pass the order is: shards
in a permuted order (``shuffle_shards``), rows inside each shard permuted
(``shuffle_within_shard``), and finally consecutive blocks of ``block_size`` positions permuted
(``shuffle_block_size``, mixing rows across neighbouring shards). Every permutation is derived
from ``(seed, dataset, pass, ...)`` keys and evaluated pointwise (a keyed Feistel bijection),
so any position range is computed directly in O(range) time and memory, without replaying or
materialising anything: even a global shuffle of a huge dataset costs nothing up front.
An epoch other than 0 (``Pipeline.set_epoch``) keys every pass of it apart from all others.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zephon.work._hashing import (
    TAG_BLOCK,
    TAG_EPOCH,
    TAG_SHARDS,
    TAG_WITHIN,
    feistel_permute,
    keys_for,
    mix64,
    permutation,
)


class DatasetOrder:
    """Pointers for positions of one dataset's stream. Not thread-safe: one per lane clone."""

    def __init__(
        self,
        counts: Sequence[int],
        *,
        seed: int,
        dataset_id: int,
        shuffle_shards: bool,
        shuffle_within_shard: bool,
        block_size: int | None,
        reshuffle_on_repeat: bool,
        epoch: int = 0,
    ) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        self.total = int(self.counts.sum())
        self.seed = seed
        self.dataset_id = dataset_id
        self.shuffle_shards = shuffle_shards
        self.shuffle_within_shard = shuffle_within_shard
        self.block_size = block_size if block_size and block_size > 1 else None
        self.reshuffle_on_repeat = reshuffle_on_repeat
        self.epoch = epoch
        self._shard_layout: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None

    def _epoch_key(self, repeat: int) -> int:
        """The key of pass ``repeat`` of the stream (epoch 0 keeps the keys it always had)."""
        key = repeat if self.reshuffle_on_repeat else 0
        return key if self.epoch == 0 else mix64(TAG_EPOCH, self.epoch, key)

    def _layout(self, ek: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(shard order, cumulative starts, cumulative ends) of epoch key ``ek``."""
        cached = self._shard_layout
        if cached is not None and cached[0] == ek:
            return cached[1], cached[2], cached[3]
        n = len(self.counts)
        order = (
            permutation(n, mix64(self.seed, TAG_SHARDS, self.dataset_id, ek))
            if self.shuffle_shards
            else np.arange(n, dtype=np.int64)
        )
        ends = np.cumsum(self.counts[order])
        starts = ends - self.counts[order]
        self._shard_layout = (ek, order, starts, ends)
        return order, starts, ends

    def pointers(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(shard_ids, indices)`` of positions ``[start, start + count)``."""
        shards: list[np.ndarray] = []
        rows: list[np.ndarray] = []
        pos, end = start, start + count
        while pos < end:
            repeat, p0 = divmod(pos, self.total)
            p1 = min(self.total, p0 + (end - pos))
            s, r = self._epoch_pointers(self._epoch_key(repeat), p0, p1)
            shards.append(s)
            rows.append(r)
            pos += p1 - p0
        if len(shards) == 1:
            return shards[0], rows[0]
        if not shards:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(shards), np.concatenate(rows)

    def _epoch_pointers(self, ek: int, p0: int, p1: int) -> tuple[np.ndarray, np.ndarray]:
        lin = np.arange(p0, p1, dtype=np.int64)
        if self.block_size is not None:
            b = self.block_size
            parts = []
            for blk in range(p0 // b, (p1 - 1) // b + 1):
                lo, hi = max(p0, blk * b), min(p1, (blk + 1) * b)
                blen = min(b, self.total - blk * b)
                key = mix64(self.seed, TAG_BLOCK, self.dataset_id, ek, blk)
                offsets = np.arange(lo - blk * b, hi - blk * b, dtype=np.int64)
                parts.append(blk * b + feistel_permute(offsets, blen, key))
            lin = parts[0] if len(parts) == 1 else np.concatenate(parts)
        order, starts, ends = self._layout(ek)
        if self.block_size is None:
            # Contiguous positions: a few runs of whole shards, no per-element search.
            lo, hi = np.searchsorted(ends, [p0, p1 - 1], side="right").tolist()
            runs = np.arange(lo, hi + 1)
            lengths = np.minimum(ends[runs], p1) - np.maximum(starts[runs], p0)
            shard_ids = np.repeat(order[runs], lengths)
            local = lin - np.repeat(starts[runs], lengths)
        else:
            slot = np.searchsorted(ends, lin, side="right")
            local = lin - starts[slot]
            shard_ids = order[slot]
        if self.shuffle_within_shard:
            base = mix64(self.seed, TAG_WITHIN, self.dataset_id, ek)
            local = feistel_permute(local, self.counts[shard_ids], keys_for(base, shard_ids))
        return shard_ids, local

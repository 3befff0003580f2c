"""Counter-based randomness: permutations derived from keys, never from a stateful RNG.

Every random decision of a work source (shard order, within-shard order, block shuffles, the
chunk->lane deal) is a pure function of ``(seed, purpose, ids...)``. That makes any part of the
stream computable on its own (a lane computes only its own chunks), keeps the checkpoint free
of RNG state, and is stable across numpy versions (only integer arithmetic and a sort of
distinct keys).
"""

from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB

# Purposes, so that keys for different decisions never collide.
TAG_SHARDS = 1
TAG_WITHIN = 2
TAG_BLOCK = 3
TAG_LANES = 4


def _splitmix(x: int) -> int:
    z = (x + _GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * _M1) & MASK64
    z = ((z ^ (z >> 27)) * _M2) & MASK64
    return z ^ (z >> 31)


def mix64(*parts: int) -> int:
    """A 64-bit key from integers (any sign or size), order-sensitive."""
    h = 0x243F6A8885A308D3
    for p in parts:
        h = _splitmix(h ^ (p & MASK64))
        if p < 0 or p > MASK64:  # fold the high bits of big or negative ints in too
            h = _splitmix(h ^ ((p >> 64) & MASK64) ^ (1 if p < 0 else 0))
    return h


def splitmix64_array(x: np.ndarray) -> np.ndarray:
    """Vectorised splitmix64 finaliser over a uint64 array (a bijection on 64-bit ints)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
        return z ^ (z >> np.uint64(31))


def permutation(n: int, key: int) -> np.ndarray:
    """A pseudo-random permutation of ``range(n)`` determined by ``key`` (int64 array).

    The sort keys are distinct (splitmix64 is a bijection), so the result does not depend on
    the sort algorithm.
    """
    if n <= 1:
        return np.arange(n, dtype=np.int64)
    h = splitmix64_array(np.arange(n, dtype=np.uint64) ^ np.uint64(key & MASK64))
    return np.argsort(h).astype(np.int64, copy=False)

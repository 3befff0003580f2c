"""megatron-core's blending index (``build_blending_indices``) in numpy, element for element.

Why: the greedy is sequential (sample ``i`` goes to the dataset whose drawn count lags
``weight * max(i, 1)`` most, the first on ties), so a plain loop costs about a second per
million samples. Here the samples are cut into blocks that all run the greedy at once, one
numpy lane per block, from a guessed start (the counts the weights round to). Walking the
blocks in order, a block whose guess was its true start is taken whole; otherwise the greedy
runs exactly, in Python, from the true start until its counts meet the lane's at the same
sample (the greedy corrects itself: they meet within tens of samples, at worst the walk runs
to the block's end) and the lane's rest is taken. Every choice is made by the same double
arithmetic and first-maximum rule as megatron-core's C++, so the result is equal, ties
included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _guessed_counts(weights: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each block's start counts as the weights would round them: the floor of the ideal
    count, plus one for the datasets with the largest remainders until they sum to the start."""
    ideal = weights[None, :] * np.maximum(starts, 1).astype(np.float64)[:, None]
    counts: np.ndarray = np.floor(ideal).astype(np.int64)
    short = starts - counts.sum(axis=1)
    order = np.argsort(counts - ideal, axis=1, kind="stable")  # largest remainder first
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(len(weights))[None, :], axis=1)
    counts += rank < short[:, None]
    return counts


def _lanes(weights: np.ndarray, starts: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """The greedy's choices of every block at once, each from its guessed start counts."""
    start_counts = _guessed_counts(weights, starts)
    drawn = start_counts.astype(np.float64)  # exact: counts stay far below 2**53
    kind = np.int16 if len(weights) <= np.iinfo(np.int16).max else np.int64  # as megatron-core
    which = np.empty((len(starts), block), dtype=kind)
    rows = np.arange(len(starts))
    for t in range(block):
        x = np.maximum(starts + t, 1).astype(np.float64)
        pick = np.argmax(weights[None, :] * x[:, None] - drawn, axis=1)  # first max on ties
        which[:, t] = pick
        drawn[rows, pick] += 1
    return start_counts, which


def _greedy_until_met(
    weights: list[float], truth: list[int], lane: list[int], first: int, choices: np.ndarray
) -> int:
    """Run the exact greedy from ``truth`` (updated in place) over ``choices`` (the lane's,
    overwritten with the true ones) until it meets the lane's counts ``lane``; returns how
    many samples it ran."""
    planned = choices.tolist()
    t = 0
    while lane != truth and t < len(planned):
        x = float(max(first + t, 1))
        best, err = 0, weights[0] * x - truth[0]
        for k in range(1, len(weights)):
            e = weights[k] * x - truth[k]
            if e > err:
                best, err = k, e
        choices[t] = best
        truth[best] += 1
        lane[planned[t]] += 1
        t += 1
    return t


def blend_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Each blended sample's dataset and its sample number there: the dataset whose drawn count
    lags ``weight * max(i, 1)`` most (the first on ties), as megatron-core builds them."""
    w = np.asarray([float(x) for x in weights], dtype=np.float64)
    if size <= 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    block = max(64, math.isqrt(size))
    starts = np.arange(0, size, block, dtype=np.int64)
    start_counts, which = _lanes(w, starts, block)
    truth = [0] * len(w)
    wl = w.tolist()
    for b, first in enumerate(starts.tolist()):
        n = min(block, size - first)
        ran = _greedy_until_met(wl, truth, start_counts[b].tolist(), first, which[b, :n])
        rest = np.bincount(which[b, ran:n], minlength=len(w)).tolist()
        truth = [a + c for a, c in zip(truth, rest, strict=True)]
    flat = which.reshape(-1)[:size]
    number = np.empty(size, dtype=np.int64)
    for k in range(len(w)):
        at = np.flatnonzero(flat == k)
        number[at] = np.arange(len(at), dtype=np.int64)
    return flat, number

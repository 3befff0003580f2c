"""``blend_indices`` against megatron-core's own C++ ``build_blending_indices``: equal element
for element, ties included, for weights that tie at every sample, weights that never do and
blends of many datasets (where the numpy lanes' guessed starts are wrong and the exact walk
has to catch up)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from zephon.io._blend_index import _guessed_counts, blend_indices

with warnings.catch_warnings():  # it warns that Transformer Engine and Apex are not installed
    warnings.simplefilter("ignore")
    from megatron.core.datasets import helpers

WEIGHTS = {
    "uneven": [0.5, 0.3, 0.2],
    "equal-4": [0.25] * 4,  # every sample ties
    "thirds": [1 / 3] * 3,  # ties up to rounding
    "equal-10": [0.1] * 10,
    "tiny-share": [0.999, 0.001],
    "dirichlet-30": np.random.RandomState(1).dirichlet(np.ones(30)).tolist(),
}


def _theirs(weights: list[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    which = np.zeros(size, dtype=np.int16)
    number = np.zeros(size, dtype=np.int64)
    w = np.asarray(weights, dtype=np.float64)
    helpers.build_blending_indices(which, number, w, len(w), size, False)
    return which, number


@pytest.mark.parametrize("name", sorted(WEIGHTS))
@pytest.mark.parametrize("size", [1, 2, 3, 63, 64, 65, 4097, 100_003])
def test_equal_to_megatron_cores_helper(name: str, size: int) -> None:
    which, number = blend_indices(WEIGHTS[name], size)
    theirs = _theirs(WEIGHTS[name], size)
    assert np.array_equal(which, theirs[0]) and np.array_equal(number, theirs[1])


def test_a_million_samples_of_thirty_datasets_need_the_exact_walk() -> None:
    """The lanes start from guessed counts; for 30 datasets many guesses are wrong (so the
    exact walk is what makes the result right), and the result is still megatron-core's."""
    weights, size = WEIGHTS["dirichlet-30"], 1_000_000
    which, number = blend_indices(weights, size)
    theirs = _theirs(weights, size)
    assert np.array_equal(which, theirs[0]) and np.array_equal(number, theirs[1])
    block = max(64, math.isqrt(size))
    starts = np.arange(0, size, block)
    onehot_counts = np.stack(
        [np.bincount(theirs[0][:s], minlength=len(weights)) for s in starts.tolist()]
    )
    wrong = np.any(_guessed_counts(np.asarray(weights), starts) != onehot_counts, axis=1)
    assert 0 < int(wrong.sum()) < len(starts)


def test_no_samples() -> None:
    which, number = blend_indices([0.5, 0.5], 0)
    assert len(which) == len(number) == 0

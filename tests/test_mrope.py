"""mRoPE position ids of packed rows with images, against transformers' own rope index of the
tiny Qwen2-VL on each document alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests._qwen2_vl import IMAGE_TOKEN, tiny_qwen2_vl
from zephon._mrope import document_mrope, row_mrope
from zephon._ops._pack_images import row_layout
from zephon.errors import DataError

# Documents as (text tokens before each image, image grid) parts and trailing text tokens.
DOCUMENTS = [
    ([(0, (1, 4, 6))], 5),
    ([(3, (1, 6, 2)), (2, (1, 2, 2))], 4),
    ([], 7),
    ([(1, (2, 4, 4))], 0),
    ([(2, (1, 8, 4)), (1, (1, 4, 8)), (3, (1, 2, 10))], 2),
]


def hf_positions(parts: list[tuple[int, tuple[int, int, int]]], tail: int) -> np.ndarray:
    """transformers' positions of one document laid out as ``parts`` then ``tail`` text."""
    ids: list[int] = []
    for text, (t, h, w) in parts:
        ids += [5] * text + [IMAGE_TOKEN] * (t * h * w // 4)
    ids += [5] * tail
    input_ids = torch.tensor([ids])
    grids = torch.tensor([g for _, g in parts], dtype=torch.long).reshape(-1, 3)
    model = tiny_qwen2_vl().model
    if not parts:  # text only: the model's own positions are 0..n-1 in all three
        return np.broadcast_to(np.arange(len(ids)), (3, len(ids)))
    positions, _ = model.get_rope_index(
        input_ids, mm_token_type_ids=(input_ids == IMAGE_TOKEN).int(), image_grid_thw=grids
    )
    return positions[:, 0].numpy()


def test_each_document_matches_transformers_rope_index() -> None:
    for parts, tail in DOCUMENTS:
        length = sum(n + g[0] * g[1] * g[2] // 4 for n, g in parts) + tail
        offsets, at = [], 0
        for text, (t, h, w) in parts:
            offsets.append((at + text, (t, h, w)))
            at += text + t * h * w // 4
        np.testing.assert_array_equal(document_mrope(length, offsets, 2), hf_positions(parts, tail))


def test_a_packed_row_restarts_every_document_at_zero() -> None:
    lengths, images, grids, expected = [], [], [], []
    for parts, tail in DOCUMENTS:
        # the packed layout: a sample's images first, then its text
        doc_grids = [g for _, g in parts]
        counts = [t * h * w // 4 for t, h, w in doc_grids]
        lengths.append(sum(counts) + sum(n for n, _ in parts) + tail)
        images.append(counts)
        grids += doc_grids
        offsets, at = [], 0
        for t, h, w in doc_grids:
            offsets.append((at, (t, h, w)))
            at += t * h * w // 4
        expected.append(document_mrope(lengths[-1], offsets, 2))
    cu, image_map = row_layout(lengths, images)
    row = row_mrope(cu, image_map, grids, 2)
    np.testing.assert_array_equal(row, np.concatenate(expected, axis=1))
    assert row.shape == (3, sum(lengths)) and row.dtype == np.int64
    assert (row[:, cu[:-1]] == 0).all()  # every document starts at 0


def test_adjacent_images_are_two_images() -> None:
    # one 2x2-token image, then a 1x2-token image right after it, then 2 text tokens
    got = document_mrope(8, [(0, (1, 4, 4)), (4, (1, 2, 4))], 2)
    expected = [
        [0, 0, 0, 0, 2, 2, 4, 5],
        [0, 0, 1, 1, 2, 2, 4, 5],
        [0, 1, 0, 1, 2, 3, 4, 5],
    ]
    assert got.tolist() == expected


def test_a_grid_that_disagrees_with_the_row_is_an_error() -> None:
    cu, image_map = row_layout([10], [[4]])
    with pytest.raises(DataError, match=r"image 0 of sample 0 has grid \(1, 4, 6\), not the 4"):
        row_mrope(cu, image_map, [(1, 4, 6)], 2)

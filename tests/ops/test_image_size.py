"""smart_resize and the vision-token count agree with the Qwen2-VL processor's own function."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
    smart_resize as qwen_smart_resize,
)

from zephon._ops._image_size import PatchGrid, smart_resize
from zephon.errors import ConfigError


@settings(max_examples=600, deadline=None)
@given(
    height=st.integers(1, 5000),
    width=st.integers(1, 5000),
    factor=st.sampled_from([14, 28, 32, 56]),
    min_pixels=st.sampled_from([1, 56 * 56, 28 * 28 * 4, 256 * 28 * 28]),
    max_pixels=st.sampled_from([28 * 28 * 16, 14 * 14 * 4 * 1280, 1280 * 28 * 28, 4096 * 4096]),
)
def test_smart_resize_matches_transformers(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> None:
    try:
        want = qwen_smart_resize(height, width, factor, min_pixels, max_pixels)
    except ValueError:
        with pytest.raises(ValueError, match="aspect ratio"):
            smart_resize(height, width, factor, min_pixels, max_pixels)
        return
    assert smart_resize(height, width, factor, min_pixels, max_pixels) == want


def test_rounding_halves_go_to_even_as_the_processor_does() -> None:
    # 42 / 28 = 1.5 rounds to 2, 70 / 28 = 2.5 rounds to 2 (Python's round, half to even)
    assert smart_resize(42 * 10, 70 * 10, 28, 1, 10**9) == qwen_smart_resize(420, 700, 28, 1, 10**9)
    assert smart_resize(70, 42, 28, 1, 10**9) == (56, 56) == qwen_smart_resize(70, 42, 28, 1, 10**9)


def test_grid_and_tokens_of_a_resized_image() -> None:
    grid = PatchGrid(patch_size=14, merge_size=2)
    h, w = grid.resized(300, 500)
    assert (h, w) == qwen_smart_resize(300, 500, 28, 56 * 56, 14 * 14 * 4 * 1280)
    assert grid.grid(h, w) == (1, h // 14, w // 14)
    assert grid.tokens(h, w) == (h // 14) * (w // 14) // 4


def test_bad_bounds_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"min_pixels .* above max_pixels"):
        PatchGrid(min_pixels=100, max_pixels=10)
    with pytest.raises(ConfigError, match="patch_size must be >= 1"):
        PatchGrid(patch_size=0)

"""Image sizes in patches: the Qwen2-VL processor's ``smart_resize`` and the vision-token count.

Why here and exact: a token count must be known for planning (packing) without pixels, and it
must agree with the model's processor, so the rounding is the processor's own: Python's
``round`` (half to even) first, then ``floor``/``ceil`` against the pixel bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zephon.errors import ConfigError

#: The Qwen2-VL image processor's defaults (pixels).
QWEN_MIN_PIXELS = 56 * 56
QWEN_MAX_PIXELS = 14 * 14 * 4 * 1280
MAX_ASPECT = 200


@dataclass(frozen=True, slots=True)
class PatchGrid:
    """How images are cut into patches: ``patch_size`` pixels a side, ``merge_size`` x
    ``merge_size`` patches per vision token, the pixel bounds of a resized image."""

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = QWEN_MIN_PIXELS
    max_pixels: int = QWEN_MAX_PIXELS

    def __post_init__(self) -> None:
        for name in ("patch_size", "merge_size", "min_pixels", "max_pixels"):
            if getattr(self, name) < 1:
                raise ConfigError(f"decode_image: {name} must be >= 1, got {getattr(self, name)}")
        if self.min_pixels > self.max_pixels:
            raise ConfigError(
                f"decode_image: min_pixels ({self.min_pixels}) is above max_pixels "
                f"({self.max_pixels}); lower min_pixels or raise max_pixels"
            )

    @property
    def factor(self) -> int:
        """The side of one vision token in pixels: resized sides are multiples of it."""
        return self.patch_size * self.merge_size

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """``(height, width)`` as the processor resizes them (see :func:`smart_resize`)."""
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        """``(t, h, w)`` in patches of an image already resized (``image_grid_thw``)."""
        return 1, height // self.patch_size, width // self.patch_size

    def tokens(self, height: int, width: int) -> int:
        """Vision tokens of an image already resized: patches over ``merge_size**2``."""
        _, h, w = self.grid(height, width)
        return h * w // (self.merge_size * self.merge_size)


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """The size nearest ``(height, width)`` with both sides multiples of ``factor``, its area
    within ``[min_pixels, max_pixels]`` and its aspect ratio kept as far as rounding allows
    (the Qwen2-VL image processor's rule, rounding included)."""
    if height < 1 or width < 1:
        raise ValueError(f"an image of {width}x{height} pixels has no area")
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(
            f"aspect ratio {max(height, width) / min(height, width):.0f} of a {width}x{height} "
            f"image is above {MAX_ASPECT}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar

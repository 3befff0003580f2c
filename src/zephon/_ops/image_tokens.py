"""image_tokens: vision tokens and patch grids of encoded images, from their headers alone.

Why: packing plans rows by token counts, and decoding every image to learn its size costs far
more than reading its header (Pillow gives the size without decoding). The count is
``decode_image``'s own (same ``smart_resize``), so a plan made from headers holds after decoding.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from zephon._image_fields import IMAGE_FIELDS
from zephon._ops._image_size import QWEN_MAX_PIXELS, QWEN_MIN_PIXELS
from zephon._ops.decode_image import DECODE_MICRO_BATCH, DecodeImageOp, image_arguments
from zephon._optional import require

#: EXIF orientations that swap width and height (transposes and quarter turns).
_SIDEWAYS = frozenset({5, 6, 7, 8})
_ORIENTATION = 0x0112


class ImageTokensOp(DecodeImageOp):
    """Adds ``grid_field`` (each image's ``(t, h, w)`` patch grid) and ``tokens_field`` (the
    record's vision tokens) as ``decode_image`` would, leaving the image bytes as they are.

    Only the header is read: the size, and the EXIF orientation (a sideways image's grid has
    its sides swapped, as after decoding). An EXIF block a PNG stores after its pixel data is
    not seen without decoding; the count is the same either way, only the grid's sides differ.
    """

    name = "image_tokens"

    def __init__(
        self,
        fields: Sequence[str] = IMAGE_FIELDS,
        *,
        patch_size: int = 14,
        merge_size: int = 2,
        min_pixels: int = QWEN_MIN_PIXELS,
        max_pixels: int = QWEN_MAX_PIXELS,
        max_patches: int | None = None,
        grid_field: str = "image_grid_thw",
        tokens_field: str = "vision_tokens",
        on_error: Literal["raise", "skip"] | None = None,
        max_batch: int = DECODE_MICRO_BATCH,
    ) -> None:
        super().__init__(**image_arguments(locals()))

    def config(self) -> Mapping[str, Any]:
        return {k: v for k, v in super().config().items() if k != "resize"}

    def _read(self, image: Any, data: Any) -> tuple[Any, tuple[int, int, int]]:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"expected encoded image bytes, got {type(data).__name__}")
        base = require("PIL.Image", "image_tokens").Image
        with image.open(io.BytesIO(data)) as opened:
            width, height = opened.size
            # the base class's getexif reads what the header gave; a PNG's would decode
            if base.getexif(opened).get(_ORIENTATION, 1) in _SIDEWAYS:
                width, height = height, width
        return data, self._grid.grid(*self._grid.resized(height, width))

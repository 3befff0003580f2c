"""decode_image: turn encoded image bytes (JPEG, PNG, WebP, ...) into uint8 RGB pixels.

Why an operator: readers keep media encoded (a row is cheap to fetch, pickle and skip), and
the decode runs where it pays, on worker threads (Pillow releases the GIL while it decodes and
resizes). The output is what a Qwen2-VL style processor would feed the model: RGB after EXIF
orientation, optionally resized to patch multiples, with its patch grid and vision-token count.
"""

from __future__ import annotations

import inspect
import io
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from zephon._image_fields import IMAGE_FIELDS
from zephon._ops._image_size import QWEN_MAX_PIXELS, QWEN_MIN_PIXELS, PatchGrid
from zephon._optional import require
from zephon.errors import ConfigError, DataFormatError, MissingFieldError
from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext, OpTraits
from zephon.types import SampleMeta, SampleRecord, StreamItem, Tombstone, tombstone_meta

DECODE_MICRO_BATCH = 16
DECODE_LATENCY_MS = 5.0
_SKIP_HINT = (
    "to go on, set {op}(on_error='skip') or the run's on_error='skip' (the record is "
    "logged and quarantined), or replace the {media}"
)


class DecodeImageOp(BaseOp):
    """Decodes every field of ``fields`` a record has into a ``uint8`` (height, width, 3) array.

    ``resize``: resize to the processor's size (sides multiples of ``patch_size * merge_size``,
    area within ``min_pixels``..``max_pixels``, at most ``max_patches`` patches), else keep the
    stored size. Either way ``grid_field`` gets each image's ``(t, h, w)`` patch grid and
    ``tokens_field`` the vision tokens of the record's images, as the processor counts them.
    ``on_error``: a corrupt image raises, or drops its record into the quarantine (``None``:
    the run's ``on_error``).
    """

    name = "decode_image"
    media = "image"  # what a field holds, for errors
    # micro-batch sizes cannot change the output; on_error cannot change what is delivered
    # (a run that raised delivered nothing a later "skip" drops), as with fetch
    config_exclude = ("max_batch", "on_error")

    def __init__(
        self,
        fields: Sequence[str] = IMAGE_FIELDS,
        *,
        resize: bool = True,
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
        super().__init__()
        if isinstance(fields, str):
            fields = (fields,)
        if not fields:
            raise ConfigError("decode_image needs at least one field")
        if on_error not in (None, "raise", "skip"):
            raise ConfigError(f"decode_image: on_error must be 'raise' or 'skip', got {on_error!r}")
        if max_patches is not None and max_patches < 1:
            raise ConfigError(f"decode_image: max_patches must be >= 1, got {max_patches}")
        self.fields = tuple(fields)
        self.resize = resize
        self.patch_size, self.merge_size = patch_size, merge_size
        self.min_pixels, self.max_pixels, self.max_patches = min_pixels, max_pixels, max_patches
        self.grid_field, self.tokens_field = grid_field, tokens_field
        self.on_error = on_error
        self.max_batch = max_batch
        cap = max_pixels if max_patches is None else min(max_pixels, max_patches * patch_size**2)
        self._grid = PatchGrid(patch_size, merge_size, min(min_pixels, cap), cap)

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return CountingAccumulator(self.max_batch, None if deterministic else DECODE_LATENCY_MS)

    def traits(self) -> OpTraits:
        # Pillow decodes and resizes without the GIL: threads scale with the cores
        return OpTraits(preserves_cursor_order=True, parallelism="auto", elementwise=True)

    def config(self) -> Mapping[str, Any]:
        return {
            "fields": self.fields,
            "resize": self.resize,
            "patch_size": self.patch_size,
            "merge_size": self.merge_size,
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
            "max_patches": self.max_patches,
            "grid_field": self.grid_field,
            "tokens_field": self.tokens_field,
        }

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        image = require("PIL.Image", "decode_image")
        return [self._one(image, elem) for elem in elems]

    def _one(self, image: Any, elem: StreamItem) -> StreamItem:
        payload, meta = elem.payload, elem.meta
        if not isinstance(payload, dict):
            raise MissingFieldError(
                f"decode_image: record {meta.sample_id} is {type(payload).__name__}, expected a "
                "dict with one of the fields " + ", ".join(self.fields),
                sample_id=meta.sample_id,
            )
        present = [f for f in self.fields if f in payload]
        if not present:
            raise MissingFieldError(
                f"decode_image: record {meta.sample_id} has none of the fields "
                f"{list(self.fields)} (fields: {sorted(payload)}); pass fields=[...]",
                sample_id=meta.sample_id,
            )
        new = dict(payload)
        grids: list[tuple[int, int, int]] = []
        tokens = 0
        for name in present:
            try:
                value, grid = self._read(image, payload[name])
            except (*self._errors(image), image.DecompressionBombError) as e:
                return self._failed(meta, payload, name, e)
            grids.append(grid)
            tokens += grid[0] * grid[1] * grid[2] // (self.merge_size * self.merge_size)
            new[name] = value
        new[self.grid_field] = grids
        new[self.tokens_field] = tokens
        return SampleRecord(meta, new)

    def _errors(self, image: Any) -> tuple[type[BaseException], ...]:
        """What a corrupt input raises while it is read (the rest are bugs and propagate)."""
        return (OSError, ValueError, SyntaxError)

    def _read(self, image: Any, data: Any) -> tuple[Any, tuple[int, int, int]]:
        """The field's new value and the image's ``(t, h, w)`` patch grid as the processor
        resizes it."""
        pixels = self._decode(image, data)
        h, w = pixels.shape[:2]
        return pixels, self._grid.grid(*(self._grid.resized(h, w) if not self.resize else (h, w)))

    def _decode(self, image: Any, data: Any) -> np.ndarray:
        """RGB pixels of ``data`` (encoded bytes), EXIF orientation applied, resized if asked."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"expected encoded image bytes, got {type(data).__name__}")
        ops = require("PIL.ImageOps", "decode_image")
        with image.open(io.BytesIO(data)) as opened:
            opened.load()
            ops.exif_transpose(opened, in_place=True)  # in place: no copy when upright
            picture = opened
            if picture.mode != "RGB":  # as the processor does: transparency over white
                rgba = picture.convert("RGBA")
                white = image.new("RGBA", rgba.size, (255, 255, 255))
                picture = image.alpha_composite(white, rgba).convert("RGB")
            if self.resize:
                h, w = self._grid.resized(picture.height, picture.width)
                if (h, w) != (picture.height, picture.width):
                    picture = picture.resize((w, h), image.Resampling.BICUBIC)
            return np.asarray(picture, dtype=np.uint8)

    def _failed(
        self, meta: SampleMeta, payload: dict[str, Any], field: str, e: Exception
    ) -> SampleRecord:
        key = payload.get("__key__")
        named = f"record {meta.sample_id}" + (f" (key {key!r})" if key is not None else "")
        first = (str(e).splitlines() or [""])[0][:160]
        why = f"field {field!r} is not a readable {self.media} ({type(e).__name__}: {first})"
        if self.on_error != "skip":
            hint = _SKIP_HINT.format(op=self.name, media=self.media)
            raise DataFormatError(f"{self.name}: {named}: {why}", hint=hint) from None
        ds, shard, row = meta.sample_id
        info: dict[str, Any] = {"dataset": ds, "shard": shard, "row": row, "file": None}
        info.update(line=None, key=key, field=field, reason=f"{self.name}: {why}")
        reason = f"skipped: {self.name}: {why}"
        dead = tombstone_meta(meta, reason=reason).with_control(Tombstone(reason, skipped=info))
        return SampleRecord(dead, None)


_IMAGE_PARAMETERS = tuple(inspect.signature(DecodeImageOp.__init__).parameters)[1:]


def image_arguments(values: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of :class:`DecodeImageOp` among ``values``, a subclass constructor's
    ``locals()``: the subclass spells its signature (its operator definition, with its own
    defaults) and hands ``decode_image``'s part on in one line."""
    return {name: values[name] for name in _IMAGE_PARAMETERS if name in values}

"""decode_video: turn encoded video bytes (MP4, WebM, MKV, ...) into uint8 RGB frames.

Why an operator: as with images, readers keep videos encoded and the decode runs on worker
threads (FFmpeg, through PyAV, decodes without the GIL). Frames are sampled at ``fps`` and
resized as the Qwen2-VL video processor does (every frame to the same patch multiples, the
frame count a multiple of ``temporal_patch_size``), so the grid and the token count are the
model's: ``t * h * w / merge_size**2`` vision tokens with ``t`` = frames / temporal patch.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from zephon._ops.decode_image import DECODE_MICRO_BATCH, DecodeImageOp, image_arguments
from zephon._optional import require
from zephon.errors import ConfigError

VIDEO_FIELDS = ("mp4", "webm", "mkv", "avi", "mov", "video")
#: The Qwen2-VL video processor's defaults: pixels per frame, frames a second, frame bounds.
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28
VIDEO_FPS = 2.0
VIDEO_MIN_FRAMES = 4
VIDEO_MAX_FRAMES = 768


class DecodeVideoOp(DecodeImageOp):
    """Decodes every field of ``fields`` a record has into a ``uint8`` (frames, height, width,
    3) array: ``fps`` frames a second, evenly spaced (at least ``min_frames``, at most
    ``max_frames``, never more than the video has), the last frame repeated up to a multiple
    of ``temporal_patch_size``. ``grid_field`` gets each video's ``(t, h, w)`` patch grid and
    ``tokens_field`` the record's vision tokens; the other arguments are ``decode_image``'s.
    A video FFmpeg cannot read follows ``on_error`` with the record named.
    """

    name = "decode_video"
    media = "video"

    def __init__(
        self,
        fields: Sequence[str] = VIDEO_FIELDS,
        *,
        fps: float = VIDEO_FPS,
        min_frames: int = VIDEO_MIN_FRAMES,
        max_frames: int = VIDEO_MAX_FRAMES,
        temporal_patch_size: int = 2,
        resize: bool = True,
        patch_size: int = 14,
        merge_size: int = 2,
        min_pixels: int = VIDEO_MIN_PIXELS,
        max_pixels: int = VIDEO_MAX_PIXELS,
        max_patches: int | None = None,
        grid_field: str = "video_grid_thw",
        tokens_field: str = "video_tokens",
        on_error: Literal["raise", "skip"] | None = None,
        max_batch: int = DECODE_MICRO_BATCH,
    ) -> None:
        super().__init__(**image_arguments(locals()))
        if not fps > 0:
            raise ConfigError(f"decode_video: fps must be > 0, got {fps}")
        if temporal_patch_size < 1 or min_frames < 1 or max_frames < min_frames:
            raise ConfigError(
                "decode_video: need temporal_patch_size >= 1 and 1 <= min_frames <= max_frames, "
                f"got {temporal_patch_size}, {min_frames}, {max_frames}"
            )
        self.fps, self.temporal_patch_size = fps, temporal_patch_size
        self.min_frames, self.max_frames = min_frames, max_frames

    def config(self) -> Mapping[str, Any]:
        return {
            **super().config(),
            "fps": self.fps,
            "min_frames": self.min_frames,
            "max_frames": self.max_frames,
            "temporal_patch_size": self.temporal_patch_size,
        }

    def _errors(self, image: Any) -> tuple[type[BaseException], ...]:
        av = require("av", "decode_video")
        return (*super()._errors(image), av.FFmpegError)

    def _read(self, image: Any, data: Any) -> tuple[Any, tuple[int, int, int]]:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"expected encoded video bytes, got {type(data).__name__}")
        av = require("av", "decode_video")
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.video:
                raise ValueError("the file holds no video stream")
            stream = container.streams.video[0]
            total = stream.frames or _count_frames(av, data)
            rate = stream.average_rate or stream.guessed_rate
            wanted = self._sample(total, float(rate) if rate else self.fps)
            frames = self._frames(image, container.decode(stream), wanted)
        pad = -len(frames) % self.temporal_patch_size
        pixels = np.stack(frames + frames[-1:] * pad)
        _, h, w, _ = pixels.shape
        size = self._grid.resized(h, w) if not self.resize else (h, w)
        _, gh, gw = self._grid.grid(*size)
        return pixels, (len(pixels) // self.temporal_patch_size, gh, gw)

    def _sample(self, total: int, rate: float) -> list[int]:
        """The frame indices to keep: ``fps`` a second over ``total`` frames shown at ``rate``
        (the Qwen2-VL video processor's rule), evenly spaced from the first frame."""
        if total < 1:
            raise ValueError("the video has no frames")
        step = self.temporal_patch_size
        cap = max(step, math.floor(min(self.max_frames, total) / step) * step)
        count = min(max(total / rate * self.fps, self.min_frames), cap, total)
        count = math.floor(count / step) * step if count >= step else total
        return [i * total // count for i in range(count)]

    def _frames(self, image: Any, decoded: Any, wanted: list[int]) -> list[np.ndarray]:
        """The frames at ``wanted`` (ascending) as RGB arrays, resized if asked."""
        keep, out, seen = set(wanted), [], 0
        for seen, frame in enumerate(decoded, start=1):
            if seen - 1 in keep:
                picture = frame.to_image()  # RGB
                if self.resize:
                    h, w = self._grid.resized(picture.height, picture.width)
                    if (h, w) != (picture.height, picture.width):
                        picture = picture.resize((w, h), image.Resampling.BICUBIC)
                out.append(np.asarray(picture, dtype=np.uint8))
                if len(out) == len(wanted):
                    return out
        raise ValueError(
            f"the video ends after {seen} frames, its header promises {wanted[-1] + 1} or more"
        )


def _count_frames(av: Any, data: Any) -> int:
    """Frames of a video whose header does not say: its packets, counted without decoding."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        return sum(1 for packet in container.demux(stream) if packet.size)

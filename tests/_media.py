"""Images made with Pillow and WebDataset shards written with the ``webdataset`` package:
the real inputs of the media tests."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

FORMATS = ("JPEG", "PNG", "WEBP")


def picture(i: int, size: tuple[int, int] = (40, 30)) -> Image.Image:
    """A deterministic RGB picture (a gradient keyed by ``i``), ``size`` = (width, height)."""
    w, h = size
    x = np.arange(w, dtype=np.uint16)[None, :, None]
    y = np.arange(h, dtype=np.uint16)[:, None, None]
    c = np.array([3, 5, 7], dtype=np.uint16)[None, None, :]
    pixels = ((x * c + y * (c + i) + 11 * i) % 256).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def encoded(image: Image.Image, fmt: str = "JPEG", **save: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return out.getvalue()


def samples(n: int, *, start: int = 0) -> list[dict[str, Any]]:
    """``n`` WebDataset samples: an image of each format in turn, a caption and a label."""
    out: list[dict[str, Any]] = []
    for i in range(start, start + n):
        fmt = FORMATS[i % len(FORMATS)]
        size = (24 + 4 * (i % 5), 20 + 3 * (i % 4))
        ext = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}[fmt]
        out.append({
            "__key__": f"part/{i:05d}",
            ext: encoded(picture(i, size), fmt),
            "txt": f"picture {i}",
            "cls": str(i % 3),
        })  # fmt: skip
    return out


def write_shards(folder: Path, per_shard: list[int]) -> list[dict[str, Any]]:
    """Shards ``folder/shard-NNNNN.tar`` holding ``per_shard`` samples each (written with
    ``webdataset.TarWriter``); returns every sample written, in order."""
    import webdataset

    folder.mkdir(parents=True, exist_ok=True)
    written: list[dict[str, Any]] = []
    for s, count in enumerate(per_shard):
        part = samples(count, start=len(written))
        with webdataset.TarWriter(str(folder / f"shard-{s:05d}.tar")) as sink:
            for sample in part:
                sink.write(sample)
        written += part
    return written


def video(
    frames: int,
    *,
    rate: int = 10,
    size: tuple[int, int] = (64, 48),
    seed: int = 0,
    container_format: str = "mp4",
    codec: str = "mpeg4",
) -> bytes:
    """A video (default an MP4 of MPEG-4 part 2) of ``frames`` frames at ``rate`` a second,
    encoded with PyAV: frame ``i`` is :func:`picture` ``seed + 3 * i``, so every frame looks
    different."""
    import av

    out = io.BytesIO()
    with av.open(out, "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            frame = av.VideoFrame.from_image(picture(seed + 3 * i, size))
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return out.getvalue()


def write_pairs_parquet(path: Path, n: int) -> None:
    """``n`` samples of two images each (a JPEG ``jpg`` and a PNG ``png``) and a caption
    ``txt`` (bytes), as one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    jpg = [encoded(picture(100 + i, (30 + 9 * (i % 4), 28 + 11 * (i % 3)))) for i in range(n)]
    png = [encoded(picture(200 + i, (56, 29 + 5 * (i % 5))), "PNG") for i in range(n)]
    txt = [f"two pictures, number {i}".encode() for i in range(n)]
    pq.write_table(pa.table({"jpg": jpg, "png": png, "txt": txt}), path, row_group_size=10)


def as_read(sample: dict[str, Any]) -> dict[str, Any]:
    """A written sample as a reader returns it: every field encoded bytes."""
    return {k: v if k == "__key__" or isinstance(v, bytes) else str(v).encode()
            for k, v in sample.items()}  # fmt: skip
